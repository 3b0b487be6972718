"""The guard's rules and signals, each declared once: one `GuardRule` per file in klguard/guard/rules/, registered
when the guard is first asked for them.

A declaration says what the rule is called, the metrics it reads (verl's names), its `guard.*` keys with their
defaults and help, what it does, whether it needs gold, and how it measures and acts (klguard.guard.step's `Step`
is what it sees of a step). Everything else reads the declarations: the guard runs them in their order, its config
section (`GuardConfig`) gets their keys, `klguard watch` lists them with their values and the inputs they lack, the
trainer and the name maps take their metric names, and docs/gen_results.py writes the rules table and the key
reference from them.

Three kinds:

- `alarm`: a rule over the latest steps, logged as `guard/alarm_<name>`; it acts after the rollback check (warn, cut
  the lr, set the clip, raise beta, lower the target) or rolls back (`trigger`);
- `signal`: a reward-hacking signal that needs no gold, logged as `guard/hack_<name>`; those named in
  `guard.hacking_signals` raise the hacking alarm, which does `guard.hacking_action`;
- `check`: no flag of its own: a pause that comes before every other decision (`stop`), or a rollback (`trigger`).

Within a kind, `order` decides: the measures, the rollback triggers (alarms, then the hacking alarm, then checks:
the first one names the rollback), the actions and a hacking alarm's evidence come in that order, and so do the
rows of the docs and of `klguard watch`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from klguard.fields import Rule
from klguard.guard.actions import ACTION_KINDS

Kind = Literal["alarm", "signal", "check"]
KINDS: tuple[str, ...] = ("alarm", "signal", "check")
HACKING = "hacking"
"""The hacking alarm's rule name: raised by the signals named in guard.hacking_signals."""
_UNSET = object()
ADVISORY_ACTIONS = frozenset({"warn", "lower_target_kl"})
"""Actions that say nothing against the weights: a warning, or a lower KL target for the controller (the KL's level
itself is judged by guard.stable_kl_share). An alarm asking only these leaves a checkpoint a rollback target."""


@dataclass(frozen=True)
class Key:
    """One `guard.<name>` key: its default, its one-line help, the rule its value obeys, and its default where the
    guard watches a model other than the built-in demo's (`external`: the TRL callback, the verl plugin, `klguard
    watch` on any log but klguard's, klguard's trainer on a Hugging Face model;
    klguard.guard.config.EXTERNAL_HOST_DEFAULTS)."""

    name: str
    default: Any
    help: str
    rule: Rule | None = None
    external: Any = _UNSET
    type: Any = None  # the field's type; None: the default's

    @property
    def has_external(self) -> bool:
        return self.external is not _UNSET


@dataclass(frozen=True, eq=False)
class GuardRule:
    """A rule or signal of the guard. The callables take a klguard.guard.step.Step (`on` the guard, `says` and
    `check` its config); `measure` runs every step (alarms and signals; a signal returns its Evidence while it is
    active, anything else is kept in `step.found[name]` for its act or trigger), `stop` and `trigger` after every
    measure, `act` after the rollback check."""

    name: str
    kind: Kind
    order: int
    reads: tuple[tuple[str, ...], ...]  # the input groups it needs: each group, one of its names
    says: Callable[[Any], str]  # what it does, with the config's values (watch's rules line, the docs' table)
    sees: str  # the failure it catches, for the summary of a log it has no input in
    actions: tuple[str, ...] = ()  # the action kinds it asks for (a signal: those of guard.hacking_action)
    advisory: bool | None = None  # an alarm that says nothing against the weights (None: its actions tell)
    keys: tuple[Key, ...] = ()
    optional: tuple[str, ...] = ()  # metrics it reads when a step has them
    needs_gold: bool = False
    default_on: bool = False  # a signal named in guard.hacking_signals by default
    on: Callable[[Any], bool] | None = None  # whether it can fire for this guard (default: kind's, see `active`)
    memory: Mapping[str, Any] = field(default_factory=dict)  # its own state (JSON values), checkpointed
    keep: tuple[str, ...] = ()  # memory that survives a rollback (the rest starts again)
    reference_baselines: tuple[str, ...] = ()  # baselines measured against the reference: new after a re-anchor
    logs: bool = False  # memory["value"], when set, is logged as guard/<name>
    hint: str | None = None  # after it paused the run, what to change ({kl_coef}, {lr}, {target_kl}, {guard})
    do: str = ""  # one line: what to do when it fires, whatever the trainer (klguard watch prints it with a decision)
    flag_when_off: bool = True  # an alarm's guard/alarm_<name> is logged while its settings turn it off
    rolls_back: bool = False
    reanchors: bool = False  # its rollbacks re-anchor the reference by default (guard.reanchor_rules)
    check: Callable[[Any, str], None] | None = None  # what no single key's rule says, on the config under a key
    measure: Callable[[Any], Any] | None = None
    stop: Callable[[Any], Any] | None = None
    trigger: Callable[[Any], Any] | None = None
    act: Callable[[Any], list] | None = None

    def active(self, guard: Any) -> bool:
        """Whether this rule can fire for `guard` (a KLGuard: its config and whether a controller chases target_kl)."""
        if self.on is not None:
            return bool(self.on(guard))
        return self.kind != "signal" or self.name in guard.cfg.hacking_signals

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*(name for group in self.reads for name in group), *self.optional]))


