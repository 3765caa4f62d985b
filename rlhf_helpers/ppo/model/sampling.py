"""Sampling responses from the shared model: one loop, two ways to run a decode step.

    out = sample_model(shared, prompt_ids, prompt_mask, max_new_tokens=48, with_logprobs=True)
    out.sequences, out.logprobs, out.entropy     # (B, P + R), (B, R), (B, R)
    out = sample(lm, prompt_ids, prompt_mask, 48, eos_token_id=..., pad_token_id=...)  # any LM

The loop draws y_t ~ softmax(z_t / T) for every row at once (no top-k, no top-p: PPO needs the
policy's own distribution) until every row has written its EOS or R = max_new_tokens; a row that
ended writes pad. Two decoders compute z_t:

- `PlainDecoder`: the model's own forward with transformers' dynamic KV cache, one token per step.
  Any architecture, any device; the reference path.
- `gpt2_decoder.GPT2CacheDecoder` (GPT-2, the tiny profile): the same layers called directly over a
  preallocated KV cache; what `SharedLoRAModel` uses when its forwards are packed (`model.packed`).
- `fast_decoder.StaticLlamaDecoder` (the CUDA fast path): a Llama-family decode step over a static
  KV cache, each LoRA adapter folded into its base weight, captured once as a CUDA graph and
  replayed every token (that module says why). On a CPU it runs eagerly (tests).

`sample_model(shared, ...)` samples a `SharedLoRAModel` (the adapter chosen, the fast decoder where
it applies); `samples.sample_responses` turns prompt texts into a `Samples` batch with it.

Host-device syncs: the stop test (has every row ended?) is read every `stop_check_every` tokens
(CUDA: 8), not every token; the columns sampled after the last row ended are all pad and are cut
off, so the result does not depend on it. The sampling draws (torch.multinomial on the global RNG)
are the same ops in the same order on both paths, so the same seed gives the same tokens wherever
the two decoders' logits agree.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn

from rlhf_helpers.core.checks import (
    NonFiniteError,
    check_temperature,
    check_token_batch,
    validation,
)
from rlhf_helpers.core.logprobs import entropy_from_logits, logprobs_from_logits
from rlhf_helpers.core.tokens import position_ids_from_mask
from rlhf_helpers.ppo.model.fast_decoder import StaticLlamaDecoder
from rlhf_helpers.ppo.model.gpt2_decoder import GPT2CacheDecoder
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel


class SampleOutput(NamedTuple):
    """What the sampling loop returns: a named tuple (`seq, logp, ent = sample_model(...)`)."""

    sequences: torch.Tensor  #: (B, P + R) prompt ids then sampled ids (pad after a row's EOS)
    logprobs: torch.Tensor | None  #: (B, R) log pi_T(y_t) of the sampled tokens (with_logprobs)
    entropy: torch.Tensor | None  #: (B, R) entropy of pi_T at each step (with_logprobs only)


# ----------------------------------------------------------------------------- decoders
class Decoder(Protocol):
    """What the loop needs of a decoder: the prompt pass, then one token per row per step."""

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                max_new_tokens: int) -> torch.Tensor:
        """(B, P) prompts -> logits of the first response token (B, V)."""

    def decode(self, token: torch.Tensor, position: torch.Tensor,
               keep: torch.Tensor) -> torch.Tensor:
        """token, position, keep (B,) -> logits of the next token (B, V)."""


class PlainDecoder:
    """z_t from the model's own forward and dynamic KV cache (any causal LM, any device)."""

    def __init__(self, lm: nn.Module) -> None:
        self.lm = lm
        self.mask: torch.Tensor | None = None  #: (B, P + t) attended keys
        self.past: Any = None

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                max_new_tokens: int) -> torch.Tensor:
        """Prompt pass: (B, P) -> logits of the first response token (B, V)."""
        self.mask = attention_mask.long()  # (B, P)
        last = torch.tensor([input_ids.shape[1] - 1], device=input_ids.device)  # the last position
        out = self.lm(input_ids=input_ids, attention_mask=self.mask,
                      position_ids=position_ids_from_mask(self.mask), use_cache=True,
                      logits_to_keep=last)
        self.past = out.past_key_values
        return out.logits[:, -1]  # (B, V)

    def decode(self, token: torch.Tensor, position: torch.Tensor,
               keep: torch.Tensor) -> torch.Tensor:
        """One token per row: token (B,), its position (B,), keep (B,) bool (False: the row has
        ended and its token is not attended) -> logits of the next token (B, V)."""
        self.mask = torch.cat([self.mask, keep.long()[:, None]], dim=1)  # (B, P + t + 1)
        out = self.lm(input_ids=token[:, None], attention_mask=self.mask,
                      position_ids=position[:, None], past_key_values=self.past, use_cache=True)
        self.past = out.past_key_values
        return out.logits[:, -1]  # (B, V)


