"""Reward model: TRL RewardTrainer + LoRA (SEQ_CLS) on the tiny SFT base, its cache, and its reuse in PPO."""

from __future__ import annotations

import json

import pytest
import torch

from rlhf_helpers.ppo import reward_training as rt
from rlhf_helpers.ppo.reward_training import (
    COMPLETE_MARKER,
    RewardTrainingConfig,
    ensure_reward_model,
    is_complete_reward_dir,
    pearson,
    reward_cache_dir,
    reward_metrics,
)
from rlhf_helpers.profiles import get_profile

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A reward adapter trained on 96 pairs for one epoch (enough to test the plumbing, not quality)."""
    from rlhf_helpers.data import load_preferences

    profile = get_profile("tiny")
    config = RewardTrainingConfig.from_profile(profile, max_train_pairs=96, epochs=1.0, batch_size=32)
    out = tmp_path_factory.mktemp("reward")
    eval_pairs = load_preferences("test")[:40]
    metrics = rt.train_reward_model(profile, out, config, eval_pairs=eval_pairs)
    return profile, out, metrics, eval_pairs


def test_training_writes_adapter_and_head_and_reports_metrics(trained):
    _, out, metrics, eval_pairs = trained
    for name in ("adapter_config.json", "adapter_model.safetensors", "score_head.safetensors"):
        assert (out / name).is_file()
    assert metrics["n_pairs"] == len(eval_pairs) and metrics["train_pairs"] == 96
    assert 0.0 <= metrics["pairwise_accuracy"] <= 1.0
    assert -1.0 <= metrics["score_hidden_correlation"] <= 1.0
    assert 0.5 < metrics["annotator_ceiling"] < 1.0


def test_shared_model_reads_the_same_score_as_peft_loading_the_saved_adapter(trained):
    """Independent path: peft's own PeftModel.from_pretrained on a fresh sequence classifier."""
    from peft import PeftModel
    from safetensors.torch import load_file

    from rlhf_helpers.models import load_causal_lm, load_sequence_classifier, load_tokenizer
    from rlhf_helpers.ppo.shared_model import SharedLoRAModel

    profile, out, _, eval_pairs = trained
    tok = load_tokenizer(profile)
    classifier = load_sequence_classifier(profile, num_labels=1)
    reference = PeftModel.from_pretrained(classifier, str(out)).eval()
    head = load_file(str(out / "score_head.safetensors"))
    assert torch.equal(head["weight"], reference.base_model.model.score.modules_to_save["default"].weight)
    texts = [p["prompt"] + p["chosen"] + tok.eos_token for p in eval_pairs[:4]]
    expected = []
    with torch.no_grad():
        for text in texts:  # one at a time: no padding at all on the reference side
            ids = tok(text, return_tensors="pt")["input_ids"]
            expected.append(float(reference(input_ids=ids).logits[0, 0]))
    shared = SharedLoRAModel(load_causal_lm(profile), tok.pad_token_id, tok.eos_token_id,
                             r=profile.lora_r, lora_alpha=profile.lora_alpha, reward_dir=out)
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left")
    got = shared.reward_scores(enc["input_ids"], enc["attention_mask"])  # (4,)
    assert torch.allclose(got, torch.tensor(expected), atol=1e-4)
    assert got.std() > 0
    # and the scores of the evaluation helper agree with both
    scored = rt.score_pairs(reference, tok, [p["prompt"] for p in eval_pairs[:4]],
                            [p["chosen"] for p in eval_pairs[:4]])
    assert torch.allclose(scored, torch.tensor(expected), atol=1e-4)


def test_pearson_matches_the_textbook_formula():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, generator=gen, dtype=torch.float64)
    y = 0.5 * x + torch.randn(50, generator=gen, dtype=torch.float64)
    expected = float(torch.corrcoef(torch.stack([x, y]))[0, 1])
    assert pearson(x.tolist(), y.tolist()) == pytest.approx(expected, abs=1e-12)
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="equally long"):
        pearson([1.0], [1.0])


def test_config_and_inputs_are_validated():
    with pytest.raises(ValueError, match="batch_size"):
        RewardTrainingConfig(batch_size=0)
    with pytest.raises(ValueError, match="learning_rate"):
        RewardTrainingConfig(learning_rate=0.0)
    with pytest.raises(ValueError, match="train_pairs"):
        rt.train_reward_model(get_profile("tiny"), "unused", train_pairs=[])


def fake_trainer(calls: list, fail: bool = False):
    """Stands in for TRL training: writes the files train_reward_model writes, optionally dies midway."""

    def train(profile, output_dir, config=None, **kwargs):
        calls.append(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "adapter_config.json").write_text("{}")
        (output_dir / "adapter_model.safetensors").write_bytes(b"weights")
        if fail:
            raise KeyboardInterrupt("interrupted (simulated)")
        (output_dir / "score_head.safetensors").write_bytes(b"head")
        return {"pairwise_accuracy": 0.8, "train_seconds": 1.0}

    return train


def test_ensure_reward_model_is_atomic_and_cached(tmp_path, monkeypatch):
    profile = get_profile("tiny")
    calls: list = []
    monkeypatch.setattr(rt, "train_reward_model", fake_trainer(calls, fail=True))
    with pytest.raises(KeyboardInterrupt):
        ensure_reward_model(profile, root=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing half-written stays behind
    # a leftover folder without the completion marker (e.g. from an older, non-atomic writer)
    final = reward_cache_dir(profile, root=tmp_path)
    assert final == tmp_path / "reward-tiny"
    final.mkdir()
    (final / "adapter_model.safetensors").write_bytes(b"half")
    assert not is_complete_reward_dir(final)
    monkeypatch.setattr(rt, "train_reward_model", fake_trainer(calls))
    assert ensure_reward_model(profile, root=tmp_path) == final
    assert is_complete_reward_dir(final) and (final / "score_head.safetensors").read_bytes() == b"head"
    assert reward_metrics(final)["pairwise_accuracy"] == 0.8
    marker = json.loads((final / COMPLETE_MARKER).read_text())
    assert marker["config"]["epochs"] == profile.reward_epochs
    # cached: a second call trains nothing
    n = len(calls)
    assert ensure_reward_model(profile, root=tmp_path) == final and len(calls) == n
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reward-tiny"]


def test_a_changed_config_gets_its_own_cache_folder(tmp_path):
    profile = get_profile("tiny")
    default = reward_cache_dir(profile, root=tmp_path)
    quick = reward_cache_dir(profile, RewardTrainingConfig.from_profile(profile, max_train_pairs=64),
                             root=tmp_path)
    overridden = reward_cache_dir(profile.replace(reward_epochs=0.5), root=tmp_path)
    assert default.name == "reward-tiny"
    assert quick.name.startswith("reward-tiny-") and overridden.name.startswith("reward-tiny-")
    assert len({default, quick, overridden}) == 3
