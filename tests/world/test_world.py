"""The review world: hidden scorer, generator, annotator, and the shipped data files."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_helpers.runtime.data import data_dir
from rlhf_helpers.world import grammar
from rlhf_helpers.world.annotator import Annotator, accuracy_ceiling, preference_probability
from rlhf_helpers.world.records import (
    DEFAULT_SIZES,
    preference_record,
    prompt_record,
    sft_record,
)
from rlhf_helpers.world.reviews import generate_prompt, generate_review, record_rng
from rlhf_helpers.world.scorer import (
    BIAS,
    MAX_WORDS,
    hidden_score,
    hidden_scores,
    is_grammatical,
    score_breakdown,
    tokenize_words,
)

PROMPT = "Review of the thriller Night Harbor:"


# --- hidden scorer -------------------------------------------------------------------------


def test_score_of_a_simple_review_matches_the_documented_formula():
    # sentiment 1.5 tanh(2/3) for "superb" (+2), one part named, grammatical, nothing penalised
    expected = 1.5 * math.tanh(2 / 3) + 0.35 * 1 + BIAS
    assert hidden_score(PROMPT, " The acting is superb.") == pytest.approx(expected)


def test_intensifier_negation_detail_and_recommendation_terms():
    response = " The plot is truly clever in the final act. The pacing is not dull. Skip this one."
    # polarity: clever 1 * 1.5, not dull -(-1) * 0.5, "skip this one" -2
    polarity = 1.5 + 0.5 - 2
    expected = 1.5 * math.tanh(polarity / 3) + 0.35 * 2 + 0.3 * 1 + BIAS
    b = score_breakdown(PROMPT, response)
    assert b.fluency == 0 and b.repetition == 0 and b.genre == 0
    assert b.total == pytest.approx(expected)


def test_spacing_around_punctuation_does_not_change_the_score():
    # a word-level tokenizer decodes "superb ." ; the scorer must read both the same way
    assert hidden_score(PROMPT, " The acting is superb .") == hidden_score(
        PROMPT, "The acting is superb."
    )


def test_repetition_and_broken_grammar_are_penalised():
    b = score_breakdown(PROMPT, " The acting is superb superb.")
    assert b.repetition == pytest.approx(-0.6)
    assert b.fluency == pytest.approx(-1.5)  # the only sentence does not parse


def test_unfinished_sentence_loses_fluency():
    assert score_breakdown(PROMPT, " The acting is superb").fluency == pytest.approx(-1.5)
    assert score_breakdown(PROMPT, " The acting is superb. The plot").fluency == pytest.approx(
        -0.75
    )


def test_length_penalty_per_word_beyond_the_limit():
    sentence = "The {} is good."
    parts = grammar.ASPECTS[:10]
    response = " ".join(sentence.format(p) for p in parts)  # 40 words, "good" repeated
    b = score_breakdown(PROMPT, response)
    assert b.n_words == 40
    assert b.length == pytest.approx(-0.15 * (40 - MAX_WORDS))


def test_wrong_genre_is_penalised_and_prompt_genre_is_not():
    right = score_breakdown(PROMPT, " This thriller is superb.")
    wrong = score_breakdown(PROMPT, " This comedy is superb.")
    assert right.genre == 0 and wrong.genre == pytest.approx(-0.75)
    assert wrong.total == pytest.approx(right.total - 0.75)


def test_gaming_by_repetition_raises_praise_but_lowers_the_score():
    # the exploit PPO finds without a KL leash: pile up praise
    one = " The acting is superb."
    many = one + " The acting is superb." * 3
    assert score_breakdown(PROMPT, many).sentiment > score_breakdown(PROMPT, one).sentiment
    assert hidden_score(PROMPT, many) < hidden_score(PROMPT, one) - 1.0


def test_empty_response_scores_the_minimum_and_scores_are_bounded():
    assert hidden_score(PROMPT, "") == -3.0
    assert hidden_score(PROMPT, " . . !") == -3.0
    junk = " superb" * 200
    assert -3.0 <= hidden_score(PROMPT, junk) <= 3.0


def test_hidden_scores_validates_its_arguments():
    with pytest.raises(ValueError, match="same length"):
        hidden_scores([PROMPT], [" a", " b"])
    with pytest.raises(ValueError, match="sequences of str"):
        hidden_scores(PROMPT, " The acting is superb.")
    with pytest.raises(ValueError, match="must be str"):
        hidden_score(PROMPT, None)  # type: ignore[arg-type]
    assert hidden_scores([PROMPT, PROMPT], [" The acting is superb.", ""]) == [
        hidden_score(PROMPT, " The acting is superb."),
        -3.0,
    ]


def test_and_but_must_join_adjectives_of_matching_polarity():
    assert is_grammatical(tokenize_words("The plot is clever and sharp."))
    assert is_grammatical(tokenize_words("The plot is clever but slow."))
    assert not is_grammatical(tokenize_words("The plot is clever and slow."))
    assert not is_grammatical(tokenize_words("The plot is clever but sharp."))


# --- generator -------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), index=st.integers(0, 10**6))
def test_generated_reviews_respect_the_corpus_invariants(seed, index):
    rng = record_rng(seed, "hypothesis", index)
    prompt = generate_prompt(rng)
    review = generate_review(rng, prompt["genre"])
    b = score_breakdown(prompt["prompt"], review)
    assert 1 <= b.n_words <= MAX_WORDS
    assert b.repetition == 0 and b.length == 0
    # every token of a review is in the tokenizer's vocabulary
    vocabulary = set(grammar.vocabulary())
    assert all(t in vocabulary for t in review.replace(".", " . ").replace("!", " ! ").split())


def test_most_generated_sentences_are_grammatical_and_styles_vary():
    rng_reviews = [sft_record(1, i) for i in range(600)]
    breakdowns = [score_breakdown(r["prompt"], r["completion"]) for r in rng_reviews]
    fluent = sum(b.fluency == 0 for b in breakdowns) / len(breakdowns)
    # only the ~6% deliberately broken reviews fail the grammar
    assert 0.88 <= fluent <= 0.99
    sentiments = [b.sentiment for b in breakdowns]
    assert sum(s > 0.5 for s in sentiments) > 150 and sum(s < -0.5 for s in sentiments) > 100
    totals = [b.total for b in breakdowns]
    assert max(totals) - min(totals) > 3.0  # a spread of quality: room to improve


def test_record_rng_is_a_function_of_seed_split_and_index():
    a = record_rng(3, "sft", 7).random()
    assert a == record_rng(3, "sft", 7).random()
    assert a != record_rng(3, "sft", 8).random() and a != record_rng(4, "sft", 7).random()
    with pytest.raises(ValueError, match="index"):
        record_rng(0, "sft", -1)
    with pytest.raises(ValueError, match="genre"):
        generate_review(random.Random(0), "opera")


def test_held_out_titles_never_appear_in_training_records():
    test_titles = {prompt_record(0, "test", i)["title"] for i in range(200)}
    train_prompts = {sft_record(0, i)["prompt"] for i in range(500)}
    train_prompts |= {prompt_record(0, "train", i)["prompt"] for i in range(500)}
    assert not any(title in p for title in test_titles for p in train_prompts)


# --- annotator -------------------------------------------------------------------------------


def test_preference_probability_is_bradley_terry():
    for a, b, t in [(1.0, 0.0, 0.5), (-2.0, 1.0, 1.0), (0.3, 0.3, 0.1), (50.0, -50.0, 0.01)]:
        assert preference_probability(a, b, t) == pytest.approx(1 / (1 + math.exp(-(a - b) / t)))
    with pytest.raises(ValueError, match="temperature"):
        preference_probability(0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="temperature"):
        Annotator(temperature=float("nan"))


def test_annotator_labels_follow_their_probability():
    annotator = Annotator(temperature=1.0, seed=0)
    a, b = " The acting is superb.", " The plot is dull."
    p = annotator.probability(PROMPT, a, b)
    n = 4000
    first = sum(annotator.label(PROMPT, a, b) == 0 for _ in range(n)) / n
    assert abs(first - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_accuracy_ceiling_limits_and_monte_carlo():
    assert accuracy_ceiling([0.5, 0.5]) == pytest.approx(0.5)
    assert accuracy_ceiling([0.0, 1.0]) == pytest.approx(1.0)
    probs = [0.9, 0.3, 0.6, 0.05]
    rng = random.Random(0)
    n = 20000
    # a perfect model predicts the likelier label; count how often a drawn label agrees
    hits = sum(
        (rng.random() < p) == (p >= 0.5) for _ in range(n // len(probs)) for p in probs
    ) / n
    assert accuracy_ceiling(probs) == pytest.approx(hits, abs=0.015)
    with pytest.raises(ValueError, match="empty"):
        accuracy_ceiling([])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        accuracy_ceiling([1.2])


# --- shipped data equals a regenerated slice ------------------------------------------------


def _shipped_lines(name: str) -> list[dict]:
    with (data_dir() / name).open() as handle:
        return [json.loads(line) for line in handle]


SLICE = list(range(12)) + [101, 1234, 1999]


@pytest.mark.parametrize("split", ["train", "test"])
def test_shipped_prompts_equal_regenerated_slice(split):
    shipped = _shipped_lines(f"prompts_{split}.jsonl")
    assert len(shipped) == DEFAULT_SIZES[f"prompts_{split}"]
    for i in [i for i in SLICE if i < len(shipped)]:
        assert shipped[i] == prompt_record(0, split, i)


def test_shipped_sft_corpus_equals_regenerated_slice():
    shipped = _shipped_lines("sft.jsonl")
    assert len(shipped) == DEFAULT_SIZES["sft"]
    for i in SLICE + [7999]:
        assert shipped[i] == sft_record(0, i)


@pytest.mark.parametrize("split", ["train", "test"])
def test_shipped_preferences_equal_regenerated_slice(split):
    shipped = _shipped_lines(f"preferences_{split}.jsonl")
    assert len(shipped) == DEFAULT_SIZES[f"preferences_{split}"]
    for i in [i for i in SLICE if i < len(shipped)]:
        record, p_chosen = preference_record(0, split, i)
        assert shipped[i] == record
        assert 0.0 <= p_chosen <= 1.0
        assert set(record) == {"prompt", "chosen", "rejected"}
        assert record["chosen"].startswith(" ") and record["chosen"] != record["rejected"]


def test_shipped_data_is_small():
    total = sum(f.stat().st_size for f in data_dir().rglob("*") if f.is_file())
    assert total < 25 * 1024 * 1024


# --- quality metrics -------------------------------------------------------------------------


def test_distinct_n_counts_unique_ngrams_by_hand():
    from rlhf_helpers.world.quality import distinct_n

    texts = ["The plot is dull.", "the plot is good"]
    # unigrams: the plot is dull . the plot is good -> 9 total, 6 unique
    assert distinct_n(texts, 1) == pytest.approx(6 / 9)
    # bigrams: (the plot)(plot is)(is dull)(dull .) + (the plot)(plot is)(is good) -> 7 total, 5
    # unique
    assert distinct_n(texts, 2) == pytest.approx(5 / 7)
    assert distinct_n(["a"], 2) == 0.0
    with pytest.raises(ValueError, match="n must be"):
        distinct_n(texts, 0)


def test_summarize_and_sample_quality_agree_with_statistics():
    import statistics

    from rlhf_helpers.world.quality import sample_quality, summarize

    values = [0.3, -1.0, 2.5, 0.0, 1.25]
    s = summarize(values)
    assert s["mean"] == pytest.approx(statistics.fmean(values))
    assert s["std"] == pytest.approx(statistics.pstdev(values))
    q = statistics.quantiles(values, n=4, method="inclusive")
    assert [s["q25"], s["median"], s["q75"]] == pytest.approx(q)
    responses = [" The acting is superb.", " The plot is dull"]
    report = sample_quality([PROMPT, PROMPT], responses, [True, False])
    assert report["eos_fraction"] == 0.5 and report["mean_words"] == 4.0
    assert report["score_mean"] == pytest.approx(statistics.fmean(hidden_scores([PROMPT] * 2,
                                                                                responses)))
    with pytest.raises(ValueError, match="ended_with_eos"):
        sample_quality([PROMPT], responses[:1], [True, True])


# ----------------------------------------------------------------------------- the builder keeps
# other people's files
def _users_data_folder(tmp_path):
    """A data folder as a user makes one: the shipped files, their own prompts_train.jsonl, no
    model."""
    import shutil

    folder = tmp_path / "mydata"
    folder.mkdir()
    for path in data_dir().glob("*.jsonl"):
        shutil.copy(path, folder / path.name)
    (folder / "prompts_train.jsonl").write_text('{"prompt": "My own prompt about"}\n',
                                                encoding="utf-8")
    return folder


def test_following_the_missing_model_advice_keeps_the_users_data(tmp_path, monkeypatch, capsys):
    """The advice a missing tiny model gives, followed to the letter, trains the model and changes
    no data file; a plain build into that folder refuses, naming the file, and writes nothing."""
    from rlhf_helpers.runtime.models import load_tokenizer
    from rlhf_helpers.runtime.profiles import get_profile
    from rlhf_helpers.world import build

    folder = _users_data_folder(tmp_path)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    monkeypatch.setenv("RLHF_DATA_DIR", str(folder))
    with pytest.raises(FileNotFoundError) as missing:
        load_tokenizer(get_profile("tiny"))
    advice = str(missing.value)
    assert (f"world.build --model-only --out {folder}`" in advice
            and "changes no data file" in advice)

    with pytest.raises(SystemExit) as refused:
        # the shipped settings: the other four files are the builder's
        build.main(["--out", str(folder)])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "mydata holds prompts_train.jsonl, which this builder did not write" in err
    assert "nothing was written" in err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before

    build.main(["--out", str(folder), "--fast", "--model-only"])  # the advice
    # no data file touched
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
    assert (folder / build.TINY_MODEL_SUBDIR / "training_log.json").is_file()
    assert not (folder / "README.md").exists()


def test_the_builder_replaces_its_own_files_and_refuses_a_foreign_card_or_model(tmp_path, capsys):
    from rlhf_helpers.world import build

    out = tmp_path / "world"
    build.main(["--out", str(out), "--fast", "--skip-model"])
    # its own files, same settings: no conflict
    build.main(["--out", str(out), "--fast", "--skip-model"])
    assert build.foreign_files(out, build.data_files(0, build.FAST_SIZES)[0], model=True) == []
    # another seed writes other records: all five differ
    assert build.foreign_files(out, build.data_files(1, build.FAST_SIZES)[0], model=False) == [
        name for name in build.data_files(0)[0]]
    (out / "README.md").write_text("# My notes\n")
    (out / build.TINY_MODEL_SUBDIR).mkdir(parents=True)
    (out / build.TINY_MODEL_SUBDIR / "config.json").write_text("{}")
    assert build.foreign_files(out, build.data_files(0, build.FAST_SIZES)[0], model=True) == [
        "README.md", "models/tiny-sft"]
    with pytest.raises(SystemExit):
        build.main(["--out", str(out), "--fast"])
    assert (out / "README.md").read_text() == "# My notes\n"
    build.main(["--out", str(out), "--fast", "--force"])
    assert (out / "README.md").read_text().startswith(build.CARD_TITLE)


def test_a_card_with_a_persons_notes_is_theirs(tmp_path, capsys):
    """Before: `--skip-model` replaced a README.md that was the card with notes added below it."""
    from rlhf_helpers.world import build

    out = tmp_path / "world"
    build.main(["--out", str(out), "--fast", "--skip-model"])
    card = out / "README.md"
    # the shipped one too
    assert build.is_builders_card(card) and build.is_builders_card(data_dir() / "README.md")
    for edit in (lambda text: text + "\nMy notes.\n",
                 lambda text: text.replace("Everything", "All", 1)):
        mine = edit(card.read_text(encoding="utf-8"))
        card.write_text(mine, encoding="utf-8")
        assert not build.is_builders_card(card)
        with pytest.raises(SystemExit) as refused:
            build.main(["--out", str(out), "--fast", "--skip-model"])
        err = capsys.readouterr().err
        assert (refused.value.code == 2
                and "holds README.md, which this builder did not write" in err)
        assert card.read_text(encoding="utf-8") == mine
    build.main(["--out", str(out), "--fast", "--skip-model", "--force"])
    assert build.is_builders_card(card)


def _refused(build, argv, capsys) -> str:
    with pytest.raises(SystemExit) as refused:
        build.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == 2 and not any("Traceback" in line for line in err), err
    return err[-1]


def test_the_builder_names_a_file_where_its_folders_go(tmp_path, capsys, monkeypatch):
    """Before: FileExistsError or NotADirectoryError tracebacks, the second after the data files
    were written; `--out ""` wrote into the current folder."""
    from rlhf_helpers.world import build

    monkeypatch.chdir(tmp_path)
    assert _refused(build, ["--out", "", "--fast", "--skip-model"], capsys).endswith(
        "--out must name a folder, got an empty path")
    assert list(tmp_path.iterdir()) == []

    a_file = tmp_path / "afile"
    a_file.write_text("mine")
    assert _refused(build, ["--out", str(a_file), "--fast", "--skip-model"], capsys).endswith(
        f"--out {a_file}: {a_file} is a file, not a folder")
    assert _refused(build, ["--out", str(a_file / "sub"), "--fast", "--skip-model"],
                    capsys).endswith(
        f"--out {a_file / 'sub'}: {a_file} is a file, not a folder")
    out = tmp_path / "world"
    out.mkdir()
    (out / "models").write_text("mine")
    line = _refused(build, ["--out", str(out), "--fast"], capsys)
    assert "holds models (a file), which this builder did not write" in line, line
    assert sorted(p.name for p in out.iterdir()) == ["models"] and a_file.read_text() == "mine"


@pytest.mark.parametrize("name, text, message", [
    ("sft.jsonl", '{"prompt": "a"\n', "sft.jsonl, line 1: not valid JSON"),
    ("sft.jsonl", None, "sft.jsonl is a folder"),
    ("prompts_test.jsonl", '{"prompt": "a"\n', "prompts_test.jsonl, line 1: not valid JSON"),
])
def test_model_only_checks_the_folders_files_before_replacing_the_model(tmp_path, capsys,
                                                                        name, text, message):
    """Before: a traceback, for prompts_test.jsonl after model.safetensors had been overwritten."""
    from rlhf_helpers.world import build

    out = tmp_path / "world"
    build.main(["--out", str(out), "--fast"])
    # the build's own progress (and any logging noise): only the refused call is read below
    capsys.readouterr()
    weights = out / build.TINY_MODEL_SUBDIR / "model.safetensors"
    before = weights.read_bytes()
    (out / name).unlink()
    if text is None:
        (out / name).mkdir()
    else:
        (out / name).write_text(text)
    line = _refused(build, ["--out", str(out), "--fast", "--model-only"], capsys)
    assert "--model-only trains on the folder's own files" in line and message in line, line
    assert weights.read_bytes() == before


@pytest.mark.parametrize("seed", ["-1", str(2**32), str(2**70)])
def test_the_builder_refuses_a_seed_outside_numpys_range(tmp_path, capsys, seed):
    """Before: accepted, writing a data set the card called seed -1 (the model's torch seed wraps
    around)."""
    from rlhf_helpers.world import build

    line = _refused(
        build, ["--out", str(tmp_path / "w"), "--fast", "--skip-model", "--seed", seed], capsys)
    assert line.endswith(f"--seed must be an int in [0, 4294967295], got {seed}")
    assert not (tmp_path / "w").exists()