# ----------------------------------------------------------------------------- the loop
def _trim_after_all_ended(tokens: torch.Tensor, eos_token_id: int) -> int:
    """Response width R: 1 + the step the last row wrote its EOS at (all steps if a row never did).

    tokens (B, S) as sampled, pad after each row's EOS. Columns after R are pad in every row.
    """
    is_eos = tokens == eos_token_id  # (B, S)
    if not bool(is_eos.any(dim=1).all()):
        return tokens.shape[1]
    first_eos = is_eos.int().argmax(dim=1)  # (B,)
    return int(first_eos.max()) + 1


@torch.no_grad()
def sample(lm: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
           max_new_tokens: int, eos_token_id: int, pad_token_id: int, temperature: float = 1.0,
           with_logprobs: bool = False, decoder: Decoder | None = None,
           stop_check_every: int | None = None) -> SampleOutput:
    """Sample responses to left-padded prompts: (B, P) -> SampleOutput with sequences (B, P + R).

    `decoder`: how logits are computed (default `PlainDecoder(lm)`); the model's adapter is whatever
    the caller has set. `stop_check_every`: read the "every row ended" flag every this many tokens
    (default 1 on a CPU, 8 on CUDA, where each read waits for the GPU). NaN/inf logits raise
    NonFiniteError (a ValueError) after the loop instead of crashing `torch.multinomial`.
    """
    if stop_check_every is None:
        stop_check_every = 1 if input_ids.device.type == "cpu" else 8
    if stop_check_every < 1:
        raise ValueError(f"stop_check_every must be >= 1, got {stop_check_every}")
    if not bool(attention_mask[:, -1].all()):  # the first token comes from the last column's logits
        raise ValueError(
            "attention_mask must be left-padded: every prompt's last column a real token")
    decoder = decoder if decoder is not None else PlainDecoder(lm)
    batch = input_ids.shape[0]
    logits = decoder.prefill(input_ids, attention_mask, max_new_tokens)  # (B, V)
    next_pos = position_ids_from_mask(attention_mask)[:, -1] + 1  # (B,)
    done = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)  # (B,)
    broken = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)  # (B,) met NaN/inf
    tokens, logprobs, entropies = [], [], []
    for step in range(max_new_tokens):
        # pi_T(v) = softmax(z / T)_v: the distribution that draws the token
        scaled = logits.float() / temperature  # (B, V)
        finite = torch.isfinite(scaled).all(dim=-1)  # (B,)
        broken = broken | ~finite
        # a NaN/inf row would crash multinomial (CPU) or trip a device assert (CUDA): it draws from
        # zeros instead, and the flag, read with the loop's own stop test, raises after the loop
        scaled = torch.where(finite[:, None], scaled, torch.zeros_like(scaled))  # (B, V)
        token = torch.multinomial(torch.softmax(scaled, dim=-1), 1).squeeze(-1)  # (B,)
        token = torch.where(done, torch.full_like(token, pad_token_id), token)
        tokens.append(token)
        if with_logprobs:  # log pi_T(y_t) and H_t of the sampling distribution at this step
            step_logits = scaled[:, None]  # (B, 1, V)
            with validation(False):  # ids are in range, `broken` covers NaN: no sync per token
                logprobs.append(logprobs_from_logits(step_logits, token[:, None])[:, 0])  # (B,)
                entropies.append(entropy_from_logits(step_logits)[:, 0])  # (B,)
        done = done | (token == eos_token_id)
        if step == max_new_tokens - 1:
            break
        if (step + 1) % stop_check_every == 0 and bool(done.all() | broken.any()):
            break
        logits = decoder.decode(token, next_pos, ~done)  # (B, V)
        next_pos = next_pos + 1
    if bool(broken.any()):
        raise NonFiniteError(f"sampling logits must be finite, but {int(broken.sum())} of {batch} "
                         f"rows met NaN or inf {'at' if stop_check_every == 1 else 'by'} response "
                         f"token {step} (the weights are broken)")
    sampled = torch.stack(tokens, dim=1)  # (B, S)
    width = _trim_after_all_ended(sampled, eos_token_id)  # steps past the last EOS are all pad
    sequences = torch.cat([input_ids, sampled[:, :width]], dim=1)  # (B, P + R)
    if not with_logprobs:
        return SampleOutput(sequences, None, None)
    return SampleOutput(sequences, torch.stack(logprobs, dim=1)[:, :width],
                        torch.stack(entropies, dim=1)[:, :width])  # (B, R) each


