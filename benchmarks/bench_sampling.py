"""Decode speed of the rollout sampler: Hugging Face `generate`, our plain loop, the fast decoder.

    python -m benchmarks.bench_sampling --device cuda  # SmolLM2-135M arch., random init, bf16
    python -m benchmarks.bench_sampling                # CPU smoke run (tiny Llama, float32)

All three run side by side in one process on the same model (random weights of the gpu profile's
architecture: no hub here), batch and response length (the TRL-baseline anchor: 32 prompts x 64 new
tokens), with the policy LoRA adapter active and EOS suppressed so that every run decodes every
step. Reported per decode step (median of repeats, after warm-up): milliseconds, tokens per second,
and the ratio to the memory-bandwidth floor = bytes of weights one step must read / the device's
measured copy bandwidth (bytes read + written by a large device-to-device copy).

Correctness, in the same run: in float32 (TF32 off) the fast decoder must give the plain loop's
tokens and log-probs (same seed); in bf16 the sampling loops' log-probs are compared with one full
forward of the policy, the numbers the PPO update uses.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from rlhf_helpers.ppo.model.sampling import sample_model
from rlhf_helpers.runtime.lora import LoRASpec

#: LoRA targets and rank of the gpu profile (rlhf_helpers.runtime.profiles.gpu_profile).
SPEED_GOAL_X_FLOOR = 20.0  #: goal: a decode step within this many times the bandwidth floor


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device: torch.device, megabytes: int = 1024) -> float:
    """Bytes per second of a large device-to-device copy, counting bytes read plus bytes written."""
    n = megabytes * 2**20 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    _sync(device)
    times = []
    for _ in range(10):
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * 4 / statistics.median(times)


def build_model(device: str, dtype: torch.dtype, small: bool) -> tuple[Any, Any]:
    """SharedLoRAModel on a random-init SmolLM2-135M (or a 2-layer Llama for the CPU smoke run)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from benchmarks.trl_baseline.common import SMOLLM2_135M_CONFIG
    from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
    from rlhf_helpers.runtime.models import load_tokenizer
    from rlhf_helpers.runtime.profiles import get_profile

    # the env may name gpu weights
    tokenizer = load_tokenizer(get_profile("tiny", weights="shipped"))
    spec = dict(SMOLLM2_135M_CONFIG)
    if small:
        spec.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2)
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    config.pad_token_id, config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()
    gpu = get_profile("gpu")
    shared = SharedLoRAModel(
        lm,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        fast_sampling=False,
        lora=LoRASpec(r=gpu.lora.r, alpha=gpu.lora.alpha, target_modules=gpu.lora.target_modules),
    )
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a real adapter (B = 0 at init would make folding it trivial)
        for param in shared.policy_parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=gen).to(param.device))
    return shared, tokenizer


def weight_bytes_per_step(shared: Any) -> int:
    """Bytes one decode step must read: every base weight once (embedding row reads are negligible,
    but the tied LM head reads the whole (V, H) matrix)."""
    lm = shared.lm
    total = sum(p.numel() * p.element_size() for name, p in lm.named_parameters()
                if "lora_" not in name and "embed_tokens" not in name)
    head = lm.get_output_embeddings().weight
    return total + (head.numel() * head.element_size()
                    if head is lm.get_input_embeddings().weight else 0)


