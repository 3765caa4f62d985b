"""docs/metrics.md is what the glossary generates, and the glossary covers exactly what the trainer
logs."""

from __future__ import annotations

import pytest
import torch
from tool_scripts import load_tool
from toy_world import good_count, toy_causal_lm, toy_tokenizer

from rlhf_helpers.ppo import metric_docs as glossary
from rlhf_helpers.ppo.metrics import GLOSSARY, describe
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.lora import LoRASpec
from rlhf_helpers.runtime.ppo_config import PPOConfig

PROMPTS = ["the movie was", "the film is", "the plot was", "the acting is"]


def test_the_checkouts_generated_docs_are_what_the_code_writes(capsys):
    assert load_tool("write_docs").main(["--check"]) == 0, capsys.readouterr().err


def test_check_flag_catches_a_stale_page(tmp_path, capsys):
    write_docs = load_tool("write_docs")
    (tmp_path / "cluster.md").write_text((write_docs.DOCS / "cluster.md").read_text())
    assert write_docs.main(["--check", "--docs", str(tmp_path)]) == 1  # metrics.md missing
    assert write_docs.main(["--docs", str(tmp_path)]) == 0
    assert write_docs.main(["--check", "--docs", str(tmp_path)]) == 0
    assert (tmp_path / "metrics.md").read_text() == load_tool("write_docs").metrics_markdown()
    page = tmp_path / "metrics.md"
    page.write_text(page.read_text() + "edited by hand\n")
    assert write_docs.main(["--check", "--docs", str(tmp_path)]) == 1
    assert "metrics.md is out of date" in capsys.readouterr().err


def test_every_logged_key_has_an_entry_and_every_entry_is_logged():
    torch.set_num_threads(1)
    tok = toy_tokenizer()
    model = SharedLoRAModel(toy_causal_lm(tok, seed=0), pad_token_id=tok.pad_token_id,
                            eos_token_id=tok.eos_token_id, lora=LoRASpec(r=4, alpha=8))
    # every optional metric switched on: ptx loss, the score clip's share and an evaluation at the
    # step
    config = PPOConfig(rollout_batch_size=4, mini_batch_size=2, ppo_epochs=1, max_prompt_length=6,
                       max_new_tokens=4, lora=LoRASpec(r=4, alpha=8), ptx_coef=0.1, eval_every=1,
                       score_clip=5.0, n_eval_prompts=4, progress_bar=False)
    trainer = PPOTrainer(config, model, tok, PROMPTS, reward_fn=good_count,
                         hidden_score_fn=good_count, ptx_texts=["the movie was good ."])
    history = trainer.train(steps=1, eval_prompts=PROMPTS)
    logged = set(history[0])
    per_minibatch = {key for row in trainer.last_update_stats for key in row}
    assert logged - set(GLOSSARY) == set(), "logged metrics without a glossary entry"
    assert per_minibatch - set(GLOSSARY) == set(), "per-minibatch stats without a glossary entry"
    assert set(GLOSSARY) - logged - per_minibatch == set(), "glossary entries nothing logs"
    # the one-line meanings are the glossary's, in metrics.GLOSSARY and in the generated docs
    doc = load_tool("write_docs").metrics_markdown()
    for name, (group, entry) in glossary.METRICS.items():
        assert describe(name) == entry.meaning
        assert group in glossary.GROUPS
        assert f"\n### {name}\n" in doc and entry.formula in doc


def test_every_training_signal_says_what_healthy_and_bad_look_like():
    bookkeeping = {"epoch", "minibatch", "step", "time_update", "time_step"}
    for name, (_group, entry) in glossary.METRICS.items():
        assert entry.meaning and entry.formula, name
        if name not in bookkeeping:
            assert entry.healthy and entry.bad, f"{name} lacks a healthy range or a failure mode"


def test_describe_rejects_an_unknown_name():
    with pytest.raises(ValueError, match="name must be a metric of the glossary"):
        describe("reward")
