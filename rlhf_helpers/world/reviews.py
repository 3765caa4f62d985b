"""Generator of the synthetic review world: prompts and one-to-three-sentence reviews.

Every record is drawn from its own RNG seeded from (seed, split, index), so record i of a split
can be regenerated alone: the shipped files can be checked slice by slice.

A review has a style, drawn first:
- "positive" / "negative": a verdict, parts of the film, moments, a recommendation, all leaning
  one way (some strongly, some mildly);
- "mixed": praise and criticism side by side ("The plot is clever but slow.");
- "vague": says little ("It is a movie. It was okay.").
About 10% of the "this <genre>" mentions name the wrong genre and about 6% of reviews contain a
broken sentence (two words swapped, a word dropped, or no final stop), so the corpus has the
mistakes the hidden scorer punishes, in the amounts short human-written data would show them.
The generator never repeats a content word and never writes more than 30 words.
"""

from __future__ import annotations

import hashlib
import random

from rlhf_helpers.world import grammar
from rlhf_helpers.world.scorer import MAX_WORDS, is_grammatical, tokenize_words

#: Review styles and how often the corpus uses them.
STYLE_WEIGHTS: dict[str, float] = {"positive": 0.33, "negative": 0.27, "mixed": 0.22, "vague": 0.18}
#: Probability that a "this <genre>" mention names a genre other than the prompt's.
WRONG_GENRE_RATE = 0.10
#: Probability that a review contains one broken sentence.
BROKEN_RATE = 0.06

_POSITIVE = [w for w, v in grammar.ADJECTIVES.items() if v > 0]
_NEGATIVE = [w for w, v in grammar.ADJECTIVES.items() if v < 0]
_NEUTRAL = [w for w, v in grammar.ADJECTIVES.items() if v == 0]
_STRONG = {w for w, v in grammar.ADJECTIVES.items() if abs(v) == 2}


