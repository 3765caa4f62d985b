"""The toy world of the tests: a 12-word tokenizer and a 2-layer random GPT-2 (fast, no files)."""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

#: Words of the toy vocabulary (after the special tokens <pad>=0, <unk>=1, <eos>=2).
TOY_WORDS = (
    "the", "movie", "film", "was", "is", "good", "bad", "great", "plot", "acting", "fine", ".")


def toy_tokenizer() -> Any:
    """A word-level `PreTrainedTokenizerFast`: pad 0, unk 1, eos 2 (pad != EOS), left padding."""
    vocab = {"<pad>": 0, "<unk>": 1, "<eos>": 2}
    for word in TOY_WORDS:
        vocab[word] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated")])
    core.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>",
                                   eos_token="<eos>", padding_side="left", model_max_length=64)


def toy_causal_lm(tokenizer: Any, seed: int = 0, n_layer: int = 2, n_embd: int = 32,
                  **config: Any) -> Any:
    """A randomly initialised GPT2LMHeadModel sized for the toy tokenizer (dropout 0 unless
    overridden)."""
    values = dict(vocab_size=len(tokenizer), n_positions=64, n_embd=n_embd, n_layer=n_layer,
                  n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                  bos_token_id=tokenizer.eos_token_id)
    values.update(config)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(**values)).eval()


def good_count(prompts: list[str], responses: list[str]) -> list[float]:
    """A learnable toy reward (a `reward_fn`): how often the response says "good" or "great"."""
    return [float(sum(w in ("good", "great") for w in r.split())) for r in responses]
