"""Regenerate data/ from a seed: prompts, SFT corpus, preference pairs, data card and tiny model.

    python -m rlhf_helpers.world.build [--fast] [--seed N] [--out data/]
        [--skip-model | --model-only] [--force]

`--fast` writes small files and trains the tiny model for a few steps (for tests); the shipped
data is the default, seed 0. Data files are a pure function of the seed (see `records.py`); the
model is reproducible on the same machine and torch version. `--model-only` trains the tiny model on
the folder's own sft.jsonl and writes nothing else.

It never replaces what it did not write: a JSONL file whose content differs from the one it would
write, a README.md that is not its data card, or a models/tiny-sft folder without its
training_log.json stop the build before anything is written (exit 2, naming them); `--force`
replaces them.
"""

from __future__ import annotations

# ruff: noqa: E402 - as a command, Ctrl-C is one line from here on: the imports below come after
if __name__ == "__main__":
    from rlhf_helpers.runtime.interrupt import quiet_early_interrupt

    quiet_early_interrupt("python -m rlhf_helpers.world.build")

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch

from rlhf_helpers.runtime.config_limits import MAX_SEED
from rlhf_helpers.runtime.data import (
    data_dir,
    jsonl_text,
    load_prompts,
    load_sft_corpus,
    write_jsonl,
)
from rlhf_helpers.runtime.interrupt import one_line_interrupt
from rlhf_helpers.world.annotator import DEFAULT_TEMPERATURE, accuracy_ceiling
from rlhf_helpers.world.quality import sample_quality, summarize
from rlhf_helpers.world.records import (
    DEFAULT_SIZES,
    preference_record,
    prompt_record,
    sft_record,
)
from rlhf_helpers.world.scorer import hidden_scores
from rlhf_helpers.world.tiny_model import (
    TinyModelConfig,
    sample_responses,
    save_model,
    train_tiny_model,
)
from rlhf_helpers.world.tokenizer import build_tokenizer

#: Record counts of a --fast build.
FAST_SIZES: dict[str, int] = {
    "prompts_train": 64, "prompts_test": 32, "sft": 512, "preferences_train": 128,
    "preferences_test": 64,
}
#: Where the tiny model lives inside the data directory.
TINY_MODEL_SUBDIR = Path("models") / "tiny-sft"


CARD_TITLE = "# Data of the review world"  #: the data card's first line
#: The card's last line: the SHA-256 of every line above it, so a card a person edited (notes added)
#: is theirs
CARD_SEAL = "<!-- written by python -m rlhf_helpers.world.build; sha256 of the text above: {} -->"


def sealed_card(text: str) -> str:
    """The data card with its seal line appended (`CARD_SEAL`)."""
    return text + CARD_SEAL.format(hashlib.sha256(text.encode("utf-8")).hexdigest()) + "\n"


def is_builders_card(path: Path) -> bool:
    """True when `path` is a data card exactly as this builder wrote it: its seal matches the text
    above it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    body = text.rstrip("\n").rpartition("\n")[0]  # everything above the seal line
    return text.startswith(CARD_TITLE) and sealed_card(body + "\n") == text


def data_files(seed: int = 0,
               sizes: dict[str, int] | None = None) -> tuple[dict[str, list[dict]], dict]:
    """The five JSONL files' records (file name -> records) and the statistics for the data card."""
    sizes = dict(sizes or DEFAULT_SIZES)
    stats: dict = {"seed": seed, "sizes": sizes, "annotator_temperature": DEFAULT_TEMPERATURE}
    files: dict[str, list[dict]] = {}
    for split in ("train", "test"):
        files[f"prompts_{split}.jsonl"] = [prompt_record(seed, split, i)
                                           for i in range(sizes[f"prompts_{split}"])]
    sft = files["sft.jsonl"] = [sft_record(seed, i) for i in range(sizes["sft"])]
    sft_scores = hidden_scores([r["prompt"] for r in sft], [r["completion"] for r in sft])
    stats["sft_scores"] = summarize(sft_scores)
    for split in ("train", "test"):
        pairs = [preference_record(seed, split, i) for i in range(sizes[f"preferences_{split}"])]
        files[f"preferences_{split}.jsonl"] = [record for record, _ in pairs]
        p_chosen = [p for _, p in pairs]
        stats[f"preferences_{split}"] = {
            "accuracy_ceiling": accuracy_ceiling(p_chosen),
            # how often the label agrees with the higher hidden score
            "label_agrees_with_score": sum(p > 0.5 for p in p_chosen) / len(p_chosen),
        }
    return files, stats


