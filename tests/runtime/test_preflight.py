"""Settings a machine or a model cannot take, and bad inputs of the reward command, end in one line
and exit 2 before any model is built (`runtime.preflight`, `stages.reward.check_can_train`,
`ppo.run_folder.check_run_fits`).

Each case here was, before, a traceback after (or during) a reward-model training, or a run that
silently did something else: a "cuda" profile trained on the CPU, 10**6 evaluation prompts evaluated
200, a rollout batch of 10**9 died in a MemoryError, `--out ''` trained and then failed to rename
the current folder.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from rlhf_helpers.runtime import preflight
from rlhf_helpers.runtime.data import data_dir, load_prompts
from rlhf_helpers.runtime.lora import LoRASpec
from rlhf_helpers.runtime.profiles import get_profile

TINY_MODEL = data_dir() / "models" / "tiny-sft"
TINY_CONFIG = json.loads((TINY_MODEL / "config.json").read_text())


def test_a_cuda_device_without_a_gpu_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "torch sees no CUDA GPU on this machine" in preflight.device_problem("cuda")
    assert "torch sees no CUDA GPU" in preflight.device_problem("cuda:7")
    assert preflight.device_problem("cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert preflight.device_problem("cuda") is None and preflight.device_problem("cuda:1") is None
    assert (preflight.device_problem("cuda:2")
            == "device 'cuda:2': this machine has 2 CUDA GPU(s), numbered 0 to 1")


def test_model_limits_are_read_from_the_models_config():
    positions, hidden = TINY_CONFIG["n_positions"], TINY_CONFIG["n_embd"]
    spec = LoRASpec(r=hidden)
    # the edges fit
    assert preflight.model_limits_problem(TINY_MODEL, positions, spec, positions - 1, 1) is None
    assert f"exceed the model's {positions} positions" in preflight.model_limits_problem(
        TINY_MODEL, positions, spec, positions - 1, 2)
    assert (f"max_length {positions + 1} exceeds"
            in preflight.model_limits_problem(TINY_MODEL, positions + 1, spec))
    assert (f"lora.r {hidden + 1} exceeds the model's hidden size {hidden}"
            in preflight.model_limits_problem(
        TINY_MODEL, positions, LoRASpec(r=hidden + 1)))
    assert ("lora.target_modules: nope is not a module of this gpt2 model"
            in preflight.model_limits_problem(
        TINY_MODEL, positions, LoRASpec(target_modules=("c_attn", "nope"))))


def test_a_batch_whose_logits_exceed_the_memory_is_refused_at_the_exact_bound(monkeypatch):
    """The bound: rows x new tokens x vocabulary x 2 bytes (the narrowest logit) against the
    device's memory."""
    vocab, tokens = TINY_CONFIG["vocab_size"], 8
    memory = 1000 * tokens * vocab * preflight.LOGIT_BYTES  # exactly 1000 rows' logits
    monkeypatch.setattr(preflight, "machine_memory_bytes", lambda device: memory)
    assert preflight.batch_memory_problem(TINY_MODEL, 1000, tokens, "cpu") is None
    problem = preflight.batch_memory_problem(TINY_MODEL, 1001, tokens, "cpu")
    assert problem.startswith(
        f"a batch of 1001 prompts x {tokens} new tokens x {vocab} vocabulary entries needs")
    monkeypatch.undo()  # the real one reads the machine's RAM
    assert (preflight.machine_memory_bytes("cpu")
            == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


# ------------------------------------------------------------------ the reward command

def data_copy(tmp_path, monkeypatch, model: bool = True):
    """The shipped data files as $RLHF_DATA_DIR in tmp_path (the tiny model linked, or copied to be
    damaged)."""
    folder = tmp_path / "data"
    folder.mkdir()
    for path in data_dir().glob("*.jsonl"):
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "models" / "tiny-sft").mkdir(parents=True)
    for path in TINY_MODEL.iterdir():
        target = folder / "models" / "tiny-sft" / path.name
        if model:
            os.symlink(path, target)
        else:
            target.write_bytes(path.read_bytes())
    monkeypatch.setenv("RLHF_DATA_DIR", str(folder))
    return folder


