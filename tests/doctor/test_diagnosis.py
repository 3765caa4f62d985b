"""The run doctor (`doctor`): each rule fires on a history built to show its signature and
stays silent on a healthy one; the loaders read this course's run folders and TRL's; the CLI prints
and exits as documented.

The healthy history follows docs/metrics.md's healthy ranges of the tiny profile (the glossary's
numbers, with step-to-step noise of the size it states); each broken history changes only what its
rule reads, so a rule that fires on another rule's signature shows up here as an extra finding.
"""

from __future__ import annotations

import json
import math
import os
import random

import pytest

from rlhf_helpers.doctor import RunFacts, Thresholds, diagnose, format_findings, load_history
from rlhf_helpers.doctor.findings import spans
from rlhf_helpers.stages import diagnose as diagnose_cli

FACTS = RunFacts(max_new_tokens=40, score_clip=5.0, value_warmup_steps=0, dtype="float32")


def healthy(steps: int = 30, seed: int = 0) -> list[dict[str, float]]:
    """A healthy tiny-profile run as the glossary describes it (score 0.25 -> ~3, kl 0 -> ~2.3 nats,
    entropy 1.7 -> 1.6, length 17 -> 23, explained variance 0.2 -> 0.5 (a warmed-up critic),
    clipfrac ~0.04, approx-KL ~0.008, the hidden score -0.5 -> ~0.9 with +-0.2 noise between
    steps)."""
    rng = random.Random(seed)
    rows = []
    for i in range(steps):
        grow = 1 - math.exp(-i / 4)  # 0 at step 1, most of the way by step 10
        rows.append({
            "step": float(i + 1), "score": 0.25 + 2.7 * grow + rng.uniform(-0.1, 0.1),
            "score_std": 1.2 + rng.uniform(-0.3, 0.3),
            "distinct_responses": rng.choice([1.0, 1.0, 0.984]), "score_clipped": 0.0,
            "kl": 2.3 * grow + rng.uniform(-0.05, 0.05) * grow,
            "entropy": 1.7 - 0.1 * grow + rng.uniform(-0.03, 0.03),
            "response_length": 17 + 6 * grow, "eos_fraction": rng.uniform(0.97, 1.0),
            "explained_variance": 0.2 + 0.3 * grow + rng.uniform(-0.05, 0.1),
            "clipfrac": rng.uniform(0.016, 0.064), "approx_kl": rng.uniform(0.003, 0.03),
            "first_ratio": 1.0 + rng.uniform(-1e-6, 1e-6), "eos_in_mask": 1.0, "policy_loss": -0.01,
            "value_loss": 0.05, "hidden_score": -0.5 + 1.4 * grow + rng.uniform(-0.2, 0.2),
        })
    # an evaluation every 10 steps: healthy 0.87-1.01 hidden, 2.8-3.05 learned
    for row in rows[9::10]:
        row.update(eval_score=rng.uniform(2.8, 3.05), eval_hidden_score=rng.uniform(0.87, 1.01))
    return rows


def rules(history, facts=FACTS, **thresholds) -> dict[str, str]:
    """rule -> severity of what `diagnose` finds."""
    return {f.rule: f.severity
            for f in diagnose(history, facts=facts, thresholds=Thresholds(**thresholds)).findings}


def broken(change, steps=30):
    """The healthy history with `change(row, index)` applied to every row."""
    rows = healthy(steps)
    for index, row in enumerate(rows):
        change(row, index)
    return rows


@pytest.mark.parametrize("seed", range(5))
def test_a_healthy_run_has_no_finding(seed):
    assert rules(healthy(seed=seed)) == {}


