"""JSONL loading: the shipped files load, and malformed files fail with the path and line."""

from __future__ import annotations

import pytest

from rlhf_helpers.runtime.data import (
    DATA_DIR_ENV,
    data_dir,
    load_jsonl,
    load_preferences,
    load_prompt_records,
    load_prompts,
    load_sft_corpus,
    write_jsonl,
)
from rlhf_helpers.world.records import DEFAULT_SIZES


def test_shipped_files_load_with_the_documented_fields():
    assert len(load_prompts("train")) == DEFAULT_SIZES["prompts_train"]
    assert len(load_prompts("test")) == DEFAULT_SIZES["prompts_test"]
    assert all(p.startswith("Review of the ") and p.endswith(":") for p in load_prompts("test"))
    assert set(load_prompt_records("test")[0]) == {"prompt", "genre", "title"}
    sft = load_sft_corpus()
    assert len(sft) == DEFAULT_SIZES["sft"] and set(sft[0]) == {"prompt", "completion"}
    pairs = load_preferences("train")
    assert len(pairs) == DEFAULT_SIZES["preferences_train"]
    assert set(pairs[0]) == {"prompt", "chosen", "rejected"}
    assert len(load_preferences("test")) == DEFAULT_SIZES["preferences_test"]


def test_round_trip_and_blank_lines(tmp_path):
    records = [{"prompt": "a", "chosen": " b", "rejected": " c"}, {"prompt": "é", "chosen": " ",
                                                                     "rejected": " d"}]
    path = tmp_path / "x.jsonl"
    write_jsonl(path, records)
    path.write_text(path.read_text() + "\n  \n")
    assert load_jsonl(path, ("prompt", "chosen", "rejected")) == records


