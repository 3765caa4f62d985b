"""What both sides of the TRL-baseline benchmark share: settings, models, rewards, evaluation.

Imported by `run_trl_ppo.py` (inside the separate trl==1.10.0 venv) and by `run_ours_ppo.py`
(inside the main venv), so it may use only torch, transformers and the light parts of
`rlhf_helpers` (the hidden scorer, the JSONL loaders and `runtime.architectures`), which both
environments have.
The parent (`benchmarks/bench_trl_baseline.py`) passes one `BenchSettings` as JSON to both, so
the two runs cannot drift apart in batch size, response length, epochs or learning rate.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# re-exported: bench_sampling.py imports SMOLLM2_135M_CONFIG from this module
from rlhf_helpers.runtime.architectures import SMOLLM2_135M_CONFIG

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The shipped tiny SFT model (word-level GPT-2) both sides start from.
TINY_MODEL_DIR = REPO_ROOT / "data" / "models" / "tiny-sft"

#: Architectures of random-init GPU runs (SmolLM2-135M's is defined in
#: rlhf_helpers.runtime.architectures).
RANDOM_INIT_CONFIGS = {"smollm2": SMOLLM2_135M_CONFIG}


@dataclass
class BenchSettings:
    """One PPO setting, applied identically to TRL's PPOTrainer and to our engine."""

    updates: int = 12  #: PPO updates (rollout batch + epochs of minibatch steps) to run and time
    #: first updates left out of the time-per-update median (allocator, caches)
    warmup_updates: int = 2
    batch_size: int = 32  #: prompts sampled per update (rollout batch)
    mini_batch_size: int = 8  #: sequences per optimiser step inside an update
    ppo_epochs: int = 4  #: passes over each rollout batch
    response_length: int = 40  #: max new tokens per response (EOS included)
    max_prompt_length: int = 16  #: prompts longer than this are cut from the left
    learning_rate: float = 1e-3  #: policy (and value) learning rate, constant schedule
    kl_coef: float = 0.05  #: fixed beta of the per-token k1 KL penalty
    clip_eps: float = 0.2  #: PPO ratio clip range
    value_clip: float = 0.2  #: value clipping range around the old values
    #: weight of the value loss (TRL: in one summed loss; ours: scales the critic's own loss)
    vf_coef: float = 0.1
    gamma: float = 1.0  #: GAE discount
    lam: float = 0.95  #: GAE lambda
    temperature: float = 1.0  #: sampling temperature (1.0: the policy's own distribution)
    lora_r: int = 8  #: LoRA rank of the policy adapter (0: full fine-tuning on both sides)
    lora_alpha: int = 16  #: LoRA alpha (scale = alpha / r)
    #: LoRA-wrapped module names
    lora_target_modules: list[str] = field(default_factory=lambda: ["c_attn", "c_proj", "c_fc"])
    #: "hidden": the hidden ground-truth scorer; else a reward-model directory
    reward: str = "hidden"
    eval_every: int = 2  #: evaluate on held-out prompts every this many updates (not timed)
    n_eval_prompts: int = 64  #: held-out prompts per evaluation
    seed: int = 0  #: torch / sampling / data-order seed
    device: str = "cpu"  #: "cpu" or "cuda"
    dtype: str = "float32"  #: parameter dtype name ("bfloat16" on a GPU)
    model_dir: str = str(TINY_MODEL_DIR)  #: SFT model both sides start from
    random_init_config: str | None = None  #: "smollm2": random weights of that architecture instead
    #: torch.set_num_threads on the CPU (1: steadier on a busy 2-core machine)
    torch_threads: int = 1

    def validate(self) -> BenchSettings:
        """Raise ValueError on settings that cannot work on both sides."""
        positive = ("updates", "batch_size", "mini_batch_size", "ppo_epochs", "response_length",
                    "max_prompt_length", "eval_every", "n_eval_prompts", "torch_threads")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size % self.mini_batch_size:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of "
                             f"mini_batch_size ({self.mini_batch_size})")
        if not 0 <= self.warmup_updates < self.updates:
            raise ValueError(f"warmup_updates must be in [0, updates), got {self.warmup_updates}")
        if self.random_init_config not in (None, *RANDOM_INIT_CONFIGS):
            raise ValueError("random_init_config must be None or one of "
                             f"{sorted(RANDOM_INIT_CONFIGS)}, got {self.random_init_config!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        return self

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BenchSettings:
        return cls(**json.loads(text)).validate()


# ----------------------------------------------------------------------------- process measurements
def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    """Resident set size of this process now, in MB (from /proc/self/statm)."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


class UpdateClock:
    """Wall time and process CPU time per PPO update, with evaluation time between updates taken
    out.

    Call `update_done()` right when an update finishes and `resume()` when the loop goes on
    after any evaluation: an update's time is the time from the previous `resume()` to its
    `update_done()`. CPU time (`time.process_time`, all threads of this process) is the steadier
    figure on a shared machine: other processes' load stretches wall time, not this process's CPU
    time.
    """

    def __init__(self) -> None:
        self.seconds: list[float] = []  #: wall seconds of each update
        self.cpu_seconds: list[float] = []  #: CPU seconds of each update
        self.resume()

    def resume(self) -> None:
        self._since = time.perf_counter()
        self._cpu_since = time.process_time()

    def update_done(self) -> float:
        elapsed = time.perf_counter() - self._since
        self.seconds.append(elapsed)
        self.cpu_seconds.append(time.process_time() - self._cpu_since)
        return elapsed


class TrainingPeak:
    """Peak CUDA memory of the training updates alone, and of the whole run with evaluations.

    Evaluations sample and score 128 held-out prompts in one batch; their (B, L, V) logits can
    exceed what an update needs, and the anchor compares updates. Call `pause()` before an
    evaluation and `resume()` after it: `peak` is the largest allocation seen between a `resume()`
    (or `start()`) and the next `pause()` (or `finish()`), `peak_with_evaluations` the largest seen
    at all. `read` and `reset` default to torch.cuda's `max_memory_allocated` and
    `reset_peak_memory_stats`.
    """

    def __init__(self, read: Callable[[], int] | None = None,
                 reset: Callable[[], None] | None = None) -> None:
        if read is None or reset is None:
            import torch

            read, reset = torch.cuda.max_memory_allocated, torch.cuda.reset_peak_memory_stats
        self._read, self._reset = read, reset
        self.peak = 0  #: bytes, training updates only
        self.peak_with_evaluations = 0  #: bytes, the whole run

    def start(self) -> None:
        self._reset()

    def pause(self) -> None:
        seen = self._read()
        self.peak, self.peak_with_evaluations = max(self.peak,
                                                    seen), max(self.peak_with_evaluations, seen)

    def resume(self) -> None:
        self.peak_with_evaluations = max(self.peak_with_evaluations, self._read())
        self._reset()

    def finish(self) -> None:
        self.pause()


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of an empty sequence")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


# ----------------------------------------------------------------------------- data and models
def load_prompt_texts(split: str, limit: int | None = None) -> list[str]:
    """Prompts of data/prompts_{split}.jsonl (validated by rlhf_helpers.runtime.data)."""
    from rlhf_helpers.runtime.data import load_prompts

    prompts = load_prompts(split)
    return prompts[:limit] if limit is not None else prompts


def load_tokenizer(settings: BenchSettings) -> Any:
    """The shipped word-level tokenizer (also for random-init runs: only timing matters there)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR))
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        raise ValueError("the shipped tokenizer must have a pad token distinct from EOS")
    tokenizer.padding_side = "left"
    tokenizer.truncation_side = "left"  # a long prompt keeps its end: the response follows it
    return tokenizer


