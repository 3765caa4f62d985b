"""Ctrl-C in every command is one line on stderr and exit 130, never a traceback: one shared helper
(`runtime.interrupt.one_line_interrupt`) around each command's `main`, and `quiet_early_interrupt`
while a command of the package still imports torch. The training command has its own line, naming
the checkpoint to resume from (tests/stages/test_cli_limits.py)."""

from __future__ import annotations

import ast
import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from command_lines import torch_is_loading
from tool_scripts import TOOLS, load_tool

from rlhf_helpers.runtime.interrupt import EXIT_INTERRUPTED, interrupted_line, one_line_interrupt

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "rlhf_helpers"
#: the commands with a Ctrl-C line of their own
OWN_LINE = {"stages/train_ppo.py"}
#: tools that need no line: standard library only, done in a blink
INSTANT_TOOLS = {"gpu_stage_result.py"}


def interrupt(*args: Any, **kwargs: Any) -> None:
    raise KeyboardInterrupt


def one_line_of(main: Callable[..., Any], args: tuple, capsys) -> str:
    """The one stderr line of `main(*args)` ended by Ctrl-C (exit 130)."""
    with pytest.raises(SystemExit) as ended:
        try:
            main(*args)
        except KeyboardInterrupt:
            pytest.fail("Ctrl-C reached the caller as a KeyboardInterrupt (a traceback)")
    err = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == EXIT_INTERRUPTED, err
    assert len(err) == 1, err
    return err[0]


def test_the_helper_turns_ctrl_c_into_one_line_and_exit_130_and_passes_the_rest_through(capsys):
    @one_line_interrupt("my-command", "nothing was written")
    def main(stop: BaseException | None = None) -> int:
        if stop is not None:
            raise stop
        return 7

    assert one_line_of(main, (KeyboardInterrupt(),), capsys) == (
        "my-command: interrupted (Ctrl-C); nothing was written")
    assert main() == 7 and main.__name__ == "main"
    with pytest.raises(ValueError, match="other"):  # an error is not an interrupt
        main(ValueError("other"))


def test_a_real_sigint_is_one_line_and_exit_130():
    """SIGINT to a process whose `main` is decorated, while it works."""
    code = textwrap.dedent("""
        import time
        from rlhf_helpers.runtime.interrupt import one_line_interrupt

        @one_line_interrupt("sleeper", "nothing was written")
        def main():
            print("working", flush=True)
            time.sleep(60)

        main()
    """)
    process = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "working\n"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.strip() == "sleeper: interrupted (Ctrl-C); nothing was written", err



@pytest.mark.skipif(not Path("/proc/self/maps").exists(),
                    reason="reads /proc to see torch being imported")