_RULES: dict[str, GuardRule] = {}
_listeners: list[Callable[[GuardRule | None], None]] = []
_discovered = False
BUILTIN = "klguard.guard.rules"


def register(rule: GuardRule) -> GuardRule:
    """Add `rule` to the guard; refused when its name, or one of its keys, is taken. Returns it."""
    if rule.kind not in KINDS:
        raise ValueError(f"guard rule {rule.name}: kind {rule.kind!r} is not one of {', '.join(KINDS)}")
    if rule.name in _RULES or rule.name == HACKING:
        raise ValueError(f"guard rule {rule.name!r} is declared twice")
    bad = [a for a in rule.actions if a not in ACTION_KINDS]
    if bad:
        raise ValueError(f"guard rule {rule.name}: unknown actions {bad}")
    taken = {k.name for r in _RULES.values() for k in r.keys}
    clash = [k.name for k in rule.keys if k.name in taken]
    if clash:
        raise ValueError(f"guard rule {rule.name}: keys {clash} are another rule's")
    _RULES[rule.name] = rule
    for listener in _listeners:
        listener(rule)
    return rule


def unregister(name: str) -> None:
    """Remove a rule registered by `register` (tests that declare their own)."""
    _RULES.pop(name)
    for listener in _listeners:
        listener(None)


def on_register(listener: Callable[[GuardRule | None], None]) -> None:
    """Call `listener(rule)` after each later registration (None after an unregistration): the config section adds
    the keys of a rule declared after it was built."""
    _listeners.append(listener)


def _discover() -> None:
    """Import every module of klguard/guard/rules/ once: each registers its declaration."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    package = importlib.import_module(BUILTIN)
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{BUILTIN}.{info.name}")


def rules(kind: str | None = None) -> list[GuardRule]:
    """The declared rules (of one kind), in their order (kinds: alarm, signal, check)."""
    _discover()
    found = [r for r in _RULES.values() if kind is None or r.kind == kind]
    return sorted(found, key=lambda r: (KINDS.index(r.kind), r.order, r.name))


def rule(name: str) -> GuardRule | None:
    _discover()
    return _RULES.get(name)


def names(kind: str) -> tuple[str, ...]:
    return tuple(r.name for r in rules(kind))


def default_signals() -> list[str]:
    """The signals that raise the hacking alarm by default (guard.hacking_signals)."""
    return [r.name for r in rules("signal") if r.default_on]


def advisory_alarms() -> set[str]:
    """The alarms whose every action is in ADVISORY_ACTIONS, or that declare themselves advisory (they leave a
    checkpoint stable)."""
    return {r.name for r in rules("alarm")
            if (r.advisory if r.advisory is not None else bool(r.actions) and set(r.actions) <= ADVISORY_ACTIONS)}


def rollback_rules() -> tuple[str, ...]:
    """The rules that roll back, in the order their triggers are read: alarms, the hacking alarm, checks."""
    alarms = [r.name for r in rules("alarm") if r.rolls_back]
    return (*alarms, HACKING, *(r.name for r in rules("check") if r.rolls_back))


def reanchor_rules() -> list[str]:
    """The rollbacks that re-anchor the reference by default (not kl_hard: a policy past the KL limit is no
    reference to keep)."""
    return [name for name in rollback_rules() if name == HACKING or rule(name).reanchors]


def declared_keys() -> list[tuple[GuardRule, Key]]:
    """Every rule's keys, with the rule, in the rules' order."""
    return [(r, k) for r in rules() for k in r.keys]


def external_defaults() -> dict[str, Any]:
    """The keys whose default differs where the guard watches another trainer's model."""
    return {k.name: k.external for _, k in declared_keys() if k.has_external}