def foreign_files(out: Path, files: dict[str, list[dict]] | None, model: bool) -> list[str]:
    """What a build into `out` would replace that this builder did not write (or wrote otherwise):
    JSONL files whose content differs from `files`', a README.md that is not the data card, a
    models/tiny-sft folder without training_log.json (when `model`)."""
    found = []
    for name, records in (files or {}).items():
        path = out / name
        if path.exists() and (not path.is_file()
                              or path.read_bytes() != jsonl_text(records).encode("utf-8")):
            found.append(name)
    card = out / "README.md"
    if files is not None and card.exists() and not is_builders_card(card):
        found.append("README.md")
    model_dir = out / TINY_MODEL_SUBDIR
    blocking = [folder for folder in (out / "models", model_dir)
                if folder.exists() and not folder.is_dir()]
    if model and blocking:  # a file where the model's folder goes
        found.append(f"{blocking[0].relative_to(out).as_posix()} (a file)")
    elif model and model_dir.exists() and not (model_dir / "training_log.json").is_file():
        found.append(TINY_MODEL_SUBDIR.as_posix())
    return found


def build_data(out: Path, seed: int = 0, sizes: dict[str, int] | None = None) -> dict:
    """Write the five JSONL files into `out`; return statistics for the data card."""
    files, stats = data_files(seed, sizes)
    for name, records in files.items():
        write_jsonl(out / name, records)
    return stats


def build_model(out: Path, seed: int = 0, fast: bool = False) -> dict:
    """Train the tiny model on out/sft.jsonl, save it, and measure its samples."""

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    config = TinyModelConfig.fast() if fast else TinyModelConfig()
    config.seed = seed
    tokenizer = build_tokenizer()
    records = load_sft_corpus(out)
    start = time.perf_counter()
    model, log = train_tiny_model(tokenizer, records, config)
    directory = out / TINY_MODEL_SUBDIR
    save_model(model, tokenizer, directory)
    log["build_seconds"] = time.perf_counter() - start
    log["torch_threads"] = torch.get_num_threads()
    log["size_on_disk_bytes"] = sum(f.stat().st_size for f in directory.iterdir() if f.is_file())

    log.update(evaluate_model(model, tokenizer, out, seed))
    (directory / "training_log.json").write_text(json.dumps(log, indent=2) + "\n")
    return log


def evaluate_model(model, tokenizer, out: Path, seed: int = 0) -> dict:
    """Samples on the held-out prompts against the corpus: scores, EOS rate, distinct-n.

    Score statistics of the corpus use every SFT record; distinct-n uses as many corpus records
    as there are samples, since distinct-n falls as the amount of text grows.
    """
    prompts = load_prompts("test", out)
    records = load_sft_corpus(out)
    responses, ended = sample_responses(model, tokenizer, prompts, seed=seed)
    corpus = sample_quality([r["prompt"] for r in records], [r["completion"] for r in records])
    same_size = sample_quality([r["prompt"] for r in records[: len(prompts)]],
                               [r["completion"] for r in records[: len(prompts)]])
    corpus["distinct_1"], corpus["distinct_2"] = same_size["distinct_1"], same_size["distinct_2"]
    return {
        "samples": sample_quality(prompts, responses, ended),
        "corpus": corpus,
        "example_samples": [p + r for p, r in zip(prompts[:8], responses[:8], strict=True)],
    }


