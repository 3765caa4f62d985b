"""The run doctor on hostile files: it is linear in the history, reads only numbers a float holds,
counts a step once, names the file it read (the newest TRL state), writes strict JSON, never opens a
pipe, and skips a last line cut mid-write. Every refusal is one line naming the file (and the line);
never a traceback."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from test_diagnosis import FACTS, healthy

from rlhf_helpers.doctor import RunFacts, Thresholds, diagnose, format_findings
from rlhf_helpers.doctor.rows import longest_run
from rlhf_helpers.ppo.metric_doc_types import ENTROPY_ROUNDING
from rlhf_helpers.stages.diagnose import main


def one_line_error(capsys, argv) -> str:
    """The CLI's stderr for `argv`, checked to be exit 2 and one line."""
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def write_rows(path, rows, end="\n"):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]) + json.dumps(rows[-1]) + end)


# ----------------------------------------------------------------------------- linear in the
# history
def test_the_longest_run_is_the_first_longest_stretch():
    rows = [{"step": i + 1, "kl": kl} for i,
            kl in enumerate([-1, -1, 2, -1, -1, -1, math.nan, -1, -1, -1, 0, -1])]
    # NaN breaks a stretch
    assert longest_run(rows, "kl", lambda v: v < 0) == [(4, -1.0), (5, -1.0), (6, -1.0)]
    # a stretch running to the end
    assert longest_run(rows[-1:], "kl", lambda v: v < 0) == [(12, -1.0)]
    assert longest_run(rows, "kl", lambda v: v > 5) == [] and longest_run([], "kl",
                                                                          lambda v: v < 0) == []


def test_a_200k_row_metrics_file_with_a_negative_kl_stretch_is_diagnosed(tmp_path):
    lines = [f'{{"step": {i}, "kl": {-0.01 if 100_000 <= i < 150_000 else 0.5}}}\n'
             for i in range(1, 200_001)]
    (tmp_path / "metrics.jsonl").write_text("".join(lines))
    found = {f.rule: f for f in diagnose(tmp_path).findings}
    assert found["negative_kl"].steps == tuple(range(100_000, 150_000))
    assert "50000 consecutive steps below 0" in found["negative_kl"].evidence


# ----------------------------------------------------------------------------- numbers a float
# holds
@pytest.mark.parametrize(
    "value, key",
    [
        ("1" + "0" * 400, "kl"),  # beyond every float: +inf (was OverflowError)
        ("-" + "9" * 5000, "kl"),  # beyond Python's 4300-digit int literals too
        ("NaN", "score"),
        ("Infinity", "score"),
        ("-Infinity", "entropy"),
        ("1e999", "entropy"),
    ],
)
def test_numbers_a_float_cannot_hold_are_named_as_non_finite(tmp_path, capsys, value, key):
    rows = [json.dumps(r) for r in healthy(6)]
    # a metric of its own: the others stay healthy
    rows[2] = rows[2][:-1] + f', "{key}_x": {value}}}'
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("[error] non_finite: NaN or infinite metrics (step 3)" in out
            and f"step 3: {key}_x" in out)


def test_a_line_nested_thousands_deep_is_refused_by_file_and_line(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "kl": 0.1}\n{"step": 2, "kl": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
    )
    err = one_line_error(capsys, [tmp_path])
    assert f"{tmp_path / 'metrics.jsonl'}, line 2: nested too deeply" in err


def test_a_setting_beyond_a_float_in_run_json_is_refused(tmp_path, capsys):
    write_rows(tmp_path / "metrics.jsonl",
               [{"step": 1, "eos_fraction": 0.1, "response_length": 40.0}])
    (tmp_path / "run.json").write_text(
        '{"ppo_config": {"max_new_tokens": 1' + "0" * 400 + '}, "profile": {"dtype": "float32"}}'
    )
    err = one_line_error(capsys, [tmp_path])
    assert "run.json: max_new_tokens must be an int >= 1" in err and "up to 2**53" in err


