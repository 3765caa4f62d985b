"""The run doctor's `nothing_trains` rule: a warm-up as long as the run, a policy gradient of
exactly 0 at every policy step, or (no gradient norm logged) rollouts that never leave the reference
are an error; healthy runs (the tests' healthy histories, toy runs with one or several minibatches,
the H200 run) get no such finding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_diagnosis import healthy

from rlhf_helpers.core.losses import policy_loss, value_loss
from rlhf_helpers.doctor import RunFacts, diagnose
from rlhf_helpers.stages.diagnose import main

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-runs" / "h200-2026-11-27-cli"
FACTS = RunFacts(max_new_tokens=40, dtype="float32", total_steps=30)


def finding(history, facts=FACTS):
    """The nothing_trains finding of `history`, or None."""
    return next(
        (f for f in diagnose(history, facts=facts).findings if f.rule == "nothing_trains"), None)


def with_grad_norms(norms):
    rows = healthy(len(norms))
    for row, norm in zip(rows, norms, strict=True):
        row["policy_grad_norm"] = norm
    return rows


def test_a_policy_gradient_of_zero_at_every_policy_step_is_an_error():
    found = finding(with_grad_norms([0.0] * 30))
    assert found is not None and found.severity == "error" and found.steps == tuple(range(1, 31))
    assert "policy_grad_norm exactly 0 at all 30 policy steps" in found.evidence


@pytest.mark.parametrize(
    "norms, facts",
    [
        ([0.1] * 30, FACTS),  # healthy: the tiny profile logs 0.07-0.14, the H200 run 0.39-0.40
        ([0.0] * 29 + [0.05], FACTS),  # one update that moved the policy
        # a warm-up logs 0 for the policy
        ([0.0] * 4 + [0.1] * 26, RunFacts(value_warmup_steps=4, total_steps=30)),
        ([None] * 30, FACTS),  # not logged: nothing to read (the kl rows say the policy moved)
    ],
)
def test_gradients_that_moved_the_policy_or_a_warm_up_give_no_finding(norms, facts):
    assert finding(with_grad_norms(norms), facts) is None


def test_a_warm_up_as_long_as_the_run_is_an_error_and_one_still_running_is_not():
    rows = with_grad_norms([0.0] * 5)  # a warm-up step logs policy_grad_norm 0
    found = finding(rows, RunFacts(value_warmup_steps=8, total_steps=5))
    assert (found is not None and found.title == "the policy was never trained"
            and found.steps == (1, 2, 3, 4, 5))
    assert "value_warmup_steps 8 >= the 5 steps run (total_steps 5)" in found.evidence
    # total unknown: judged by the steps run
    assert finding(rows, RunFacts(value_warmup_steps=5)) is not None
    # a run stopped (or diagnosed live) during a warm-up shorter than the run: its policy steps are
    # still to come
    assert finding(rows, RunFacts(value_warmup_steps=8, total_steps=60)) is None


def test_a_warm_up_longer_than_the_run_is_read_from_run_json(tmp_path, capsys):
    rows = with_grad_norms([0.0] * 3)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "run.json").write_text(
        json.dumps({"ppo_config": {"value_warmup_steps": 4, "total_steps": 3},
                    "profile": {"dtype": "float32"}})
    )
    assert main([str(tmp_path)]) == 0
    assert ("[error] nothing_trains: the policy was never trained (steps 1-3)"
            in capsys.readouterr().out)


def test_rollouts_that_never_leave_the_reference_are_an_error_without_a_gradient_norm():
    """An update loop of one's own logs no policy_grad_norm: a policy that never moved samples
    rollouts whose KL to the reference is rounding (measured on the toy world: 0 to 1.2e-7) and
    whose updates' approx_kl is ~1e-14."""
    rows = healthy(10)
    for row in rows:
        row.update(kl=1.2e-7, approx_kl=5e-15, clipfrac=0.0)
    found = finding(rows)
    assert found is not None and found.title == "the policy never moved from the reference"
    assert found.steps == tuple(range(2, 11))  # the rollouts after the first policy update
    rows[5]["kl"] = 0.01  # one rollout from a moved policy
    assert finding(rows) is None


