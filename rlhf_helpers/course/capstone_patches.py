"""What an attempt of notebook 08's checks may change outside its own model: the model's classes and
torch's functions, recorded once and put back, and named, after every attempt.

    shared = SharedNamespaces(model)        # once, in the set-up cell
    ... the attempt runs ...
    patches = shared.put_back()             # e.g. ["SharedLoRAModel.values", "torch.randperm"]

Each attempt runs on a fresh copy of the check's model (`course.capstone_state`), so whatever it
does to that object cannot reach the next attempt. A class or a module is shared by every copy, the
notebook's training model included: `type(model).values = ...` or `torch.randperm = ...` inside a
learner's function would change every later check, and the training run. Shallow copies of those
namespaces' entries (cheap: references, no tensors) find the change; the entry is put back.
"""

from __future__ import annotations

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


class SharedNamespaces:
    """The entries of the namespaces every copy of a model shares: its classes (and their bases),
    and `TORCH_NAMESPACES`."""

    def __init__(self, model: Any) -> None:
        self.namespaces = [*_model_classes(model), *TORCH_NAMESPACES]
        #: each namespace's entries (name -> object) when recorded
        self.entries = [dict(vars(namespace)) for namespace in self.namespaces]

    def put_back(self) -> list[str]:
        """Put back every entry changed, removed or added since the record ('SharedLoRAModel.values'
        for each), and return their names."""
        patched = []
        for namespace, entries in zip(self.namespaces, self.entries, strict=True):
            now = vars(namespace)
            for name in set(now) | set(entries):
                old, new = entries.get(name, _MISSING), now.get(name, _MISSING)
                if old is new:
                    continue
                if old is _MISSING and isinstance(namespace, ModuleType) and isinstance(
                        new, ModuleType):
                    continue  # a submodule imported on first use (torch's lazy imports)
                patched.append(f"{_label(namespace)}.{name}")
                if old is _MISSING:
                    delattr(namespace, name)
                else:
                    setattr(namespace, name, old)
        return sorted(patched)