def _prompts(tokenizer: Any, batch: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    from rlhf_helpers.ppo.model.samples import tokenize_prompts
    from rlhf_helpers.runtime.data import load_prompts

    texts = load_prompts("train")[:batch]
    return tokenize_prompts(tokenizer, texts, 24, device)


def _no_eos(shared: Any):
    """Context: EOS never sampled (its logit is never drawn as a real EOS: the id is moved out of
    range), so every run decodes all steps and the timings compare equal work."""
    class _Swap:
        def __enter__(self):
            self.eos = shared.eos_token_id
            shared.eos_token_id = -1
        def __exit__(self, *exc):
            shared.eos_token_id = self.eos
    return _Swap()


def time_sampler(shared: Any, ids: torch.Tensor, attn: torch.Tensor, new_tokens: int, fast: bool,
                 repeats: int) -> float:
    """Median seconds per decode step of sampling.sample_model (prefill included, then / steps)."""
    device = ids.device
    shared.fast_sampling = fast
    times = []
    with _no_eos(shared):
        for i in range(repeats + 2):  # 2 warm-ups (graph capture, allocator)
            torch.manual_seed(i)
            _sync(device)
            start = time.perf_counter()
            seq = sample_model(shared, ids, attn, new_tokens).sequences
            _sync(device)
            if i >= 2:
                times.append((time.perf_counter() - start) / (seq.shape[1] - ids.shape[1]))
    return statistics.median(times)


def time_hf_generate(shared: Any, ids: torch.Tensor, attn: torch.Tensor, new_tokens: int,
                     repeats: int) -> float:
    """Median seconds per decode step of transformers' `generate` (sampling, policy adapter on)."""
    device = ids.device
    shared.use("policy")
    times = []
    for i in range(repeats + 1):
        torch.manual_seed(i)
        _sync(device)
        start = time.perf_counter()
        seq = shared.peft.generate(input_ids=ids, attention_mask=attn, do_sample=True,
                                   top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                                   min_new_tokens=new_tokens, pad_token_id=shared.pad_token_id,
                                   eos_token_id=shared.eos_token_id)
        _sync(device)
        if i >= 1:
            times.append((time.perf_counter() - start) / (seq.shape[1] - ids.shape[1]))
    return statistics.median(times)


def check_equal_paths(device: str, batch: int, new_tokens: int, small: bool) -> dict[str, Any]:
    """float32, TF32 off: fast decoder vs plain loop, same seed: share of equal tokens, max
    |dlogp|."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    shared, tokenizer = build_model(device, torch.float32, small)
    ids, attn = _prompts(tokenizer, batch, device)
    out = {}
    for fast in (False, True):
        shared.fast_sampling = fast
        torch.manual_seed(7)
        out[fast] = sample_model(shared, ids, attn, new_tokens, with_logprobs=True)
    (seq_p, logp_p, _), (seq_f, logp_f, _) = out[False], out[True]
    width = min(seq_p.shape[1], seq_f.shape[1]) - ids.shape[1]
    same = (seq_p[:, ids.shape[1]:][:, :width] == seq_f[:, ids.shape[1]:][:, :width])
    # compare log-probs only up to the first differing token of each row (after it the rows diverge)
    agree = same.int().cumprod(dim=1).bool()
    diff = (logp_p[:, :width] - logp_f[:, :width]).abs()[agree]
    return {"fp32_token_agreement": float(same.float().mean()),
            "fp32_rows_identical": float(same.all(dim=1).float().mean()),
            "fp32_max_logprob_diff": float(diff.max()) if diff.numel() else float("nan")}


def check_bf16_vs_forward(shared: Any, ids: torch.Tensor, attn: torch.Tensor,
                          new_tokens: int) -> dict[str, float]:
    """Max |log-prob of the sampling loop - log-prob of one full policy forward| over real
    tokens."""
    figures = {}
    P = ids.shape[1]
    for fast in (False, True):
        shared.fast_sampling = fast
        torch.manual_seed(11)
        seq, logp, _ = sample_model(shared, ids, attn, new_tokens, with_logprobs=True)
        mask = shared.response_mask(seq[:, P:])
        forward = shared.policy_logprobs(seq, torch.cat([attn, mask.long()], dim=1), P)
        figures[f"{'fast' if fast else 'plain'}_loop_vs_forward_max_logprob_diff"] = float(
            ((logp - forward).abs() * mask).max())
    return figures


def main(fast: bool = False, device: str = "cpu", batch: int = 32, new_tokens: int = 64,
         json_path: str | None = None) -> dict[str, Any]:
    """Time the three samplers and check the fast path; returns the figures."""
    small = device == "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda needs a CUDA GPU")
    repeats = 2 if fast or small else 5
    if small:
        batch, new_tokens = min(batch, 8), min(new_tokens, 16)
    figures: dict[str, Any] = {"device": device, "batch": batch, "new_tokens": new_tokens}
    if device == "cuda":
        figures["gpu"] = torch.cuda.get_device_name()
    figures.update(check_equal_paths(device, batch, new_tokens, small))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shared, tokenizer = build_model(device, dtype, small)
    ids, attn = _prompts(tokenizer, batch, device)
    figures.update(check_bf16_vs_forward(shared, ids, attn, new_tokens) if device == "cuda" else {})
    dev = torch.device(device)
    floor_s = weight_bytes_per_step(shared) / copy_bandwidth(dev, 256 if small else 2048)
    for name, seconds in (("hf_generate", time_hf_generate(shared, ids, attn, new_tokens, repeats)),
                          ("plain_loop", time_sampler(
                              shared, ids, attn, new_tokens, False, repeats)),
                          ("fast_decoder", time_sampler(
                              shared, ids, attn, new_tokens, True, repeats))):
        figures[f"{name}_ms_per_step"] = 1e3 * seconds
        figures[f"{name}_tokens_per_s"] = batch / seconds
        figures[f"{name}_x_floor"] = seconds / floor_s
    figures["bandwidth_floor_ms_per_step"] = 1e3 * floor_s
    figures["speedup_fast_vs_hf_generate"] = (figures["hf_generate_ms_per_step"]
                                              / figures["fast_decoder_ms_per_step"])
    figures["goal_x_floor"] = SPEED_GOAL_X_FLOOR
    figures["goal_met"] = device == "cuda" and figures["fast_decoder_x_floor"] <= SPEED_GOAL_X_FLOOR
    if json_path:
        Path(json_path).write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--fast", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = main(args.fast, args.device, args.batch, args.new_tokens, args.json)
    for key, value in result.items():
        print(f"{key:44} {value:.4g}" if isinstance(value, float) else f"{key:44} {value}")