# --------------------------------------------------------------------- sampling the shared model
@torch.no_grad()
def sample_model(model: SharedLoRAModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 max_new_tokens: int, temperature: float = 1.0, adapter: str | None = "policy",
                 with_logprobs: bool = False) -> SampleOutput:
    """Sample the shared model's responses to left-padded prompts with a KV cache: (B, P) ->
    SampleOutput with sequences (B, P + R), R <= max_new_tokens (and, `with_logprobs`, logprobs and
    entropy (B, R)).

    y_t ~ softmax(z_t / temperature): no top-k, no top-p (PPO needs the policy's own distribution).
    A row stops after its EOS; later positions hold pad. `adapter=None` samples the reference. Uses
    the global torch RNG (seeded by the caller). NaN/inf logits (broken weights) raise
    NonFiniteError after the loop.

    The log-probs and entropies are read from the logits the loop computes anyway, so a rollout
    needs no second policy forward. They belong to the distribution that sampled,
    softmax(z / temperature), and equal
    `model.policy_logprobs(seq, attn, P, with_entropy=True, temperature=temperature)` up to float
    rounding on every token up to and including EOS (after it they belong to pad: finite, masked).
    On CUDA a Llama-family model samples with the fast decoder (`model.fast_sampling`); if that path
    itself fails, it warns and this model samples with the plain loop from then on, drawing the same
    tokens.
    """
    check_token_batch(input_ids, attention_mask)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    check_temperature(temperature)
    settings = dict(eos_token_id=model.eos_token_id, pad_token_id=model.pad_token_id,
                    temperature=temperature, with_logprobs=with_logprobs)
    with model.reference() if adapter is None else contextlib.nullcontext():
        if adapter is not None:
            model.use(adapter)
        if model.fast_sampling:
            devices = [input_ids.device] if input_ids.device.type == "cuda" else []
            rng = _rng_states(devices)
            try:
                if model.fast_decoder is None:  # built once; each adapter is folded in its weights
                    model.fast_decoder = StaticLlamaDecoder(model.lm)
                model.fast_decoder.load_adapter(adapter)
                return sample(model.lm, input_ids, attention_mask, max_new_tokens,
                              decoder=model.fast_decoder, **settings)
            except NonFiniteError:  # broken weights: no other decoder would do better
                raise
            except Exception as error:  # a failure of the fast path itself
                warnings.warn(
                    f"fast sampling failed ({type(error).__name__}: {error}); this model samples "
                    "with the plain loop from now on", RuntimeWarning, stacklevel=2)
                model.fast_sampling, model.fast_decoder = False, None
                _set_rng_states(devices, rng)  # the plain loop draws what the fast one would have
        # GPT-2: a preallocated cache, layers called directly (gpt2_decoder.py); else lm's forward
        decoder = GPT2CacheDecoder(model.lm) if model.packed else PlainDecoder(model.lm)
        return sample(model.lm, input_ids, attention_mask, max_new_tokens,
                      decoder=decoder, **settings)


def _rng_states(devices: list[torch.device]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    return torch.random.get_rng_state(), [torch.cuda.get_rng_state(d) for d in devices]


def _set_rng_states(devices: list[torch.device],
                    states: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
    torch.random.set_rng_state(states[0])
    for device, state in zip(devices, states[1], strict=True):
        torch.cuda.set_rng_state(state, device)
