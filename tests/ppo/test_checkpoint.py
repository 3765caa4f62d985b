"""Checkpoints of the shared model and trainer: round trip, crash mid-save, exact resume, NaN
stop."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from rlhf_helpers.core.checks import NonFiniteError
from rlhf_helpers.core.losses import policy_loss
from rlhf_helpers.ppo.checkpoints import save_load as ckpt
from rlhf_helpers.ppo.checkpoints.save_load import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.ppo_config import PPOConfig

PROMPTS = ["the movie was", "the film is", "the plot was", "the acting is", "the movie is great .",
           "the film was bad ."]


pytestmark = pytest.mark.usefixtures("one_torch_thread")



@pytest.fixture
def make_trainer(make_trainer):
    """Toy trainers of this module: 6 new tokens, lr 3e-2, the adaptive KL controller (its state is
    checkpointed too); `init_seed` changes the initial adapters and heads (a 'fresh' trainer must
    get everything from the checkpoint, not from sharing the seed)."""
    def make(init_seed: int = 0, **overrides):
        values = dict(max_new_tokens=6, policy_lr=3e-2, value_lr=3e-2,
                      target_kl=0.5, kl_horizon=100)
        return make_trainer(init_seed=init_seed, prompts=PROMPTS, **{**values, **overrides})
    return make


def model_state(trainer: PPOTrainer) -> dict[str, torch.Tensor]:
    """Every parameter of the shared model (adapters, heads, base) by name, cloned."""
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def without_times(history):
    return [{k: v for k, v in m.items() if not k.startswith("time_")} for m in history]


def test_round_trip_restores_every_adapter_head_and_optimizer(make_trainer, tmp_path):
    trainer = make_trainer()
    trainer.step()
    path = save_checkpoint(trainer, tmp_path)
    assert path == tmp_path / "step-000001" and latest_checkpoint(tmp_path) == path
    for adapter in ("policy", "value", "reward"):
        assert (path / "adapters" / adapter / "adapter_model.safetensors").is_file()
    fresh = make_trainer(init_seed=7)
    before = model_state(fresh)
    assert any(not torch.equal(before[k], v) for k, v in model_state(trainer).items())
    load_checkpoint(fresh, tmp_path)
    assert_same_state(model_state(trainer), model_state(fresh))
    assert fresh.step_count == 1 and fresh.history == trainer.history
    assert vars(fresh.kl_controller) == vars(trainer.kl_controller)
    for mine, theirs in ((trainer.policy_opt.optimizer, fresh.policy_opt.optimizer),
                         (trainer.value_opt.optimizer, fresh.value_opt.optimizer)):
        a, b = mine.state_dict()["state"], theirs.state_dict()["state"]
        assert a.keys() == b.keys() and len(a) > 0
        for key in a:
            for name in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(a[key][name], b[key][name])


def test_resume_equals_an_uninterrupted_run_metric_for_metric(make_trainer, tmp_path):
    n, k = 3, 1
    straight = make_trainer()
    for _ in range(n):
        straight.step()
    first = make_trainer()
    for _ in range(k):
        first.step()
    save_checkpoint(first, tmp_path)
    torch.manual_seed(999)  # the resumed run must not depend on the caller's RNG either
    resumed = make_trainer(init_seed=3)
    load_checkpoint(resumed, tmp_path)
    for _ in range(n - k):
        resumed.step()
    assert resumed.kl_controller.value != PPOConfig(target_kl=0.5).kl_coef  # adaptive beta moved
    assert without_times(resumed.history) == without_times(straight.history)
    assert_same_state(model_state(resumed), model_state(straight))


def test_crash_mid_save_leaves_the_previous_checkpoint(make_trainer, tmp_path, monkeypatch):
    trainer = make_trainer()
    trainer.step()
    good = save_checkpoint(trainer, tmp_path)
    state_after_1 = model_state(trainer)
    trainer.step()  # new weights that a failed save must not half-publish
    real_save = torch.save

    def crash_midway(obj, path, *args, **kwargs):
        real_save({"partial": True}, path)  # part of the file is on disk, then the process dies
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(ckpt.torch, "save", crash_midway)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(trainer, tmp_path)
    monkeypatch.setattr(ckpt.torch, "save", real_save)
    assert latest_checkpoint(tmp_path) == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000001"]  # no debris
    fresh = make_trainer(init_seed=5)
    load_checkpoint(fresh, tmp_path)
    assert fresh.step_count == 1
    assert_same_state(state_after_1, model_state(fresh))


def test_crash_before_the_pointer_moves_keeps_latest_on_the_old_step(make_trainer,
                                                                     tmp_path, monkeypatch):
    trainer = make_trainer()
    trainer.step()
    good = save_checkpoint(trainer, tmp_path)
    trainer.step()

    def crash(*args, **kwargs):
        raise OSError("power cut (simulated)")

    monkeypatch.setattr(ckpt, "_write_pointer", crash)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(trainer, tmp_path)
    # step-000002 is complete on disk, but `latest` was never moved to it
    assert latest_checkpoint(tmp_path) == good
    fresh = make_trainer(init_seed=5)
    assert load_checkpoint(fresh, tmp_path) == good and fresh.step_count == 1


def test_only_the_newest_checkpoints_are_kept(make_trainer, tmp_path):
    trainer = make_trainer(ppo_epochs=1)
    for _ in range(3):
        trainer.step()
        save_checkpoint(trainer, tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000002", "step-000003"]
    with pytest.raises(ValueError, match="keep"):
        save_checkpoint(trainer, tmp_path, keep=0)


def test_nan_loss_stops_the_run_and_the_checkpoint_on_disk_is_the_last_good_one(
        make_trainer, tmp_path):
    state = {}

    def nan_on_third_step(*args):
        loss, stats = policy_loss(*args)
        if trainer.step_count == 2:
            loss = loss * math.nan
        return loss, stats

    trainer = make_trainer(save_every=1, output_dir=str(tmp_path), ppo_epochs=1,
                           policy_loss_fn=nan_on_third_step)
    with pytest.raises(NonFiniteError):
        trainer.train(steps=4,
                      callback=lambda m: state.__setitem__(int(m["step"]), model_state(trainer)))
    assert latest_checkpoint(tmp_path).name == "step-000002"
    fresh = make_trainer(init_seed=9)
    load_checkpoint(fresh, tmp_path)
    assert fresh.step_count == 2
    assert_same_state(state[2], model_state(fresh))
    assert all(torch.isfinite(p).all() for p in fresh.model.parameters())


def test_loading_errors_are_clear(make_trainer, tmp_path):
    trainer = make_trainer()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(trainer, tmp_path)
    path = save_checkpoint(trainer, tmp_path)
    weights = path / "adapters" / "value" / "adapter_model.safetensors"
    weights.unlink()
    with pytest.raises(ckpt.CheckpointDamagedError,
                       match=f"checkpoint {path} is damaged: {weights} is missing"):
        load_checkpoint(trainer, path)
    # the weights' own loader names the adapter
    with pytest.raises(FileNotFoundError, match="'value' adapter"):
        ckpt.load_model_weights(trainer.model, path)


class _RunsCodeWhenUnpickled:
    """A crafted checkpoint object: unpickling it would create `marker` (any code could run
    there)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        from pathlib import Path

        return (Path.touch, (Path(self.marker),))