def test_a_null_trl_metric_is_not_logged(tmp_path, capsys):
    log = [
        {"step": s, "reward": 1.0 + s, "reward_std": 0.5,
         "completions/clipped_ratio": None, "entropy": None}
        for s in range(1, 4)
    ]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 3, "log_history": log}))
    assert main([str(tmp_path)]) == 0
    history = diagnose(tmp_path)
    assert history.steps == 3 and not history.findings


def test_numpy_numbers_are_numbers():
    rows = healthy(30)
    as_numpy = [{k: (np.float32(v) if k != "step" else np.int64(v)) for k,
                 v in row.items()} for row in rows]
    expected = [(f.rule, f.steps) for f in diagnose(rows, facts=FACTS).findings]
    assert [(f.rule, f.steps) for f in diagnose(as_numpy, facts=FACTS).findings] == expected
    as_numpy[3]["kl"] = np.bool_(True)
    with pytest.raises(ValueError, match="row 4: kl must be a number, got bool"):
        diagnose(as_numpy, facts=FACTS)


# ----------------------------------------------------------------------------- a step counts once
def test_a_step_logged_three_times_counts_once_and_its_last_row_is_read(tmp_path):
    rows = healthy(10)
    short = dict(rows[4], response_length=1.0)  # length_collapse needs 3 steps
    three = rows[:5] + [short, short, short] + rows[5:]
    assert not {f.rule for f in diagnose(three, facts=FACTS).findings} & {"length_collapse"}
    write_rows(tmp_path / "metrics.jsonl", three)
    diagnosis = diagnose(tmp_path, facts=FACTS)
    assert diagnosis.steps == 10 and "1 step(s) logged more than once" in format_findings(diagnosis)
    # a resumed run logs again the steps after its checkpoint: the rows it went on from are read
    resumed = rows[:6] + [dict(rows[4], kl=-1.0), dict(rows[5], kl=-1.0)] + rows[6:]
    read = {r["step"]: r["kl"] for r in resumed}
    assert read[5.0] == -1.0 and len(read) == 10
    assert [
        f.steps
        for f in diagnose(resumed, facts=FACTS, thresholds=Thresholds(negative_kl_steps=2)).findings
        if f.rule == "negative_kl"
    ] == [(5, 6)]


# ----------------------------------------------------------------------------- TRL: the newest
# state, named
def _trl_state(path, global_step, reward):
    path.parent.mkdir(parents=True, exist_ok=True)
    log = [
        {"step": s, "reward": reward(s), "reward_std": 0.0 if reward(s) == 0.0 else 0.4}
        for s in range(1, global_step + 1)
    ]
    path.write_text(json.dumps({"global_step": global_step, "log_history": log}))


def test_a_newer_checkpoint_s_trl_state_is_read_over_a_stale_top_level_one(tmp_path, capsys):
    _trl_state(tmp_path / "trainer_state.json", 10, lambda s: 1.0 + s)
    _trl_state(tmp_path / "checkpoint-20" / "trainer_state.json", 20,
               lambda s: 1.0 + s if s <= 10 else 0.0)
    _trl_state(tmp_path / "checkpoint-5" / "trainer_state.json", 5, lambda s: 1.0 + s)
    diagnosis = diagnose(tmp_path)
    assert diagnosis.steps == 20 and diagnosis.source_file == str(tmp_path / "checkpoint-20"
                                                                  / "trainer_state.json")
    assert [f.rule for f in diagnosis.findings] == ["no_learning_signal"]
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"20 steps read from {tmp_path / 'checkpoint-20' / 'trainer_state.json'}" in out
    assert "newer than the top-level trainer_state.json (global_step 10)" in out


@pytest.mark.parametrize("top_step", [20, 30])
def test_a_top_level_trl_state_as_new_as_the_checkpoints_is_read(tmp_path, top_step):
    _trl_state(tmp_path / "trainer_state.json", top_step, lambda s: 1.0 + s)
    _trl_state(tmp_path / "checkpoint-20" / "trainer_state.json", 20, lambda s: 0.0)
    diagnosis = diagnose(tmp_path)
    assert diagnosis.source_file == str(tmp_path / "trainer_state.json") and not diagnosis.findings


