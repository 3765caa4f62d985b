"""Word lists and sentence templates of the synthetic movie-review world.

This module is the single source of truth for the language of the world: the generator
(`reviews.py`) writes sentences from these templates, the hidden scorer (`scorer.py`) checks
fluency by matching sentences against the same templates and reads sentiment and specificity
from the same word lists, and the tokenizer's vocabulary is every word that appears here.

A template is a tuple of slots. A slot is either a literal (lower-case words) or the name of a
class in `CLASSES` written in capitals; a class name ending in "?" is optional. Every sentence
ends in "." or "!". Words are plain English without apostrophes, digits or quotes, so both the
word-level tokenizer and a hub tokenizer read them without surprises.
"""

from __future__ import annotations

#: Genres a prompt can name; each is one lower-case word so "this <genre>" is a fixed-size slot.
GENRES: tuple[str, ...] = (
    "thriller", "comedy", "drama", "romance", "western", "documentary", "musical", "mystery",
)

#: Words that make up film titles (title case; they only ever appear in prompts).
TITLE_FIRST: tuple[str, ...] = (
    "Night", "Glass", "Silver", "Last", "Winter", "Broken", "Hollow", "Paper", "Quiet", "Red",
    "Iron", "Lost", "Golden", "Distant", "Crimson", "Midnight", "Silent", "Wild", "Burning",
    "Fallen", "Hidden", "Northern", "Bitter", "Summer",
)
TITLE_SECOND: tuple[str, ...] = (
    "Harbor", "Orchard", "River", "Crown", "Empire", "Moon", "Storm", "Garden", "Bridge",
    "Signal", "Hour", "Shore", "Tide", "Station", "Echo", "Country", "Sky", "Star", "Valley",
    "Letters", "Road", "House", "Island", "Frontier",
)

#: Adjective polarity: +2 strong praise, +1 praise, 0 vague, -1 criticism, -2 strong criticism.
ADJECTIVES: dict[str, int] = {
    # strong praise
    "superb": 2, "brilliant": 2, "stunning": 2, "wonderful": 2, "outstanding": 2,
    "masterful": 2, "gripping": 2, "unforgettable": 2, "excellent": 2, "beautiful": 2,
    "moving": 2, "delightful": 2,
    # praise
    "good": 1, "solid": 1, "charming": 1, "engaging": 1, "clever": 1, "pleasant": 1,
    "enjoyable": 1, "decent": 1, "warm": 1, "sharp": 1, "lively": 1, "effective": 1,
    # vague
    "okay": 0, "fine": 0, "average": 0, "ordinary": 0, "passable": 0, "acceptable": 0,
    # criticism
    "dull": -1, "flat": -1, "weak": -1, "uneven": -1, "predictable": -1, "clumsy": -1,
    "forgettable": -1, "tedious": -1, "bland": -1, "slow": -1, "thin": -1, "shallow": -1,
    # strong criticism
    "awful": -2, "terrible": -2, "dreadful": -2, "boring": -2, "painful": -2, "lifeless": -2,
    "incoherent": -2, "unbearable": -2, "messy": -2, "hollow": -2, "lazy": -2, "wooden": -2,
}

#: Intensifiers multiply the polarity of the adjective that follows them.
INTENSIFIERS: dict[str, float] = {
    "truly": 1.5, "really": 1.5, "very": 1.5, "quite": 1.25, "rather": 1.25, "simply": 1.5,
}

#: What a review can be specific about: parts of the film (singular nouns).
ASPECTS: tuple[str, ...] = (
    "acting", "plot", "script", "dialogue", "score", "soundtrack", "cinematography", "editing",
    "pacing", "direction", "ending", "cast", "humor", "setting", "lighting", "music",
)

#: People in the film a review can single out (two-word phrases).
ROLES: tuple[str, ...] = (
    "lead actor", "lead actress", "villain", "supporting cast", "young hero", "narrator",
    "director",
)

#: Concrete moments of the film: the "details" a specific review points to.
DETAILS: tuple[str, ...] = (
    "in the opening scene", "in the final act", "during the chase", "in the finale",
    "in the second half", "in the flashbacks", "during the dinner scene",
    "during the storm sequence", "in the courtroom scene", "in the quiet moments",
    "in the last scene", "during the train sequence", "in the first hour", "at the wedding",
)

#: Whole sentences that say little: the vague reviews of the corpus.
VAGUE_SENTENCES: tuple[str, ...] = (
    "i watched it", "i have seen it", "it is a movie", "there is not much to say",
    "some parts are okay", "i am not sure what to think", "it has some moments",
    "it is what it is", "it was on last night", "my friend liked it more than me",
)

