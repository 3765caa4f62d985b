"""Build, pretrain and supervised-fine-tune the tiny GPT-2 of the `tiny` profile.

Two stages on the SFT corpus, both plain next-token cross-entropy:
1. pretraining: loss on every token of "prompt response<eos>" (learns the language);
2. SFT: loss on the response tokens and EOS only (learns to answer a prompt and to stop).
Dropout is 0 in the saved config (PPO needs two forwards of the same input to agree).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerBase


@dataclass
class TinyModelConfig:
    """Architecture and training schedule of the tiny model."""

    n_layer: int = 3  #: transformer blocks
    n_embd: int = 128  #: hidden size
    n_head: int = 4  #: attention heads
    n_positions: int = 64  #: longest sequence (prompt + response + EOS)
    pretrain_steps: int = 600  #: optimiser steps of stage 1 (loss on all tokens)
    sft_steps: int = 400  #: optimiser steps of stage 2 (loss on response tokens only)
    batch_size: int = 64  #: sequences per step
    learning_rate: float = 3e-3  #: peak AdamW learning rate (cosine decay, linear warm-up)
    warmup_steps: int = 50  #: warm-up steps at the start of each stage
    weight_decay: float = 0.01  #: AdamW weight decay
    seed: int = 0  #: seeds torch and the batch order

    @classmethod
    def fast(cls) -> TinyModelConfig:
        """A schedule short enough for tests (seconds): same architecture, few steps."""
        return cls(pretrain_steps=30, sft_steps=20, batch_size=16, warmup_steps=5)


def gpt2_config(tokenizer: PreTrainedTokenizerBase, config: TinyModelConfig) -> GPT2Config:
    """The GPT-2 config of the tiny model: dropouts 0, pad != EOS, EOS also used as BOS."""
    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=config.n_positions,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        summary_first_dropout=0.0,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def encode_examples(
    tokenizer: PreTrainedTokenizerBase, records: list[dict], max_length: int
) -> list[tuple[list[int], int]]:
    """(token ids of "prompt completion<eos>", number of prompt tokens) for each SFT record."""
    examples = []
    for record in records:
        prompt_ids = tokenizer(record["prompt"])["input_ids"]
        response_ids = tokenizer(record["completion"])["input_ids"] + [tokenizer.eos_token_id]
        ids = (prompt_ids + response_ids)[:max_length]
        examples.append((ids, len(prompt_ids)))
    return examples


def collate(
    examples: list[tuple[list[int], int]], pad_id: int, response_only: bool
) -> dict[str, torch.Tensor]:
    """Right-padded batch; labels are -100 at padding (and at the prompt if `response_only`)."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)  # (B, T)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)  # (B, T)
    for row, (ids, n_prompt) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        start = n_prompt if response_only else 0
        labels[row, start : len(ids)] = torch.tensor(ids[start:])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _lr_at(step: int, total: int, warmup: int, peak: float) -> float:
    # linear warm-up then cosine decay to 10% of the peak
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def length_bucketed_batches(
    examples: list[tuple[list[int], int]], batch_size: int, rng: random.Random
):
    """Endless stream of batches of similar length (less padding, so faster steps on a CPU).

    Each pass shuffles the examples, sorts windows of 50 batches by length, cuts them into
    batches and shuffles the batches; every example is used once per pass.
    """
    window = batch_size * 50
    while True:
        order = list(examples)
        rng.shuffle(order)
        batches = []
        for start in range(0, len(order) - batch_size + 1, window):
            chunk = sorted(order[start : start + window], key=lambda e: len(e[0]))
            batches += [chunk[i : i + batch_size]
                        for i in range(0, len(chunk) - batch_size + 1, batch_size)]
        rng.shuffle(batches)
        yield from batches


def train_stage(
    model: GPT2LMHeadModel,
    examples: list[tuple[list[int], int]],
    pad_id: int,
    steps: int,
    config: TinyModelConfig,
    response_only: bool,
    desc: str,
) -> list[float]:
    """Run `steps` AdamW steps on shuffled length-bucketed batches; returns every step's loss."""
    if len(examples) < config.batch_size:
        raise ValueError(
            f"need at least batch_size={config.batch_size} examples, got {len(examples)}"
        )
    rng = random.Random(config.seed + (1 if response_only else 0))
    batches = length_bucketed_batches(examples, config.batch_size, rng)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    model.train()
    losses: list[float] = []
    for step in tqdm(range(steps), desc=desc, leave=False):
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, steps, config.warmup_steps, config.learning_rate)
        batch = collate(next(batches), pad_id, response_only)
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def train_tiny_model(
    tokenizer: PreTrainedTokenizerBase, records: list[dict], config: TinyModelConfig
) -> tuple[GPT2LMHeadModel, dict]:
    """A freshly initialised tiny GPT-2, pretrained then SFT'd on `records`; and a training log."""
    torch.manual_seed(config.seed)
    # tiny activations late in training turn denormal and slow CPU matmuls down many times over
    torch.set_flush_denormal(True)
    model = GPT2LMHeadModel(gpt2_config(tokenizer, config))
    examples = encode_examples(tokenizer, records, config.n_positions)
    start = time.perf_counter()
    pretrain = train_stage(model, examples, tokenizer.pad_token_id, config.pretrain_steps, config,
                           response_only=False, desc="pretrain")
    sft = train_stage(model, examples, tokenizer.pad_token_id, config.sft_steps, config,
                      response_only=True, desc="sft")
    log = {
        "config": asdict(config),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": time.perf_counter() - start,
        "pretrain_loss_first_last": [pretrain[0], _tail_mean(pretrain)],
        "sft_loss_first_last": [sft[0], _tail_mean(sft)],
    }
    return model, log


def _tail_mean(values: list[float], n: int = 20) -> float:
    tail = values[-n:]
    return sum(tail) / len(tail)


def save_model(model: GPT2LMHeadModel, tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
    """Save model, tokenizer and a sampling generation config (temperature 1, no top-k/top-p)."""
    directory.mkdir(parents=True, exist_ok=True)
    model.generation_config.do_sample = True
    model.generation_config.temperature = 1.0
    model.generation_config.top_k = 0
    model.generation_config.top_p = 1.0
    model.generation_config.max_new_tokens = 40
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))


@torch.no_grad()
def sample_responses(
    model: GPT2LMHeadModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    max_new_tokens: int = 40,
    batch_size: int = 64,
    seed: int = 0,
) -> tuple[list[str], list[bool]]:
    """Sample one response per prompt at temperature 1 (no top-k/top-p).

    Returns the decoded responses (special tokens removed, with a leading space like the
    corpus) and whether each ended with EOS. Prompts are left-padded; `generate` derives the
    position ids from the attention mask (a plain forward pass does not: pass them there).
    """
    torch.manual_seed(seed)
    responses: list[str] = []
    ended: list[bool] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        batch = tokenizer(chunk, return_tensors="pt", padding=True, padding_side="left")
        out = model.generate(
            **batch,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        new_tokens = out[:, batch["input_ids"].shape[1] :]  # (B, new)
        for row in new_tokens.tolist():
            has_eos = tokenizer.eos_token_id in row
            if has_eos:
                row = row[: row.index(tokenizer.eos_token_id)]
            responses.append(" " + tokenizer.decode(row, skip_special_tokens=True))
            ended.append(has_eos)
    return responses, ended
