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