def replace_with(path, text):
    path.unlink()
    path.write_text(text)


def to_folder(path):
    path.unlink()
    path.mkdir()


DATA_DAMAGE = {
    "empty": (lambda d: replace_with(d / "preferences_train.jsonl", ""),
              "preferences_train.jsonl: the file has no"),
    "not JSON": (lambda d: replace_with(d / "preferences_test.jsonl", '{"prompt": "a"\n'),
                 "preferences_test.jsonl, line 1: not valid JSON"),
    "a folder": (lambda d: to_folder(d / "preferences_train.jsonl"),
                 "preferences_train.jsonl is a folder"),
    "missing": (lambda d: (d / "preferences_test.jsonl").unlink(), "data file not found"),
    "repeated key": (lambda d: replace_with(d / "preferences_train.jsonl",
                                            '{"prompt": "a", "chosen": " b", '
                                            '"rejected": " c", "prompt": "d"}\n'),
                     "the key 'prompt' appears twice"),
    "config not JSON": (lambda d: replace_with(d / "models/tiny-sft/config.json", "{"),
                        "config.json does not load"),
    "weights gone": (lambda d: (d / "models/tiny-sft/model.safetensors").unlink(),
                     "holds no weights"),
}


@pytest.fixture
def reward_cli(tmp_path, monkeypatch):
    """The reward command with training replaced by a failure: a check that comes too late shows as
    that."""
    from rlhf_helpers.stages import reward

    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("RLHF_PROFILE_OVERRIDES", raising=False)
    monkeypatch.setattr(reward, "train_reward_model", lambda *a,
                        **k: pytest.fail("the reward model trained"))

    def refused(argv, capsys):
        with pytest.raises(SystemExit) as stopped:
            reward.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert (stopped.value.code == 2
                and err[-1].startswith("python -m rlhf_helpers.stages.reward: error: ")), err
        # argparse's usage, then the one line
        assert not any("Traceback" in line for line in err), err
        return err[-1]

    return refused


@pytest.mark.parametrize("damage", DATA_DAMAGE)
def test_the_reward_command_names_a_bad_data_file_or_model_folder(tmp_path, monkeypatch, capsys,
                                                                    reward_cli, damage):
    change, message = DATA_DAMAGE[damage]
    folder = data_copy(tmp_path, monkeypatch, model=False)
    change(folder)
    line = reward_cli(["--out", str(tmp_path / "reward")], capsys)
    assert message in line, line
    assert not (tmp_path / "reward").exists()


@pytest.mark.parametrize("data", ["missing", "a file"])
def test_the_reward_command_names_a_data_folder_that_is_not_one(tmp_path, monkeypatch, capsys,
                                                                reward_cli, data):
    where = tmp_path / "nowhere"
    if data == "a file":
        where.write_text("x")
    monkeypatch.setenv("RLHF_DATA_DIR", str(where))
    line = reward_cli(["--out", str(tmp_path / "reward")], capsys)
    assert str(where) in line and ("not found" in line or "not a folder" in line), line


