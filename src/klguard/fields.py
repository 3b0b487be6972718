"""Building blocks of the configuration's sections: fields with a description, choices from one Literal, checks.

A choice field is typed with a `typing.Literal`; that type is the only list of its values: OmegaConf refuses
other values on merge, `check_tree` refuses them in a config built in Python, and `choices(T)` writes them into
the field's description. A field's own range is a `Rule` given to `opt(..., rule=...)`, next to the field; rules
that involve several fields of a section are its `check(self, key)` method, which names them under `key`.
Combinations across sections are klguard.config.validate's.

A leaf below both klguard.config and klguard.guard (whose GuardConfig the schema embeds): it imports nothing of
klguard but `errors`, so the guard's section is built without importing the schema, the loader or torch.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from typing import Any, Literal, NoReturn, get_args, get_origin

from klguard.errors import ConfigError


def opt(default: Any, help: str, *, rule: Rule | None = None, unsupported: Mapping[str, str] | None = None,
        invalid: str | None = None) -> Any:
    """A schema field with a default, a one-line description and optionally the `rule` its value obeys.

    For a choice field: `unsupported` maps values known elsewhere (verl) to why klguard refuses them,
    `invalid` replaces "is not one of: ..." for every refused value."""
    metadata: dict[str, Any] = {"help": help}
    if rule is not None:
        metadata["rule"] = rule
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


def _not_one_of(allowed: tuple) -> str:
    return f"is not one of: {', '.join(sorted(map(_name, allowed)))}"


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
        why = f.metadata.get("invalid") or _not_one_of(allowed)
    return f"{key}={value!r} {why}"


def one_of(key: str, value: Any, tp: Any) -> None:
    """One item of a list-valued choice field, against the Literal `tp`."""
    if value not in (allowed := choice_values(tp)):
        fail(key, value, _not_one_of(allowed))


@cache
def type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def choice_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, tuple]]:
    """(dotted key, field, allowed values) of every choice field under the dataclass `cls`."""
    for f in dataclasses.fields(cls):
        tp = type_hints(cls)[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            yield from choice_fields(tp, f"{prefix}{f.name}.")
        elif allowed := choice_values(tp):
            yield f"{prefix}{f.name}", f, allowed


# ----------------------------------------------------------------------------- checks
def fail(key: str, value: Any, why: str) -> NoReturn:
    raise ConfigError(f"{key}={value!r} {why}")


@dataclasses.dataclass(frozen=True)
class Rule:
    """What one field's value must satisfy (`ok`), and the message's end when it does not (`why`).
    A None passes: null in a field that does not allow it is OmegaConf's type error."""

    ok: Callable[[Any], bool]
    why: str

    def check(self, key: str, value: Any) -> None:
        if value is not None and not self.ok(value):
            fail(key, value, self.why)


positive = Rule(lambda v: math.isfinite(v) and v > 0, "must be a finite number > 0")
non_negative = Rule(lambda v: math.isfinite(v) and v >= 0, "must be a finite number >= 0")
finite = Rule(math.isfinite, "must be a finite number")
_INTERVAL = re.compile(r"^([\[(])(-?[\d.]+), (-?[\d.]+)([\])])$")


def interval(spec: str) -> Rule:
    """A number in `spec`, such as "(0, 1]" (NaN is not); the message quotes it."""
    low_bracket, low, high, high_bracket = _INTERVAL.match(spec).groups()
    lo, hi = float(low), float(high)

    def ok(v: float) -> bool:
        return (v >= lo if low_bracket == "[" else v > lo) and (v <= hi if high_bracket == "]" else v < hi)

    return Rule(ok, f"must be in {spec}")


def greater(bound: float, note: str = "") -> Rule:
    return Rule(lambda v: v > bound, f"must be > {bound}" + (f" {note}" if note else ""))


def at_least(least: float, *, or_null: bool = False) -> Rule:
    """>= least; or_null only adds the words (every rule lets None pass)."""
    return Rule(lambda v: v >= least, f"must be >= {least}" + (" or null" if or_null else ""))


def whole(value: Any, least: int) -> bool:
    """An integer (not a bool) >= least."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_tree(node: Any, key: str = "") -> None:
    """Check a config section and the sections under it: its choice fields against their Literals, its own
    `check(key)` (rules over several of its fields), each field's rule, then each sub-section."""
    hints = type_hints(type(node))
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if (allowed := choice_values(hints[f.name])) and value not in allowed:
            raise ConfigError(refusal(_join(key, f.name), value, f, allowed))
    check = getattr(node, "check", None)
    if check is not None:
        check(key)
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if "rule" in f.metadata:
            f.metadata["rule"].check(_join(key, f.name), value)
        elif dataclasses.is_dataclass(value):
            check_tree(value, _join(key, f.name))


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name
