"""What the tests of the commands share: the one line a refusal prints, and whether a process is
importing torch (the moment a Ctrl-C used to end in a traceback)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def refused_line(call: Callable[[], Any], capsys: pytest.CaptureFixture[str], code: int = 2) -> str:
    """The one stderr line of `call()`, which must end in SystemExit(code) (2: bad input, 130:
    Ctrl-C) with exactly that line and no traceback."""
    with pytest.raises(SystemExit) as refused:
        call()
    err = capsys.readouterr().err.strip()
    assert refused.value.code == code, err
    assert err and "\n" not in err, err
    return err


def torch_is_loading(pid: int) -> bool:
    """Whether the process has mapped torch's library: it is importing torch, seconds before a
    command's `main` runs."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False