@pytest.mark.parametrize("overrides, message", [
    ({"lora": {"target_modules": ["nope"]}},
     "lora.target_modules: nope is not a module of this gpt2 model"),
    # trained and exited 0 before
    ({"lora": {"target_modules": ["c_attn", "nope"]}}, "nope is not a module"),
    ({"lora": {"r": 2**40}},
     f"lora.r {2**40} exceeds the model's hidden size {TINY_CONFIG['n_embd']}"),
    ({"max_length": TINY_CONFIG["n_positions"] + 1},
     f"exceeds the model's {TINY_CONFIG['n_positions']} positions"),
    ({"device": "cuda"}, "the tiny profile's device 'cuda': torch sees no CUDA GPU"),
    ({"device": "cuda:7"}, "the tiny profile's device 'cuda:7': torch sees no CUDA GPU"),
    ({"seed": -1}, "seed must be an int in [0, 4294967295], got -1"),
])
def test_the_reward_command_refuses_settings_the_model_or_machine_cannot_take(monkeypatch, tmp_path,
                                                                             capsys, reward_cli,
                                                                              overrides, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", json.dumps(overrides))
    line = reward_cli(["--out", str(tmp_path / "reward")], capsys)
    assert message in line, line


def test_the_reward_command_refuses_an_empty_out_or_one_under_a_file(tmp_path, capsys, reward_cli):
    assert reward_cli(["--out", ""], capsys).endswith("--out must name a folder, got an empty path")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    line = reward_cli(["--out", str(a_file / "sub")], capsys)
    assert f"--out {a_file / 'sub'} lies under {a_file}, which is a file" in line
    assert a_file.read_text() == "mine"


def test_the_reward_command_keeps_a_persons_files_in_a_reward_folder(tmp_path, capsys, reward_cli):
    """Before: a reward folder with notes added was replaced whole (its COMPLETE.json was all the
    check asked for)."""
    from rlhf_helpers.runtime.artifacts import COMPLETE_MARKER

    out = tmp_path / "reward"
    out.mkdir()
    (out / "adapter.safetensors").write_bytes(b"weights")
    (out / COMPLETE_MARKER).write_text(json.dumps({"files": {"adapter.safetensors": "0" * 64}}))
    (out / "notes.txt").write_text("mine")
    line = reward_cli(["--out", str(out)], capsys)
    assert f"--out {out} holds notes.txt, which the reward command did not write" in line, line
    assert (out / "notes.txt").read_text() == "mine"


def test_the_reward_config_refuses_a_seed_numpy_cannot_take():
    from rlhf_helpers.stages.reward_training import RewardTrainingConfig

    profile = get_profile("tiny")
    for seed in (-1, 2**32):
        with pytest.raises(ValueError,
                           match=rf"seed must be an int in \[0, 4294967295\], got {seed}"):
            RewardTrainingConfig.from_profile(profile, seed=seed)
    assert RewardTrainingConfig.from_profile(profile, seed=2**32 - 1).seed == 2**32 - 1


# ------------------------------------------------------------------ the training command

@pytest.fixture
def train_cli(tmp_path, monkeypatch):
    from rlhf_helpers.stages import train_ppo

    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES",
                       json.dumps({"rollout_batch_size": 4, "mini_batch_size": 2}))
    monkeypatch.setattr(train_ppo, "ensure_reward_model", lambda *a,
                        **k: pytest.fail("the reward model trained"))
    monkeypatch.setattr(train_ppo, "build_shared_model", lambda *a,
                        **k: pytest.fail("the model was built"))

    def refused(argv, capsys):
        with pytest.raises(SystemExit) as stopped:
            train_ppo.main(["--profile", "tiny", "--steps", "1", "--no-progress", *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert stopped.value.code == 2, err
        return err[-1]

    return refused


def test_training_refuses_a_device_this_machine_lacks(monkeypatch, tmp_path, capsys, train_cli):
    """Before: a "cuda" profile on a CPU-only machine trained on the CPU without a word (hours, not
    minutes)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES",
                       json.dumps({"device": "cuda", "rollout_batch_size": 4,
                                   "mini_batch_size": 2}))
    line = train_cli(["--output-dir", str(tmp_path / "ppo")], capsys)
    assert "the tiny profile's device 'cuda': torch sees no CUDA GPU on this machine" in line


def test_training_refuses_more_evaluation_prompts_than_the_test_file_has(tmp_path,
                                                                         capsys, train_cli):
    """Before: --n-eval-prompts 1000000 evaluated on the 200 there are, and reported it as asked."""
    n = len(load_prompts("test"))
    line = train_cli(["--output-dir", str(tmp_path / "ppo"), "--eval-every", "1",
                      "--n-eval-prompts", str(n + 1)],
                     capsys)
    assert line.endswith(f"n_eval_prompts {n + 1} exceeds the {n} prompts of prompts_test.jsonl: "
                         "lower it, or pass --eval-every 0 to train without evaluations")
    # the edge and eval off: accepted
    with pytest.raises(pytest.fail.Exception, match="the reward model trained"):
        train_cli(["--output-dir", str(tmp_path / "ok"), "--eval-every", "1",
                   "--n-eval-prompts", str(n)], capsys)
    with pytest.raises(pytest.fail.Exception, match="the reward model trained"):
        train_cli(["--output-dir", str(tmp_path / "off"), "--eval-every", "0", "--n-eval-prompts",
                   str(n + 1)], capsys)


def test_training_refuses_a_rollout_batch_beyond_the_machines_memory(tmp_path, capsys, train_cli):
    """Before: a MemoryError traceback after the reward model trained. An evaluation batch holds at
    most n_eval_prompts rows, so a huge eval_batch_size alone is no problem."""
    line = train_cli(["--output-dir", str(tmp_path / "ppo"), "--rollout-batch-size", str(10**9),
                      "--mini-batch-size", str(10**9)], capsys)
    assert "a batch of 1000000000 prompts x" in line and "lower rollout_batch_size" in line, line
    with pytest.raises(pytest.fail.Exception, match="the reward model trained"):
        train_cli(["--output-dir", str(tmp_path / "eval"), "--eval-every", "1",
                   "--eval-batch-size", str(10**9)],
                  capsys)


def test_training_refuses_an_empty_output_dir(capsys, train_cli):
    """Before: `--output-dir ""` was read as "not given" and the run wrote into runs/ppo-tiny."""
    assert train_cli(["--output-dir", ""],
                     capsys).endswith("--output-dir must name a folder, got an empty path")


# ------------------------------------------------------------------ bool flags

@pytest.mark.parametrize("argv, value", [
    (["--whiten-advantages"], True), (["--no-whiten-advantages"], False),
    (["--whiten-advantages", "false"], False), (["--whiten-advantages=0"], False),
    (["--whiten-advantages", "No"], False), (["--whiten-advantages", "true"], True),
    (["--whiten-advantages=yes"], True), (["--whiten-advantages", "on"], True),
])
def test_a_bool_flag_takes_a_word(argv, value):
    """Before: `--whiten-advantages false` was "unrecognized arguments: false"."""
    from rlhf_helpers.stages.train_ppo import parse_args

    assert parse_args([*argv, "--clip-eps", "0.1"]).whiten_advantages is value


@pytest.mark.parametrize("argv, message", [
    (["--whiten-advantages", "maybe"],
     "argument --whiten-advantages: expected true or false, got 'maybe'"),
    (["--no-progress-bar", "yes"], "argument --no-progress-bar takes no value, got 'yes' (write "
                                   "--progress-bar true or false instead)"),
])
def test_a_bool_flag_names_a_word_it_cannot_read(capsys, argv, message):
    from rlhf_helpers.stages.train_ppo import parse_args

    with pytest.raises(SystemExit) as stopped:
        parse_args(argv)
    assert stopped.value.code == 2 and capsys.readouterr().err.strip().endswith(message)


def test_train_reward_model_checks_the_model_limits_before_it_loads_a_model(monkeypatch, tmp_path):
    """Before: RewardTrainingConfig(max_length=10**6) trained; r=2**40 was an allocator
    traceback."""
    from rlhf_helpers.stages import reward_training
    from rlhf_helpers.stages.reward_training import RewardTrainingConfig, train_reward_model

    monkeypatch.setattr(reward_training, "load_sequence_classifier", lambda *a,
                        **k: pytest.fail("a model loaded"))
    profile = get_profile("tiny")
    for overrides, message in [({"max_length": 10**6}, "max_length 1000000 exceeds the model's"),
                               ({"lora": {"r": 2**40}},
                                "lora.r 1099511627776 exceeds the model's hidden size")]:
        config = RewardTrainingConfig.from_profile(profile, **overrides)
        with pytest.raises(ValueError, match=message):
            train_reward_model(profile, tmp_path / "reward", config)
