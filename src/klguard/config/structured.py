"""The schema as OmegaConf sees it, and the way back to klguard's own dataclasses.

OmegaConf validates `typing.Literal` fields only from 2.4, and verl pins hydra-core 1.3 (omegaconf < 2.4). So that
klguard loads its config in a verl environment too, OmegaConf merges a copy of the schema in which each choice field
is typed `str`; the Literal stays the one list of values, checked by `klguard.fields.check_tree` with the
same one-line message. Everything else (types, defaults, `${...}` interpolations) is OmegaConf's as before.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

from klguard.fields import choice_values, type_hints


@cache
def omegaconf_schema(cls: type) -> type:
    """A dataclass with `cls`'s fields, defaults and descriptions, choice fields typed `str` (or `str | None`)."""
    hints = type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            tp = omegaconf_schema(tp)
            spec = dataclasses.field(default_factory=tp, metadata=f.metadata)
        else:
            if allowed := choice_values(tp):
                tp = str | None if None in allowed else str
            spec = dataclasses.field(default=f.default, default_factory=f.default_factory, metadata=f.metadata)
        fields.append((f.name, tp, spec))
    return dataclasses.make_dataclass(f"OmegaConf{cls.__name__}", fields)


def build(cls: type, data: dict[str, Any]) -> Any:
    """An instance of the schema class `cls` from a resolved plain dict (OmegaConf.to_container's)."""
    hints = type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        tp = hints[f.name]
        sub = tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None
        kwargs[f.name] = build(sub, data[f.name]) if sub is not None else data[f.name]
    return cls(**kwargs)
