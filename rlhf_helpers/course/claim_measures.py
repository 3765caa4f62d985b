"""What a claim measured: the numbers on each side of its comparisons, and by how much it holds.

A claim is checked as a bool (`check_claims({"the score rises by over 0.5": rise > 0.5})`), which
says whether it holds but not by how much. To say more, this module reads the check cell's own
source: it finds the `check_claims({...})` call that is running, takes each claim's expression,
and evaluates the operands of its comparisons again in the cell's namespace. A claim's expression
reads the run's results and changes nothing, so evaluating a side of it twice gives the same
number.

    rise > 0.5                       -> one comparison: left 0.83, right 0.5, slack +0.33
    0.8 < gap < 1.4                  -> two: slack min(gap - 0.8, 1.4 - gap)
    a > 1 and bool(b < 2)            -> the smallest slack of the two (of `or`: the largest)

The slack is signed: positive where the comparison holds, negative by how much it fails. Its
relative size divides it by the larger of that comparison's two sides (1e-12 at least), so that a
claim about a KL of 1e-7 and one about a score of 3 share a scale; an `and` keeps the comparison
with the smallest relative slack, an `or` the largest. `==`, `!=`, `in` and a bare bool have no
slack (None); their sides are still recorded. A claim that mixes them (or a part written another
way, such as pandas' `between(...).all()`) with ordering comparisons takes its margin from the
ordering comparisons alone: the other parts are checked for holding, not measured.
"""

from __future__ import annotations

import ast
import linecache
import math
from dataclasses import dataclass
from types import FrameType

#: The ordering comparisons, each as (left, right) -> signed slack, positive where it holds
_SLACK = {ast.Lt: lambda a, b: b - a, ast.LtE: lambda a, b: b - a,
          ast.Gt: lambda a, b: a - b, ast.GtE: lambda a, b: a - b}
_SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
           ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}


@dataclass(frozen=True)
class Side:
    """One comparison of a claim: `left op right` as the code reads it, and the values."""

    #: the comparison's source, e.g. "mean_of(late, 'kl') < 0.5"
    text: str
    #: the left operand's value (a float where it is a number, else its repr)
    left: float | str
    #: the operator, e.g. "<"
    op: str
    #: the right operand's value
    right: float | str
    #: right - left for < and <=, left - right for > and >=; None for other operators or values
    slack: float | None
    #: slack / max(|left|, |right|, 1e-12); None where slack is None
    relative: float | None


@dataclass(frozen=True)
class Measure:
    """Everything one claim compared, and by how much it holds."""

    #: the claim's text, as the notebook states it
    claim: str
    #: whether it holds on this run
    holds: bool
    #: each comparison found in its expression, in source order
    sides: tuple[Side, ...]
    #: the slack of the comparison that decides it (the smallest relative slack of an `and`, the
    #: largest of an `or`); None without an ordering comparison
    slack: float | None
    #: that comparison's relative slack; None where slack is None
    relative: float | None


def _number(value: object) -> float | str:
    """A 0-d tensor, numpy scalar, int or float as a float; anything else as its short repr."""
    if isinstance(value, bool):
        return repr(value)
    item = getattr(value, "item", None)
    if callable(item) and len(getattr(value, "shape", ())) == 0:
        value = item()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unwrap(node: ast.expr) -> ast.expr:
    """`bool(x)` -> x: the course wraps numpy and torch comparisons in bool()."""
    while (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
           and node.func.id == "bool" and len(node.args) == 1 and not node.keywords):
        node = node.args[0]
    return node


Slack = tuple[float, float] | None  # (slack, relative slack)


def _combine(slacks: list[Slack], how: type) -> Slack:
    """The deciding comparison of an `and` (smallest relative slack) or an `or` (largest)."""
    known = [s for s in slacks if s is not None]
    if not known:
        return None
    pick = min if how is ast.And else max
    return pick(known, key=lambda s: s[1])


def _relative(slack: float, left: float, right: float) -> float:
    return slack / max(abs(left), abs(right), 1e-12) if math.isfinite(slack) else slack


def _measure(node: ast.expr, evaluate, sides: list[Side]) -> Slack:
    """Record the comparisons of `node` into `sides`; return its (slack, relative slack), None if
    it has no ordering comparison."""
    node = _unwrap(node)
    if isinstance(node, ast.BoolOp):
        return _combine([_measure(v, evaluate, sides) for v in node.values], type(node.op))
    if not isinstance(node, ast.Compare):
        return None
    values = [evaluate(node.left)] + [evaluate(c) for c in node.comparators]
    operands = [node.left, *node.comparators]
    slacks = []
    for i, op in enumerate(node.ops):
        left, right = _number(values[i]), _number(values[i + 1])
        numeric = isinstance(left, float) and isinstance(right, float)
        slack = _SLACK[type(op)](left, right) if numeric and type(op) in _SLACK else None
        relative = None if slack is None else _relative(slack, left, right)
        text = f"{ast.unparse(operands[i])} {_SYMBOL[type(op)]} {ast.unparse(operands[i + 1])}"
        sides.append(Side(text, left, _SYMBOL[type(op)], right, slack, relative))
        slacks.append(None if slack is None else (slack, relative))
    return _combine(slacks, ast.And)


def _claim_expressions(frame: FrameType) -> dict[str, ast.expr]:
    """{claim text: its expression} of the `check_claims({...})` call running in `frame`; {} when
    its source cannot be read (code that was not written to a file or cell)."""
    source = "".join(linecache.getlines(frame.f_code.co_filename))
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    line = frame.f_lineno
    for call in ast.walk(tree):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id == "check_claims" and call.args
                and isinstance(call.args[0], ast.Dict)
                and call.lineno <= line <= (call.end_lineno or call.lineno)):
            return {key.value: value for key, value in zip(call.args[0].keys, call.args[0].values,
                                                           strict=True)
                    if isinstance(key, ast.Constant) and isinstance(key.value, str)}
    return {}


def measure_claims(holds: dict[str, bool], frame: FrameType | None) -> list[Measure]:
    """One Measure per claim of `holds`, its sides evaluated again in `frame` (the cell that called
    check_claims). A claim whose source is not found, or whose sides fail to evaluate again, has no
    sides and no slack."""
    expressions = _claim_expressions(frame) if frame is not None else {}
    measures = []
    for claim, held in holds.items():
        sides: list[Side] = []
        decided: Slack = None
        if claim in expressions:

            def evaluate(node: ast.expr):
                code = compile(ast.Expression(node), "<claim>", "eval")
                return eval(code, frame.f_globals, frame.f_locals)  # noqa: S307 - the cell's own code

            try:
                decided = _measure(expressions[claim], evaluate, sides)
            except Exception:  # noqa: BLE001 - a side that does not evaluate alone: no measure
                sides, decided = [], None
        slack, relative = decided if decided is not None else (None, None)
        measures.append(Measure(claim, held, tuple(sides), slack, relative))
    return measures
