"""Where one PPO update of our engine spends its time, on bench_trl_baseline's tiny settings.

    python -m benchmarks.profile_ppo_step                # CPU-time breakdown of a few updates
    python -m benchmarks.profile_ppo_step --cprofile 30  # + one update's top 30 functions, cProfile
    python -m benchmarks.profile_ppo_step --torch 25     # + the top 25 torch ops of one update
    python -m benchmarks.profile_ppo_step --device cuda  # bench_trl_baseline's GPU anchor (SmolLM2)
    python -m benchmarks.profile_ppo_step --compile      # the packed forward under torch.compile

One torch thread. On the CPU, times are process CPU seconds (`time.process_time`), steadier than
wall time on a shared machine; on CUDA they are wall seconds after a device synchronize, with the
process CPU seconds beside them (CPU ~ wall: the host, not the GPU, bounds the step). Each phase is
timed around the same calls `PPOTrainer.step()` makes. Not a
`bench_*` module: it reports no goal, it tells where to look.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")


def build_trainer(updates: int = 12, device: str = "cpu") -> Any:
    """Our trainer exactly as `trl_baseline/run_ours_ppo.py` builds it (hidden reward): the tiny
    profile on the CPU, the random-init SmolLM2-135M GPU anchor on CUDA."""
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.bench_trl_baseline import settings_from_profile
    from benchmarks.trl_baseline.common import (
        load_model,
        load_prompt_texts,
        load_tokenizer,
    )
    from benchmarks.trl_baseline.run_ours_ppo import build_engine

    settings = settings_from_profile(fast=False, device=device,
                                     random_init_config="smollm2" if device == "cuda" else None)
    settings.updates = updates
    torch.manual_seed(settings.seed)
    tokenizer = load_tokenizer(settings)
    base = load_model(settings, AutoModelForCausalLM, tokenizer)
    return build_engine(settings, base, tokenizer, load_prompt_texts("train"))


class PhaseClock:
    """Seconds per named phase, summed over calls: CPU seconds, or wall seconds after a CUDA
    sync."""

    def __init__(self, cuda: bool = False) -> None:
        self.seconds: dict[str, float] = {}
        self.cuda = cuda

    def now(self) -> float:
        if not self.cuda:
            return time.process_time()
        import torch

        torch.cuda.synchronize()
        return time.perf_counter()

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self.now()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase] = self.seconds.get(phase, 0.0) + self.now() - start

        setattr(owner, name, timed)


def breakdown(trainer: Any, steps: int) -> dict[str, float]:
    """Mean CPU seconds per update, total and by phase, over `steps` updates."""
    import rlhf_helpers.ppo.iteration as iteration
    import rlhf_helpers.ppo.trainer as trainer_module

    clock = PhaseClock(cuda=trainer.model.device.type == "cuda")
    clock.wrap(trainer_module, "rollout", "rollout")
    clock.wrap(iteration, "sample_responses", "rollout: sample")
    clock.wrap(iteration, "score_samples", "rollout: reward")
    clock.wrap(trainer, "update", "update epochs")
    model = trainer.model
    for method in ("policy_logprobs", "ref_logprobs", "values"):
        clock.wrap(model, method, f"model.{method} (rollout + update)")
    start, cpu_start = clock.now(), time.process_time()
    for _ in range(steps):
        trainer.step()
    total = clock.now() - start
    seconds = {k: v / steps for k, v in clock.seconds.items()}
    out = {"total": total / steps, "process CPU s (all phases)": (time.process_time() - cpu_start)
           / steps, "rollout": seconds.pop("rollout")}
    out["rollout: sample"] = seconds.pop("rollout: sample")
    out["rollout: reward"] = seconds.pop("rollout: reward")
    out["rollout: other (forward passes, GAE)"] = (out["rollout"] - out["rollout: sample"]
                                                   - out["rollout: reward"])
    out["update epochs"] = seconds.pop("update epochs")
    out["rest of step (metrics)"] = out["total"] - out["rollout"] - out["update epochs"]
    out.update(sorted(seconds.items()))
    return out


def compile_forwards(trainer: Any) -> None:
    """Compile the packed forward the update and the scoring passes run (torch.compile with
    dynamic shapes: the real-token count changes every minibatch), and print what the step that
    compiles it costs."""
    import torch
    import torch._dynamo

    import rlhf_helpers.ppo.model.shared_model as shared_model

    if not trainer.model.packed:
        raise SystemExit("--compile: this model does not run the packed GPT-2 forward (GPT-2 on "
                         "the tiny profile's CPU path only), so there is nothing to compile")
    shared_model.packed_hidden = torch.compile(shared_model.packed_hidden, dynamic=True)
    cpu, wall = time.process_time(), time.perf_counter()
    trainer.step()
    print(f"the step that compiled: {time.process_time() - cpu:.1f} CPU s, "
          f"{time.perf_counter() - wall:.1f} wall s")
    trainer.step()  # a second step: a shape or mode the first did not meet compiles here
    counters = torch._dynamo.utils.counters
    gave_up = sum(n for why, n in counters["unimplemented"].items() if "recompile limit" in why)
    # a frame over the recompile limit runs eagerly from then on: the timing would not be compiled
    print(f"torch.compile: {counters['stats']['unique_graphs']} graphs; frames "
          f"{counters['frames']['ok']} of {counters['frames']['total']} compiled; graph breaks "
          f"{sum(counters['graph_break'].values())}; recompile limit hit {gave_up} times")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="timed updates after the warm-up")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed updates first (--compile adds its own two: compare it with "
                             "--warmup 4 without it, the same updates timed)")
    parser.add_argument("--cprofile", type=int, default=0,
                        help="print this many cProfile rows (0: off)")
    parser.add_argument("--torch", type=int, default=0,
                        help="print this many torch.profiler rows (0: off)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--trace", default="",
                        help="write the torch.profiler trace (Chrome JSON) here")
    parser.add_argument("--compile", action="store_true",
                        help="compile the packed GPT-2 forward (torch.compile, dynamic shapes) "
                             "after the warm-up, and time the step that compiles it")
    cli = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    trainer = build_trainer(device=cli.device)
    for _ in range(cli.warmup):
        trainer.step()
    if cli.compile:
        compile_forwards(trainer)
    if cli.cprofile:
        profiler = cProfile.Profile()
        profiler.enable()
        trainer.step()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(cli.cprofile)
        print(text.getvalue())
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(cli.cprofile)
        print(text.getvalue())
    if cli.torch:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                               if cli.device == "cuda" else [])
        with profile(activities=activities) as prof:
            trainer.step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=cli.torch))
        if cli.device == "cuda":
            print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=cli.torch))
            events = prof.key_averages()
            cuda_s = sum(e.self_device_time_total for e in events) / 1e6
            launches = sum(e.count for e in events
                           if e.key.startswith("cuda") and "Launch" in e.key)
            print(f"GPU busy (sum of kernel self times) in one update: {cuda_s:.3f} s; "
                  f"CUDA kernel launches: {launches}")
        if cli.trace:
            prof.export_chrome_trace(cli.trace)
    figures = breakdown(trainer, cli.steps)
    width = max(len(k) for k in figures)
    unit = "wall s (CUDA synced)" if cli.device == "cuda" else "CPU s"
    print(f"{unit} per update (mean of {cli.steps}, after warm-up), step {trainer.step_count}:")
    for key, value in figures.items():
        print(f"  {key:<{width}}  {value:.3f}")


if __name__ == "__main__":
    main()
