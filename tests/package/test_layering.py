"""The package's architecture, read from the source with ast, so it stays as designed.

Layers (an import may point only down, or within its own package):

    core      maths only: imports nothing else of rlhf_helpers
    runtime   profiles, PPO config, precision, models, data, cache    -> core
    world     the offline review world                                -> core, runtime
    ppo       the engine (knows neither the world nor the stages)     -> core, runtime
    doctor    the run doctor: rules on a run's metrics and files      -> core, runtime, ppo
    cluster   the same run's verl / OpenRLHF settings                 -> core, runtime
    stages    SFT -> reward -> PPO, the pipeline and its CLIs         -> core, runtime, world, ppo,
                                                                         doctor
    compare   PPO vs GRPO/RLOO vs best-of-n                           -> ... , stages
    widgets   explorers and live figures                              -> core, runtime, doctor
    course    notebook header, Colab set-up, notebook 06's harness,
              `make course`                                           -> anything below

The package root's own modules are its facade: `__init__` (the maths re-exports) and `_moved` (old
import paths of moved modules, resolved only when imported).

Also: no import circle between modules, nothing imports `benchmarks`, no function over 60 lines
of code, imports inside functions only for heavy optional packages and each with a comment, and no
code branches on an exception's message text.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "rlhf_helpers"
#: package -> the packages it may import besides itself
ALLOWED = {
    "core": set(),
    "runtime": {"core"},
    "world": {"core", "runtime"},
    "ppo": {"core", "runtime"},
    "doctor": {"core", "runtime", "ppo"},
    "cluster": {"core", "runtime"},
    "stages": {"core", "runtime", "world", "ppo", "doctor"},
    "compare": {"core", "runtime", "world", "ppo", "doctor", "stages"},
    "widgets": {"core", "runtime", "doctor"},
    "course": {"core", "runtime", "world", "ppo", "doctor", "cluster", "stages", "compare",
               "widgets"},
}
#: the package root's modules besides its __init__: a facade, in no layer
ROOT_MODULES = {"_moved"}
#: third-party packages a function may import lazily, with a comment saying why
LAZY_OK = {"trl", "datasets", "plotly", "ipywidgets", "IPython", "nbclient",
           "nbformat", "accelerate"}
#: modules kept free of torch (imported by the header cell, the world builder, the profiles): torch
#: & co lazily
LIGHT = {"runtime.profiles", "runtime.precision", "runtime.data", "course.notebook"}
HEAVY = {"torch", "transformers", "peft", "safetensors", "tokenizers"}
#: modules whose functions' source is copied elsewhere and so must import what they use inside them
SELF_CONTAINED = {"course.colab_setup"}


def modules() -> dict[str, Path]:
    """'ppo.trainer' -> its path, for every module of the package ('' is the package's __init__)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        out[name.removesuffix("__init__").rstrip(".")] = path
    return out


MODULES = modules()


def imports(path: Path) -> list[tuple[ast.stmt, str, bool]]:
    """(node, absolute module name, inside a function?) of every import in a file."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((child, alias.name, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                assert child.level == 0, f"{path}: relative import"
                base = child.module or ""
                # `from pkg import module`
                if base == "rlhf_helpers" or base.startswith("rlhf_helpers."):
                    for alias in child.names:
                        full = f"{base}.{alias.name}"
                        inner = full.removeprefix("rlhf_helpers.")
                        found.append((child, full if inner in MODULES else base, in_function))
                else:
                    found.append((child, base, in_function))
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(tree, False)
    return found


def internal(name: str) -> str | None:
    """The package module `name` refers to ('core.gae'), or None for another library."""
    if name != "rlhf_helpers" and not name.startswith("rlhf_helpers."):
        return None
    inner = name.removeprefix("rlhf_helpers").lstrip(".")
    while inner and inner not in MODULES:
        inner = inner.rpartition(".")[0]
    return inner


def layer(module: str) -> str | None:
    return module.split(".")[0] if "." in module or module in ALLOWED else None


def edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        graph[name] = {t for _, imported,
                       _ in imports(path) if (t := internal(imported)) not in (None, name)}
    return graph


def test_every_module_lives_in_a_layer():
    loose = [m for m in MODULES if m and m not in ROOT_MODULES and layer(m) not in ALLOWED]
    assert loose == [], f"modules outside the layers {sorted(ALLOWED)}: {loose}"


def test_imports_point_down_the_layers():
    wrong = []
    for module, targets in edges().items():
        here = layer(module)
        for target in targets:
            there = layer(target)
            if here is None or there is None or there == here:
                # the root package re-exports the maths core lazily; same-layer imports are fine
                continue
            if there not in ALLOWED[here]:
                wrong.append(f"{module} -> {target}")
    assert wrong == [], "imports against the layers:\n" + "\n".join(wrong)


def test_core_imports_nothing_else_of_the_package():
    assert all(layer(t) == "core" for m,
               ts in edges().items() if layer(m) == "core" for t in ts if t)


def test_no_import_circle():
    # the root __init__ is only a facade
    graph = {m: {t for t in ts if t} for m, ts in edges().items() if m}
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        seen[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if seen.get(nxt) == 1:
                raise AssertionError("import circle: "
                                     + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in seen:
                visit(nxt)
        path.pop()
        seen[node] = 2

    for start in sorted(graph):
        if start not in seen:
            visit(start)


def test_nothing_imports_benchmarks():
    bad = [f"{m} imports {n}" for m, p in MODULES.items() for _, n,
           _ in imports(p) if n.split(".")[0] == "benchmarks"]
    assert bad == []


def optional_wrappers() -> set[str]:
    """The package's modules that import one of LAZY_OK at their top (a notebook client on
    nbclient): importing one is as heavy, and as optional, as importing that package."""
    return {name for name, path in MODULES.items()
            if any(not in_function and imported.split(".")[0] in LAZY_OK
                   for _, imported, in_function in imports(path))}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_inside_functions_are_heavy_optional_ones_with_a_reason(module):
    if module in SELF_CONTAINED:
        return
    lines = MODULES[module].read_text().splitlines()
    for node, name, in_function in imports(MODULES[module]):
        if not in_function:
            continue
        top = name.split(".")[0]
        allowed = (top in LAZY_OK or (module in LIGHT and top in HEAVY)
                   or internal(name) in optional_wrappers())
        assert allowed, (
            f"{module}:{node.lineno}: `{name}` imported inside a function (import it at the top)")
        commented = "#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith("#")
        assert commented, (
            f"{module}:{node.lineno}: a lazy import of {name} needs a comment saying why")


#: The longest a function's code may be (its lines after the docstring): modules are split along
#: concepts, as long as a concept needs, but a function longer than a screen is two jobs.
MAX_FUNCTION_LINES = 60


def test_functions_fit_a_screen():
    long = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = node.body
            if (len(body) > 1 and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                body = body[1:]  # the docstring does not count
            lines = node.end_lineno - body[0].lineno + 1
            if lines > MAX_FUNCTION_LINES:
                long.append(f"{module}.{node.name}: {lines} lines")
    assert long == [], f"split these by job: {long}"


def test_no_code_branches_on_an_error_message():
    pattern = re.compile(r"""["'][^"']{3,}["']\s+(?:not\s+)?in\s+str\(\s*\w+\s*\)""")
    bad = [m for m, p in MODULES.items() if pattern.search(p.read_text())]
    assert bad == [], f"catch a typed exception instead of reading its text: {bad}"


def test_the_checker_sees_a_violation():
    """The rules above are not vacuous: the checker reads real edges and would catch an upward
    one."""
    graph = edges()
    assert "core.checks" in graph["core.gae"] and "ppo.model.shared_model" in graph["ppo.trainer"]
    assert "ppo" not in ALLOWED["runtime"] and "world" not in ALLOWED["ppo"]
    assert "doctor" not in ALLOWED["ppo"]
    assert "ppo.checkpoints.digest" in graph["doctor.checkpoints"]
    tree_imports = imports(MODULES["stages.train_ppo"])
    assert any(internal(n) == "ppo.trainer" for _, n, _ in tree_imports)


def test_ruff_is_clean_at_the_line_length_the_code_uses():
    """pyproject's ruff settings (line length 120; the notebook sources' three exemptions are
    pyproject's) hold for the package, tests, benchmarks, tools and notebooks/src: `make lint`, run
    here so CI enforces it."""
    ruff = Path(sys.executable).with_name("ruff")
    ruff = str(ruff) if ruff.exists() else shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed in this environment")
    root = PACKAGE.parent
    out = subprocess.run(
        [ruff, "check", "rlhf_helpers", "tests", "benchmarks", "tools", "notebooks/src"], cwd=root,
        capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]
