"""What an attempt of notebook 08's checks may change outside its own model: the model's classes and
torch's functions, recorded once; each attempt runs with them, and what it patched is named and
put back.

    shared = SharedNamespaces(model)        # once, in the set-up cell
    with shared.recorded_state() as patched:    # the attempt runs with the recorded entries
        ...                                     # patched: e.g. ["SharedLoRAModel.values"]

Each attempt runs on a fresh copy of the check's model (`course.capstone_state`), so whatever it
does to that object cannot reach the next attempt. A class or a module is shared by every copy, the
notebook's training model included: `type(model).values = ...` or `torch.randperm = ...` inside a
learner's function would change every later check, and the training run. Shallow copies of those
namespaces' entries (cheap: references, no tensors) find the change; the entry is put back.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional
import torch.nn.utils

#: torch's namespaces a learner's loop calls into (and could patch): functions, and tensor methods
TORCH_NAMESPACES: tuple[Any, ...] = (torch, torch.nn.functional, torch.nn.utils, torch.Tensor,
                                     torch.nn.Parameter)
_MISSING = object()  #: an entry the namespace did not have


def _label(namespace: Any) -> str:
    """How a message names a namespace: 'torch.nn.functional', 'SharedLoRAModel'."""
    if isinstance(namespace, ModuleType):
        return namespace.__name__
    return "torch.Tensor" if namespace is torch.Tensor else namespace.__qualname__


def _model_classes(model: Any) -> list[type]:
    """Every class of `model`'s modules and their bases (`object` left out)."""
    classes = {cls for module in model.modules() for cls in type(module).__mro__}
    classes.discard(object)
    return sorted(classes, key=lambda cls: (cls.__module__, cls.__qualname__))


def _differences(namespaces: list[Any], entries: list[dict[str, Any]]) -> list[tuple[Any, str]]:
    """(namespace, name) of each entry changed, removed or added since `entries` were recorded (a
    submodule imported on first use, as torch imports some lazily, left out)."""
    found = []
    for namespace, recorded in zip(namespaces, entries, strict=True):
        now = vars(namespace)
        for name in set(now) | set(recorded):
            old, new = recorded.get(name, _MISSING), now.get(name, _MISSING)
            if old is new or (old is _MISSING and isinstance(namespace, ModuleType)
                              and isinstance(new, ModuleType)):
                continue
            found.append((namespace, name))
    return found


def _put(namespaces: list[Any], entries: list[dict[str, Any]]) -> list[str]:
    """Make the namespaces' entries `entries` again; the names ('SharedLoRAModel.values') of
    those that differed."""
    changed = _differences(namespaces, entries)
    recorded = {id(namespace): e for namespace, e in zip(namespaces, entries, strict=True)}
    for namespace, name in changed:
        old = recorded[id(namespace)].get(name, _MISSING)
        if old is _MISSING:
            delattr(namespace, name)
        else:
            setattr(namespace, name, old)
    return sorted(f"{_label(namespace)}.{name}" for namespace, name in changed)


class SharedNamespaces:
    """The entries of the namespaces every copy of a model shares: its classes (and their bases),
    and `TORCH_NAMESPACES`."""

    def __init__(self, model: Any) -> None:
        self.namespaces = [*_model_classes(model), *TORCH_NAMESPACES]
        #: each namespace's entries (name -> object) when recorded
        self.entries = [dict(vars(namespace)) for namespace in self.namespaces]

    @contextmanager
    def recorded_state(self) -> Iterator[list[str]]:
        """Run the block with the recorded entries; after it, the list it gives gets the names
        ('SharedLoRAModel.values') of those the block changed, and the caller's entries of
        before the block come back (a patch of the caller's own, made outside any attempt, is
        kept for the caller and left out of the attempt)."""
        callers = [dict(vars(namespace)) for namespace in self.namespaces]
        _put(self.namespaces, self.entries)
        patched: list[str] = []
        try:
            yield patched
        finally:
            patched.extend(name for namespace, name in _differences(self.namespaces, self.entries)
                           for name in [f"{_label(namespace)}.{name}"])
            patched.sort()
            _put(self.namespaces, callers)