def model_config(settings: BenchSettings, tokenizer: Any, **overrides: Any) -> Any:
    """The config both sides build their models from, dropout 0 (PPO compares two forwards)."""
    from transformers import AutoConfig

    if settings.random_init_config is None:
        config = AutoConfig.from_pretrained(settings.model_dir)
    else:
        spec = dict(RANDOM_INIT_CONFIGS[settings.random_init_config])
        config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    drop = {k: 0.0 for k, v in config.to_dict().items()
            if ("dropout" in k or "pdrop" in k) and isinstance(v, float)}
    for key, value in {**drop, **overrides}.items():
        setattr(config, key, value)
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.bos_token_id = tokenizer.eos_token_id
    return config


def load_model(settings: BenchSettings, auto_class: Any, tokenizer: Any, seed_offset: int = 0,
               **config_overrides: Any) -> Any:
    """`auto_class` from the SFT directory, or randomly initialised (seeded) for random-init
    runs."""
    import torch

    config = model_config(settings, tokenizer, **config_overrides)
    dtype = getattr(torch, settings.dtype)
    if settings.random_init_config is None:
        model = auto_class.from_pretrained(settings.model_dir, config=config, dtype=dtype)
    else:
        torch.manual_seed(settings.seed + seed_offset)
        model = auto_class.from_config(config, dtype=dtype)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.to(settings.device)