def write_card(out: Path, stats: dict, model_log: dict | None) -> None:
    """Write data/README.md: what each file is, how it was made, sizes, the accuracy ceiling."""
    lines = card_files(stats) + card_labels(stats) + card_sft_scores(stats)
    if model_log is not None:
        lines += card_model(model_log)
    (out / "README.md").write_text(sealed_card("\n".join(lines) + "\n"), encoding="utf-8")


def card_files(stats: dict) -> list[str]:
    """The card's title, the command that rebuilds the data, and the table of its files."""
    sizes = stats["sizes"]
    return [
        CARD_TITLE,
        "",
        "Everything here is synthetic and regenerated by one command (seed "
        f"{stats['seed']}):",
        "",
        "    python -m rlhf_helpers.world.build --seed "
        f"{stats['seed']} --out data/",
        "",
        "Each record is drawn from its own RNG seeded from (seed, file, index), so any slice can",
        "be regenerated alone (`tests/world/test_world.py` checks the shipped files this way).",
        "Texts are plain English movie reviews from a small template grammar",
        "(`rlhf_helpers/world/grammar.py`); responses start with a space so `prompt + response`",
        "reads as text (TRL joins an explicit prompt and its completion that way).",
        "",
        "| file | records | fields | what |",
        "| --- | --- | --- | --- |",
        f"| prompts_train.jsonl | {sizes['prompts_train']} | prompt, genre, title | prompts "
        "\"Review of the <genre> <Title>:\" for RL |",
        f"| prompts_test.jsonl | {sizes['prompts_test']} | prompt, genre, title | held-out "
        "prompts: titles never used in any train file |",
        f"| sft.jsonl | {sizes['sft']} | prompt, completion | SFT corpus (TRL prompt-completion "
        "format) |",
        f"| preferences_train.jsonl | {sizes['preferences_train']} | prompt, chosen, rejected | "
        "pairs for the reward model (TRL RewardTrainer explicit-prompt standard format) |",
        f"| preferences_test.jsonl | {sizes['preferences_test']} | prompt, chosen, rejected | "
        "held-out pairs on held-out titles |",
    ]


def card_labels(stats: dict) -> list[str]:
    """How the preferences were labelled, and the accuracy ceiling of each preference file."""
    lines = [
        "",
        "## How the preferences were labelled",
        "",
        "Two different reviews of the same prompt are drawn from the generator; a simulated",
        "annotator prefers the first with the Bradley-Terry probability",
        "p = sigmoid((s_a - s_b) / T), T = "
        f"{stats['annotator_temperature']}, where s is the hidden score",
        "(`rlhf_helpers/world/scorer.py`, documented there). Labels are therefore noisy, and the",
        "best pairwise accuracy any reward model can reach is E[max(p, 1 - p)]:",
        "",
        "| file | accuracy ceiling | labels agreeing with the higher hidden score |",
        "| --- | --- | --- |",
    ]
    for split in ("train", "test"):
        s = stats[f"preferences_{split}"]
        lines.append(f"| preferences_{split}.jsonl | {s['accuracy_ceiling']:.3f} | "
                     f"{s['label_agrees_with_score']:.3f} |")
    return lines


def card_sft_scores(stats: dict) -> list[str]:
    """The hidden scores of the SFT corpus."""
    sft = stats["sft_scores"]
    return [
        "",
        "## Hidden scores of the SFT corpus",
        "",
        f"mean {sft['mean']:.3f}, std {sft['std']:.3f}, min {sft['min']:.3f}, "
        f"quartiles {sft['q25']:.3f} / {sft['median']:.3f} / {sft['q75']:.3f}, max "
        f"{sft['max']:.3f}.",
        "The corpus mixes positive, negative, mixed and vague reviews; about 10% of genre",
        "mentions name the wrong genre and about 6% of reviews contain a broken sentence.",
        "No review repeats a content word or exceeds 30 words (the scorer's gameable terms).",
    ]


