"""The word-level tokenizer of the tiny model, built with `tokenizers`.

- vocabulary: the special tokens, then every word and punctuation mark of `grammar.vocabulary()`
  (case kept: "The" and "the" are two tokens); anything else becomes `<unk>`;
- pre-tokenizer: split on whitespace, then isolate punctuation, so "superb." is "superb" + ".";
- decoder: join with spaces and glue ". , ! ? :" back onto the word before them;
- special tokens: `<pad>` (id 0), `<unk>` (id 1), `<eos>` (id 2); pad differs from EOS so masks
  built from the pad id never hide the end of a response; no BOS is added;
- padding side: left, as generation with a batch of prompts needs.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rlhf_helpers.world import grammar

PAD_TOKEN = "<pad>"
UNK_TOKEN = "<unk>"
EOS_TOKEN = "<eos>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, UNK_TOKEN, EOS_TOKEN)
#: Longest sequence (prompt + response + EOS) the tiny model handles.
MODEL_MAX_LENGTH = 64


def build_vocab() -> dict[str, int]:
    """Token -> id: special tokens first, then the sorted words of the grammar."""
    tokens = list(SPECIAL_TOKENS) + grammar.vocabulary()
    return {token: i for i, token in enumerate(tokens)}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh word-level tokenizer wrapped as a `PreTrainedTokenizerFast` (deterministic)."""
    core = Tokenizer(models.WordLevel(vocab=build_vocab(), unk_token=UNK_TOKEN))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated")]
    )
    # WordPiece's decoder with cleanup joins on spaces and removes the space before . , ! ?
    core.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        eos_token=EOS_TOKEN,
        padding_side="left",
        model_max_length=MODEL_MAX_LENGTH,
    )
    return tokenizer