def test_a_run_without_warm_up_whose_first_critic_explains_nothing_is_only_info():
    rows = healthy()
    for ev in (-0.02, 0.03, 0.099):  # an untrained critic measured within 0.03 of 0
        rows[0]["explained_variance"] = ev
        assert rules(rows) == {"untrained_critic": "info"}
    rows[0]["explained_variance"] = 0.15  # after a 4-step warm-up: 0.15-0.3
    assert rules(rows) == {}
    rows[0]["explained_variance"] = -0.02
    assert rules(rows, facts=RunFacts(value_warmup_steps=1)) == {}  # step 1 was a critic-only step


# every rule: the signature that makes it fire, with the severity it has
SIGNATURES = {
    "non_finite": ("error", lambda r, i: r.update(policy_loss=math.nan) if i == 12 else None),
    "no_learning_signal": ("error", lambda r, i: r.update(score_std=0.0, score=0.0)),
    "first_ratio_not_one": ("error", lambda r, i: r.update(first_ratio=1.6 if i else 1.0)),
    "eos_masked": ("error", lambda r, i: r.update(eos_in_mask=0.0)),
    "nothing_trains": ("error", lambda r, i: r.update(policy_grad_norm=0.0)),
    "negative_kl": ("warning", lambda r, i: r.update(kl=-0.05 - 0.01 * i)),
    "off_policy": ("warning", lambda r, i: r.update(clipfrac=0.3)),
    "critic_not_learning": ("warning", lambda r, i: r.update(explained_variance=-0.1)),
    "collapse": ("warning", lambda r, i: r.update(entropy=1.7 * 0.9 ** i)),
    "length_collapse": ("warning", lambda r, i: r.update(response_length=max(1.0, 17 - 3 * i))),
    "length_runaway": ("warning", lambda r,
                       i: r.update(response_length=39.5, eos_fraction=0.2) if i > 5 else None),
    "reward_saturated": ("warning", lambda r, i: r.update(score_clipped=0.8) if i > 10 else None),
    "over_optimisation": ("warning",
                          lambda r, i: r.update(hidden_score=1.0 - 0.15 * max(0, i - 10),
                                                score=2 + 0.05 * i)),
}


@pytest.mark.parametrize("rule", SIGNATURES)
def test_each_rule_fires_on_its_signature_and_only_it(rule):
    severity, change = SIGNATURES[rule]
    found = rules(broken(change))
    found.pop("untrained_critic", None)  # a broken critic is also cold at step 1 (info)
    if rule == "critic_not_learning":
        assert found == {rule: severity}
    else:
        assert found == {rule: severity}, format_findings(diagnose(broken(change), facts=FACTS))


def test_each_rule_has_its_fields_filled():
    for rule, (_, change) in SIGNATURES.items():
        finding = next(f for f in diagnose(broken(change), facts=FACTS).findings if f.rule == rule)
        assert finding.steps and finding.evidence and finding.meaning and finding.check_first
        assert finding.learn_more.startswith(("docs/", "notebooks/")), finding.learn_more
        json.dumps(finding.to_json())  # diagnosis.json can hold it


# the limits of each rule: just inside the healthy side stays silent
def test_thresholds_sit_where_they_say():
    one_step = broken(lambda r, i: r.update(clipfrac=0.3) if i == 7 else None)
    assert "off_policy" not in rules(one_step)  # one noisy step is not sustained
    # at the limit: healthy side
    assert "off_policy" not in rules(broken(lambda r, i: r.update(clipfrac=0.2)))
    four = broken(lambda r, i: r.update(kl=-0.01) if 10 <= i < 14 else None)
    assert "negative_kl" not in rules(four)  # 4 in a row: 1/16 by chance, not enough
    five = broken(lambda r, i: r.update(kl=-0.01) if 10 <= i < 15 else None)
    assert rules(five) == {"negative_kl": "warning"}
    ratio = broken(lambda r, i: r.update(first_ratio=1.0 + 9e-5))
    assert rules(ratio) == {}  # within float32's 1e-4
    assert rules(ratio, facts=RunFacts(dtype="bfloat16")) == {}
    # inside bf16's eps / 8 = 9.8e-4
    bf16_noise = broken(lambda r, i: r.update(first_ratio=1.0 + 9e-4))
    assert "first_ratio_not_one" in rules(bf16_noise)
    assert rules(bf16_noise, facts=RunFacts(dtype="bfloat16")) == {}
    # fp16: eps / 8 = 1.2e-4
    assert "first_ratio_not_one" in rules(bf16_noise, facts=RunFacts(dtype="float16"))
    # the smallest reference-as-old deviation measured
    moved = broken(lambda r, i: r.update(first_ratio=1.0034))
    assert all("first_ratio_not_one" in rules(moved, facts=RunFacts(dtype=d))
               for d in ("float32", "bf16", "fp16"))