def card_model(model_log: dict) -> list[str]:
    """The tiny model: how it was trained, its size and time, its samples against the corpus."""
    samples, corpus = model_log["samples"], model_log["corpus"]
    lines = [
        "",
        "## The tiny model (models/tiny-sft/)",
        "",
        "A GPT-2 with a word-level tokenizer (`rlhf_helpers/world/tokenizer.py`), pretrained on",
        "every token of sft.jsonl and then fine-tuned on the response tokens only",
        "(`rlhf_helpers/world/tiny_model.py`). Load it with `AutoTokenizer` /",
        "`AutoModelForCausalLM.from_pretrained(\"data/models/tiny-sft\")`.",
        "",
        f"- parameters: {model_log['n_parameters']:,}; size on disk: "
        f"{model_log['size_on_disk_bytes'] / 1e6:.2f} MB",
        f"- training time of this build: {model_log['build_seconds']:.0f} s on 2 CPU cores "
        f"({model_log['torch_threads']} torch threads; timings vary with other load on the",
        "  machine: `python -m benchmarks.bench_world` measures a full rebuild)",
        "",
        "| metric | model samples (held-out prompts, T=1) | corpus |",
        "| --- | --- | --- |",
    ]
    for key in ("score_mean", "score_std", "score_q25", "score_median", "score_q75",
                "distinct_1", "distinct_2", "mean_words"):
        lines.append(f"| {key} | {samples[key]:.3f} | {corpus[key]:.3f} |")
    lines.append(f"| eos_fraction | {samples['eos_fraction']:.3f} | 1.000 |")
    lines += ["", "Corpus scores use all of sft.jsonl; distinct-n uses as many corpus records as",
              "there are samples. The gap in mean score comes mostly from repeated words and",
              "broken sentences in the samples: room for RL to improve."]
    return lines


@one_line_interrupt("python -m rlhf_helpers.world.build",
                    "run it again (with --force if it names a file this left cut short)")
def main(argv: list[str] | None = None) -> dict:
    """Command-line entry point; returns the statistics it wrote into the card."""
    parser = argparse.ArgumentParser(prog="python -m rlhf_helpers.world.build",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of every record and the model")
    parser.add_argument("--out", default=None, help="output directory (default data/)")
    parser.add_argument("--fast", action="store_true", help="small files, few training steps")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--skip-model", action="store_true", help="write the data files only")
    only.add_argument("--model-only", action="store_true",
                      help="train the tiny model on the folder's own sft.jsonl; write no data file "
                           "and no card")
    parser.add_argument("--force", action="store_true",
                        help="replace files this builder did not write")
    args = parser.parse_args(argv)
    if args.out is not None and not args.out.strip():
        parser.error("--out must name a folder, got an empty path")
    args.out = data_dir() if args.out is None else Path(args.out)
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"--seed must be an int in [0, {MAX_SEED}], got {args.seed}")
    blocked = next((folder for folder in (args.out, *args.out.parents) if folder.exists()), None)
    if blocked is not None and not blocked.is_dir():
        parser.error(f"--out {args.out}: {blocked} is a file, not a folder")
    # the folder's own files train and measure the model: checked before anything is replaced
    if args.model_only:
        try:
            load_sft_corpus(args.out)
            load_prompts("test", args.out)
        except (ValueError, OSError) as error:  # the loaders name the file (and the line)
            parser.error(f"--model-only trains on the folder's own files: {error}")
    files = None
    if not args.model_only:
        files, stats = data_files(args.seed, FAST_SIZES if args.fast else None)
    foreign = foreign_files(args.out, files, model=not args.skip_model)
    if foreign and not args.force:
        parser.error(f"{args.out} holds {', '.join(foreign)}, which this builder did not write (or "
                     "wrote with other settings); nothing was written. Build into a new --out "
                     "folder, pass --model-only to train only the tiny model on the folder's own "
                     "sft.jsonl, or --force to replace them")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.model_only:
        return {"data": None, "model": build_model(args.out, args.seed, args.fast)}
    for name, records in files.items():
        write_jsonl(args.out / name, records)
    model_log = None if args.skip_model else build_model(args.out, args.seed, args.fast)
    write_card(args.out, stats, model_log)
    return {"data": stats, "model": model_log}


if __name__ == "__main__":
    main()
