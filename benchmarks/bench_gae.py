"""Benchmark: vectorised `compute_gae` against the seeds' per-sample, per-token Python loop.

B = 64 responses of up to T = 256 tokens on the CPU, medians of several repeats taken in one run,
reported as a ratio (goal: at least 20x). Also checks that the two agree. For context it times
the batched reverse loop (one Python step per token, vectorised over the batch, as trlx does).
Timings on a shared machine are noisy; the ratio is what to compare.

    python -m benchmarks gae
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from rlhf_helpers import compute_gae

#: Speed-up of compute_gae over the per-sample, per-token loop that the issue asks for.
GOAL_SPEEDUP = 20.0


def gae_seed_loop(rewards, values, mask, gamma, lam):
    """The seeds' GAE: for each sample, for each token backwards, scalar tensor arithmetic."""
    advantages = torch.zeros_like(rewards)  # (B, T)
    returns = torch.zeros_like(rewards)  # (B, T)
    for b in range(rewards.shape[0]):
        length = int(mask[b].sum())
        lastgaelam = 0.0
        for t in reversed(range(length)):
            next_value = values[b, t + 1] if t < length - 1 else 0.0
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            lastgaelam = delta + gamma * lam * lastgaelam
            advantages[b, t] = lastgaelam
            returns[b, t] = lastgaelam + values[b, t]
    return advantages, returns


def gae_batched_token_loop(rewards, values, mask, gamma, lam):
    """trlx-style: one Python step per token, vectorised over the batch."""
    next_values = torch.zeros_like(values)  # (B, T)
    next_values[:, :-1] = values[:, 1:] * mask[:, 1:]
    deltas = (rewards + gamma * next_values - values) * mask  # (B, T)
    advantages = torch.zeros_like(rewards)  # (B, T)
    running = torch.zeros_like(rewards[:, 0])  # (B,)
    for t in reversed(range(rewards.shape[1])):
        running = (deltas[:, t] + gamma * lam * running) * mask[:, t]
        advantages[:, t] = running
    return advantages, (advantages + values) * mask


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(B: int = 64, T: int = 256, gamma: float = 1.0, lam: float = 0.95, fast: bool = False) -> dict:
    """Time the three GAE implementations on one seeded batch; print a table, return the figures."""
    torch.manual_seed(0)
    lengths = torch.randint(T // 4, T + 1, (B,))  # (B,): variable-length responses
    lengths[0] = T  # at least one full-length row
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # (B, T)
    rewards = torch.randn(B, T) * mask  # (B, T)
    values = torch.randn(B, T) * mask  # (B, T)
    args = (rewards, values, mask, gamma, lam)

    loop_repeats, fast_repeats = (1, 5) if fast else (3, 50)
    seconds = {
        "seed loop (per sample, per token)": median_seconds(lambda: gae_seed_loop(*args), loop_repeats),
        "batched token loop (trlx)": median_seconds(lambda: gae_batched_token_loop(*args), fast_repeats),
        "compute_gae (vectorised)": median_seconds(lambda: compute_gae(*args), fast_repeats),
    }
    adv, ret = compute_gae(*args)
    seed_adv, seed_ret = gae_seed_loop(*args)
    max_diff = max((adv - seed_adv).abs().max().item(), (ret - seed_ret).abs().max().item())

    vectorised = seconds["compute_gae (vectorised)"]
    print(f"GAE on B={B}, T={T}, gamma={gamma}, lam={lam}, CPU, {torch.get_num_threads()} torch threads")
    print(f"{'implementation':<36} {'median ms':>10} {'x slower than compute_gae':>27}")
    for name, sec in seconds.items():
        print(f"{name:<36} {sec * 1e3:>10.3f} {sec / vectorised:>27.1f}")
    speedup = seconds["seed loop (per sample, per token)"] / vectorised
    verdict = "meets" if speedup >= GOAL_SPEEDUP else "MISSES"
    print(f"speed-up over the seed loop: {speedup:.0f}x ({verdict} the {GOAL_SPEEDUP:.0f}x goal); "
          f"max |difference| {max_diff:.2e}")
    return {
        "B": B,
        "T": T,
        "torch_threads": torch.get_num_threads(),
        "seed_loop_ms": seconds["seed loop (per sample, per token)"] * 1e3,
        "batched_token_loop_ms": seconds["batched token loop (trlx)"] * 1e3,
        "compute_gae_ms": vectorised * 1e3,
        "speedup_vs_seed_loop": speedup,
        "speedup_vs_batched_token_loop": seconds["batched token loop (trlx)"] / vectorised,
        "goal_speedup": GOAL_SPEEDUP,
        "meets_goal": speedup >= GOAL_SPEEDUP,
        "max_abs_difference": max_diff,
    }


if __name__ == "__main__":
    main()
