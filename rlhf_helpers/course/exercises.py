"""An exercise's check cannot be passed by calling the library function the exercise teaches.

    exercise_check("Exercise 2 (gae_one)", check_gae_one, hidden=[rlhf_helpers.compute_gae])

While the check runs, every name bound to a hidden object, in every loaded `rlhf_helpers` module, in
every loaded module of the object's own package (torch's re-exports too), on its class (for a method
such as `PPOTrainer.update`) and in the notebook's own namespace, points to a tripwire that raises
LibraryShortcut. So does the private twin a library function delegates to (`_td_errors` beside
`td_errors`). Afterwards every name is put back. The check itself must
then compare against an independent reference (a loop, a formula), not against the library twin.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any


class LibraryShortcut(AssertionError):
    """The learner's code called the library function its exercise asks them to write."""


def qualified_name(obj: Any) -> str:
    """module.qualname of a function, method or class: the name a learner would import."""
    return f"{obj.__module__}.{obj.__qualname__}"


def tripwire(obj: Any) -> Callable[..., Any]:
    """A stand-in for `obj` that refuses to run, naming it."""
    name = qualified_name(obj)

    def refuse(*_: Any, **__: Any) -> Any:
        raise LibraryShortcut(f"{name} is hidden during this check: it is what the exercise teaches, so "
                              "write it from the equations (other library functions stay available)")

    refuse.__name__ = refuse.__qualname__ = getattr(obj, "__name__", "hidden")
    return refuse


def _owner_of_method(obj: Any) -> Any | None:
    """The class that defines `obj` when obj is a method (qualname "Class.method"), else None."""
    parts = obj.__qualname__.split(".")
    if len(parts) != 2 or "<locals>" in parts:
        return None
    owner = getattr(importlib.import_module(obj.__module__), parts[0], None)
    return owner if isinstance(owner, type) and vars(owner).get(parts[1]) is obj else None


@contextmanager
def hidden_from_learner(objects: Iterable[Any], namespace: MutableMapping[str, Any] | None = None
                        ) -> Iterator[None]:
    """Replace every binding of each object (library modules, its class, `namespace`) by a tripwire."""
    objects = list(objects)
    for obj in list(objects):  # the private twin of a function: `_name` in its module
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        twin = getattr(module, f"_{getattr(obj, '__name__', '')}", None) if module is not None else None
        if callable(twin):
            objects.append(twin)
    targets = {id(obj): obj for obj in objects}
    if not targets:
        yield
        return
    wires = {key: tripwire(obj) for key, obj in targets.items()}
    undo: list[tuple[Any, str, Any]] = []  # (owner, attribute or key, original)
    packages = {"rlhf_helpers"} | {obj.__module__.split(".")[0] for obj in targets.values()}
    owners: list[Any] = [module for name, module in list(sys.modules.items())
                         if module is not None and name.split(".")[0] in packages]
    owners += [owner for obj in targets.values() if (owner := _owner_of_method(obj)) is not None]
    try:
        for owner in owners:
            for attribute, value in list(vars(owner).items()):
                if id(value) in targets and value is targets[id(value)]:
                    undo.append((owner, attribute, value))
                    setattr(owner, attribute, wires[id(value)])
        if namespace is not None:
            for key, value in list(namespace.items()):
                if id(value) in targets and value is targets[id(value)]:
                    undo.append((namespace, key, value))
                    namespace[key] = wires[id(value)]
        yield
    finally:
        for owner, attribute, value in reversed(undo):
            if isinstance(owner, MutableMapping):
                owner[attribute] = value
            else:
                setattr(owner, attribute, value)
