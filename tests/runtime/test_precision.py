"""Dtype by device (mocked CUDA capabilities), fp16 PPO steps with a gradient scaler on the CPU, and
the memory estimate of the gpu profile checked against independent counts of real models and
tensors."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings

import pytest
import torch

from rlhf_helpers.core.checks import NonFiniteError
from rlhf_helpers.ppo.checkpoints.save_load import (
    load_checkpoint,
    save_checkpoint,
    trainer_state_dict,
)
from rlhf_helpers.ppo.model.memory_estimate import (
    FLOAT32_BYTES,
    LLAMA_PROJECTIONS,
    T4_MEMORY_BYTES,
    ModelShape,
    activation_bytes,
    estimate_memory,
    estimate_ppo_memory,
    ppo_phase_estimates,
)
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.runtime import precision
from rlhf_helpers.runtime.lora import LoRASpec
from rlhf_helpers.runtime.precision import amp_flags, compute_dtype, describe_dtype, resolve_dtype
from rlhf_helpers.runtime.profiles import get_profile

PROMPTS = ["the movie was", "the film is", "the plot was", "the acting is"]


def fake_gpu(monkeypatch, capability: tuple[int, int] | None, name: str = "Fake GPU") -> None:
    """Make torch see a CUDA device of this compute capability (None: no CUDA at all)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: capability is not None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


# ----------------------------------------------------------------------------- dtype by device
@pytest.mark.parametrize(("capability", "expected"), [
    ((7, 5), "float16"),  # T4: bf16 only emulated (is_bf16_supported() says True there)
    ((7, 0), "float16"),  # V100
    ((8, 0), "bfloat16"),  # A100
    ((8, 9), "bfloat16"),  # L4
    ((9, 0), "bfloat16"),  # H100
])
def test_cuda_dtype_follows_the_compute_capability(monkeypatch, capability, expected):
    fake_gpu(monkeypatch, capability)
    # must not be trusted
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert compute_dtype("cuda") == expected
    assert compute_dtype("cuda:0") == expected
    assert compute_dtype("cpu") == "float32"
    assert get_profile("gpu").dtype == expected
    assert get_profile("gpu").torch_dtype is getattr(torch, expected)


def test_without_cuda_the_cpu_gets_float32_and_a_gpu_profile_its_nominal_dtype(monkeypatch):
    fake_gpu(monkeypatch, None)
    assert compute_dtype("cpu") == "float32"
    assert compute_dtype("cuda") == precision.NOMINAL_CUDA_DTYPE == "bfloat16"
    assert get_profile("gpu").dtype == "bfloat16"
    assert get_profile("gpu", device="cpu").dtype == "float32"
    assert get_profile("tiny").dtype == "float32"


def test_an_explicit_dtype_wins_and_bad_names_are_refused(monkeypatch):
    fake_gpu(monkeypatch, (7, 5))
    assert get_profile("gpu", dtype="float32").dtype == "float32"
    assert get_profile("gpu", dtype="bfloat16").dtype == "bfloat16"  # emulated, but asked for
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"dtype": "bfloat16"}')
    assert get_profile("gpu").dtype == "bfloat16"
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"dtype": "fp16"}')
    with pytest.raises(ValueError,
                       match=r"dtype must be one of \('auto', 'float32', 'bfloat16', 'float16'\)"):
        get_profile("gpu")
    monkeypatch.delenv("RLHF_PROFILE_OVERRIDES")
    with pytest.raises(ValueError, match="dtype must be one of"):
        get_profile("tiny", dtype="half")
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype("float64", "cpu")
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda"):
        compute_dtype("mps")


def test_describe_says_why(monkeypatch):
    fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    assert (describe_dtype("float16", "cuda")
            == "float16 (Tesla T4, compute capability 7.5: no bf16 in hardware)")
    assert describe_dtype("float32",
                          "cuda").endswith("set explicitly, the automatic choice is float16)")
    fake_gpu(monkeypatch, (8, 0), "NVIDIA A100")
    assert (describe_dtype("bfloat16", "cuda")
            == "bfloat16 (NVIDIA A100, compute capability 8.0: bf16 in hardware)")
    assert describe_dtype("float32", "cpu") == "float32 (CPU)"