# ----------------------------------------------------------------------------- strict JSON
def _strict(text):
    def refuse(name):
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_strict_json(tmp_path, capsys):
    rows = healthy(6)
    rows[2]["score"] = math.inf
    rows[3]["kl"] = math.nan
    write_rows(tmp_path / "metrics.jsonl", rows)
    assert main([str(tmp_path), "--json"]) == 0
    printed = _strict(capsys.readouterr().out)
    assert (printed["source_file"] == str(tmp_path / "metrics.jsonl")
            and printed["findings"][0]["rule"] == "non_finite")
    # thresholds are finite (Thresholds refuses inf)
    diagnosis = diagnose(rows, facts=RunFacts(score_clip=math.inf))
    written = _strict(json.dumps(diagnosis.to_json(), allow_nan=False))
    assert written["facts"]["score_clip"] == "inf"


def test_a_run_json_with_an_infinite_setting_is_refused_not_printed_as_infinity(tmp_path, capsys):
    write_rows(tmp_path / "metrics.jsonl", healthy(3))
    (tmp_path / "run.json").write_text(
        '{"ppo_config": {"score_clip": Infinity}, "profile": {"dtype": "float32"}}')
    assert ("run.json: score_clip must be a number >= 0, got float inf"
            in one_line_error(capsys, [tmp_path, "--json"]))


# ----------------------------------------------------------------------------- what the file is
@pytest.mark.parametrize(
    "make, said",
    [
        (lambda p: p.mkdir(), "is a folder, not a file"),
        (lambda p: p.symlink_to(p.parent / "gone.jsonl"), "is a broken link (to "),
        (lambda p: os.mkfifo(p), "is a named pipe (FIFO), not a file"),
    ],
    ids=["folder", "broken link", "pipe"],
)
@pytest.mark.parametrize("given", ["run folder", "the file"])
def test_a_metrics_jsonl_that_is_not_a_file_is_named_and_never_opened(
        tmp_path, capsys, make, said, given):
    """A pipe is never opened: opening one for reading waits for a writer (the doctor hung)."""
    make(tmp_path / "metrics.jsonl")
    err = one_line_error(capsys,
                         [tmp_path if given == "run folder" else tmp_path / "metrics.jsonl"])
    assert f"{tmp_path / 'metrics.jsonl'} {said}" in err and "holds no metrics.jsonl" not in err


def test_a_trl_state_that_is_a_pipe_is_never_opened(tmp_path, capsys):
    (tmp_path / "checkpoint-3").mkdir()
    os.mkfifo(tmp_path / "checkpoint-3" / "trainer_state.json")
    assert "is a named pipe (FIFO), not a file" in one_line_error(capsys, [tmp_path])


def test_a_last_line_cut_mid_write_is_skipped_with_a_note(tmp_path, capsys):
    rows = healthy(5)
    # no newline: cut
    text = "".join(json.dumps(r) + "\n" for r in rows) + json.dumps(healthy(6)[5])[:37]
    (tmp_path / "metrics.jsonl").write_text(text)
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "5 steps read" in out and "line 6: skipped, a record cut mid-write" in out
    # ended by a newline: not a cut write
    (tmp_path / "metrics.jsonl").write_bytes(text.encode() + b"\n")
    assert "line 6: not valid JSON" in one_line_error(capsys, [tmp_path])
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n{oops}\n"
                                            + json.dumps(rows[1]))
    assert (f"{tmp_path / 'metrics.jsonl'}, line 2: not valid JSON"
            in one_line_error(capsys, [tmp_path]))
    (tmp_path / "metrics.jsonl").write_bytes(json.dumps(rows[0]).encode() + b"\n"
                                             + '{"kl": "é'.encode()[:-1])
    assert main([str(tmp_path)]) == 0  # a multi-byte character cut in two: still the cut last line


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path):
    """`python -m rlhf_helpers.stages.diagnose RUN | head -1`: the pipe closes before the report is
    written."""
    write_rows(tmp_path / "metrics.jsonl", healthy(30))
    command = [sys.executable, "-m", "rlhf_helpers.stages.diagnose", str(tmp_path), "--json"]
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    # before the child has imported anything: its first write meets a closed pipe
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 0 and err == "", err