def record_rng(seed: int, split: str, index: int) -> random.Random:
    """The RNG of record `index` of `split`: seeded from sha256("seed/split/index")."""
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    digest = hashlib.sha256(f"{seed}/{split}/{index}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def is_held_out_title(first: int, second: int) -> bool:
    """Titles reserved for held-out prompts: about one in six (first, second) word pairs."""
    return (first + second) % 6 == 0


def generate_prompt(rng: random.Random, held_out: bool = False) -> dict[str, str]:
    """A prompt record {"prompt", "genre", "title"}; `held_out` picks from the reserved titles."""
    while True:
        i = rng.randrange(len(grammar.TITLE_FIRST))
        j = rng.randrange(len(grammar.TITLE_SECOND))
        if is_held_out_title(i, j) == held_out:
            break
    genre = rng.choice(grammar.GENRES)
    title = f"{grammar.TITLE_FIRST[i]} {grammar.TITLE_SECOND[j]}"
    return {"prompt": grammar.PROMPT_TEMPLATE.format(genre=genre, title=title), "genre": genre,
            "title": title}


def _adjective(rng: random.Random, sign: int) -> str:
    """An adjective of the given sign (+1, -1, or 0 for vague); strong words about half the time."""
    if sign == 0:
        return rng.choice(_NEUTRAL)
    pool = _POSITIVE if sign > 0 else _NEGATIVE
    strong = rng.random() < 0.5
    return rng.choice([w for w in pool if (w in _STRONG) == strong])


def _fill(rng: random.Random, template: tuple[str, ...], sign: int, genre: str) -> list[str]:
    """Fill one template; `sign` is the polarity the sentence should carry."""
    words: list[str] = []
    pair_signs = (sign, sign)
    if "but" in template:
        pair_signs = (sign, -sign if sign != 0 else rng.choice([-1, 1]))
        if pair_signs[0] == 0:
            pair_signs = (pair_signs[1], -pair_signs[1])
    n_adjectives = 0
    for k, slot in enumerate(template):
        name = slot.rstrip("?")
        if slot.endswith("?"):
            # intensifiers only before a non-vague adjective, about a third of the time
            if name == "INT" and sign != 0 and rng.random() < 0.3:
                words.append(rng.choice(grammar.CLASSES["INT"]))
            continue
        if name == "ADJ":
            adj_sign = pair_signs[min(n_adjectives, 1)]
            if k > 0 and template[k - 1] == "not":
                adj_sign = -adj_sign  # "not dull" praises, so pick the opposite word
            words.append(_adjective(rng, adj_sign))
            n_adjectives += 1
        elif name == "GENRE":
            wrong = rng.random() < WRONG_GENRE_RATE
            words.append(rng.choice([g for g in grammar.GENRES if g != genre]) if wrong else genre)
        elif name == "REC":
            options = [p for p, v in grammar.RECOMMENDATIONS.items() if (v > 0) == (sign > 0)]
            words.append(rng.choice(options))
        elif name == "END":
            words.append("!" if sign > 0 and rng.random() < 0.25 else ".")
        elif name.isupper():
            words.append(rng.choice(grammar.CLASSES[name]))
        else:
            words.append(name)
    return " ".join(words).split()


def _plan(rng: random.Random, style: str) -> list[tuple[str, int]]:
    """The (sentence kind, polarity sign) of each sentence of a review of `style`."""
    if style == "vague":
        kinds = [("vague", 0)] + ([("verdict", 0)] if rng.random() < 0.6 else [])
        rng.shuffle(kinds)
        return kinds
    n = rng.choices([1, 2, 3], weights=[0.25, 0.5, 0.25])[0]
    body = rng.choices(["aspect", "pair", "plural"], weights=[0.6, 0.2, 0.2], k=n)
    plan: list[tuple[str, int]] = []
    if style == "mixed":
        signs = [1, -1] * 2
        rng.shuffle(signs)
        n = max(n, 2)
        body = rng.choices(["aspect", "pair", "plural"], weights=[0.6, 0.2, 0.2], k=n)
        plan = [(kind, signs[i]) for i, kind in enumerate(body)]
        if rng.random() < 0.3:
            plan[0] = ("pair", 1)
        return plan
    sign = 1 if style == "positive" else -1
    plan = [(kind, sign) for kind in body]
    if rng.random() < 0.5:
        plan.insert(0, ("verdict", sign))
    if rng.random() < 0.3:
        plan.append(("recommendation", sign))
    return plan[:3]


def _render(sentences: list[list[str]]) -> str:
    """Capitalise each sentence, write "I", and attach punctuation to the word before it."""
    out = []
    for words in sentences:
        words = ["I" if w == "i" else w for w in words]
        words[0] = words[0][:1].upper() + words[0][1:]
        text = " ".join(words)
        for mark in grammar.PUNCTUATION:
            text = text.replace(f" {mark}", mark)
        out.append(text)
    return " ".join(out)


def _break(rng: random.Random, sentence: list[str]) -> list[str]:
    """Corrupt a sentence so it no longer follows the grammar (swap, drop, or lose the stop)."""
    for _ in range(20):
        broken = list(sentence)
        how = rng.choice(["swap", "drop", "stop"])
        if how == "stop" or len(broken) < 3:
            broken = broken[:-1]
        elif how == "swap":
            i = rng.randrange(len(broken) - 2)
            broken[i], broken[i + 1] = broken[i + 1], broken[i]
        else:
            del broken[rng.randrange(len(broken) - 1)]
        if broken and not is_grammatical(broken):
            return broken
    return sentence[:-1]  # a sentence without its stop never parses


def generate_review(rng: random.Random, genre: str) -> str:
    """One review (plain text, no leading space) of a film of `genre`, drawn from `rng`."""
    if genre not in grammar.GENRES:
        raise ValueError(f"genre must be one of {grammar.GENRES}, got {genre!r}")
    style = rng.choices(list(STYLE_WEIGHTS), weights=list(STYLE_WEIGHTS.values()))[0]
    while True:
        sentences: list[list[str]] = []
        used: set[str] = set()
        for kind, sign in _plan(rng, style):
            for _ in range(30):
                template = rng.choice(grammar.TEMPLATES[kind])
                if kind == "pair":
                    # a mixed review joins opposites with "but"; others mostly use "and"
                    use_but = style == "mixed" or rng.random() < 0.1
                    template = grammar.TEMPLATES["pair"][1 if use_but else 0]
                words = _fill(rng, template, sign, genre)
                content = [w for w in words if w.isalpha() and w not in grammar.FUNCTION_WORDS]
                if not used & set(content) and len(content) == len(set(content)):
                    used |= set(content)
                    sentences.append(words)
                    break
        n_words = sum(w.isalpha() for s in sentences for w in s)
        if sentences and n_words <= MAX_WORDS:
            break
    if rng.random() < BROKEN_RATE:
        k = rng.randrange(len(sentences))
        sentences[k] = _break(rng, sentences[k])
    return _render(sentences)


__all__ = ["generate_prompt", "generate_review", "record_rng", "is_held_out_title",
           "tokenize_words"]
