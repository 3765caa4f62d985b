"""The run doctor's registry (`doctor.registry`, `doctor.rules`): every rule is registered where it
is written, with its documentation and only metrics the glossary documents; a correct toy run gets
no finding but the untrained critic; a trainer and its run.json give the same facts."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import toy_trainer

from rlhf_helpers.doctor import RULES, RunFacts, Thresholds, compute_record, diagnose
from rlhf_helpers.doctor.registry import registered, rule
from rlhf_helpers.doctor.report import format_findings
from rlhf_helpers.doctor.rules import RULE_MODULES, documented
from rlhf_helpers.ppo.metric_docs import METRICS


def test_every_rule_has_its_docs_and_reads_only_metrics_the_glossary_documents():
    assert len({known.name for known in RULES}) == len(RULES) >= 16
    modules = {f"rlhf_helpers.doctor.{name}" for name in RULE_MODULES}
    for known in RULES:
        assert known.check.__module__ in modules, known.name  # registered where it is written
        when = known.fires(Thresholds())
        assert isinstance(when, str) and len(when) > 20, known.name
        assert known.doc() == f"{known.severity}: {when}"
        assert known.teaches.startswith(("docs/", "notebooks/", "rlhf_helpers/")), known.teaches
        assert [m for m in known.reads if m not in METRICS] == [], known.name
    # the documentation follows the thresholds it is given
    assert "7 steps" in registered("off_policy").doc(Thresholds(sustain_steps=7))
    assert [known.severity for known in documented()] == sorted(
        (known.severity for known in RULES), key=("error", "warning", "info").index)


def test_a_rule_is_refused_a_second_name_or_an_unknown_severity():
    with pytest.raises(ValueError, match="'off_policy' is registered twice"):
        rule("off_policy", "warning", fires=lambda t: "", teaches="docs/metrics.md")
    with pytest.raises(ValueError, match="severity must be one of"):
        rule("new_rule", "fatal", fires=lambda t: "", teaches="docs/metrics.md")
    with pytest.raises(KeyError, match="no run doctor rule is registered as 'new_rule'"):
        registered("new_rule")


#: as long as the critic's grace: after it the toy world's critic (a random 2-layer model, 8
#: prompts) still explains about nothing, and critic_not_learning names that, rightly
TOY_STEPS = Thresholds().critic_grace_steps


@pytest.mark.parametrize("seed, dtype", [(0, torch.float32), (1, torch.float32),
                                         (2, torch.float32), (0, torch.bfloat16)])
def test_a_correct_toy_run_yields_at_most_untrained_critic(seed, dtype, one_torch_thread):
    """A rule that fires on the project's own correct run is wrong (or its threshold is): the
    issue's first version of a new rule did, and no test saw it."""
    trainer = toy_trainer(init_seed=seed, seed=seed, dtype=dtype)
    for _ in range(TOY_STEPS):
        trainer.step()
    found = diagnose(trainer)
    assert {f.rule for f in found.findings} <= {"untrained_critic"}, format_findings(found)


def test_a_trainer_and_its_run_json_give_the_same_facts_and_findings(tmp_path, one_torch_thread):
    """One way to build a run's facts (`facts.run_facts`): the live trainer's and the ones its
    run.json records are equal, and so are the findings."""
    trainer = toy_trainer(value_warmup_steps=1, score_clip=5.0, total_steps=4)
    for _ in range(3):
        trainer.step()
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in trainer.history))
    (tmp_path / "run.json").write_text(json.dumps(
        {"profile": {"dtype": "float32"}, "ppo_config": trainer.config.to_dict(),
         "compute": compute_record(trainer)}))
    live, files = diagnose(trainer), diagnose(tmp_path)
    assert live.facts == files.facts == RunFacts(max_new_tokens=8, score_clip=5.0,
                                                 value_warmup_steps=1, total_steps=4)
    assert live.findings == files.findings