def test_the_length_runaway_needs_max_new_tokens():
    rows = broken(SIGNATURES["length_runaway"][1])
    assert "length_runaway" not in rules(rows, facts=RunFacts())


def test_the_length_collapse_cause_is_one_that_depends_on_length():
    """The finding blames the per-token KL, not a negative score. The shaped returns say why: with
    gamma = 1 a score shifted by -3 lowers every response's return by exactly 3, whatever its
    length, while a KL of 0.5 nats per token costs beta * 0.5 per token, more the longer the
    response."""
    import torch

    from rlhf_helpers.core.kl import shape_rewards

    lengths = torch.tensor([1, 4, 10])
    mask = (torch.arange(10)[None, :] < lengths[:, None]).float()  # (3, 10)
    ref = torch.full((3, 10), -2.0)  # (3, 10)
    beta = 0.2

    def returns(scores, kl_per_token):
        rewards, _ = shape_rewards(scores, ref + kl_per_token, ref, mask, beta)  # (3, 10): k1 = kl
        return rewards.sum(dim=1)  # (3,): the return from the first token, gamma = 1

    base = returns(torch.ones(3), 0.0)
    shifted = returns(torch.ones(3) - 3.0, 0.0)
    torch.testing.assert_close(shifted - base, torch.full((3,), -3.0))  # the same for every length
    moved = returns(torch.ones(3), 0.5)
    torch.testing.assert_close(moved - base, -beta * 0.5 * lengths.float())  # grows with the length
    rows = broken(SIGNATURES["length_collapse"][1])
    finding = next(f for f in diagnose(rows, facts=FACTS).findings if f.rule == "length_collapse")
    assert "KL penalty is paid per token" in finding.meaning
    assert "A negative score alone is no reason" in finding.meaning
    assert "kl_coef x kl" in finding.check_first


def test_over_optimisation_on_the_evaluations_alone():
    rows = healthy(40)
    evaluations = [(3.15, 0.02), (3.3, -0.8), (3.5, -2.42), (3.65, -2.84)]
    for row, (learned, hidden) in zip(rows[9::10], evaluations, strict=True):
        # the glossary's kl_coef 0 evaluations
        row.update(eval_score=learned, eval_hidden_score=hidden)
    found = diagnose(rows, facts=FACTS).findings
    assert [f.rule for f in found] == ["over_optimisation"]
    assert found[0].steps == (20, 30, 40)
    assert "eval_hidden_score 0.02 at step 10 -> -2.84 at step 40" in found[0].evidence


def test_a_learned_score_that_falls_with_the_hidden_one_is_not_over_optimisation():
    rows = broken(lambda r, i: r.update(hidden_score=1.0 - 0.15 * max(0, i - 10),
                                        score=3 - 0.1 * max(0, i - 10)))
    assert "over_optimisation" not in rules(rows)


def test_findings_come_sorted_by_severity():
    rows = broken(lambda r, i: r.update(clipfrac=0.3, first_ratio=1.5, explained_variance=-0.1))
    severities = [f.severity for f in diagnose(rows, facts=FACTS).findings]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)
    assert severities[0] == "error"