# ----------------------------------------------------------------------------- TRL checkpoint
# names, empty states
def test_a_checkpoint_named_with_a_non_ascii_digit_is_not_a_checkpoint(tmp_path):
    _trl_state(tmp_path / "checkpoint-2" / "trainer_state.json", 2, lambda s: 1.0 + s)
    # '²'.isdigit() is True
    _trl_state(tmp_path / "checkpoint-²" / "trainer_state.json", 9, lambda s: 0.0)
    diagnosis = diagnose(tmp_path)
    assert diagnosis.source_file == str(tmp_path / "checkpoint-2"
                                        / "trainer_state.json") and diagnosis.steps == 2


def test_an_empty_checkpoint_state_is_passed_over_for_a_logged_one_and_named_when_alone(
        tmp_path, capsys):
    _trl_state(tmp_path / "trainer_state.json", 10, lambda s: 1.0 + s)
    empty = tmp_path / f"checkpoint-{'9' * 240}" / "trainer_state.json"
    empty.parent.mkdir()
    empty.write_text('{"log_history": []}')
    diagnosis = diagnose(tmp_path)
    assert diagnosis.source_file == str(tmp_path / "trainer_state.json") and diagnosis.steps == 10
    assert any("holds no logged step" in note and str(empty) in note for note in diagnosis.notes)
    (tmp_path / "trainer_state.json").unlink()
    assert f"{empty} holds no logged step" in one_line_error(capsys, [str(tmp_path)])


# ----------------------------------------------------------------------------- diagnose()'s
# arguments
class _NoModel:
    history = healthy(3)
    config = object()


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda: diagnose(healthy(3), facts="x"), "facts must be a RunFacts or None, got str"),
        (lambda: diagnose(healthy(3), thresholds={"sustain_steps": 3}),
         "thresholds must be a Thresholds or None"),
        (lambda: diagnose(_NoModel()), "source looks like a PPOTrainer"),
    ],
)
def test_diagnose_s_arguments_are_checked_by_name(call, said):
    with pytest.raises(TypeError, match=said):
        call()


def test_a_trainer_like_object_without_a_model_is_read_with_its_facts_given():
    assert diagnose(_NoModel(), facts=FACTS).steps == 3


# ----------------------------------------------------------------------------- steps are integers
# >= 0
@pytest.mark.parametrize("step", [-5, -5.5, 2.5, "1e400", "NaN"])
def test_a_step_that_is_not_an_integer_from_0_is_refused_by_file_and_line(tmp_path, capsys, step):
    rows = healthy(4)
    text = "".join(json.dumps(row) + "\n" for row in rows[:2]) + "\n"  # a blank line: line 3
    text += json.dumps(dict(rows[2], step=0.0)).replace("0.0,", f"{step},", 1) + "\n"
    (tmp_path / "metrics.jsonl").write_text(text)
    error = one_line_error(capsys, [str(tmp_path)])
    assert f"{tmp_path / 'metrics.jsonl'}, line 4: step must be an integer >= 0" in error


def test_steps_from_0_as_ints_or_integral_floats_are_read():
    rows = [dict(row, step=step) for row,
            step in zip(healthy(3), [0, 1.0, np.int64(2)], strict=True)]
    assert diagnose(rows, facts=FACTS).steps == 3
    with pytest.raises(ValueError, match=r"row 2: step must be an integer >= 0, got float -5.5"):
        diagnose([dict(rows[0], step=5), dict(rows[1], step=-5.5)], facts=FACTS)
    with pytest.raises(ValueError, match=r"row 1: step must be an integer >= 0, got int -5"):
        diagnose([dict(rows[0], step=-5), dict(rows[1], step=-5.5)], facts=FACTS)


