"""What a config dataclass says about its fields: their `#:` docs, exact types, command-line flags.

    field_docs(PPOConfig)["clip_eps"]          # "PPO ratio clip range epsilon"
    check_field_types(config)                  # FieldTypeError: mini_batch_size must be an int, ...
    check_options(config, PPOConfig.OPTIONS)   # ValueError: kl_kind must be one of 'k1', ...
    add_field_flags(parser, PPOConfig)         # --clip-eps, --lora-r, --whiten-advantages/--no-...
    changes = given_field_values(args, PPOConfig)   # {"clip_eps": 0.1} for the flags a user gave
    parser.parse_args(join_negative_values(argv, actions))  # --missing-eos-penalty -1e3: a value

The configs document each field with a `#:` comment (cleanrl style); reading those comments here
makes the same text the `--help` of every flag, so the flags and the docs cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_FIELD_LINE = re.compile(r"^(\w+)\s*:[^#]*?(?:#:\s*(.*))?$")


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its `#:` comment: the `#:` lines right above the field, then the one on its
    line."""
    names = {f.name for f in dataclasses.fields(cls)}
    docs: dict[str, str] = {}
    above: list[str] = []
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # no source at hand (a frozen app): flags without help
        return docs
    for line in source.splitlines():
        text = line.strip()
        if text.startswith("#:"):
            above.append(text[2:].strip())
            continue
        match = _FIELD_LINE.match(text)
        if match and match.group(1) in names:
            docs[match.group(1)] = " ".join([*above, match.group(2) or ""]).strip()
        above = []
    return docs


def _allowed(hint: Any) -> tuple[Any, ...]:
    """The types a hint admits: (int,), (float, NoneType), (tuple[str, ...],) ..."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _matches(value: Any, kind: Any) -> bool:
    """True if `value` is exactly of type `kind` (a bool is never an int; an int is a float)."""
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, int | float)
    if typing.get_origin(kind) is tuple:  # the configs' tuples are tuple[X, ...]
        item_kind = typing.get_args(kind)[0]
        return isinstance(value, tuple) and all(_matches(item, item_kind) for item in value)
    return isinstance(value, kind)


_NAMES = {int: "an int", float: "a number", bool: "a bool (true or false)", str: "a string",
          type(None): "None"}


class FieldTypeError(TypeError, ValueError):
    """A config field's value of the wrong type: a TypeError, and a ValueError like every other
    refusal of a setting, so a caller catching either (the commands catch ValueError) gets it."""


def check_field_types(config: Any, expected: Mapping[str, str] | None = None) -> None:
    """FieldTypeError naming the first field whose value is not of its annotated type, its value
    and the type expected: `mini_batch_size must be an int, got bool True`. Where a number belongs
    a bool is refused. `expected[name]` says what a field must be where its type says too little
    ("None or an int >= 1")."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        kinds = _allowed(hints[field.name])
        if not any(_matches(value, kind) for kind in kinds):
            words = (expected or {}).get(field.name) or " or ".join(
                _NAMES.get(kind, getattr(kind, "__name__", str(kind))) for kind in kinds)
            got = f"{type(value).__name__} {value!r}"
            raise FieldTypeError(f"{field.name} must be {words}, got {got}")


def check_options(config: Any, options: Mapping[str, Any]) -> None:
    """ValueError naming the first field of `options` whose value is not a registered name:
    `options[field]` is the registry (`core.registry.Registry`) of the names that field takes."""
    for name, registry in options.items():
        registry.check(name, getattr(config, name))


def flag_name(field: str, prefix: str = "") -> str:
    """The command-line flag of a field: clip_eps -> --clip-eps, lora's r -> --lora-r."""
    return "--" + (prefix + field).replace("_", "-")


def _or_none(kind: Any) -> Any:
    """argparse type of an `X | None` field: an X, or the word none (or null)."""
    def parse(text: str) -> Any:
        if text.strip().lower() in ("none", "null"):
            return None
        return kind(text)
    parse.__name__ = f"{kind.__name__} or none"  # argparse names it in "invalid ... value"
    return parse


#: The words a bool flag takes as its value (`--whiten-advantages false`), case ignored.
TRUE_WORDS, FALSE_WORDS = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