def test_a_crafted_trainer_state_is_refused_without_running_its_code(make_trainer, tmp_path):
    trainer = make_trainer()
    trainer.step()
    path = save_checkpoint(trainer, tmp_path)
    # the real state loads with the safe unpickler: tensors, numbers, strings, lists, dicts only
    torch.load(path / ckpt.TRAINER_STATE_FILE, weights_only=True)
    marker = tmp_path / "code-ran"
    state = ckpt.trainer_state_dict(trainer)
    state["history"] = [_RunsCodeWhenUnpickled(str(marker))]
    torch.save(state, path / ckpt.TRAINER_STATE_FILE)
    with pytest.raises(ckpt.CheckpointDamagedError,
                       match="trainer_state.pt does not match its SHA-256"):
        load_checkpoint(make_trainer(), tmp_path)
    # whoever crafts a file can rewrite the digests too: the safe loader still refuses it
    ckpt.write_manifest(path)
    fresh = make_trainer(init_seed=3)
    with pytest.raises(ValueError, match=r"trainer_state.pt was refused by the safe "
                                         r"loader.*Unsupported global"):
        load_checkpoint(fresh, tmp_path)
    assert not marker.exists()
    assert fresh.step_count == 0  # nothing of the refused state was applied


def test_a_checkpoint_is_a_complete_reward_source_for_a_resumed_run(make_trainer, tmp_path):
    """A resumed run builds its reward adapter from the checkpoint (its reward folder may be gone):
    a model built with reward_dir=<checkpoint> scores like the model that saved it, with another
    reward LoRA rank too (the shape comes from the checkpoint's adapter_config.json, not from the
    new model's spec)."""
    from toy_world import toy_causal_lm, toy_tokenizer

    from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
    from rlhf_helpers.runtime.lora import LoRASpec

    tok = toy_tokenizer()
    saved = make_trainer()
    # a trained-looking reward adapter and head: LoRA's B starts at 0, so perturb both
    with torch.no_grad():
        generator = torch.Generator().manual_seed(5)
        for param in saved.model.adapter_parameters("reward"):
            param.add_(0.3 * torch.randn(param.shape, generator=generator))
        saved.model.score_head.linear.weight.add_(
            torch.randn(saved.model.score_head.linear.weight.shape,
                        generator=generator))
    path = save_checkpoint(saved, tmp_path)
    ids = torch.tensor([tok.encode("the movie was great .")] * 2)  # (2, L)
    mask = torch.ones_like(ids)  # (2, L)
    expected = saved.model.reward_scores(ids, mask)  # (2,)

    def built(reward_dir):
        return SharedLoRAModel(toy_causal_lm(tok, seed=0), pad_token_id=tok.pad_token_id,
                               eos_token_id=tok.eos_token_id, seed=7, lora=LoRASpec(r=2, alpha=4),
                               reward_dir=reward_dir)

    torch.testing.assert_close(built(path).reward_scores(ids, mask), expected, rtol=0, atol=0)
    # control: without the checkpoint the scores differ (a test that could not fail proves nothing)
    assert not torch.allclose(built(None).reward_scores(ids, mask), expected)
    (path / "heads.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="lacks heads.safetensors"):
        built(path)


def test_load_checkpoint_keeps_the_checkpoints_learning_rates_and_kl_and_says_so(make_trainer,
                                                                                  tmp_path):
    """Before: the optimisers' lr and the KL controller became the checkpoint's with no word,
    while trainer.config still named the values the caller had asked for."""
    saver = make_trainer(policy_lr=1e-3, kl_horizon=200, target_kl=None, kl_coef=0.2)
    saver.step()
    path = save_checkpoint(saver, tmp_path / "fixed")
    loader = make_trainer(init_seed=1, policy_lr=0.05, target_kl=None, kl_coef=0.5)
    with pytest.warns(UserWarning,
                      match=r"policy_lr 0.001 \(trainer.config had 0.05\), kl_coef 0.2 "
                            r"\(trainer.config had 0.5\): the trainer goes on with the "
                            r"checkpoint's values") as caught:
        load_checkpoint(loader, path)
    assert len(caught) == 1 and "value_lr" not in str(caught[0].message)  # the same in both
    assert loader.policy_opt.optimizer.param_groups[0]["lr"] == loader.config.policy_lr == 1e-3
    assert loader.kl_controller.value == loader.config.kl_coef == 0.2
    # an adaptive controller: its target and horizon are settings, its beta is where it has got to
    saver = make_trainer(target_kl=0.5, kl_horizon=100, kl_coef=0.2)
    saver.step()
    path = save_checkpoint(saver, tmp_path / "adaptive")
    loader = make_trainer(init_seed=1, target_kl=1.0, kl_horizon=100, kl_coef=0.1)
    with pytest.warns(UserWarning,
                      match=r"with target_kl 0.5 \(trainer.config had 1.0\):") as caught:
        load_checkpoint(loader, path)
    assert len(caught) == 1 and loader.config.target_kl == loader.kl_controller.target == 0.5
    assert loader.config.kl_coef == 0.1  # where beta started, not what it is now
    same = make_trainer(init_seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same settings: not a word
        load_checkpoint(same, path)
