"""Benchmark: vectorised `compute_gae` against the seeds' per-sample, per-token Python loop.

B = 64 responses of up to T = 256 tokens on the CPU, medians of interleaved repeats in one run,
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

#: Goal: the speed-up of compute_gae over the per-sample, per-token loop.
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


def interleaved_medians(fns: dict[str, tuple[Callable[[], object], int]],
                        rounds: int) -> dict[str, float]:
    """Median wall time per call of each function, over `rounds` rounds that call each in turn
    (`calls` times per round), so a load spike on the shared machine hits all of them alike."""
    for fn, _ in fns.values():
        fn()  # warm-up (caches, allocator, thread pool)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, (fn, calls) in fns.items():
            for _ in range(calls):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def measure(args: tuple, rounds: int, fast_calls: int) -> dict[str, float]:
    """Median seconds per call of the three implementations at the current torch thread count."""
    return interleaved_medians(
        {
            "seed loop (per sample, per token)": (lambda: gae_seed_loop(*args), 1),
            "batched token loop (trlx)": (lambda: gae_batched_token_loop(*args), fast_calls),
            "compute_gae (vectorised)": (lambda: compute_gae(*args), fast_calls),
        },
        rounds,
    )


def main(B: int = 64, T: int = 256, gamma: float = 1.0, lam: float = 0.95,
         fast: bool = False) -> dict:
    """Time the three GAE implementations on one seeded batch; print a table, return the figures.

    Measured twice: with torch's default thread count and with one thread. On a loaded machine with
    few cores (the shared 2-core box), waking a second thread for a small matrix product can cost
    more than the product itself; the one-thread column shows the work without that overhead.
    """
    torch.manual_seed(0)
    lengths = torch.randint(T // 4, T + 1, (B,))  # (B,): variable-length responses
    lengths[0] = T  # at least one full-length row
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # (B, T)
    rewards = torch.randn(B, T) * mask  # (B, T)
    values = torch.randn(B, T) * mask  # (B, T)
    args = (rewards, values, mask, gamma, lam)
    rounds, fast_calls = (1, 5) if fast else (5, 20)

    default_threads = torch.get_num_threads()
    per_threads = {default_threads: measure(args, rounds, fast_calls)}
    if default_threads != 1:
        torch.set_num_threads(1)
        try:
            per_threads[1] = measure(args, rounds, fast_calls)
        finally:
            torch.set_num_threads(default_threads)

    adv, ret = compute_gae(*args)
    seed_adv, seed_ret = gae_seed_loop(*args)
    max_diff = max((adv - seed_adv).abs().max().item(), (ret - seed_ret).abs().max().item())

    print(f"GAE on B={B}, T={T}, gamma={gamma}, lam={lam}, CPU; median ms per call")
    header = "".join(f"{f'{n} thread(s)':>14}" for n in per_threads)
    print(f"{'implementation':<36}{header}")
    for name in per_threads[default_threads]:
        print(f"{name:<36}" + "".join(f"{sec[name] * 1e3:>14.3f}" for sec in per_threads.values()))
    speedups = {
        n: sec["seed loop (per sample, per token)"] / sec["compute_gae (vectorised)"]
        for n, sec in per_threads.items()
    }
    print(f"{'speed-up over the seed loop':<36}"
          + "".join(f"{f'{x:.0f}x':>14}" for x in speedups.values()))
    verdict = "meets" if speedups[default_threads] >= GOAL_SPEEDUP else "MISSES"
    print(
        f"default threads {verdict} the {GOAL_SPEEDUP:.0f}x goal; max |difference| {max_diff:.2e}")

    seconds = per_threads[default_threads]
    figures = {
        "B": B,
        "T": T,
        "torch_threads": default_threads,
        "seed_loop_ms": seconds["seed loop (per sample, per token)"] * 1e3,
        "batched_token_loop_ms": seconds["batched token loop (trlx)"] * 1e3,
        "compute_gae_ms": seconds["compute_gae (vectorised)"] * 1e3,
        "speedup_vs_seed_loop": speedups[default_threads],
        "speedup_vs_batched_token_loop": (
            seconds["batched token loop (trlx)"] / seconds["compute_gae (vectorised)"]
        ),
        "goal_speedup": GOAL_SPEEDUP,
        "meets_goal": speedups[default_threads] >= GOAL_SPEEDUP,
        "max_abs_difference": max_diff,
    }
    if 1 in per_threads and default_threads != 1:
        figures["compute_gae_ms_1_thread"] = per_threads[1]["compute_gae (vectorised)"] * 1e3
        figures["speedup_vs_seed_loop_1_thread"] = speedups[1]
    return figures


if __name__ == "__main__":
    main()