# ----------------------------------------------------------------------------- values no run logs
@pytest.mark.parametrize(("key", "value", "said"), [
    ("step", 1e300, "step must be at most 1,000,000,000 (no run is that long), got float 1e+300"),
    ("step", 10**12, "step must be at most 1,000,000,000 (no run is that long), got int "),
    ("eos_fraction", 2, "eos_fraction must be in [0, 1] (fraction of responses that ended with"),
    ("clipfrac", -0.25, "clipfrac must be in [0, 1] (fraction of response tokens"),
    ("response_length", -5, "response_length must be >= 0 (mean response length in tokens"),
    ("value_loss", -1.0, "value_loss must be >= 0"),
    ("explained_variance", 1.5, "explained_variance must be <= 1"),
    ("entropy", -3, "entropy must be >= -0.0113249 (mean per-token entropy of the policy"),
    ("entropy_update", -0.5, "entropy_update must be >= -0.0113249 (mean policy entropy"),
])
def test_a_value_no_run_logs_is_refused_by_file_and_line(tmp_path, capsys, key, value, said):
    """Before: `step: 1e300`, an eos_fraction of 2 and a response_length of -5 were read without a
    word (the rules then compared them, or the step became a 300-digit int)."""
    rows = healthy(4)
    rows[2][key] = value
    write_rows(tmp_path / "metrics.jsonl", rows)
    error = one_line_error(capsys, [str(tmp_path)])
    assert f"{tmp_path / 'metrics.jsonl'}, line 3: {said}" in error, error
    with pytest.raises(ValueError, match=rf"row 3: {re.escape(said)}"):  # the same from the API
        diagnose(rows, facts=FACTS)


def test_values_at_the_edges_of_the_possible_and_non_finite_ones_are_read(tmp_path):
    """0 and 1 are shares, 0 is a length, an entropy a rounding below 0 is one; NaN and inf are the
    rules' (a run stopped by them)."""
    rows = healthy(4)
    rows[0].update(eos_fraction=0.0, clipfrac=1.0, response_length=0.0, step=0,
                   entropy=-ENTROPY_ROUNDING, entropy_update=-1e-8)
    rows[1].update(value_loss=float("nan"), explained_variance=-50.0, step=10**9)
    assert diagnose(rows, facts=FACTS).steps == 4


def test_the_entropys_slack_is_float32_rounding_of_the_largest_logits():
    """The bound's derivation (metric_doc_types.ENTROPY_ROUNDING) in numbers: below 0 by at most
    (2 + log2 V) roundings of 2**-24 of |logits / temperature| <= 1e4, about a hundredth."""
    assert ENTROPY_ROUNDING == pytest.approx((2 + 17) * 2.0**-24 * 1e4)
    assert 0.005 < ENTROPY_ROUNDING < 0.02


@pytest.mark.parametrize(("key", "literal", "said"), [
    ("response_length", "1" + "0" * 400,
     "response_length must be >= 0 (mean response length in tokens, EOS included), got an integer "
     "of 401 digits: no run logs that, so the file was edited or damaged"),
    ("eos_fraction", "-" + "9" * 5000, "eos_fraction must be in [0, 1] (fraction of responses"),
    ("step", "1" + "0" * 400,
     "step must be an integer from 0 to 1,000,000,000 (no run is that long), got an integer of "
     "401 digits: no run logs that, so the file was edited or damaged"),
])
def test_an_integer_beyond_every_float_in_a_bounded_metric_is_refused_by_its_digits(
        tmp_path, capsys, key, literal, said):
    """Before: `response_length: 10**400` was read as inf and reported as the run's own 'NaN or
    infinite metrics' finding, and `step: 10**400` was refused as 'got float inf'."""
    rows = healthy(4)
    rows[2][key] = 0.0
    text = "".join(json.dumps(row) + "\n" for row in rows)
    text = text.replace(f'"{key}": 0.0', f'"{key}": {literal}', 1)
    (tmp_path / "metrics.jsonl").write_text(text)
    error = one_line_error(capsys, [str(tmp_path)])
    assert f"{tmp_path / 'metrics.jsonl'}, line 3: {said}" in error, error
    if key == "eos_fraction":
        assert "got a negative integer of 5000 digits" in error