@pytest.mark.parametrize(
    "dtype, kl, moved",
    [
        ("float32", 1e-3, False),  # 1e-4 per token x 17-23 tokens: within rounding
        ("float32", 0.05, True),
        ("bfloat16", 1e-2, False),  # bf16's 9.8e-4 per token x 17-23 tokens
        # the toy world's KL at step 2 (the tiny profile's: 0.22, the H200 run's: 0.27)
        ("bfloat16", 0.19, True),
    ],
)
def test_the_reference_s_rounding_follows_the_dtype(dtype, kl, moved):
    rows = healthy(10)
    for row in rows:
        row.update(kl=kl, approx_kl=0.0)
    assert (finding(rows, RunFacts(dtype=dtype)) is None) == moved


def test_an_update_s_approx_kl_shows_a_policy_that_moved_within_the_update():
    rows = healthy(10)
    for row in rows:
        # the updates moved the policy (the H200 run logged 0.0014-0.0073)
        row.update(kl=0.0, approx_kl=0.004)
    assert finding(rows) is None


def test_the_h200_run_trains():
    assert finding(H200, facts=None) is None
    assert diagnose(H200).facts.total_steps == 20


@pytest.mark.parametrize("settings", [{}, {"ppo_epochs": 1, "mini_batch_size": 8}],
                         ids=["2x2 updates", "1 update"])
def test_healthy_toy_runs_train_and_a_loss_times_zero_does_not(make_trainer,
                                                               one_torch_thread, settings):
    """One update per step logs approx_kl ~1e-14 (it is measured before the step): only the
    rollouts' KL and the gradient norm tell whether the policy moved."""
    healthy_run = make_trainer(**settings)
    zero = make_trainer(**settings, policy_loss_fn=lambda *inputs: policy_loss(*inputs)[0] * 0.0)
    for _ in range(3):
        healthy_run.step()
        zero.step()
    assert finding(healthy_run, facts=None) is None
    found = finding(zero, facts=None)
    assert found is not None and found.steps == (1, 2, 3)
    assert found.title == "the policy's gradient is 0 at every update"


# ----------------------------------------------------------------------------- a critic that never
# trains
def _loss(out):
    return out[0] if isinstance(out, tuple) else out


def critic_finding(history, facts=FACTS):
    return next((f for f in diagnose(history, facts=facts).findings
                 if f.rule == "critic_never_trains"), None)


def test_a_value_gradient_of_zero_at_every_step_is_an_error_and_one_moving_step_is_not():
    rows = healthy(10)
    for row in rows:
        row["value_grad_norm"] = 0.0
    found = critic_finding(rows)
    assert found is not None and found.severity == "error" and found.steps == tuple(range(1, 11))
    assert "value_grad_norm exactly 0 at all 10 steps" in found.evidence
    rows[6]["value_grad_norm"] = 1e-30
    assert critic_finding(rows) is None
    assert critic_finding(healthy(10)) is None  # not logged: no verdict


def test_healthy_runs_train_their_critic():
    assert critic_finding(H200, facts=None) is None


def test_a_toy_run_whose_value_loss_is_times_zero_never_trains_its_critic(make_trainer,
                                                                          one_torch_thread):
    healthy_run = make_trainer()
    constant = make_trainer(value_loss_fn=lambda *inputs: _loss(value_loss(*inputs)) * 0.0)
    for _ in range(2):
        healthy_run.step()
        constant.step()
    assert critic_finding(healthy_run, facts=None) is None
    found = critic_finding(constant, facts=None)
    assert found is not None and found.steps == (1, 2) and found.severity == "error"
