"""The commands' argument parser: a usage error is one line and exit 2, like every other refusal of
a command (`--help` still prints the usage and every flag).

    parser = OneLineParser(prog="python -m rlhf_helpers.cluster.export", description="...")
    parser.parse_args(["--gpus", "abc"])   # stderr: "python -m ...: error: argument --gpus: ..."
"""

from __future__ import annotations

import argparse
import typing


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line: argparse's usage lines before it would
    bury the error (the training command's sixty flags make forty lines)."""

    def error(self, message: str) -> typing.NoReturn:
        """Print `prog: error: message` on stderr and exit 2 (argparse's documented hook for its
        errors)."""
        self.exit(2, f"{self.prog}: error: {message}\n")