# ----------------------------------------------------------------------------- rewards
def split_response_ids(row: Sequence[int], context_length: int, pad_id: int,
                       eos_id: int) -> list[int]:
    """Response ids of one query+response row: after the prompt, up to (excluding) EOS or pad."""
    response = []
    for token in row[context_length:]:
        if token in (eos_id, pad_id):
            break
        response.append(token)
    return response


def decode_pairs(tokenizer: Any, query_responses: Any,
                 context_length: int) -> tuple[list[str], list[str]]:
    """(prompts, responses) texts of left-padded queries followed by responses."""
    prompts, responses = [], []
    for row in query_responses.tolist():
        prompts.append(tokenizer.decode(row[:context_length], skip_special_tokens=True))
        ids = split_response_ids(row, context_length, tokenizer.pad_token_id,
                                 tokenizer.eos_token_id)
        responses.append(" " + tokenizer.decode(ids, skip_special_tokens=True))
    return prompts, responses


def hidden_score_texts(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """The hidden ground-truth score of each (prompt, response) pair."""
    from rlhf_helpers.world.scorer import hidden_scores

    return hidden_scores(list(prompts), list(responses))


# ----------------------------------------------------------------------------- evaluation
def evaluate(
    tokenizer: Any,
    prompts: Sequence[str],
    settings: BenchSettings,
    generate: Callable[[Any, Any], Any],
    policy_logprobs: Callable[[Any, Any, int], Any],
    ref_logprobs: Callable[[Any, Any, int], Any],
) -> dict[str, float]:
    """Mean hidden score and mean sequence KL(policy || ref) of samples on held-out prompts.

    KL per sequence = sum over response tokens (EOS included, padding excluded) of
    log pi(y_t) - log ref(y_t) for sampled y_t: the k1 estimate, unbiased for the sequence KL.
    `generate(input_ids, attention_mask) -> (B, P + R)`;
    `*_logprobs(query_responses, attention_mask, context_length) -> (B, R)` for the response tokens.
    The same seed is used for every evaluation, so curves compare like with like.
    """
    import torch

    batch = tokenizer(list(prompts), return_tensors="pt", padding=True, truncation=True,
                      max_length=settings.max_prompt_length, padding_side="left")
    input_ids = batch["input_ids"].to(settings.device)  # (B, P)
    attention = batch["attention_mask"].to(settings.device)  # (B, P)
    context = input_ids.shape[1]
    devices = [settings.device] if settings.device == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(settings.seed + 12345)
        with torch.no_grad():
            sequences = generate(input_ids, attention)  # (B, P + R)
    responses = sequences[:, context:]  # (B, R)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    # mask: real response tokens up to and including the first EOS
    is_eos = (responses == eos).int()
    after_eos = (torch.cumsum(is_eos, dim=1) - is_eos) > 0  # (B, R)
    mask = (~after_eos) & (responses != pad)  # (B, R)
    full_attention = torch.cat([attention, mask.long()], dim=1)  # (B, P + R)
    with torch.no_grad():
        logp = policy_logprobs(sequences, full_attention, context)  # (B, R)
        ref = ref_logprobs(sequences, full_attention, context)  # (B, R)
    kl = ((logp - ref) * mask).sum(dim=1)  # (B,)
    texts_prompts, texts_responses = decode_pairs(tokenizer, sequences.masked_fill(~torch.cat(
        [attention.bool(), mask], dim=1), pad), context)
    scores = torch.tensor(hidden_score_texts(texts_prompts, texts_responses),
                          dtype=torch.float64)  # (B,)
    return {
        "kl": float(kl.mean()),
        "hidden_score": float(scores.mean()),
        # standard error of that mean: how far a rerun with other samples could move it
        "hidden_score_se": float(scores.std() / len(scores) ** 0.5) if len(scores) > 1
        else float("nan"), "response_tokens": float(mask.sum(dim=1).float().mean()),
        "eos_fraction": float((is_eos.sum(dim=1) > 0).float().mean()),
    }


def causal_lm_logprobs(model: Any, sequences: Any, attention_mask: Any, context_length: int) -> Any:
    """Per-token log-probs (B, R) of the response tokens under a causal LM, left-pad aware."""
    import torch

    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)  # (B, T): GPT-2 needs them, left pad
    logits = model(input_ids=sequences, attention_mask=attention_mask,
                   position_ids=position_ids).logits  # (B, T, V)
    logits = logits[:, context_length - 1 : -1].float()  # (B, R, V): position t predicts token t+1
    targets = sequences[:, context_length:]  # (B, R)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(payload, indent=2))