@pytest.mark.parametrize(
    "lines, line_number, message",
    [
        (['{"prompt": "a"}', "{not json"], 2, "not valid JSON"),
        (['{"prompt": "a"}', "", "[1, 2]"], 3, "expected a JSON object"),
        (['{"prompt": "a"}', '{"other": "b"}'], 2, "missing field 'prompt'"),
        (['{"prompt": 3}'], 1, "field 'prompt' must be a string"),
    ],
)
def test_malformed_lines_name_the_file_and_line(tmp_path, lines, line_number, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as error:
        load_jsonl(path, ("prompt",))
    text = str(error.value)
    assert str(path) in text and f"line {line_number}" in text and message in text


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_jsonl(tmp_path / "nope.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no records"):
        load_jsonl(empty)


def test_data_dir_override_and_split_validation(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert data_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match="prompts_train.jsonl"):
        load_prompts("train")
    write_jsonl(tmp_path / "prompts_train.jsonl", [{"prompt": "p", "genre": "g", "title": "t"}])
    assert load_prompts("train") == ["p"]
    with pytest.raises(ValueError, match="split"):
        load_preferences("validation")


def test_a_non_utf8_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    good = b'{"prompt": "a"}\n'
    bad = '{"prompt": "caf\xe9"}\n'.encode("latin-1")  # latin-1 é: a lone 0xE9 is not UTF-8
    path.write_bytes(good + bad + good)
    with pytest.raises(ValueError) as error:
        load_jsonl(path, ("prompt",))
    text = str(error.value)
    assert str(path) in text and "line 2" in text and "not valid UTF-8" in text
    assert f"at byte {bad.index(0xE9)} of the line" in text  # 0-based, counted in bytes


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    """Some editors start UTF-8 files with a BOM (EF BB BF); it is not part of the first record."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + '{"prompt": "é"}\r\n{"prompt": "b"}\r\n'.encode())
    assert load_jsonl(path, ("prompt",)) == [{"prompt": "é"}, {"prompt": "b"}]


# ----------------------------------------------------------------------------- malformed data files
def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


PROMPT = '{"prompt": %s, "genre": "drama", "title": "T"}'
PAIR = '{"prompt": "p", "chosen": %s, "rejected": %s}'


@pytest.mark.parametrize(("text", "message"), [
    ('""', "line 2: field 'prompt' is empty"), ('"   "', "line 2: field 'prompt' is empty"),
    ('"a \\ud800 b"', "line 2: field 'prompt' holds a lone UTF-16 surrogate"),
])
def test_an_empty_prompt_or_a_lone_surrogate_is_refused_with_file_and_line(tmp_path, text, message):
    from rlhf_helpers.runtime.data import load_prompts

    path = write_lines(tmp_path / "prompts_train.jsonl", [PROMPT % '"fine"', PROMPT % text])
    with pytest.raises(ValueError, match=message) as refused:
        load_prompts("train", tmp_path)
    assert str(path) in str(refused.value)


def test_a_lone_surrogate_in_a_preference_is_refused(tmp_path):
    write_lines(tmp_path / "preferences_train.jsonl", [PAIR % ('"good"', '"bad \\udfff"')])
    with pytest.raises(ValueError, match="line 1: field 'rejected' holds a lone UTF-16 surrogate"):
        load_preferences("train", tmp_path)


def test_what_is_accepted_is_said_in_a_warning(tmp_path):
    write_lines(tmp_path / "preferences_train.jsonl", [
        PAIR % ('"good"', '"bad"'), PAIR % ('"same"', '"same"'), PAIR % ('""', '"bad"'),
        PAIR % ('"good"', '"bad"'), PAIR % ('"nul \\u0000 here"', '"bad"')])
    with pytest.warns(UserWarning) as caught:
        pairs = load_preferences("train", tmp_path)
    assert len(pairs) == 5  # accepted, as before
    text = "\n".join(str(w.message) for w in caught)
    assert "1 line(s) hold a NUL character (first: line 5)" in text
    assert ("1 pair(s) with chosen == rejected (the pair carries no preference); first: record 2"
            in text)
    assert "1 pair(s) with an empty chosen or rejected response; first: record 3" in text
    assert "1 pair(s) with a repeat of an earlier pair (it counts twice); first: record 4" in text


def test_a_folder_where_a_data_file_belongs_is_named_as_a_folder(tmp_path):
    (tmp_path / "prompts_train.jsonl").mkdir()
    with pytest.raises(IsADirectoryError, match="is a folder; expected a JSONL file"):
        load_jsonl(tmp_path / "prompts_train.jsonl")


def test_the_gpu_sft_folder_follows_the_cache_dir_which_defaults_to_the_runs_dir(
        tmp_path, monkeypatch):
    from rlhf_helpers.runtime.profiles import get_profile

    monkeypatch.delenv("RLHF_CACHE_DIR", raising=False)
    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "elsewhere"))
    assert get_profile("gpu", weights="hub").sft_model_path == str(tmp_path / "elsewhere"
                                                                   / "sft-smollm2-135m")
    assert get_profile("gpu",
                       weights="random").sft_model_path.startswith(str(tmp_path / "elsewhere"))
    # the caches may live apart from the runs
    monkeypatch.setenv("RLHF_CACHE_DIR", str(tmp_path / "cache"))
    assert get_profile("gpu",
                       weights="hub").sft_model_path == str(tmp_path / "cache" / "sft-smollm2-135m")


def test_a_key_given_twice_in_one_record_is_refused_with_file_and_line(tmp_path):
    """json keeps the last of two equal keys; an empty first prompt then hides behind a good second
    one."""
    from rlhf_helpers.runtime.data import load_jsonl

    path = tmp_path / "prompts_train.jsonl"
    path.write_text('{"prompt": "The film was"}\n{"prompt": "", "prompt": "The movie was"}\n',
                    encoding="utf-8")
    with pytest.raises(ValueError,
                       match=r"prompts_train.jsonl, line 2: the key 'prompt' appears twice"):
        load_jsonl(path, fields=["prompt"])
    nested = tmp_path / "nested.jsonl"
    nested.write_text('{"prompt": "a", "meta": {"k": 1, "k": 2}}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 1: the key 'k' appears twice"):
        load_jsonl(nested)


def training_data_copy(tmp_path, monkeypatch):
    """A copy of the shipped data files (the tiny model linked, not copied) as $RLHF_DATA_DIR, a
    runs folder in tmp_path and small PPO batches: a training command's inputs that a test may
    damage."""
    import json
    import os

    from rlhf_helpers.runtime.data import data_dir

    folder = tmp_path / "data"
    folder.mkdir()
    for path in data_dir().glob("*.jsonl"):
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "models").mkdir()
    os.symlink(data_dir() / "models" / "tiny-sft", folder / "models" / "tiny-sft")
    monkeypatch.setenv("RLHF_DATA_DIR", str(folder))
    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES",
                       json.dumps({"rollout_batch_size": 4, "mini_batch_size": 2}))
    return folder


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "prompts_train.jsonl").write_text(""), "prompts_train.jsonl"),
    (lambda d: (d / "prompts_test.jsonl").open("a").write("not json\n"),
     f"prompts_test.jsonl, line {DEFAULT_SIZES['prompts_test'] + 1}: not valid JSON"),
    (lambda d: ((d / "prompts_train.jsonl").unlink(),
                (d / "prompts_train.jsonl").mkdir()), "is a folder"),
    (lambda d: (d / "preferences_train.jsonl").write_text('{"prompt": "a", "chosen": "b"}\n'),
     "preferences_train.jsonl, line 1: missing field 'rejected'"),
])
def test_a_bad_data_file_stops_training_with_exit_2_naming_it(
        tmp_path, monkeypatch, capsys, damage, message):
    """Through the training command: one line, exit 2, before any model is built (was a traceback,
    exit 1)."""

    from rlhf_helpers.stages import train_ppo

    folder = training_data_copy(tmp_path, monkeypatch)
    damage(folder)
    monkeypatch.setattr(train_ppo, "build_shared_model", lambda *a,
                        **k: pytest.fail("the model was built"))
    monkeypatch.setattr(train_ppo, "ensure_sft_model", lambda *a,
                        **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as stopped:
        train_ppo.main(["--profile", "tiny", "--steps", "1", "--output-dir", str(tmp_path / "ppo")])
    err = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(err) == 1, err
    assert "error: data: " in err[0] and message in err[0], err


def test_prompts_the_tokenizer_cannot_spell_are_counted_and_training_warns_once(
        tmp_path, monkeypatch, capsys):
    import json

    from rlhf_helpers.runtime.models import load_tokenizer, unknown_tokens
    from rlhf_helpers.runtime.profiles import get_profile
    from rlhf_helpers.stages import train_ppo

    tokenizer = load_tokenizer(get_profile("tiny"))
    # the shipped prompts: every token known
    assert unknown_tokens(tokenizer, load_prompts("train")) == (0.0, 0)
    share, only = unknown_tokens(tokenizer, ["Review of the drama Bitter Road:", "😀😀", "مرحبا"])
    ids = tokenizer(["Review of the drama Bitter Road:", "😀😀", "مرحبا"],
                    add_special_tokens=False)["input_ids"]
    assert only == 2 and share == sum(t == tokenizer.unk_token_id for row in ids
                                      for t in row) / sum(map(len, ids))
    assert unknown_tokens(tokenizer, []) == (0.0, 0)

    folder = training_data_copy(tmp_path, monkeypatch)
    with (folder / "prompts_train.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"prompt": "😀😀 🎬", "genre": "drama", "title": "X"}) + "\n")
    monkeypatch.setattr(train_ppo, "ensure_reward_model", lambda *a, **k: None)

    class Built(Exception):
        pass

    def build(*args, **kwargs):
        raise Built

    monkeypatch.setattr(train_ppo, "build_shared_model", build)
    with pytest.raises(Built):
        train_ppo.main(["--profile", "tiny", "--steps", "1", "--output-dir", str(tmp_path / "ppo")])
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    total = len(load_prompts("train", folder))
    assert len(warned) == 1 and f"(1 of {total} prompts are nothing else)" in warned[0], warned
    assert (warned[0].startswith("warning: 0.0")
            and "% of the training prompts' tokens are unknown" in warned[0])
