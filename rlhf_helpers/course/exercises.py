"""An exercise's check cannot be passed by calling the library function the exercise teaches, by
changing the caller's tensors in place, or by never returning.

    exercise_check("Exercise 2 (gae_one)", check_gae_one, hidden=[rlhf_helpers.compute_gae])

While the check runs, a hidden Python function refuses to run: its code is swapped for one that
raises LibraryShortcut, so every way of reaching it refuses, whatever holds it (a module's name, an
import made during the check, a default argument, a dict, a bound method). So does the private twin
a library function delegates to (`_td_errors` beside `td_errors`). An object without swappable code
(a C function, a closure) is replaced instead by a tripwire wherever it is bound: in every loaded
`rlhf_helpers` module, every loaded module of its own package (torch's re-exports too), its class
and the notebook's namespace; after the check every binding of a tripwire is put back, in modules
imported during the check too. The check itself must then compare against an independent reference
(a loop, a formula), not against the library twin.

`guard_in_place` makes the learner's function fail when it changes a tensor it was given (the
notebook's tensors would change under it); `time_limit` stops a check that runs too long (an endless
loop); `same_function` tells whether a function is the one a check ran (or the same cell run again).
"""

from __future__ import annotations

import dataclasses
import importlib
import signal
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any


class LibraryShortcut(AssertionError):
    """The learner's code called the library function its exercise asks them to write."""


class CheckTimeout(Exception):
    """An exercise's check ran past its time limit."""


def qualified_name(obj: Any) -> str:
    """module.qualname of a function, method or class: the name a learner would import."""
    return f"{obj.__module__}.{obj.__qualname__}"


def _refusal(name: str) -> str:
    return (f"{name} is hidden during this check: it is what the exercise teaches, so write it "
            "from the equations (other library functions stay available)")


def tripwire(obj: Any) -> Callable[..., Any]:
    """A stand-in for `obj` that refuses to run, naming it."""
    message = _refusal(qualified_name(obj))

    def refuse(*_: Any, **__: Any) -> Any:
        raise LibraryShortcut(message)

    refuse.__name__ = refuse.__qualname__ = getattr(obj, "__name__", "hidden")
    return refuse


def _refuse_template(*args: Any, **kwargs: Any) -> Any:
    # runs with the hidden function's globals: it reaches this module by import; MESSAGE is replaced
    raise __import__("rlhf_helpers.course.exercises",
                     fromlist=["LibraryShortcut"]).LibraryShortcut("MESSAGE")


def _refusing_code(function: types.FunctionType) -> types.CodeType:
    """A code object that raises LibraryShortcut naming `function`, with no free variables."""
    code = _refuse_template.__code__
    consts = tuple(_refusal(qualified_name(function)) if c == "MESSAGE" else c
                   for c in code.co_consts)
    return code.replace(co_consts=consts, co_name=function.__name__)


def _owner_of_method(obj: Any) -> Any | None:
    """The class that defines `obj` when obj is a method (qualname "Class.method"), else None."""
    parts = obj.__qualname__.split(".")
    if len(parts) != 2 or "<locals>" in parts:
        return None
    owner = getattr(importlib.import_module(obj.__module__), parts[0], None)
    return owner if isinstance(owner, type) and vars(owner).get(parts[1]) is obj else None


def _swappable(obj: Any) -> types.FunctionType | None:
    """The Python function behind `obj` when its code can be swapped (no closure), else None."""
    function = getattr(obj, "__func__", obj)  # a bound method's function
    return function if isinstance(function,
                                  types.FunctionType) and not function.__closure__ else None


def _with_twins(objects: Iterable[Any]) -> dict[int, Any]:
    """The objects and the private twin (`_name` in the same module) of each, by id."""
    objects = list(objects)
    for obj in list(objects):
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        twin = getattr(module, f"_{getattr(obj, '__name__', '')}",
                       None) if module is not None else None
        if callable(twin):
            objects.append(twin)
    return {id(obj): obj for obj in objects}


def _rebind(owners: Iterable[Any], replace: Mapping[int, Any],
            originals: Mapping[int, Any]) -> None:
    """In each owner (a module, class or dict), every attribute that is one of `originals` becomes
    its replacement."""
    for owner in owners:
        items = owner if isinstance(owner, MutableMapping) else vars(owner)
        for key, value in list(items.items()):
            if id(value) in replace and value is originals[id(value)]:
                if isinstance(owner, MutableMapping):
                    owner[key] = replace[id(value)]
                else:
                    setattr(owner, key, replace[id(value)])


def _library_owners(packages: set[str]) -> list[Any]:
    return [module for name, module in list(sys.modules.items())
            if module is not None and name.split(".")[0] in packages]


@contextmanager
def hidden_from_learner(objects: Iterable[Any], namespace: MutableMapping[str, Any] | None = None
                        ) -> Iterator[None]:
    """Make each object (and its private twin) refuse to run while the block runs; see the module's
    docstring."""
    targets = _with_twins(objects)
    swapped = {id(f): f for obj in targets.values() if (f := _swappable(obj)) is not None}
    bound = {key: obj for key, obj in targets.items() if _swappable(obj) is None}
    codes = {key: function.__code__ for key, function in swapped.items()}
    wires = {key: tripwire(obj) for key, obj in bound.items()}
    packages = {"rlhf_helpers"} | {obj.__module__.split(".")[0] for obj in bound.values()}
    owners: list[Any] = _library_owners(packages) if bound else []
    owners += [owner for obj in bound.values() if (owner := _owner_of_method(obj)) is not None]
    owners += [namespace] if namespace is not None and bound else []
    try:
        for function in swapped.values():
            function.__code__ = _refusing_code(function)
        _rebind(owners, wires, bound)
        yield
    finally:
        for key, function in swapped.items():
            function.__code__ = codes[key]
        # modules imported during the check may have bound a tripwire too: sweep them all again
        if bound:
            back = {id(wire): bound[key] for key, wire in wires.items()}
            _put_back(_library_owners(packages) + owners, back)


