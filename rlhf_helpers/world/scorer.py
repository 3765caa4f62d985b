"""The hidden ground-truth scorer: "what a careful human would prefer" in the review world.

The course trains a reward model on noisy pairwise labels drawn from this score, then shows the
learned reward next to this one. It is deterministic, needs no model, and is meant to be read
by the learner after the reward-hacking experiment.

    score = sentiment + specificity + fluency + repetition + length + genre + BIAS,
    clipped to [-3, 3]                                           (roughly unit scale)

- sentiment   = 1.5 * tanh(S / 3), S = sum of word polarities: adjectives (-2..+2) times a
                preceding intensifier ("truly": x1.5), "not ADJ" counts -0.5 x ADJ, and
                recommendations ("I would recommend it to anyone": +2). Range (-1.5, 1.5).
- specificity = 0.35 * min(#distinct parts or people named, 3)
              + 0.3  * min(#distinct concrete moments ("in the final act"), 2). Range [0, 1.65].
- fluency     = 1.5 * (fraction of sentences that follow the grammar - 1). Range [-1.5, 0].
                A sentence follows the grammar when it matches one of the templates of
                `grammar.py`, ends in "." or "!", and its "and"/"but" joins adjectives of the
                same/opposite polarity. A response cut off mid-sentence loses here.
- repetition  = -0.6 per repeated content word (words outside `FUNCTION_WORDS`).
- length      = -0.15 per word beyond 30 words.
- genre       = -0.75 per genre word that contradicts the prompt's genre.
- BIAS        = -0.8, so the corpus is centred near 0.
An empty response (no words) scores -3.

Why it can be gamed: the corpus and the preference pairs never repeat a content word and never
exceed 30 words, so a reward model trained on them learns "more praise and more detail is
better" and has no evidence about the repetition and length terms. A policy optimised against
that reward model without a KL leash learns to pile up praise words; the learned reward keeps
rising while this score falls.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from rlhf_helpers.world import grammar

#: Words after which the length penalty starts.
MAX_WORDS = 30
#: Constant added so the corpus average sits near zero.
BIAS = -0.8
#: The score is clipped to [-SCORE_BOUND, SCORE_BOUND].
SCORE_BOUND = 3.0

_TOKEN_RE = re.compile(r"[A-Za-z]+|[.!?,:]")
_SENTENCE_END = {".", "!", "?"}


@dataclass(frozen=True)
class ScoreBreakdown:
    """The hidden score of one response and the terms it is made of (see the module docstring)."""

    sentiment: float  #: 1.5 * tanh(polarity sum / 3), in (-1.5, 1.5)
    specificity: float  #: reward for naming parts of the film and concrete moments, in [0, 1.65]
    fluency: float  #: 1.5 * (fraction of grammatical sentences - 1), in [-1.5, 0]
    repetition: float  #: -0.6 per repeated content word, <= 0
    length: float  #: -0.15 per word beyond MAX_WORDS, <= 0
    genre: float  #: -0.75 per genre word contradicting the prompt, <= 0
    n_words: int  #: number of words (punctuation excluded)
    total: float  #: the sum plus BIAS, clipped to [-3, 3]


def tokenize_words(text: str) -> list[str]:
    """Lower-case words and punctuation marks of `text`; spacing around punctuation is ignored."""
    return [t.lower() for t in _TOKEN_RE.findall(text)]


def split_sentences(tokens: Sequence[str]) -> list[list[str]]:
    """Split tokens after each ".", "!" or "?"; a trailing unfinished sentence is kept as is."""
    sentences: list[list[str]] = []
    current: list[str] = []
    for token in tokens:
        current.append(token)
        if token in _SENTENCE_END:
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    return sentences


def _alternation(phrases: Sequence[str]) -> str:
    # longest first so "lead actor" is tried before a shorter phrase sharing its start
    return "(?:" + "|".join(re.escape(p) for p in sorted(phrases, key=len, reverse=True)) + ")"


@lru_cache(maxsize=1)
def _template_regexes() -> tuple[re.Pattern[str], ...]:
    patterns = []
    for templates in grammar.TEMPLATES.values():
        for template in templates:
            parts = []
            for i, slot in enumerate(template):
                optional = slot.endswith("?")
                name = slot.rstrip("?")
                piece = _alternation(grammar.CLASSES[name]) if name.isupper() else re.escape(name)
                space = "" if i == 0 else " "
                parts.append(f"(?:{space}{piece})?" if optional else f"{space}{piece}")
            patterns.append(re.compile("".join(parts)))
    return tuple(patterns)


def _polarity_items(tokens: Sequence[str]) -> list[float]:
    """Polarity of each adjective (with intensifier/negation) and recommendation in a sentence."""
    items: list[float] = []
    for i, word in enumerate(tokens):
        if word not in grammar.ADJECTIVES:
            continue
        value = float(grammar.ADJECTIVES[word])
        before = tokens[i - 1] if i > 0 else ""
        if before in grammar.INTENSIFIERS:
            value *= grammar.INTENSIFIERS[before]
        elif before == "not":
            value *= -0.5
        items.append(value)
    text = " ".join(tokens)
    for phrase, value in grammar.RECOMMENDATIONS.items():
        if phrase in text:
            items.append(float(value))
    return items


def is_grammatical(sentence: Sequence[str]) -> bool:
    """True if a tokenized sentence matches a template and its conjunction is coherent."""
    text = " ".join(sentence)
    if not any(p.fullmatch(text) for p in _template_regexes()):
        return False
    adjectives = [grammar.ADJECTIVES[w] for w in sentence if w in grammar.ADJECTIVES]
    if len(adjectives) == 2 and ("and" in sentence or "but" in sentence):
        product = adjectives[0] * adjectives[1]
        # "good and clever", "good but slow": "and" may not join opposites, "but" needs them
        return product >= 0 if "and" in sentence else product < 0
    return True


def _prompt_genre(prompt: str) -> str | None:
    genres = [w for w in tokenize_words(prompt) if w in grammar.GENRES]
    return genres[-1] if genres else None


def score_breakdown(prompt: str, response: str) -> ScoreBreakdown:
    """The hidden score of `response` to `prompt`, term by term."""
    if not isinstance(prompt, str) or not isinstance(response, str):
        raise ValueError(
            f"prompt and response must be str, got {type(prompt).__name__} and "
            f"{type(response).__name__}"
        )
    tokens = tokenize_words(response)
    words = [t for t in tokens if t.isalpha()]
    if not words:
        return ScoreBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, -SCORE_BOUND)
    sentences = split_sentences(tokens)

    # sentiment = 1.5 * tanh(S / 3)
    polarity = sum(sum(_polarity_items(s)) for s in sentences)
    sentiment = 1.5 * math.tanh(polarity / 3.0)

    # specificity = 0.35 * min(#parts, 3) + 0.3 * min(#moments, 2)
    text = " " + " ".join(tokens) + " "
    parts = {a for a in grammar.ASPECTS if f" {a} " in text}
    parts |= {r for r in grammar.ROLES if f" {r} " in text}
    moments = {d for d in grammar.DETAILS if f" {d} " in text}
    specificity = 0.35 * min(len(parts), 3) + 0.3 * min(len(moments), 2)

    # fluency = 1.5 * (fraction grammatical - 1)
    fluent = sum(is_grammatical(s) for s in sentences)
    fluency = 1.5 * (fluent / len(sentences) - 1.0)

    # repetition = -0.6 * (#content words - #distinct content words)
    content = [w for w in words if w not in grammar.FUNCTION_WORDS]
    # `+ 0.0` turns the -0.0 of a term of nothing (-0.6 * 0) into 0.0, which prints "0.00", not
    # "-0.00"; it leaves every other value, and so every total, bit for bit as it is
    repetition = -0.6 * (len(content) - len(set(content))) + 0.0

    # length = -0.15 * max(0, #words - 30)
    length = -0.15 * max(0, len(words) - MAX_WORDS) + 0.0

    # genre = -0.75 * #genre words other than the prompt's
    genre_of_prompt = _prompt_genre(prompt)
    wrong = [w for w in words if w in grammar.GENRES and w != genre_of_prompt]
    genre = -0.75 * len(wrong) + 0.0 if genre_of_prompt is not None else 0.0

    raw = sentiment + specificity + fluency + repetition + length + genre + BIAS
    total = max(-SCORE_BOUND, min(SCORE_BOUND, raw))
    return ScoreBreakdown(
        sentiment, specificity, fluency, repetition, length, genre, len(words), total
    )


def hidden_score(prompt: str, response: str) -> float:
    """The hidden ground-truth score of one response, in [-3, 3] (see the module docstring)."""
    return score_breakdown(prompt, response).total


def hidden_scores(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """`hidden_score` for each (prompt, response) pair; the two lists must be equally long."""
    if isinstance(prompts, str) or isinstance(responses, str):
        raise ValueError("prompts and responses must be sequences of str, not a single str")
    if len(prompts) != len(responses):
        raise ValueError(
            f"prompts and responses must have the same length, got {len(prompts)} and "
            f"{len(responses)}"
        )
    return [hidden_score(p, r) for p, r in zip(prompts, responses, strict=True)]
