"""Building blocks of the configuration's sections: fields with a description, choices from one Literal, checks.

A choice field is typed with a `typing.Literal`; that type is the only list of its values: OmegaConf refuses
other values on merge, `check_tree` refuses them in a config built in Python, and `choices(T)` writes them into
the field's description. Range checks live in each section's `check(self, key)`, which names its fields
under `key`; `check_tree` runs them after the choices.

Imports nothing of klguard but `errors`, so that any section (klguard.guard.config too) can use it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import types
import typing
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any, Literal, NoReturn, get_args, get_origin

from klguard.errors import ConfigError


def opt(default: Any, help: str, *, unsupported: Mapping[str, str] | None = None, invalid: str | None = None) -> Any:
    """A schema field with a default and a one-line description.

    For a choice field: `unsupported` maps values known elsewhere (verl) to why klguard refuses them,
    `invalid` replaces "is not one of: ..." for every refused value."""
    metadata: dict[str, Any] = {"help": help}
    if unsupported:
        metadata["unsupported"] = dict(unsupported)
    if invalid:
        metadata["invalid"] = invalid
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(cls: type, help: str) -> Any:
    """A field holding a sub-section (a dataclass), with a description."""
    return dataclasses.field(default_factory=cls, metadata={"help": help})


# ----------------------------------------------------------------------------- choices
def choice_values(tp: Any) -> tuple:
    """The values a Literal type allows (None last for an optional one); () for any other type."""
    if get_origin(tp) is Literal:
        return get_args(tp)
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and get_origin(args[0]) is Literal:
            return (*get_args(args[0]), None)
    return ()


def _name(value: Any) -> str:
    return "null" if value is None else str(value)


def choices(tp: Any, notes: Mapping[str, str] | None = None, /, **more: str) -> str:
    """`a | b (note) | c`: the values of the Literal `tp` for a description; each note names one of them."""
    notes = {**(notes or {}), **more}
    names = [_name(v) for v in choice_values(tp)]
    if not names or set(notes) - set(names):
        raise ValueError(f"choices({tp}): not a Literal, or notes on values it lacks: {set(notes) - set(names)}")
    return " | ".join(f"{n} ({notes[n]})" if n in notes else n for n in names)


def refusal(key: str, value: Any, f: dataclasses.Field, allowed: tuple) -> str:
    """The one-line message for a value outside a choice field's Literal."""
    unsupported = f.metadata.get("unsupported", {})
    if isinstance(value, str) and value in unsupported:
        why = unsupported[value]
    else:
        why = f.metadata.get("invalid") or f"is not one of: {', '.join(sorted(map(_name, allowed)))}"
    return f"{key}={value!r} {why}"


def one_of(key: str, value: Any, tp: Any) -> None:
    """One item of a list-valued choice field, against the Literal `tp`."""
    allowed = choice_values(tp)
    if value not in allowed:
        fail(key, value, f"is not one of: {', '.join(sorted(map(_name, allowed)))}")


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def choice_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, tuple]]:
    """(dotted key, field, allowed values) of every choice field under the dataclass `cls`."""
    for f in dataclasses.fields(cls):
        tp = _hints(cls)[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            yield from choice_fields(tp, f"{prefix}{f.name}.")
        elif allowed := choice_values(tp):
            yield f"{prefix}{f.name}", f, allowed


# ----------------------------------------------------------------------------- checks
def fail(key: str, value: Any, why: str) -> NoReturn:
    raise ConfigError(f"{key}={value!r} {why}")


def positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    """A finite number > 0 (>= 0 with allow_zero)."""
    if value is None or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        fail(key, value, "must be " + ("a finite number >= 0" if allow_zero else "a finite number > 0"))


_INTERVAL = re.compile(r"^([\[(])(-?[\d.]+), (-?[\d.]+)([\])])$")


def within(key: str, value: float, interval: str) -> None:
    """`interval` such as "(0, 1]": a number in it (NaN is not); the message quotes it."""
    low_bracket, low, high, high_bracket = _INTERVAL.match(interval).groups()
    above = value >= float(low) if low_bracket == "[" else value > float(low)
    below = value <= float(high) if high_bracket == "]" else value < float(high)
    if not (above and below):
        fail(key, value, f"must be in {interval}")


def at_least(key: str, value: int | None, least: int, *, or_null: bool = False) -> None:
    """An integer >= `least`; with or_null, None passes and the message says so."""
    if value is None and or_null:
        return
    if value is None or value < least:
        fail(key, value, f"must be >= {least}" + (" or null" if or_null else ""))


def check_tree(node: Any, key: str = "") -> None:
    """Check a config section and the sections under it: its choice fields against their Literals, each
    sub-section, then the section's own `check(key)` (a section checks only its own fields, named under key)."""
    for f in dataclasses.fields(node):
        value, path = getattr(node, f.name), f"{key}.{f.name}" if key else f.name
        if dataclasses.is_dataclass(value):
            check_tree(value, path)
        elif (allowed := choice_values(_hints(type(node))[f.name])) and value not in allowed:
            raise ConfigError(refusal(path, value, f, allowed))
    check = getattr(node, "check", None)
    if check is not None:
        check(key)