def test_show_environment_prints_the_dtype_and_why(monkeypatch, capsys):
    from rlhf_helpers.course.notebook import show_environment

    fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    monkeypatch.setenv("RLHF_PROFILE", "gpu")
    env = show_environment()
    assert env.dtype == "float16"
    assert ("dtype: float16 (Tesla T4, compute capability 7.5: no bf16 in hardware)"
            in capsys.readouterr().out)


def test_amp_flags_autocast_around_float32_masters_in_a_16_bit_dtype(monkeypatch):
    """By the compute dtype: a T4 autocasts fp16, a bf16 profile bf16, float32 never; the CPU
    computes in float32 (the tiny profile, the gpu profile's "auto" there) unless a profile names a
    16-bit dtype, which then autocasts as on a GPU (how tests/stages/test_gpu_paths.py runs the gpu
    profile's mixed precision without one)."""
    fake_gpu(monkeypatch, (7, 5))
    assert amp_flags(get_profile("gpu")) == {"bf16": False, "fp16": True}
    assert amp_flags(get_profile("gpu", dtype="bfloat16")) == {"bf16": True, "fp16": False}
    assert amp_flags(get_profile("gpu", dtype="float32")) == {"bf16": False, "fp16": False}
    # auto: float32
    assert amp_flags(get_profile("gpu", device="cpu")) == {"bf16": False, "fp16": False}
    assert (amp_flags(get_profile("gpu", device="cpu", dtype="float16"))
            == {"bf16": False, "fp16": True})
    assert amp_flags(get_profile("tiny")) == {"bf16": False, "fp16": False}
    assert precision.master_dtype() is torch.float32


def test_sft_config_on_the_cpu_trains_without_mixed_precision(tmp_path):
    from rlhf_helpers.stages.sft import sft_config

    args = sft_config(get_profile("gpu", device="cpu"), tmp_path)
    assert (args.bf16, args.fp16, args.use_cpu) == (False, False, True)


def test_reward_model_trains_float32_masters_whatever_the_profile_dtype(tmp_path, one_torch_thread):
    """A bf16 profile still trains (and saves) the LoRA matrices and the score head in float32."""
    from safetensors.torch import load_file

    from rlhf_helpers.runtime.data import load_preferences
    from rlhf_helpers.stages import reward_training as rt

    profile = get_profile("tiny", dtype="bfloat16")  # on the CPU: no autocast, float32 masters
    config = rt.RewardTrainingConfig.from_profile(profile, max_train_pairs=16,
                                                  epochs=1.0, batch_size=8)
    rt.train_reward_model(profile, tmp_path, config, eval_pairs=load_preferences("test")[:8])
    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    assert any(".score." in key for key in saved) and any("lora_" in key for key in saved)
    assert {tensor.dtype for tensor in saved.values()} == {torch.float32}


# ----------------------------------------------------------------------------- fp16 PPO on the CPU
@pytest.fixture
def make_trainer(make_trainer):
    """Toy trainers of this module: 4 prompts, one hidden scorer; the base dtype is the argument."""
    return lambda dtype, **overrides: make_trainer(dtype=dtype, prompts=PROMPTS, **overrides)