def test_steps_print_as_spans():
    assert spans([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10"
    assert spans([]) == "-"


def test_a_run_folder_is_read_with_its_settings(tmp_path):
    rows = broken(SIGNATURES["length_runaway"][1])
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path
     / "run.json").write_text(json.dumps({"ppo_config": {"max_new_tokens": 40, "score_clip": None,
                                                         "value_warmup_steps": 0},
                                          "profile": {"dtype": "float32"}}))
    history, facts = load_history(tmp_path)
    assert len(history) == 30 and facts.max_new_tokens == 40
    assert "length_runaway" in {f.rule for f in diagnose(tmp_path).findings}


def test_a_trl_folder_is_read_through_the_name_map(tmp_path):
    """GRPOTrainer's log_history: every group's rewards equal (frac_reward_zero_std 1) is no signal
    at all."""
    log = [{"step": s, "reward": 0.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0, "kl": 0.0,
            "entropy": 1.5, "completions/mean_length": 20.0, "completions/clipped_ratio": 0.0,
            "clip_ratio/region_mean": 0.0,
            "loss": 0.0} for s in range(1, 6)] + [{"train_runtime": 12.0, "step": 5}]
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-5" / "trainer_state.json").write_text(json.dumps({"log_history": log}))
    history, facts = load_history(tmp_path)
    assert facts.source == "trl" and len(history) == 5 and history[0]["eos_fraction"] == 1.0
    assert rules(tmp_path, facts=None) == {"no_learning_signal": "error"}


@pytest.mark.parametrize("bad, message", [
    ("nothing", "holds no metrics.jsonl"),
    ("missing.jsonl", "no such file"),
    ("not-json", "line 2: not valid JSON"),
    ("a-list", "line 1: expected a JSON object"),
])
def test_unreadable_sources_are_refused_by_name(tmp_path, bad, message):
    path = tmp_path / "run"
    path.mkdir()
    if bad == "missing.jsonl":
        path = path / "missing.jsonl"
    elif bad == "not-json":
        (path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2,\n')
    elif bad == "a-list":
        (path / "metrics.jsonl").write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=message):
        diagnose(path)
    with pytest.raises(ValueError, match="source must be"):
        diagnose(42)


def test_the_cli_prints_the_findings_and_exits_0_or_2(tmp_path, capsys):
    rows = broken(SIGNATURES["first_ratio_not_one"][1])
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert diagnose_cli.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[error] first_ratio_not_one" in out and "steps 2-30" in out
    assert diagnose_cli.main([str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"][0]["rule"] == "first_ratio_not_one"
    assert diagnose_cli.main([str(tmp_path / "nowhere")]) == 2
    assert "error: source must be a run folder" in capsys.readouterr().err
    diagnosis = diagnose(tmp_path)
    written = diagnose_cli.write_diagnosis(diagnosis, tmp_path)
    assert json.loads(written.read_text()) == diagnosis.to_json()
    assert not list(tmp_path.glob(".*partial"))
    assert diagnose_cli.tracker_values(diagnosis)["doctor/first_ratio_not_one"] == 29.0
    assert diagnose_cli.tracker_values(diagnosis)["doctor/errors"] == 1.0


def test_eos_kept_share_counts_the_first_eos_under_the_mask():
    """Two prompts' columns, then responses; EOS = 2, pad = 0. The right mask keeps each first EOS,
    a "not padding" mask with pad == EOS drops them, a response cut at the limit has no EOS to
    keep."""
    from types import SimpleNamespace

    import torch

    from rlhf_helpers.ppo.experience import eos_kept_share

    sequences = torch.tensor([[5, 6, 7, 2, 0, 0],
                              [5, 6, 8, 9, 2, 2],
                              [5, 6, 7, 8, 9, 9]])  # (B, P + R), P = 2
    ended = torch.tensor([True, True, False])
    right = torch.tensor([[1, 1, 0, 0],
                          [1, 1, 1, 0],
                          [1, 1, 1, 1]]).float()  # (B, R): up to the first EOS
    batch = SimpleNamespace(sequences=sequences, context_length=2, ended_with_eos=ended, mask=right)
    assert eos_kept_share(batch, eos_token_id=2) == 1.0
    naive = right * (sequences[:, 2:] != 2).float()  # "not padding" when pad == EOS
    assert eos_kept_share(SimpleNamespace(**{**vars(batch), "mask": naive}), eos_token_id=2) == 0.0
    half = right.clone()
    half[1, 2] = 0.0  # only the second response's EOS hidden
    assert eos_kept_share(SimpleNamespace(**{**vars(batch), "mask": half}), eos_token_id=2) == 0.5
    none = SimpleNamespace(**{**vars(batch), "ended_with_eos": torch.tensor([False, False, False])})
    assert eos_kept_share(none, eos_token_id=2) == 1.0


# ----------------------------------------------------------------------------- end to end on a toy
# PPO run
def _toy_trainer(trainer_class, steps: int, **config):
    """A real PPOTrainer (toy model, toy tokenizer, a word-count reward) after `steps` steps."""
    import torch
    from toy_world import good_count, toy_causal_lm, toy_tokenizer

    from rlhf_helpers.ppo.shared_model import SharedLoRAModel
    from rlhf_helpers.runtime.lora import LoRASpec
    from rlhf_helpers.runtime.ppo_config import PPOConfig

    torch.manual_seed(0)
    tok = toy_tokenizer()
    model = SharedLoRAModel(toy_causal_lm(tok, seed=0), pad_token_id=tok.pad_token_id,
                            eos_token_id=tok.eos_token_id, lora=LoRASpec(r=4, alpha=8))
    settings = dict(rollout_batch_size=8, mini_batch_size=4, ppo_epochs=2, max_prompt_length=6,
                    max_new_tokens=6,
                    lora=LoRASpec(r=4, alpha=8), policy_lr=3e-3, progress_bar=False)
    trainer = trainer_class(PPOConfig(**{**settings, **config}), model, tok,
                            ["the movie was", "the film is", "the plot was", "the acting is"],
                            reward_fn=good_count)
    for _ in range(steps):
        trainer.step()
    return trainer


def test_a_correct_toy_run_logs_ratio_one_and_every_eos_in_the_mask(one_torch_thread):
    from rlhf_helpers.ppo.trainer import PPOTrainer

    trainer = _toy_trainer(PPOTrainer, 3)
    # float32 rounding only
    assert all(abs(row["first_ratio"] - 1.0) < 1e-4 for row in trainer.history)
    assert all(row["eos_in_mask"] == 1.0 for row in trainer.history)
    assert not {f.rule for f in diagnose(trainer).findings} & {"first_ratio_not_one", "eos_masked"}


# the reference as old log-probs and the hidden EOS on toy runs, in float32, bf16 and fp16:
# test_doctor_precision.py


def test_a_real_trl_grpo_log_with_a_constant_reward_is_named(tmp_path, one_torch_thread):
    """TRL's own GRPOTrainer log (trainer_state.json), not a hand-written one: a reward that is
    always 0.0 (a parser that never matches) trains nothing, and the doctor says so; a reward that
    varies gets no finding."""
    pytest.importorskip("trl")
    import warnings

    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rlhf_helpers.runtime.models import load_causal_lm, load_tokenizer
    from rlhf_helpers.runtime.profiles import get_profile

    profile = get_profile("tiny")
    prompts = Dataset.from_dict(
        {"prompt": ["the movie was", "the film is", "the plot was", "the acting is"] * 4})
    found = {}
    for name, reward in (("constant", lambda prompts, completions, **_: [0.0] * len(completions)),
                         ("words", lambda prompts, completions,
                          **_: [float(len(c.split())) for c in completions])):
        torch.manual_seed(0)
        out = tmp_path / name
        args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=8, num_generations=4,
                          max_completion_length=8, max_steps=3, logging_steps=1, save_strategy="no",
                          report_to="none", use_cpu=True, learning_rate=1e-3, disable_tqdm=True,
                          gradient_checkpointing=False, beta=0.1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TRL's notes on defaults
            trainer = GRPOTrainer(model=load_causal_lm(profile), reward_funcs=reward, args=args,
                                  processing_class=load_tokenizer(profile), train_dataset=prompts)
            trainer.train()
        trainer.save_state()
        found[name] = {f.rule: (f.severity, f.steps) for f in diagnose(out).findings}
    assert found["constant"] == {"no_learning_signal": ("error", (1, 2, 3))}
    assert "no_learning_signal" not in found["words"]


@pytest.mark.parametrize("name, text, message", [
    ("run.json", '{"ppo_config": 5, "profile": {}}', "not a run record"),
    ("run.json", '{"ppo_config": {}, "profile": "tiny"}', "not a run record"),
    ("run.json", '{"ppo_config": {"max_new_tokens": "40"}, "profile": {}}',
     "max_new_tokens must be an int >= 1, got str '40'"),
    ("run.json", '{"ppo_config": {"value_warmup_steps": "x"}, "profile": {}}',
     "value_warmup_steps must be an int >= 0, got str 'x'"),
    ("run.json", '{"ppo_config": {"score_clip": "5"}, "profile": {}}',
     "score_clip must be a number >= 0, got str"),
    ("run.json", '{"ppo_config": {}, "profile": {"dtype": 16}}',
     "dtype must be a dtype name, got int 16"),
    ("run.json", b'{"ppo_config": {\xff}}', "not UTF-8 JSON"),
    ("metrics.jsonl", '{"step": 1, "kl": "0.5"}\n', "row 1: kl must be a number, got str '0.5'"),
    ("metrics.jsonl", '{"step": 1, "entropy": [1.5]}\n',
     "row 1: entropy must be a number, got list"),
    ("metrics.jsonl", '{"step": 1, "clipfrac": true}\n',
     "row 1: clipfrac must be a number, got bool True"),
])
def test_a_run_folder_with_values_of_the_wrong_type_is_one_line(
        tmp_path, capsys, name, text, message):
    """Before: tracebacks (AttributeError, TypeError), or the value silently read as 'not
    logged'."""
    from rlhf_helpers.stages.diagnose import main

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "kl": 0.5}\n')
    (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and str(tmp_path) in err, err


@pytest.mark.parametrize(
    "make", [lambda path: path.mkdir(), lambda path: path.symlink_to(path.parent / "gone"),
             lambda path: os.mkfifo(path)], ids=["folder", "broken link", "pipe"])
def test_a_run_json_that_is_not_a_file_is_named_not_read_as_no_settings(tmp_path, capsys, make):
    """Before: the doctor skipped it and diagnosed without the run's settings, exit 0."""
    from rlhf_helpers.stages.diagnose import main

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "kl": 0.5}\n')
    make(tmp_path / "run.json")
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert (len(err.splitlines()) == 1
            and f"{tmp_path / 'run.json'} is not a readable file" in err), err


@pytest.mark.parametrize("log, message", [
    ("5", "not a TRL trainer_state.json (expected an object with a log_history list, got int"),
    ("null",
     "not a TRL trainer_state.json (expected an object with a log_history list, got NoneType"),
    ("[]", "holds no logged step"),
    ('[{"step": 1, "reward": "0.5"}]', "row 1: score must be a number, got str '0.5'"),
])
def test_a_trl_state_with_a_log_of_the_wrong_shape_is_one_line(tmp_path, capsys, log, message):
    from rlhf_helpers.stages.diagnose import main

    (tmp_path / "trainer_state.json").write_text('{"log_history": ' + log + "}")
    assert main([str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
