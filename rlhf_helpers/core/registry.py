"""A registry of one option's values: each name with its metadata, registered where it is written.

    KL_ESTIMATORS = Registry("kl_kind", "KL estimator", "rlhf_helpers/core/kl_estimators.py")
    KL_ESTIMATORS.add(KLEstimator("k1", ...))       # ValueError if the name is taken
    KL_ESTIMATORS["k3"].verl                        # "low_var_kl"
    KL_ESTIMATORS.check("kl_kind", "k4")            # ValueError: kl_kind must be one of ...

verl keeps its advantage estimators and policy losses this way (`register_adv_est`,
`register_policy_loss` in trainer/ppo/core_algos.py): a decorator next to each function puts it in
a dict by name, and every caller asks that dict. Here the entries also carry what the rest of the
package needs to know about a value (its formula, its verl and OpenRLHF names, whether the explorers
draw it), so the config, the cluster export and the widgets read one source. No torch here: the
torch-free layers (`runtime.ppo_config`, `cluster`) validate against these names.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, Protocol, TypeVar


class Named(Protocol):
    """What an entry needs: its name (the value a config or a caller gives)."""

    @property
    def name(self) -> str: ...


E = TypeVar("E", bound=Named)


class UnknownName(ValueError, KeyError):
    """A name that no entry has: a ValueError (a bad setting, what the commands catch) and a
    KeyError (a mapping's miss, so `registry.get(name)` gives None)."""

    __str__ = ValueError.__str__  # the message as it is (KeyError's would quote it)


class Registry(Mapping[str, E], Generic[E]):
    """name -> entry of one option, in the order they were registered (a read-only mapping)."""

    def __init__(self, option: str, what: str, home: str) -> None:
        self.option = option  #: the setting or argument that takes these names ("kl_kind")
        self.what = what  #: one value in words ("KL estimator")
        self.home = home  #: the file that registers them (named in a refusal)
        self._entries: dict[str, E] = {}

    def add(self, entry: E) -> E:
        """Register `entry` under its name; ValueError if that name is taken."""
        name = entry.name
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a {self.what}'s name must be a non-empty string, got {name!r}")
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered twice ({self.home})")
        self._entries[name] = entry
        return entry

    def __getitem__(self, name: str) -> E:
        return self._entries[self.check(self.option, name)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def names(self) -> tuple[str, ...]:
        """Every registered name, in the order of registration."""
        return tuple(self._entries)

    def check(self, argument: str, value: object) -> str:
        """`value` when it is a registered name; else UnknownName (a ValueError) naming `argument`,
        the names it takes and where they are registered."""
        if value in self:
            return value  # type: ignore[return-value]
        names = ", ".join(repr(name) for name in self._entries)
        raise UnknownName(f"{argument} must be one of {names} (the {self.what}s registered in "
                         f"{self.home}), got {value!r}")

    def __repr__(self) -> str:
        return f"Registry({self.option!r}: {', '.join(self._entries)})"