def _put_back(owners: Iterable[Any], back: Mapping[int, Any]) -> None:
    """Every tripwire (id in `back`) bound in an owner, in a dict or list it holds, or in the
    default arguments of a function it holds, becomes the original again."""
    def original(value: Any) -> Any:
        return back.get(id(value), value)

    for owner in owners:
        items = owner if isinstance(owner, MutableMapping) else vars(owner)
        for key, value in list(items.items()):
            if id(value) in back:
                if isinstance(owner, MutableMapping):
                    owner[key] = back[id(value)]
                else:
                    setattr(owner, key, back[id(value)])
            elif isinstance(value, dict):
                value.update({k: back[id(v)] for k, v in value.items() if id(v) in back})
            elif isinstance(value, list):
                value[:] = [original(v) for v in value]
            elif isinstance(value, types.FunctionType):
                if value.__defaults__ and any(id(v) in back for v in value.__defaults__):
                    value.__defaults__ = tuple(original(v) for v in value.__defaults__)
                if value.__kwdefaults__ and any(id(v) in back
                                                for v in value.__kwdefaults__.values()):
                    value.__kwdefaults__ = {k: original(v) for k, v in value.__kwdefaults__.items()}


def _tensors(value: Any, label: str, depth: int = 1) -> Iterator[tuple[str, Any]]:
    """(label, tensor) for a tensor argument, and for the tensors one level inside a list, tuple,
    dict or dataclass argument; parameters (weights an update may change) are left out."""
    if hasattr(value, "_version") and hasattr(value,
                                              "shape") and type(value).__name__ != "Parameter":
        yield label, value
        return
    if depth == 0:
        return
    if isinstance(value, (list, tuple)):
        items = ((f"{label}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, Mapping):
        items = ((f"{label}[{k!r}]", v) for k, v in value.items())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f"{label}.{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value))
    else:
        return
    for item_label, item in items:
        yield from _tensors(item, item_label, depth - 1)


def guard_in_place(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, failing with AssertionError when it changes a tensor it was given in place (torch
    counts every in-place write in a tensor's `_version`): a caller's tensors must not change under
    it."""
    code = getattr(function, "__code__", None)
    names = list(code.co_varnames[:code.co_argcount]) if code is not None else []  # positional

    def guarded(*args: Any, **kwargs: Any) -> Any:
        labelled = [(names[i] if i < len(names) else f"argument {i + 1}", a)
                    for i, a in enumerate(args)]
        watched = [(label, t, t._version) for name, value in [*labelled, *kwargs.items()]
                   for label, t in _tensors(value, name)]
        result = function(*args, **kwargs)
        changed = [label for label, tensor, version in watched if tensor._version != version]
        if changed:
            raise AssertionError(f"{function.__name__} changed its argument {changed[0]} in place: "
                                 "the caller's tensor would change under it. Work on a new tensor "
                                 "(x = x.clone(), x = x * m instead of x *= m)")
        return result

    guarded.__name__ = guarded.__qualname__ = function.__name__
    guarded.__wrapped__ = function  # type: ignore[attr-defined]
    return guarded


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise CheckTimeout in the block after `seconds` of wall time (SIGALRM: the main thread of a
    POSIX process, as in a Jupyter kernel; elsewhere, or with None, no limit)."""
    usable = (seconds is not None and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def stop(*_: Any) -> None:
        raise CheckTimeout(
            f"the check stopped after {seconds:g} s: the code it runs did not finish (an endless "
            "loop, such as a while loop whose index never reaches its end?)")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _same_value(x: Any, y: Any) -> bool:
    """Whether two closed-over values are alike: functions by `same_function`, a decorator's state
    object (torch.no_grad()) by its type and attributes, anything else by ==."""
    if x is y:
        return True
    if isinstance(x, types.FunctionType):
        return same_function(x, y)
    if isinstance(x, types.MethodType):  # e.g. the clone method of a torch.no_grad() instance
        return (isinstance(y, types.MethodType) and x.__func__ is y.__func__
                and _same_value(x.__self__, y.__self__))
    if type(x) is not type(y):
        return False
    if type(x).__eq__ is object.__eq__:  # an object compared by identity: compare what it holds
        return getattr(x, "__dict__", None) == getattr(y, "__dict__", None) is not None
    try:
        return bool(x == y)
    except Exception:  # noqa: BLE001  # a tensor's ==, say: not one bool
        return False


def same_function(a: Any, b: Any) -> bool:
    """Whether two functions are one: the same object, or the same unchanged cell run again (equal
    code, defaults and closure contents, looked at through decorators: two functions a decorator
    wrapped share the wrapper's code, so the wrapped functions are compared)."""
    if a is b:
        return True
    if not (isinstance(a, types.FunctionType) and isinstance(b, types.FunctionType)):
        return False
    wrapped_a, wrapped_b = getattr(a, "__wrapped__", None), getattr(b, "__wrapped__", None)
    if (wrapped_a is None) != (wrapped_b is None):
        return False
    if wrapped_a is not None and not same_function(wrapped_a, wrapped_b):
        return False
    cells = [tuple(cell.cell_contents for cell in f.__closure__ or ()) for f in (a, b)]
    same_cells = len(cells[0]) == len(cells[1]) and all(
        _same_value(x, y) for x, y in zip(*cells, strict=True))
    return (a.__code__ == b.__code__ and a.__defaults__ == b.__defaults__
            and a.__kwdefaults__ == b.__kwdefaults__ and same_cells)
