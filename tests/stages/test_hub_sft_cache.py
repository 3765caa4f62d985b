"""The gpu profile's SFT model, prepared once and cached (`stages.sft.ensure_sft_model`), exercised
with random-init mode on a shrunken SmolLM2-style architecture (no hub, CPU, two SFT steps)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from command_lines import refused_line
from safetensors import safe_open
from transformers import LlamaForCausalLM

import rlhf_helpers.runtime.data
from rlhf_helpers.runtime.architectures import SMOLLM2_135M_CONFIG, architecture_of
from rlhf_helpers.runtime.artifacts import COMPLETE_MARKER
from rlhf_helpers.runtime.models import load_causal_lm, load_tokenizer
from rlhf_helpers.runtime.profiles import get_profile, gpu_profile
from rlhf_helpers.stages import sft
from rlhf_helpers.stages.reward import reward_cache_dir
from rlhf_helpers.stages.sft import ensure_sft_model, random_init_tokenizer_dir, sft_cache_key

#: SmolLM2's layout (Llama, grouped-query attention, tied embeddings), shrunk to run in a second
SMALL_ARCHITECTURE = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                      "max_position_embeddings": 128, "tie_word_embeddings": True}
STEPS = 2

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def small_corpus(monkeypatch):
    """64 SFT records instead of 8000: TRL tokenises the whole data set even for two steps."""
    records = rlhf_helpers.runtime.data.load_sft_corpus()[:64]
    monkeypatch.setattr(sft, "load_sft_corpus", lambda: list(records))  # the name sft.py calls


@pytest.fixture
def trainings(monkeypatch):
    """Counts the calls of `sft_with_trl` (each one is a training run)."""
    calls = []
    original = sft.sft_with_trl

    def counted(*args, **kwargs):
        calls.append(args[4])  # output_dir
        return original(*args, **kwargs)

    monkeypatch.setattr(sft, "sft_with_trl", counted)
    return calls


def random_init_profile(tmp_path: Path, **changes):
    values = dict(device="cpu", dtype="float32", weights="random", sft_batch_size=4,
                  sft_model_path=str(tmp_path / "runs" / "sft-random-init"))
    values.update(changes)
    return get_profile("gpu", **values)


def ensure(profile, **kwargs) -> Path:
    return ensure_sft_model(profile, architecture=SMALL_ARCHITECTURE, max_steps=STEPS, **kwargs)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".tmp-"))


def test_trains_once_then_reuses_the_cache(tmp_path, small_corpus, trainings, capsys):
    profile = random_init_profile(tmp_path)
    path = ensure(profile)
    assert path == Path(profile.sft_model_path) and len(trainings) == 1
    assert "fine-tuning" in capsys.readouterr().out
    marker = json.loads((path / COMPLETE_MARKER).read_text())
    assert marker["key"]["weights"] == {"source": "random", "file": None}
    assert marker["key"]["base_model"] == profile.base_model
    assert marker["key"]["architecture"] == SMALL_ARCHITECTURE
    assert (marker["key"]["sft"]["lr"] == profile.sft_lr
            and marker["key"]["sft"]["max_steps"] == STEPS)
    # float32 master weights on disk; the later stages load them in their own dtype
    with safe_open(str(path / "model.safetensors"), "pt") as weights:
        assert {weights.get_tensor(k).dtype for k in weights.keys()} == {torch.float32}
    model, tokenizer = load_causal_lm(profile), load_tokenizer(profile)
    assert isinstance(model, LlamaForCausalLM) and model.config.num_hidden_layers == 2
    shipped = load_tokenizer(get_profile("tiny"))
    assert tokenizer.get_vocab() == shipped.get_vocab()  # the shipped word-level tokenizer
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert (model.config.pad_token_id, model.config.eos_token_id) == (tokenizer.pad_token_id,
                                                                      tokenizer.eos_token_id)
    weights_file = path / "model.safetensors"
    mtime = weights_file.stat().st_mtime_ns

    assert ensure(profile) == path
    assert len(trainings) == 1 and weights_file.stat().st_mtime_ns == mtime  # reused, not trained
    assert "reusing" in capsys.readouterr().out
    assert leftovers(path.parent) == []


def test_trains_again_when_the_marker_does_not_match(tmp_path, small_corpus, trainings, capsys):
    profile = random_init_profile(tmp_path)
    path = ensure(profile)
    assert len(trainings) == 1
    ensure(profile.replace(sft_lr=profile.sft_lr * 2))  # other SFT settings
    assert len(trainings) == 2 and "other settings" in capsys.readouterr().out
    # `python -m rlhf_helpers.stages.sft`
    ensure(profile.replace(sft_lr=profile.sft_lr * 2), force=True)
    assert len(trainings) == 3
    (path / "model.safetensors").write_bytes(b"truncated")  # a damaged folder is not reused
    ensure(profile)
    assert len(trainings) == 4 and "checksum" in capsys.readouterr().out
    marker = json.loads((path / COMPLETE_MARKER).read_text())
    assert (marker["key"]
            == json.loads(json.dumps(sft_cache_key(profile, SMALL_ARCHITECTURE, STEPS))))
    assert leftovers(path.parent) == []


def test_a_failed_training_leaves_no_half_written_folder(tmp_path, small_corpus, monkeypatch):
    profile = random_init_profile(tmp_path)
    final = Path(profile.sft_model_path)

    def crash(model, tokenizer, records, profile, output_dir, **kwargs):
        Path(output_dir).mkdir(parents=True)
        (Path(output_dir) / "config.json").write_text("{}")  # half a model folder
        raise RuntimeError("killed mid-training")

    with monkeypatch.context() as patch:
        patch.setattr(sft, "sft_with_trl", crash)
        with pytest.raises(RuntimeError, match="mid-training"):
            ensure(profile)
    assert not final.exists() and leftovers(final.parent) == []

    ensure(profile)  # a good folder, then a retraining with other settings that fails
    before = {p.name: p.read_bytes() for p in final.iterdir()}
    with monkeypatch.context() as patch:
        patch.setattr(sft, "sft_with_trl", crash)
        with pytest.raises(RuntimeError):
            ensure(profile.replace(sft_lr=1e-3))
    # the old folder is untouched
    assert {p.name: p.read_bytes() for p in final.iterdir()} == before
    assert leftovers(final.parent) == []


def test_folders_of_dead_runs_are_removed(tmp_path, small_corpus, trainings):
    profile = random_init_profile(tmp_path)
    final = Path(profile.sft_model_path)
    final.parent.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = final.parent / f".tmp-{final.name}-{int(dead.stdout)}"
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    # another cache's folder is not this one's to remove
    unrelated = final.parent / ".tmp-reward-gpu-1"
    unrelated.mkdir()
    ensure(profile)
    assert not stale.exists() and unrelated.exists()


def test_tiny_profile_is_a_no_op(trainings, capsys):
    tiny = get_profile("tiny")
    assert ensure_sft_model(tiny) == Path(tiny.sft_model_path)
    assert trainings == [] and capsys.readouterr().out == ""


def test_random_init_settings(monkeypatch, tmp_path, capsys):
    real = gpu_profile().sft_model_path
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"weights": "random"}')
    profile = get_profile("gpu")
    assert profile.weights == "random" and profile.sft_model_path == real + "-random-init"
    # the real reward cache stays clean
    assert reward_cache_dir(profile).name == "reward-gpu-random-init"
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"weights": "gguf"}')
    assert get_profile("gpu").sft_model_path == real + "-gguf"
    assert reward_cache_dir(get_profile("gpu")).name == "reward-gpu-gguf"
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"weights": "hub"}')
    assert get_profile("gpu").sft_model_path == real
    assert reward_cache_dir(get_profile("gpu")).name == "reward-gpu"
    monkeypatch.delenv("RLHF_PROFILE_OVERRIDES")
    with pytest.raises(ValueError, match="weights must be 'shipped' in the tiny profile"):
        get_profile("tiny", weights="random")
    # an old script's setting
    with pytest.raises(ValueError, match="random_init was replaced by weights"):
        get_profile("gpu", random_init=True)
    # random weights where the real model belongs
    with pytest.raises(ValueError, match="sft_model_path"):
        ensure_sft_model(gpu_profile().replace(weights="random", device="cpu"))
    with pytest.raises(ValueError, match="architecture"):  # hub weights come with their own
        ensure_sft_model(get_profile("gpu", weights="hub", sft_model_path=str(tmp_path / "sft")),
                         architecture=SMALL_ARCHITECTURE)
    assert capsys.readouterr().out == ""  # refused before it starts
    assert architecture_of("HuggingFaceTB/SmolLM2-135M") == SMOLLM2_135M_CONFIG
    with pytest.raises(ValueError, match="base_model"):
        architecture_of("gpt5")
    assert (random_init_tokenizer_dir() / "tokenizer.json").is_file()


def test_missing_sft_folder_names_ensure_sft_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="ensure_sft_model"):
        load_causal_lm(get_profile("gpu", sft_model_path=str(tmp_path / "none")))


def _nothing_may_start(*args, **kwargs):
    raise AssertionError("the SFT command must stop before any model is built")


def test_the_sft_command_shows_its_help_without_training(monkeypatch, capsys):
    """Before: the command had no argument parser, so `--help` started a gpu-profile SFT run."""
    monkeypatch.setattr(sft, "prepare_sft_model", _nothing_may_start)
    monkeypatch.setattr(sys, "argv", ["sft", "--help"])
    with pytest.raises(SystemExit) as done:
        sft.main()
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {sft.PROG}")


def test_the_sft_command_refuses_a_machine_without_its_gpu_in_one_line(monkeypatch, capsys):
    """Before: a forced SFT run on a CPU-only machine ended in torch's AssertionError traceback
    ('Torch not compiled with CUDA enabled'); now the reward command's refusal, exit 2."""
    import rlhf_helpers.runtime.preflight as preflight

    monkeypatch.setattr(sft, "prepare_sft_model", _nothing_may_start)
    monkeypatch.setattr(preflight.torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RLHF_PROFILE_OVERRIDES", raising=False)
    monkeypatch.setattr(sys, "argv", ["sft"])
    err = refused_line(lambda: sft.main(), capsys)
    assert err.startswith(f"{sft.PROG}: error: the gpu profile's device 'cuda': torch sees no "
                          "CUDA GPU on this machine")
    # a bad override is one line too
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"sft_lr": "fast"}')
    err = refused_line(lambda: sft.main([]), capsys)
    assert "$RLHF_PROFILE_OVERRIDES" in err