def test_ctrl_c_while_the_doctor_imports_torch_is_one_line_and_exit_130(tmp_path):
    """Before: a KeyboardInterrupt traceback out of `import torch`."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    process = subprocess.Popen(
        [sys.executable, "-m", "rlhf_helpers.stages.diagnose", str(tmp_path)], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while (not torch_is_loading(process.pid) and process.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.005)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.strip() == interrupted_line("python -m rlhf_helpers.stages.diagnose",
                                           "before it started, so nothing was written"), err


def package_command(name: str) -> Callable[[], Any]:
    return lambda: importlib.import_module(f"rlhf_helpers.{name}")


#: label -> (the module, the function its main calls that Ctrl-C interrupts, main's arguments
#: (tmp_path -> args), the command's name in its line)
COMMANDS: dict[str, tuple[Callable[[], Any], str, Callable[[Path], tuple], str]] = {
    "reward": (package_command("stages.reward"), "ensure_sft_model",
               lambda tmp: (["--profile", "tiny", "--threads", "1", "--out", str(tmp / "r")],),
               "python -m rlhf_helpers.stages.reward"),
    "doctor": (package_command("stages.diagnose"), "diagnose", lambda tmp: ([str(tmp)],),
               "python -m rlhf_helpers.stages.diagnose"),
    "export": (package_command("cluster.export"), "get_profile", lambda tmp: ([],),
               "python -m rlhf_helpers.cluster.export"),
    # its first step that is not parsing (the gpu profile's machine check: a CPU-only machine
    # would refuse before the training)
    "sft": (package_command("stages.sft"), "base_problem", lambda tmp: ([],),
            "python -m rlhf_helpers.stages.sft"),
    "world": (package_command("world.build"), "data_files",
              lambda tmp: (["--out", str(tmp / "data"), "--fast", "--skip-model"],),
              "python -m rlhf_helpers.world.build"),
    "run_course": (package_command("course.run_course"), "course_notebooks",
                   lambda tmp: (["--notebooks", str(tmp)],),
                   "python -m rlhf_helpers.course.run_course"),
    "build_site": (lambda: load_tool("build_site"), "ensure_executed", lambda tmp: ([],),
                   "tools/build_site.py"),
    "build_notebooks": (lambda: load_tool("build_notebooks"), "sources",
                        lambda tmp: (["--check"],), "tools/build_notebooks.py"),
    "course_time": (lambda: load_tool("course_time"), "cpu_seconds", lambda tmp: ([],),
                    "tools/course_time.py"),
    "claim_margins": (lambda: load_tool("claim_margins"), "available_variants",
                      lambda tmp: (["--out", str(tmp)],), "tools/claim_margins.py"),
    "walk_iteration": (lambda: load_tool("walk_iteration"), "walk_one_iteration",
                       lambda tmp: ([],), "tools/walk_iteration.py"),
    "write_docs": (lambda: load_tool("write_docs"), "metrics_markdown",
                   lambda tmp: (["--check", "--docs", str(tmp)],), "tools/write_docs.py"),
}


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("command", COMMANDS)
def test_ctrl_c_in_a_command_is_one_line_and_exit_130(command, tmp_path, monkeypatch, capsys):
    """Before: the reward command, the doctor and the export printed a KeyboardInterrupt
    traceback (exit 1), as did the other commands and tools."""
    load, working, args, prog = COMMANDS[command]
    module = load()
    monkeypatch.setattr(module, working, interrupt)
    line = one_line_of(module.main, args(tmp_path), capsys)
    assert line.startswith(f"{prog}: interrupted (Ctrl-C)"), line


def runs_as_a_command(path: Path) -> bool:
    """Whether the module has an `if __name__ == "__main__":` block of its own."""
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and getattr(node.test.left, "id", "") == "__name__"
               for node in ast.parse(path.read_text()).body)


def entry_points() -> dict[str, Path]:
    """Every command of the package (a module run as __main__) and every script of tools/."""
    found = {path.relative_to(PACKAGE).as_posix(): path for path in PACKAGE.rglob("*.py")
             if runs_as_a_command(path)}
    found.update({f"tools/{path.name}": path for path in TOOLS.glob("*.py")
                  if path.name not in INSTANT_TOOLS})
    return {name: path for name, path in found.items() if name not in OWN_LINE}


#: what a command may import before it quiets Ctrl-C: the standard library, and the helper itself
QUICK_IMPORTS = set(sys.stdlib_module_names) | {"__future__", "rlhf_helpers.runtime.interrupt"}


def imports_before_quiet(tree: ast.Module) -> list[str]:
    """The modules a command imports at its top, before its `if __name__ == "__main__":` block
    that calls `quiet_early_interrupt` (all of them where it has none), other than QUICK_IMPORTS:
    a Ctrl-C while they load (seconds: nbformat, jupytext, torch) would be a traceback."""
    found = []
    for node in tree.body:
        if (isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)
                and "quiet_early_interrupt(" in ast.unparse(node)):
            break
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found += [name for name in names
                  if name not in QUICK_IMPORTS and name.split(".")[0] not in QUICK_IMPORTS]
    return found


def test_every_command_and_tool_has_the_one_line_ctrl_c():
    """A command added later gets the same line: its `main` is decorated, and a command or a tool
    that imports more than the standard library quiets Ctrl-C before those imports. Before: the
    tools were exempt, and Ctrl-C in the first second of tools/build_site.py, course_time.py and
    build_notebooks.py printed a traceback from inside nbformat's or jupytext's imports."""
    missing = []
    for name, path in entry_points().items():
        tree = ast.parse(path.read_text())
        main = next((node for node in tree.body
                     if isinstance(node, ast.FunctionDef) and node.name == "main"), None)
        decorated = main is not None and any(
            isinstance(d, ast.Call) and getattr(d.func, "id", "") == "one_line_interrupt"
            for d in main.decorator_list)
        if not decorated:
            missing.append(f"{name}: main is not decorated with one_line_interrupt")
        if unquiet := imports_before_quiet(tree):
            missing.append(f"{name}: imports {unquiet[0]} before quiet_early_interrupt")
    assert missing == []
    assert len(entry_points()) >= len(COMMANDS)


def test_an_error_raised_from_a_ctrl_c_is_the_same_one_line(capsys):
    """A step's undo that failed on Ctrl-C raises StepUndoError from the KeyboardInterrupt: the
    command ends as on Ctrl-C; an error with another cause is passed through."""
    @one_line_interrupt("my-command")
    def main(cause: BaseException) -> int:
        raise RuntimeError("could not be undone whole") from cause

    assert one_line_of(main, (KeyboardInterrupt(),), capsys) == interrupted_line("my-command", "")
    with pytest.raises(RuntimeError, match="undone whole"):
        main(ValueError("another cause"))
