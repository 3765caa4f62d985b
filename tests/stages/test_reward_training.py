"""Reward model: TRL RewardTrainer + LoRA (SEQ_CLS) on the tiny SFT base, its cache, and its reuse
in PPO."""

from __future__ import annotations

import json

import pytest
import torch

from rlhf_helpers.runtime.artifacts import COMPLETE_MARKER, shown_path
from rlhf_helpers.runtime.lora import LoRASpec
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.stages import reward as rt
from rlhf_helpers.stages import reward_training
from rlhf_helpers.stages.reward import ensure_reward_model, reward_cache_dir, reward_metrics
from rlhf_helpers.stages.reward_training import RewardTrainingConfig, pearson

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A reward adapter trained on 96 pairs for one epoch (enough to test the plumbing, not
    quality)."""
    from rlhf_helpers.runtime.data import load_preferences

    profile = get_profile("tiny")
    config = RewardTrainingConfig.from_profile(profile, max_train_pairs=96,
                                               epochs=1.0, batch_size=32)
    out = tmp_path_factory.mktemp("reward")
    eval_pairs = load_preferences("test")[:40]
    metrics = rt.train_reward_model(profile, out, config, eval_pairs=eval_pairs)
    return profile, out, metrics, eval_pairs


def test_training_writes_adapter_and_head_and_reports_metrics(trained):
    _, out, metrics, eval_pairs = trained
    for name in ("adapter_config.json", "adapter_model.safetensors", "score_head.safetensors"):
        assert (out / name).is_file()
    assert (metrics["n_pairs"] == len(eval_pairs)
            and metrics["train_pairs"] == 96 == metrics["pairs_seen"])
    assert 0.0 <= metrics["pairwise_accuracy"] <= 1.0
    assert -1.0 <= metrics["score_hidden_correlation"] <= 1.0
    assert 0.5 < metrics["annotator_ceiling"] < 1.0


def test_a_fraction_of_an_epoch_reports_the_pairs_it_saw(tmp_path):
    """epochs=0.1 of 96 pairs in batches of 8 is ceil(0.1 * 12) = 2 steps: 16 pairs, not 96 (the
    report said 96 before, the size of the data set, not what the trainer read)."""
    from rlhf_helpers.runtime.data import load_preferences

    profile = get_profile("tiny")
    config = RewardTrainingConfig.from_profile(profile, max_train_pairs=96,
                                               epochs=0.1, batch_size=8)
    metrics = rt.train_reward_model(profile, tmp_path, config,
                                    eval_pairs=load_preferences("test")[:8])
    assert metrics["train_pairs"] == 16 == metrics["pairs_seen"]


@pytest.mark.parametrize(("n", "batch", "steps", "expected"), [
    (96, 8, 2, 16), (10, 4, 3, 10), (10, 4, 4, 14), (10, 4, 6, 20), (10, 4, 0, 0), (3, 8, 5, 15)])
def test_pairs_seen_counts_the_short_last_batch_of_each_epoch(n, batch, steps, expected):
    # a loop reference: batches of `batch`, the last of each epoch holding what is left
    seen, step = 0, 0
    while step < steps:
        for start in range(0, n, batch):
            if step == steps:
                break
            seen += min(batch, n - start)
            step += 1
    assert reward_training.pairs_seen(n, batch, steps) == seen == expected


def test_shared_model_reads_the_same_score_as_peft_loading_the_saved_adapter(trained):
    """Independent path: peft's own PeftModel.from_pretrained on a fresh sequence classifier."""
    from peft import PeftModel
    from safetensors.torch import load_file

    from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
    from rlhf_helpers.runtime.models import load_causal_lm, load_sequence_classifier, load_tokenizer

    profile, out, _, eval_pairs = trained
    tok = load_tokenizer(profile)
    classifier = load_sequence_classifier(profile, num_labels=1)
    reference = PeftModel.from_pretrained(classifier, str(out)).eval()
    head = load_file(str(out / "score_head.safetensors"))
    assert torch.equal(head["weight"],
                       reference.base_model.model.score.modules_to_save["default"].weight)
    texts = [p["prompt"] + p["chosen"] + tok.eos_token for p in eval_pairs[:4]]
    expected = []
    with torch.no_grad():
        for text in texts:  # one at a time: no padding at all on the reference side
            ids = tok(text, return_tensors="pt")["input_ids"]
            expected.append(float(reference(input_ids=ids).logits[0, 0]))
    shared = SharedLoRAModel(load_causal_lm(profile), tok.pad_token_id, tok.eos_token_id,
                             reward_dir=out, lora=LoRASpec(r=profile.lora.r,
                                                           alpha=profile.lora.alpha))
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left")
    got = shared.reward_scores(enc["input_ids"], enc["attention_mask"])  # (4,)
    assert torch.allclose(got, torch.tensor(expected), atol=1e-4)
    assert got.std() > 0
    # and the scores of the evaluation helper agree with both
    scored = reward_training.score_pairs(reference, tok, [p["prompt"] for p in eval_pairs[:4]],
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
    """Stands in for TRL training: writes the files train_reward_model writes, optionally dies
    midway."""

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
    assert rt.reward_dir_problem(final) is not None
    monkeypatch.setattr(rt, "train_reward_model", fake_trainer(calls))
    assert ensure_reward_model(profile, root=tmp_path) == final
    assert (rt.reward_dir_problem(final)
            is None) and (final / "score_head.safetensors").read_bytes() == b"head"
    assert reward_metrics(final)["pairwise_accuracy"] == 0.8
    marker = json.loads((final / COMPLETE_MARKER).read_text())
    assert marker["key"]["config"]["epochs"] == profile.reward_epochs
    # cached: a second call trains nothing
    n = len(calls)
    assert ensure_reward_model(profile, root=tmp_path) == final and len(calls) == n
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reward-tiny"]


def test_a_changed_config_gets_its_own_cache_folder(tmp_path):
    profile = get_profile("tiny")
    default = reward_cache_dir(profile, root=tmp_path)
    quick = reward_cache_dir(profile,
                             RewardTrainingConfig.from_profile(profile, max_train_pairs=64),
                             root=tmp_path)
    overridden = reward_cache_dir(profile.replace(reward_epochs=0.5), root=tmp_path)
    assert default.name == "reward-tiny"
    assert quick.name.startswith("reward-tiny-") and overridden.name.startswith("reward-tiny-")
    assert len({default, quick, overridden}) == 3


# ---- a damaged cache is detected by checksum and trained again into place ---------------------

def cached_fake(tmp_path, monkeypatch):
    """A cached reward folder written by ensure_reward_model with the fake trainer; returns it and
    the list of training calls."""
    profile = get_profile("tiny")
    calls: list = []
    monkeypatch.setattr(rt, "train_reward_model", fake_trainer(calls))
    final = ensure_reward_model(profile, root=tmp_path)
    assert len(calls) == 1 and (rt.reward_dir_problem(final) is None)
    return profile, final, calls


DAMAGES = {
    "truncated adapter": lambda d: (d / "adapter_model.safetensors").write_bytes(b"weig"),
    "garbage score head": lambda d: (d / "score_head.safetensors").write_bytes(b"\x00garbage\xff"),
    "non-JSON adapter config": lambda d: (d / "adapter_config.json").write_text("{not json"),
    "deleted adapter": lambda d: (d / "adapter_model.safetensors").unlink(),
    "marker without checksums": lambda d: (d / COMPLETE_MARKER).write_text('{"metrics": {}}'),
    "non-JSON marker": lambda d: (d / COMPLETE_MARKER).write_text("{"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_cached_folder_is_trained_again_and_says_so(
        tmp_path, monkeypatch, capsys, damage):
    profile, final, calls = cached_fake(tmp_path, monkeypatch)
    capsys.readouterr()
    DAMAGES[damage](final)
    assert rt.reward_dir_problem(final) is not None  # the marker alone is not trusted
    assert ensure_reward_model(profile, root=tmp_path) == final
    assert len(calls) == 2  # trained again, into the same folder
    err = capsys.readouterr().err
    assert (err.count("\n") == 1 and f"reward cache {shown_path(final)} is damaged" in err
            and "training it again" in err)
    assert (rt.reward_dir_problem(final)
            is None) and (final / "score_head.safetensors").read_bytes() == b"head"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reward-tiny"]  # no temporary folder left
    assert ensure_reward_model(profile, root=tmp_path) == final and len(calls) == 2  # cached again


def test_the_marker_holds_the_sha256_of_every_cached_file(tmp_path, monkeypatch):
    import hashlib

    _, final, _ = cached_fake(tmp_path, monkeypatch)
    marker = json.loads((final / COMPLETE_MARKER).read_text())
    expected = {name: hashlib.sha256((final / name).read_bytes()).hexdigest()
                for name in ("adapter_config.json", "adapter_model.safetensors",
                             "score_head.safetensors")}
    assert marker["files"] == expected


def dead_pid() -> int:
    """The id of a process that has exited (a child that ran and was reaped)."""
    import subprocess
    import sys

    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    return int(child.stdout)


@pytest.mark.skipif(__import__("os").name == "nt", reason="process liveness check is POSIX-only")
def test_temporary_folders_of_killed_runs_are_removed_but_live_ones_kept(tmp_path,
                                                                         monkeypatch, capsys):
    import os

    profile = get_profile("tiny")
    dead, live = dead_pid(), os.getppid()  # the parent of this test process is alive
    stale = tmp_path / f".tmp-reward-tiny-{dead}"
    other_profile_stale = tmp_path / f".tmp-reward-gpu-1a2b3c4d-{dead}"
    running = tmp_path / f".tmp-reward-tiny-{live}"  # another run still training: not ours to touch
    checkpoint_tmp = tmp_path / f".tmp-step-000001-{dead}"  # not a reward folder: not ours either
    for folder in (stale, other_profile_stale, running, checkpoint_tmp):
        folder.mkdir()
        (folder / "adapter_model.safetensors").write_bytes(b"half")
    calls: list = []
    monkeypatch.setattr(rt, "train_reward_model", fake_trainer(calls))
    final = ensure_reward_model(profile, root=tmp_path)
    assert not stale.exists() and not other_profile_stale.exists()
    assert running.is_dir() and checkpoint_tmp.is_dir()
    assert (rt.reward_dir_problem(final) is None) and len(calls) == 1
    assert ("removed 2 temporary reward folder(s) of runs that no longer exist"
            in capsys.readouterr().err)


# ---- the cache key covers the data's content --------------------------------

def copy_data_dir(tmp_path):
    """A copy of the shipped data directory that a test may edit."""
    import shutil

    from rlhf_helpers.runtime.data import data_dir

    target = tmp_path / "data"
    shutil.copytree(data_dir(), target)  # the tiny model too (models/tiny-sft, 2.6 MB)
    return target


@pytest.mark.parametrize("edited", ["preferences_train.jsonl", "preferences_test.jsonl"])
def test_an_edited_preference_file_trains_the_reward_model_again(
        tmp_path, monkeypatch, capsys, edited):
    data = copy_data_dir(tmp_path)
    monkeypatch.setenv("RLHF_DATA_DIR", str(data))
    runs = tmp_path / "runs"
    profile, final, calls = cached_fake(runs, monkeypatch)
    # unchanged data: cached
    assert ensure_reward_model(profile, root=runs) == final and len(calls) == 1
    with (data / edited).open("a") as handle:  # one more pair
        handle.write(json.dumps(
            {"prompt": "The film", "chosen": " was good.", "rejected": " was bad."}) + "\n")
    capsys.readouterr()
    assert ensure_reward_model(profile, root=runs) == final
    assert len(calls) == 2
    assert "is out of date (it was trained on other data" in capsys.readouterr().err
    marker = json.loads((final / COMPLETE_MARKER).read_text())
    import hashlib

    assert marker["key"]["data"][edited] == hashlib.sha256((data / edited).read_bytes()).hexdigest()


def test_another_data_directory_with_other_content_is_not_served_the_old_model(
        tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    profile, final, calls = cached_fake(runs, monkeypatch)  # trained on the shipped data
    same = copy_data_dir(tmp_path / "same")  # copied while data_dir() is still the shipped one
    other = copy_data_dir(tmp_path)
    lines = (other / "preferences_train.jsonl").read_text().splitlines()
    (other / "preferences_train.jsonl").write_text("\n".join(lines[:100]) + "\n")  # a smaller set
    monkeypatch.setenv("RLHF_DATA_DIR", str(other))
    ensure_reward_model(profile, root=runs)
    assert len(calls) == 2
    monkeypatch.setenv("RLHF_DATA_DIR", str(same))  # the shipped content elsewhere
    moved = get_profile("tiny")  # its SFT model now lives under the copied data directory too
    assert moved.sft_model_path != profile.sft_model_path
    calls_before = len(calls)
    ensure_reward_model(moved, root=runs)
    # back to the shipped preferences: the other folder's model was replaced
    assert len(calls) == calls_before + 1
    ensure_reward_model(profile, root=runs)  # the original paths, the same contents: cached
    assert len(calls) == calls_before + 1  # the content, not the path, is the key


def test_a_fine_tuned_again_sft_model_trains_the_reward_model_again(tmp_path, monkeypatch, capsys):
    """A gpu-profile SFT folder is identified by its COMPLETE.json (settings, data checksums,
    sizes)."""
    import shutil

    from rlhf_helpers.runtime.data import data_dir

    sft = tmp_path / "sft"
    shutil.copytree(data_dir() / "models" / "tiny-sft", sft)
    (sft
     / COMPLETE_MARKER).write_text(json.dumps({"key": {"data": {"sft.jsonl": "aaa"}}, "files": {}}))
    runs = tmp_path / "runs"
    calls: list = []
    monkeypatch.setattr(rt, "train_reward_model", fake_trainer(calls))
    profile = get_profile("tiny").replace(sft_model_path=str(sft))
    final = ensure_reward_model(profile, root=runs)
    ensure_reward_model(profile, root=runs)
    assert len(calls) == 1
    (sft
     / COMPLETE_MARKER).write_text(json.dumps({"key": {"data": {"sft.jsonl": "bbb"}}, "files": {}}))
    capsys.readouterr()
    assert ensure_reward_model(profile, root=runs) == final and len(calls) == 2
    assert "on another SFT model" in capsys.readouterr().err


def test_the_sft_cache_key_covers_the_corpus(tmp_path, monkeypatch):
    from rlhf_helpers.stages.sft import sft_cache_key

    profile = get_profile("gpu", weights="random", device="cpu")
    key = sft_cache_key(profile)
    data = copy_data_dir(tmp_path)
    monkeypatch.setenv("RLHF_DATA_DIR", str(data))
    assert sft_cache_key(profile) == key  # same content
    with (data / "sft.jsonl").open("a") as handle:
        handle.write(json.dumps({"prompt": "The film", "completion": " was fine."}) + "\n")
    assert sft_cache_key(profile)["data"] != key["data"]


@pytest.mark.parametrize("overrides, message", [
    ({"batch_size": True}, "batch_size must be an int, got bool True"),
    ({"batch_size": "4"}, "batch_size must be an int, got str '4'"),
    ({"batch_size": 4.5}, "batch_size must be an int, got float 4.5"),
    ({"max_length": None}, "max_length must be an int, got NoneType None"),
    ({"epochs": True}, "epochs must be a number, got bool True"),
    ({"epochs": float("inf")}, "epochs must be a finite number > 0, got inf"),
    ({"learning_rate": "0.1"}, "learning_rate must be a number, got str '0.1'"),
    ({"seed": "0"}, "seed must be an int, got str '0'"),
])
def test_reward_training_settings_of_the_wrong_type_are_refused_by_name(overrides, message):
    """Before: a bool or 4.5 was accepted (True as batch size 1), a string was a TypeError naming
    nothing."""
    import re

    from rlhf_helpers.runtime.profiles import get_profile
    from rlhf_helpers.stages.reward_training import RewardTrainingConfig

    with pytest.raises(ValueError, match=re.escape(message)):
        RewardTrainingConfig.from_profile(get_profile("tiny"), **overrides)