def test_a_response_length_above_run_jsons_max_new_tokens_is_refused_naming_both_files(
        tmp_path, capsys):
    """Before: `response_length: 1e30` was read although run.json said max_new_tokens 40."""
    rows = healthy(4)
    rows[0]["response_length"] = 40.0  # every response cut at the limit: a run's
    rows[2]["response_length"] = 1e30
    write_rows(tmp_path / "metrics.jsonl", rows)
    (tmp_path / "run.json").write_text(
        '{"ppo_config": {"max_new_tokens": 40}, "profile": {"dtype": "float32"}}')
    error = one_line_error(capsys, [str(tmp_path)])
    assert error.endswith(
        f"{tmp_path / 'metrics.jsonl'}, row 3: response_length 1e+30 is above the max_new_tokens "
        f"40 of {tmp_path / 'run.json'}: no run logs that, so one of the files was edited or "
        "damaged"), error
    rows[2]["response_length"] = 40.0
    write_rows(tmp_path / "metrics.jsonl", rows)
    assert main([str(tmp_path)]) == 0


def test_a_step_beyond_run_jsons_total_steps_is_refused_naming_both_files(tmp_path, capsys):
    """Before: step 999 in a 2-step run was read, and findings named steps that never ran;
    `--resume` rewrites total_steps, so no run logs a step beyond it."""
    rows = healthy(2)
    rows[1]["step"] = 999
    write_rows(tmp_path / "metrics.jsonl", rows)
    (tmp_path / "run.json").write_text(
        '{"ppo_config": {"total_steps": 2}, "profile": {"dtype": "float32"}}')
    error = one_line_error(capsys, [str(tmp_path)])
    assert error.endswith(
        f"{tmp_path / 'metrics.jsonl'}, row 2: step 999 is beyond the total_steps 2 of "
        f"{tmp_path / 'run.json'}: no run logs that (a resumed run rewrites total_steps), so one "
        "of the files was edited or damaged"), error
    rows[1]["step"] = 2.0  # the last step, as the trainer logs it (a float)
    write_rows(tmp_path / "metrics.jsonl", rows)
    assert main([str(tmp_path)]) == 0
    (tmp_path / "run.json").write_text(
        '{"ppo_config": {"total_steps": 1}, "profile": {"dtype": "float32"}}')
    assert "row 2: step 2.0 is beyond the total_steps 1" in one_line_error(capsys, [str(tmp_path)])


def test_a_trl_log_entry_no_run_logs_is_refused_naming_the_file_and_entry(tmp_path, capsys):
    log = [{"step": 1, "reward": 0.5, "completions/mean_length": 12.0},
           {"step": 2, "reward": 0.6, "completions/mean_length": -3.0}]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": log}))
    error = one_line_error(capsys, [str(tmp_path)])
    assert (f"{tmp_path / 'trainer_state.json'}, log_history entry 2: response_length must be "
            ">= 0") in error, error

# ----------------------------------------------------------------------------- thresholds
@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("negative_kl_steps", -1, "an int >= 1"),
        ("sustain_steps", 0, "an int >= 1"),
        ("sustain_steps", 2.0, "an int"),
        ("clipfrac_high", math.nan, "a finite number"),
        ("approx_kl_high", math.inf, "a finite number"),
        ("zero_std_share", 1.5, "in [0, 1]"),
        ("eos_floor", -0.1, "in [0, 1]"),
        ("ratio_tolerance", -1e-4, ">= 0"),
        ("critic_grace_steps", -1, "an int >= 0"),
        ("cold_critic_ev", True, "a finite number"),
    ],
)
def test_thresholds_out_of_their_range_are_refused_by_name(field, value, said):
    with pytest.raises(ValueError, match=rf"Thresholds\.{field} must be .*{re.escape(said)}"):
        Thresholds(**{field: value})
