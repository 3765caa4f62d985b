"""The run doctor judges a run by the dtype it computed in: a healthy bf16 run recorded on an H200
(tests/fixtures/gpu-runs) gives nothing above info, and the broken variants of notebook 06 still
give their errors in float32, bfloat16 and float16 (toy runs in each dtype, and the H200 run with
the numbers a broken run must log)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from rlhf_helpers.core.tolerances import dtype_name, ratio_tolerance, spread_tolerance
from rlhf_helpers.doctor import RunFacts, compute_record, diagnose, load_history
from rlhf_helpers.ppo.trainer import PPOTrainer

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-runs" / "h200-2026-11-27-cli"
ABOVE_INFO = ("error", "warning")


def _above_info(diagnosis) -> dict[str, str]:
    return {f.rule: f.severity for f in diagnosis.findings if f.severity in ABOVE_INFO}


# ----------------------------------------------------------------------------- dtype names
@pytest.mark.parametrize("spelling, name", [
    ("bf16", "bfloat16"), ("torch.bfloat16", "bfloat16"), ("bfloat16", "bfloat16"),
    (torch.bfloat16, "bfloat16"), ("fp16", "float16"), ("half", "float16"),
    ("torch.float16", "float16"), (" Float16 ", "float16"),
    ("fp32", "float32"), ("torch.float32", "float32"), (torch.float64, "float64")])
def test_every_spelling_of_a_dtype_is_one_dtype(spelling, name):
    assert dtype_name(spelling) == name
    assert RunFacts(dtype=spelling).dtype == name
    assert ratio_tolerance(spelling) == ratio_tolerance(name)


@pytest.mark.parametrize("unknown", ["bf17", "int8", "auto", "", None, 16, torch.int64])
def test_an_unknown_dtype_is_an_error_never_float32(unknown):
    with pytest.raises(ValueError, match="dtype must be a floating dtype name"):
        RunFacts(dtype=unknown)


def test_the_tolerances_follow_the_dtype_s_eps():
    """float32/64 keep the course's float32 tolerances; a 16-bit dtype gets eps / 8 for the ratio
    and one eps for the spread of equal scores: fp16 has 3 more mantissa bits than bf16, so 8x
    tighter (down to float32's floor)."""
    assert ratio_tolerance("float32") == ratio_tolerance("float64") == 1e-4
    assert ratio_tolerance("bf16") == pytest.approx(2.0 ** -7 / 8)
    assert ratio_tolerance("fp16") == pytest.approx(2.0 ** -10 / 8)
    assert spread_tolerance("float32") == 1e-6 and spread_tolerance("bf16") == 2.0 ** -7


# ----------------------------------------------------------------------------- the H200 run
def test_the_h200_fixture_is_the_recorded_run_and_the_float32_verdict_was_its_false_alarm():
    """The fixture's diagnosis.json (written by the old doctor, which took the float32 masters'
    dtype) named first_ratio_not_one and eos_masked; judging the same metrics as float32 with no
    share tolerance gives them again at the same steps, so the fixture is that run and those were
    the false alarms."""
    recorded = json.loads((H200 / "diagnosis.json").read_text())
    errors = {f["rule"]: f["steps"] for f in recorded["findings"] if f["severity"] == "error"}
    assert set(errors) == {"first_ratio_not_one",
                           "eos_masked"} and recorded["facts"]["dtype"] == "float32"
    rows, facts = load_history(H200)
    assert facts.dtype == "bfloat16" and len(rows) == recorded["steps"] == 20
    as_float32 = diagnose(rows, facts=dataclasses.replace(facts, dtype="float32"))
    ratio = next(f for f in as_float32.findings if f.rule == "first_ratio_not_one")
    assert list(ratio.steps) == errors["first_ratio_not_one"]
    # the old `< 1.0`
    assert [r["step"] for r in rows if r["eos_in_mask"] < 1.0] == errors["eos_masked"]


def test_the_h200_run_gives_nothing_above_info():
    diagnosis = diagnose(H200)
    assert diagnosis.facts.dtype == "bfloat16"
    assert _above_info(diagnosis) == {}, [f.text() for f in diagnosis.findings]
    # fresh value adapters, no warm-up
    assert {f.rule for f in diagnosis.findings} == {"untrained_critic"}


def test_the_h200_run_with_the_reference_as_old_log_probs_is_an_error_from_the_first_move():
    """With the reference's log-probs as the old ones, the first minibatch's ratio is the mean over
    its tokens of pi_old / pi_ref = exp(logp_old - logp_ref), at least exp(mean(logp_old -
    logp_ref)) by Jensen. That mean over the first minibatch (half the batch) is estimated by the
    batch's k1 KL per token, kl / response_length: an estimate of the bound, not the bound itself,
    but at step 2 it is already 16x outside bf16's tolerance. Step 1 (policy = reference, KL 0)
    gives 1 even with the bug."""
    rows, facts = load_history(H200)
    broken = [{**row, "first_ratio": math.exp(row["kl"] / row["response_length"])} for row in rows]
    finding = next(f for f in diagnose(broken, facts=facts).findings
                   if f.rule == "first_ratio_not_one")
    assert finding.severity == "error"
    assert list(finding.steps) == [int(r["step"]) for r in rows
                                   if r["kl"] > 0] == list(range(2, 21))


def test_the_h200_run_with_the_eos_hidden_is_an_error():
    rows, facts = load_history(H200)
    # pad == EOS's "not padding" mask hides every EOS
    hidden = [{**row, "eos_in_mask": 0.0} for row in rows]
    assert _above_info(diagnose(hidden, facts=facts)) == {"eos_masked": "error"}
    one_missed = [{**row, "eos_in_mask": 1.0 - 1e-5} for row in rows]  # one EOS of 10^5 hidden
    assert _above_info(diagnose(one_missed, facts=facts)) == {"eos_masked": "error"}


@pytest.mark.parametrize("spelling", ["bf16", "torch.bfloat16", "bfloat16"])
def test_run_json_s_compute_record_is_read_in_any_spelling(tmp_path, spelling):
    run = tmp_path / "run"
    shutil.copytree(H200, run)
    record = json.loads((run / "run.json").read_text())
    record["profile"]["dtype"] = "float32"  # the compute record wins over the profile's name
    record["compute"] = {"dtype": spelling, "loss_scaling": False}
    (run / "run.json").write_text(json.dumps(record))
    assert _above_info(diagnose(run)) == {}
    record["compute"]["dtype"] = "bf17"
    (run / "run.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"run\.json: dtype must be a floating dtype name.*'bf17'"):
        diagnose(run)
    record["compute"] = {"dtype": "float16", "loss_scaling": "yes"}
    (run / "run.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="loss_scaling must be true or false, got str"):
        diagnose(run)


# ----------------------------------------------------------------------------- live runs in every
# dtype
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _toy_run(trainer_class, dtype: torch.dtype, steps: int, seed: int = 0) -> PPOTrainer:
    """A real PPOTrainer on the toy world whose frozen base is stored in `dtype` (float32 LoRA
    masters, a loss scaler on an fp16 base), as the gpu profile builds it on a GPU."""
    from toy_world import good_count, toy_causal_lm, toy_tokenizer

    from rlhf_helpers.ppo.shared_model import SharedLoRAModel
    from rlhf_helpers.runtime.lora import LoRASpec
    from rlhf_helpers.runtime.ppo_config import PPOConfig

    torch.manual_seed(0)
    tok = toy_tokenizer()
    lora = LoRASpec(r=4, alpha=8)
    model = SharedLoRAModel(toy_causal_lm(tok, seed=seed).to(dtype), pad_token_id=tok.pad_token_id,
                            eos_token_id=tok.eos_token_id, lora=lora)
    config = PPOConfig(rollout_batch_size=8, mini_batch_size=4, ppo_epochs=2, max_prompt_length=6,
                       max_new_tokens=6, lora=lora, policy_lr=3e-3, progress_bar=False, seed=seed)
    trainer = trainer_class(config, model, tok,
                            ["the movie was", "the film is", "the plot was", "the acting is"],
                            reward_fn=good_count)
    for _ in range(steps):
        trainer.step()
    return trainer


class RefAsOld(PPOTrainer):
    """Notebook 06 (a), broken on purpose: the reference's log-probs used as the old ones."""

    def update(self, batch, generator):
        return super().update(
            dataclasses.replace(batch, old_logprobs=batch.ref_logprobs), generator)


class EosHidden(PPOTrainer):
    """Notebook 06 (b), broken on purpose: pad == EOS's "not padding" mask hides every sampled
    EOS."""

    def update(self, batch, generator):
        responses = batch.sequences[:, batch.context_length:]
        mask = batch.mask * (responses != self.model.eos_token_id).float()
        return super().update(dataclasses.replace(batch, mask=mask), generator)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_live_facts_name_the_compute_dtype_not_the_masters(dtype, one_torch_thread):
    trainer = _toy_run(PPOTrainer, dtype, 1)
    assert {p.dtype for p in trainer.model.policy_parameters()} == {torch.float32}  # the masters
    expected = {"dtype": dtype_name(dtype), "loss_scaling": dtype == torch.float16}
    assert compute_record(trainer) == expected
    facts = diagnose(trainer).facts
    assert (facts.dtype, facts.loss_scaling) == (expected["dtype"], expected["loss_scaling"])


def test_a_trainer_whose_model_does_not_say_its_dtype_is_refused():
    from types import SimpleNamespace

    config = SimpleNamespace(max_new_tokens=8, score_clip=None, value_warmup_steps=0, total_steps=3)
    trainer = SimpleNamespace(history=[], config=config, model=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="has no compute_dtype: pass facts=RunFacts"):
        diagnose(trainer)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_notebook_06_s_bugs_are_errors_in_every_dtype_and_the_fixed_run_has_none(dtype, seed,
                                                                                 one_torch_thread):
    correct = _toy_run(PPOTrainer, dtype, 3, seed)
    assert not {"first_ratio_not_one", "eos_masked"} & set(_above_info(diagnose(correct)))
    assert all(row["eos_in_mask"] == 1.0 for row in correct.history)  # a share of counts: exact
    ref_as_old = next(f for f in diagnose(_toy_run(RefAsOld, dtype, 3, seed)).findings
                      if f.rule == "first_ratio_not_one")
    # step 1: the policy is the reference, so the ratio is 1 even with the bug; it moved by step 2
    assert ref_as_old.severity == "error" and list(ref_as_old.steps) == [2, 3]
    hidden = next(f for f in diagnose(_toy_run(EosHidden, dtype, 2, seed)).findings
                  if f.rule == "eos_masked")
    assert hidden.severity == "error" and hidden.steps


def test_the_h200_ranges_the_thresholds_quote_are_the_fixture_s():
    """thresholds.CHECKED_ON quotes the H200 run's ranges; they are its metrics' (rounded as
    quoted), and each lies on the healthy side of its threshold."""
    from rlhf_helpers.doctor import Thresholds
    from rlhf_helpers.doctor.thresholds import CHECKED_ON

    rows, _ = load_history(H200)

    def span(key, digits):
        values = [r[key] for r in rows]
        return f"{min(values):.{digits}g}-{max(values):.{digits}g}"

    t = Thresholds()
    quoted = {
        "score_spread": f"H200 ({span('score_std', 2)})",
        "clipfrac_high": f"H200 ({span('clipfrac', 2)})",
        "approx_kl_high": f"H200 ({span('approx_kl', 2)})",
        "short_length": f"H200 ({span('response_length', 2)})", "distinct_floor": "H200 (0.99-1.0)"}
    for name, text in quoted.items():
        assert text in CHECKED_ON[name], (name, text, CHECKED_ON[name])
    assert (max(r["clipfrac"] for r in rows) <= t.clipfrac_high
            and max(r["approx_kl"] for r in rows) <= t.approx_kl_high)
    assert min(r["entropy"] for r in rows) / rows[0]["entropy"] >= 0.79 > t.entropy_drop
    assert min(r["eos_fraction"] for r in rows) >= 0.945 > t.eos_floor
    assert min(r["distinct_responses"] for r in rows) >= 0.99 > t.distinct_floor
    assert max(abs(r["first_ratio"] - 1) for r in rows) <= 2.3e-4 < ratio_tolerance("bf16") / 4


def test_every_threshold_says_where_it_was_checked():
    from rlhf_helpers.doctor import Thresholds
    from rlhf_helpers.doctor.thresholds import CHECKED_ON

    assert set(CHECKED_ON) == {f.name for f in dataclasses.fields(Thresholds)}