class BoolFlag(argparse.Action):
    """A bool field's flag: bare --x sets True, --x true|false (yes/no, on/off, 1/0) sets that, so
    `--x false` is not "unrecognized arguments: false". Built with `negative=True` it is --no-x:
    bare only."""

    def __init__(self, option_strings: list[str], dest: str, negative: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", **kwargs)
        self.negative = negative

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values is None:
            setattr(namespace, self.dest, not self.negative)
            return
        positive = option_string.replace("--no-", "--", 1) if option_string else ""
        if self.negative:
            parser.error(f"argument {option_string} takes no value, got {values!r} (write "
                         f"{positive} true or false instead)")
        word = values.strip().lower()
        if word not in TRUE_WORDS + FALSE_WORDS:
            parser.error(f"argument {option_string}: expected true or false, got {values!r}")
        setattr(namespace, self.dest, word in TRUE_WORDS)


def add_field_flags(parser: Any, cls: type, aliases: dict[str, tuple[str, ...]] | None = None,
                    notes: dict[str, str] | None = None, prefix: str = "") -> list[argparse.Action]:
    """One flag per field of `cls` (nested dataclasses: one per inner field, `--lora-r`), its help
    the field's `#:` doc (plus `notes[name]`), added to `parser` (an ArgumentParser or an argument
    group); returns the actions made. A flag not given sets nothing (argparse.SUPPRESS), so the
    caller's config keeps its value. Bools get --x [true|false] / --no-x; `X | None` fields also
    take the word none; a field of the class's OPTIONS takes the names its registry holds (argparse
    lists them in --help and refuses any other)."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    options: Mapping[str, Any] = getattr(cls, "OPTIONS", {})
    aliases, notes = aliases or {}, notes or {}
    actions: list[argparse.Action] = []
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            actions += add_field_flags(parser, hint, prefix=f"{prefix}{field.name}_")
            continue
        kinds = [kind for kind in _allowed(hint) if kind is not type(None)]
        names = (flag_name(field.name, prefix), *aliases.get(field.name, ()))
        help_text = docs.get(field.name,
                             "") + (f" ({notes[field.name]})" if field.name in notes else "")
        help_text = help_text.replace("%", "%%")  # argparse formats help with %
        dest = prefix + field.name
        kind = kinds[0]
        if kind is bool:
            actions.append(parser.add_argument(*names, dest=dest, action=BoolFlag,
                                               default=argparse.SUPPRESS, metavar="true|false",
                                               help=f"{help_text} (--no-{names[0][2:]}: false)"))
            actions.append(parser.add_argument(*(f"--no-{name[2:]}" for name in names), dest=dest,
                                               action=BoolFlag, negative=True,
                                               default=argparse.SUPPRESS, help=argparse.SUPPRESS))
        elif typing.get_origin(kind) is tuple:
            actions.append(
                parser.add_argument(*names, dest=dest, nargs="+", default=argparse.SUPPRESS,
                                    metavar="NAME", help=help_text))
        elif len(kinds) < len(_allowed(hint)):  # X | None
            actions.append(parser.add_argument(
                *names, dest=dest, type=_or_none(kind), default=argparse.SUPPRESS,
                metavar="PATH" if kind is str else f"{kind.__name__.upper()}|none", help=help_text))
        elif field.name in options:  # the registry itself: a name registered later is accepted too
            actions.append(parser.add_argument(*names, dest=dest, type=kind,
                                               choices=options[field.name],
                                               default=argparse.SUPPRESS, help=help_text))
        else:
            actions.append(parser.add_argument(*names, dest=dest, type=kind,
                                               default=argparse.SUPPRESS, help=help_text))
    return actions


def _is_number(word: str) -> bool:
    """Whether a command-line word reads as a number (float() does: -1e3, -.5, -inf, -nan)."""
    try:
        float(word)
    except ValueError:
        return False
    return True


def join_negative_values(argv: Sequence[str], actions: Iterable[argparse.Action]) -> list[str]:
    """`argv` with every `--flag -1e3` written `--flag=-1e3`, where --flag (or an abbreviation
    argparse would expand to it) is one of `actions` that takes exactly one value and the next word
    is a negative number.

    argparse takes a word that starts with '-' for an option unless it matches its own
    negative-number pattern, -1 or -1.5 but not -1e3, -inf or -nan (`_negative_number_matcher`, not
    a public setting), and then says "expected one argument". `--flag=value` is its documented
    spelling for any value, so the words are joined before parsing; everything after a bare `--` is
    left as it is."""
    takes_one = {name for action in actions if action.nargs is None
                 for name in action.option_strings}
    every = {name for action in actions for name in action.option_strings} | {"-h", "--help"}
    words, out, i = list(argv), [], 0
    while i < len(words):
        word = words[i]
        if word == "--":
            out += words[i:]
            break
        matches = [name for name in every if name.startswith(word)] if word.startswith("--") else []
        name = word if word in every else (matches[0] if len(matches) == 1 else None)
        after = words[i + 1] if i + 1 < len(words) else ""
        if name in takes_one and after.startswith("-") and _is_number(after):
            out.append(f"{word}={after}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def given_field_values(args: argparse.Namespace, cls: type, prefix: str = "") -> dict[str, Any]:
    """{field: value} of the flags `add_field_flags` made that the command line gave (nested
    dataclasses as a mapping: {"lora": {"r": 4}}); `--target-kl none` is given: {"target_kl":
    None}."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        dest = prefix + field.name
        if dataclasses.is_dataclass(hints[field.name]):
            inner = given_field_values(args, hints[field.name], prefix=f"{dest}_")
            if inner:
                out[field.name] = inner
        elif hasattr(args, dest):  # the flags default to SUPPRESS: set only when given
            value = getattr(args, dest)
            out[field.name] = tuple(value) if isinstance(value, list) else value
    return out