def snapshot(params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def changed(before, params) -> bool:
    return any(not torch.equal(a, p.detach()) for a, p in zip(before, params, strict=True))


def test_one_fp16_ppo_step_is_finite_and_moves_the_policy(make_trainer, one_torch_thread):
    trainer = make_trainer(torch.float16)
    model = trainer.model
    base = [p for name, p in model.lm.named_parameters() if "lora_" not in name]
    # frozen base
    assert {p.dtype for p in base} == {torch.float16} and not any(p.requires_grad for p in base)
    assert {p.dtype for p in model.policy_parameters()
            + model.value_parameters()} == {torch.float32}  # masters
    assert trainer.policy_opt.scaler.is_enabled() and trainer.value_opt.scaler.is_enabled()
    before = snapshot(model.policy_parameters())
    metrics = trainer.step()
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert changed(before, model.policy_parameters())
    # still masters after the step
    assert {p.dtype for p in model.policy_parameters()} == {torch.float32}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_grad_scaler_without_float16(make_trainer, dtype, one_torch_thread):
    trainer = make_trainer(dtype)
    assert not trainer.policy_opt.scaler.is_enabled() and not trainer.value_opt.scaler.is_enabled()
    trainer.step()
    # checkpoints of float32/bf16 runs unchanged
    assert "policy_scaler" not in trainer_state_dict(trainer)


def test_an_fp16_overflow_skips_the_step_and_halves_the_scale_without_a_nan_stop(make_trainer,
                                                                                 one_torch_thread):
    trainer = make_trainer(torch.float16)
    # a loss scale of 2^40 overflows float16 (max 65504) in every backward: every step is skipped
    init = 2.0**40
    trainer.policy_opt.scaler = torch.amp.GradScaler("cpu", init_scale=init, growth_interval=100)
    trainer.value_opt.scaler = torch.amp.GradScaler("cpu", init_scale=init, growth_interval=100)
    policy, value = (snapshot(trainer.model.policy_parameters()),
                     snapshot(trainer.model.value_parameters()))
    metrics = trainer.step()  # no NonFiniteError
    steps = trainer.config.ppo_epochs * (trainer.config.rollout_batch_size
                                         // trainer.config.mini_batch_size)
    assert (trainer.policy_opt.overflow_skips, trainer.value_opt.overflow_skips) == (steps, steps)
    # halved once per skipped step
    assert trainer.policy_opt.scaler.get_scale() == init * 0.5**steps
    assert not changed(policy, trainer.model.policy_parameters())
    assert not changed(value, trainer.model.value_parameters())
    assert metrics["policy_grad_norm"] == 0.0 and math.isfinite(metrics["policy_loss"])


def test_a_gradient_still_not_finite_below_the_minimum_scale_stops_the_run(
        make_trainer, monkeypatch, one_torch_thread):
    import rlhf_helpers.ppo.optim as optim_module

    trainer = make_trainer(torch.float16)
    init = 2.0**40
    trainer.policy_opt.scaler = torch.amp.GradScaler("cpu", init_scale=init, growth_interval=100)
    # the floor just below the scale: one skip (S -> S/2) is an overflow, the second overflow a NaN
    # stop
    monkeypatch.setattr(optim_module, "MIN_LOSS_SCALE", init / 2 + 1)
    skips_at_the_stop = []
    check = optim_module.check_all_finite

    def recording_check(*args, **kwargs):
        skips_at_the_stop.append(trainer.policy_opt.overflow_skips)
        check(*args, **kwargs)

    monkeypatch.setattr(optim_module, "check_all_finite", recording_check)
    with pytest.raises(NonFiniteError, match="gradient norm"):
        trainer.step()
    assert skips_at_the_stop == [1]  # the first overflow was skipped, the second stopped the run
    # the stopped step is undone whole (`step_undo`): its skip and halved scale included
    assert trainer.policy_opt.overflow_skips == 0 and trainer.policy_opt.scaler.get_scale() == init


def test_scaler_state_survives_a_checkpoint(make_trainer, tmp_path, one_torch_thread):
    trainer = make_trainer(torch.float16)
    trainer.step()
    trainer.policy_opt.scaler.update(new_scale=1024.0)  # a state a fresh scaler would not have
    trainer.value_opt.overflow_skips = 3
    save_checkpoint(trainer, tmp_path)  # loading below goes through torch.load(weights_only=True)
    fresh = make_trainer(torch.float16)
    load_checkpoint(fresh, tmp_path)
    assert fresh.policy_opt.scaler.state_dict() == trainer.policy_opt.scaler.state_dict()
    assert fresh.value_opt.scaler.state_dict() == trainer.value_opt.scaler.state_dict()
    assert (fresh.policy_opt.overflow_skips, fresh.value_opt.overflow_skips) == (0, 3)


# ----------------------------------------------------------------------------- memory estimate
def small_llama_config(**changes) -> dict:
    """A Llama small enough for the CPU, with no two sizes equal (so shapes cannot be confused)."""
    config = dict(model_type="llama", hidden_size=48, intermediate_size=80, num_attention_heads=4,
                  num_key_value_heads=2, num_hidden_layers=2, vocab_size=50,
                  tie_word_embeddings=True, max_position_embeddings=128)
    config.update(changes)
    return config


def build_llama(config: dict, dtype: torch.dtype = torch.float32,
                device: str = "cpu") -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(config)
    hf_config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(hf_config, dtype=dtype).eval()


def test_gpu_profile_stages_fit_a_t4_with_margin():
    limit = 0.8 * T4_MEMORY_BYTES
    for dtype in ("bfloat16", "float16"):  # an A100/L4 and a T4 (same element size, same estimate)
        estimates = estimate_memory(get_profile("gpu", dtype=dtype))
        assert set(estimates) == {"sft", "reward", "ppo"}
        for stage, estimate in estimates.items():
            assert 0 < estimate.total < limit, (stage, estimate.total / 2**30)
            parts = [
                getattr(estimate, f.name) for f in dataclasses.fields(estimate)
                if f.name not in ("stage", "phase")
            ]
            assert estimate.total == sum(parts) and all(part >= 0 for part in parts)
    phases = ppo_phase_estimates(get_profile("gpu"))
    assert estimate_ppo_memory(get_profile("gpu")).total == max(p.total for p in phases.values())


def test_parameter_bytes_equal_real_models_built_from_the_config():
    """SmolLM2-135M's random-init architecture on the meta device (no memory, exact parameter
    shapes)."""
    from rlhf_helpers.runtime.architectures import SMOLLM2_135M_CONFIG

    profile = get_profile("gpu")
    shape = ModelShape.from_config(SMOLLM2_135M_CONFIG)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        lm = build_llama(SMOLLM2_135M_CONFIG, torch.bfloat16, device="meta")
        # tied embedding: one Parameter, counted once
        count = sum(p.numel() for p in lm.parameters())
        assert shape.parameter_count() == count
        assert estimate_memory(profile)["sft"].weights == count * FLOAT32_BYTES  # float32 masters
        # PPO: the bf16 base plus three float32 adapters and two float32 heads, as the shared model
        # holds them
        shared = SharedLoRAModel(lm, pad_token_id=0, eos_token_id=1, lora=profile.lora)
    update = ppo_phase_estimates(profile, shape)["update"]
    assert update.weights == sum(p.numel() * p.element_size() for p in shared.parameters())
    trained = shared.policy_parameters() + shared.value_parameters()
    # Adam's 2 moments
    assert update.optimizer_states == 2 * sum(p.numel() * p.element_size() for p in trained)
    lora = shape.lora_parameter_count(profile.lora.r, tuple(profile.lora.target_modules))
    assert lora == sum(p.numel() for p in shared.adapter_parameters("policy"))


def saved_activation_bytes(model: torch.nn.Module, backbone: torch.nn.Module, rows: int,
                           seq_len: int, autocast_dtype: torch.dtype | None) -> int:
    """Bytes of the distinct tensors a forward saves for backward (saved_tensors_hooks), weights
    excluded: the parameters themselves and autocast's low-precision copies of them (same shape or
    transposed)."""
    params = list(model.parameters())
    weights = {p.untyped_storage().data_ptr() for p in params}
    weight_shapes = {s for p in params if p.ndim == 2
                     for s in (tuple(p.shape), tuple(p.shape)[::-1])}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        is_weight_copy = (autocast_dtype is not None and t.dtype == autocast_dtype
                          and tuple(t.shape) in weight_shapes)
        if storage.data_ptr() not in weights and not is_weight_copy:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(0, 50, (rows, seq_len),
                        generator=torch.Generator().manual_seed(0))  # (rows, L)
    attn = torch.ones(rows, seq_len, dtype=torch.long)  # (rows, L)
    attn[0, :2] = 0  # a left-padded row
    amp = torch.autocast("cpu",
                         dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp:
        backbone(input_ids=ids, attention_mask=attn, use_cache=False)
    return sum(seen.values())


@pytest.mark.parametrize(("stage", "dtype", "targets"), [
    ("ppo", torch.bfloat16, LLAMA_PROJECTIONS),  # an A100's PPO: frozen bf16 base, float32 LoRA
    ("ppo", torch.float16, LLAMA_PROJECTIONS),  # a T4's
    ("ppo", torch.float16, ("q_proj", "v_proj")),
    ("ppo", torch.float32, LLAMA_PROJECTIONS),  # the CPU's
    ("reward", torch.bfloat16, LLAMA_PROJECTIONS),  # float32 classifier under autocast
    ("reward", torch.bfloat16, ("q_proj", "v_proj")),
    # full fine-tuning of float32 masters under autocast
    ("sft", torch.bfloat16, LLAMA_PROJECTIONS),
    ("sft", torch.float32, LLAMA_PROJECTIONS),
])
def test_activation_bytes_equal_the_tensors_a_real_forward_saves(stage, dtype, targets,
                                                                 one_torch_thread):
    from peft import LoraConfig, get_peft_model

    config = small_llama_config()
    shape = ModelShape.from_config(config)
    autocast = stage != "ppo" and dtype != torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = build_llama(config, torch.float32 if autocast else dtype)
        if stage != "sft":
            model.requires_grad_(False)
            model = get_peft_model(model,
                                   LoraConfig(r=4, lora_alpha=8, target_modules=list(targets)))
        backbone = model.get_base_model().model if stage != "sft" else model.model
    s = torch.tensor([], dtype=dtype).element_size()
    for rows, seq_len in ((3, 10), (5, 14)):
        measured = saved_activation_bytes(model, backbone, rows, seq_len,
                                          dtype if autocast else None)
        estimate = activation_bytes(shape, rows, seq_len, s, full=stage == "sft", autocast=autocast,
                                    lora_r=4, lora_targets=targets)
        # exact on torch 2.13 + transformers 5.23; other versions may pass the attention mask and
        # RoPE's cos/sin differently: those two terms are the tolerance
        mask = rows * seq_len * shape.num_layers * s * seq_len
        rope = 2 * seq_len * shape.head_dim * (FLOAT32_BYTES if autocast else s)
        assert abs(estimate - measured) <= mask + rope, (estimate, measured)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_logits_and_kv_cache_terms_count_real_tensors(dtype, one_torch_thread):
    """The (b, R, V) logits a policy forward really returns and the KV cache sampling really
    keeps."""
    config = small_llama_config(vocab_size=53)
    shape = ModelShape.from_config(config)
    profile = get_profile("gpu", dtype="bfloat16" if dtype == torch.bfloat16 else "float16",
                          rollout_batch_size=6, mini_batch_size=3, max_prompt_length=5,
                          max_new_tokens=7, lora=LoRASpec(r=4, target_modules=("q_proj", "v_proj")))
    phases = ppo_phase_estimates(profile, shape, fast_sampling=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        shared = SharedLoRAModel(build_llama(config, dtype), pad_token_id=0, eos_token_id=1,
                                 fast_sampling=False,
                                 lora=LoRASpec(r=4, alpha=8, target_modules=("q_proj", "v_proj")))
    P, R = profile.ppo.max_prompt_length, profile.ppo.max_new_tokens

    def response_logits(rows: int) -> torch.Tensor:
        ids = torch.randint(2, 53, (rows, P + R),
                            generator=torch.Generator().manual_seed(rows))  # (rows, P + R)
        with torch.no_grad():
            return shared.policy_logits(ids, torch.ones_like(ids))[:, P - 1 : -1]  # (rows, R, V)

    mb, batch = (response_logits(profile.ppo.mini_batch_size),
                 response_logits(profile.ppo.rollout_batch_size))
    assert mb.shape == (profile.ppo.mini_batch_size, R, shape.vocab_size) and mb.dtype == dtype
    upcast = mb.float().element_size()  # logprobs_from_logits works on a float32 copy
    # update: the logits in the compute dtype and four float32 copies; scoring: the logits and two
    assert phases["update"].logits == mb.numel() * (mb.element_size() + 4 * upcast)
    assert phases["rollout scoring"].logits == batch.numel() * (batch.element_size() + 2 * upcast)

    B = profile.ppo.rollout_batch_size
    ids = torch.randint(2, 53, (B, P + R))  # (B, P + R): a full-length rollout
    with torch.no_grad():
        cache = shared.lm(input_ids=ids, use_cache=True).past_key_values
    layers = [(layer.keys, layer.values) for layer in cache.layers]
    cache_bytes = sum(t.numel() * t.element_size() for pair in layers for t in pair)
    assert len(layers) == shape.num_layers
    # the cache, plus one layer's copy while it grows
    assert phases["sampling"].kv_cache == cache_bytes * (shape.num_layers + 1) // shape.num_layers


def test_sampler_buffers_count_a_real_fast_decoder(one_torch_thread):
    """The fast sampler's folded weights and static caches (eager on the CPU, same buffers as on
    CUDA)."""
    from rlhf_helpers.ppo.model.fast_decoder import MAX_GRAPHS, StaticLlamaDecoder

    config = small_llama_config()
    shape = ModelShape.from_config(config)
    profile = get_profile("gpu", dtype="float16", rollout_batch_size=6, mini_batch_size=3,
                          eval_batch_size=4, max_prompt_length=5, max_new_tokens=7,
                          lora=LoRASpec(r=4, target_modules=("q_proj", "v_proj")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        shared = SharedLoRAModel(build_llama(config, torch.float16), pad_token_id=0, eos_token_id=1,
                                 fast_sampling=False,
                                 lora=LoRASpec(r=4, alpha=8, target_modules=("q_proj", "v_proj")))
    decoder = StaticLlamaDecoder(shared.lm, use_graphs=False)
    P = profile.ppo.max_prompt_length
    for batch in (profile.ppo.rollout_batch_size, profile.ppo.eval_batch_size,
                  profile.ppo.rollout_batch_size):
        ids = torch.randint(2, 50, (batch, P))  # (batch, P) full-width prompts
        decoder.prefill(ids, torch.ones_like(ids), profile.ppo.max_new_tokens)
    assert len(decoder.entries) == MAX_GRAPHS
    folded = sum(w.numel() * w.element_size() for layer in decoder.weights for w,
                 _ in layer.values())
    biggest = max(sum(t.numel() * t.element_size() for t in entry.keys + entry.values)
                  for entry in decoder.entries.values())
    actual = folded + sum(sum(t.numel() * t.element_size() for t in entry.keys + entry.values)
                          for entry in decoder.entries.values())
    estimate = ppo_phase_estimates(profile, shape, fast_sampling=True)["update"].sampler_buffers
    # the estimate assumes every entry holds the largest batch: exact for the weights and that entry
    assert estimate == folded + MAX_GRAPHS * biggest >= actual


def test_bench_memory_prints_the_estimate_of_the_step_it_measured():
    from dataclasses import asdict

    from benchmarks.bench_memory import ppo_estimate, size_spec

    spec = asdict(size_spec("smollm2"))
    estimate = ppo_estimate(spec, "bfloat16", "cuda")
    assert (estimate is not None and 0 < estimate.total < T4_MEMORY_BYTES
            and estimate.sampler_buffers > 0)
    assert ppo_estimate(spec, "float32", "cpu").sampler_buffers == 0  # the plain sampler on a CPU
    assert ppo_estimate(asdict(size_spec("tiny")), "float32", "cpu") is None  # GPT-2: not estimated