#: Recommendations and their polarity (read like adjectives by the scorer).
RECOMMENDATIONS: dict[str, int] = {
    "i would recommend it to anyone": 2,
    "i would gladly watch it again": 2,
    "it is worth seeing on the big screen": 2,
    "i would recommend it to fans of the genre": 1,
    "it is worth a look": 1,
    "i would not recommend it": -2,
    "skip this one": -2,
    "i would not watch it again": -2,
    "wait until it is on television": -1,
}

#: Subjects for sentences about the whole film; "this GENRE" is filled with the prompt's genre.
FILM_SUBJECTS: tuple[str, ...] = ("this film", "the film", "this movie", "the movie", "it")

#: Verbs linking a subject to an adjective.
LINKS_SINGULAR: tuple[str, ...] = ("is", "was", "feels", "seems")
LINKS_PLURAL: tuple[str, ...] = ("are", "were", "feel", "seem")

#: Sentence-final punctuation.
ENDINGS: tuple[str, ...] = (".", "!")

#: Word classes the templates refer to. Each entry lists the phrases a slot of that class accepts.
CLASSES: dict[str, tuple[str, ...]] = {
    "FILM": FILM_SUBJECTS,
    "GENRE": GENRES,
    "LINK": LINKS_SINGULAR,
    "LINKS": LINKS_PLURAL,
    "BE": ("is", "was"),
    "INT": tuple(INTENSIFIERS),
    "ADJ": tuple(ADJECTIVES),
    "ASPECT": ASPECTS,
    "ROLE": ROLES,
    "DETAIL": DETAILS,
    "VAGUE": VAGUE_SENTENCES,
    "REC": tuple(RECOMMENDATIONS),
    "END": ENDINGS,
}

#: Sentence templates, by the kind of sentence the generator wants to write.
TEMPLATES: dict[str, tuple[tuple[str, ...], ...]] = {
    # a verdict on the whole film
    "verdict": (
        ("FILM", "LINK", "INT?", "ADJ", "END"),
        ("this", "GENRE", "LINK", "INT?", "ADJ", "END"),
        ("this", "is", "a", "GENRE", "that", "LINK", "INT?", "ADJ", "END"),
    ),
    # one part of the film, optionally pinned to a moment
    "aspect": (
        ("the", "ASPECT", "LINK", "INT?", "ADJ", "END"),
        ("the", "ASPECT", "LINK", "INT?", "ADJ", "DETAIL", "END"),
        ("the", "ROLE", "LINK", "INT?", "ADJ", "END"),
        ("the", "ROLE", "LINK", "INT?", "ADJ", "DETAIL", "END"),
        ("the", "ASPECT", "BE", "not", "ADJ", "END"),
    ),
    # two adjectives on one part: "and" joins same polarity, "but" joins opposite polarity
    "pair": (
        ("the", "ASPECT", "LINK", "ADJ", "and", "ADJ", "END"),
        ("the", "ASPECT", "LINK", "ADJ", "but", "ADJ", "END"),
    ),
    # two parts sharing one verdict
    "plural": (
        ("the", "ASPECT", "and", "the", "ASPECT", "LINKS", "INT?", "ADJ", "END"),
    ),
    "recommendation": (("REC", "END"),),
    "vague": (("VAGUE", "END"),),
}

#: Words that do not count as content when the scorer measures repetition.
FUNCTION_WORDS: frozenset[str] = frozenset(
    """a an and the this that it is was are were feels feel seems seem of in at on during to i
    my me not but than more much some there what be would""".split()
)

#: The prompt every record starts with: "Review of the <genre> <Title> <Title>:".
PROMPT_TEMPLATE = "Review of the {genre} {title}:"

#: Punctuation the tokenizer isolates as tokens.
PUNCTUATION: tuple[str, ...] = (".", "!", ",", ":", "?")


def all_phrases() -> list[str]:
    """Every literal phrase the grammar can produce (lower case, as written in the templates)."""
    phrases: list[str] = []
    for templates in TEMPLATES.values():
        for template in templates:
            phrases += [slot for slot in template if not slot.rstrip("?").isupper()]
    for options in CLASSES.values():
        phrases += list(options)
    return phrases


def vocabulary() -> list[str]:
    """Sorted list of every word the world can write, with sentence-initial capitals and titles."""
    words: set[str] = set()
    for phrase in all_phrases():
        words.update(phrase.split())
    # a sentence starts with a capital; "i" is always written "I"
    words |= {w.capitalize() for w in words}
    words |= set(TITLE_FIRST) | set(TITLE_SECOND)
    words |= set(PROMPT_TEMPLATE.format(genre="", title="").replace(":", " ").split())
    words |= set(PUNCTUATION)
    return sorted(words)
