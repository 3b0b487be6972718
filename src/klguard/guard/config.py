"""Configuration of the KL guard (mounted under ``guard.*`` in klguard's schema): the keys of the guard itself, here,
and each rule's own, from its declaration (klguard.guard.registry), in the rules' order.

Every window, patience and cooldown counts calls to :meth:`KLGuard.observe`, i.e. training steps
when the trainer calls it once per step (the trainer may call it once per epoch instead).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from klguard.errors import ConfigError
from klguard.fields import Rule as KeyRule
from klguard.fields import at_least, check_tree, choices, fail, greater, interval, opt, type_hints
from klguard.guard import registry
from klguard.guard.signals import VAL_METRIC

HackingAction = Literal["raise_kl_coef", "rollback", "none"]
HACKING_ACTIONS: tuple[str, ...] = get_args(HackingAction)
DEFAULT_HACKING_SIGNALS: list[str] = registry.default_signals()
"""The signals that raise the hacking alarm by default: those declared `default_on`."""
ROLLBACK_RULES = registry.rollback_rules()  # the rules that roll back
REANCHOR_RULES = tuple(registry.reanchor_rules())  # a policy past the KL limit is no reference: not kl_hard

_POSITIVE, _SHARE, _TOLERANCE = greater(0), interval("(0, 1]"), at_least(0)
_FACTOR, _STEPS, _COUNT = at_least(1), at_least(1), at_least(0)


@dataclass(init=False, repr=False, eq=False)
class GuardConfig:
    """Thresholds and responses of the guard. Where a field's help names a measurement, the default was
    calibrated on the built-in demo (docs/guard.md lists the measurements). The fields here are the guard's own;
    each rule's keys are added from its declaration (`dataclasses.fields(GuardConfig)` lists them all)."""

    enable: bool = opt(True, "Run the KL guard (false: plain verl behaviour, observe() returns no actions)")
    cooldown: int = opt(10, "Steps between two firings of the same rule", rule=_COUNT)

    # Tightening, whichever rule asks (bounded: no ratchet)
    lr_floor_scale: float = opt(
        0.25, "The lr scale never goes below this share of the lr (bounded tightening: no ratchet)", rule=_SHARE)
    kl_coef_max: float = opt(
        10.0, "A kl_coef raise that would reach this pauses the run instead (no ratchet)", rule=_POSITIVE)
    target_kl_step: float = opt(0.005, "How much a rollback or a KL spike lowers target_kl",
                                rule=_POSITIVE)
    target_kl_min: float = opt(0.002, "The guard never lowers target_kl below this",
                               rule=_POSITIVE)

    # Validation (val_drop, proxy_val_divergence)
    val_metric: str = opt(
        VAL_METRIC, "Glob of the validation metrics the rules read (no gold: val-aux/*/score/*, the RM's own score)",
        rule=KeyRule(lambda v: bool(v.strip()), "must be a non-empty metric glob"))
    val_fall_tol: float = opt(0.02, "Relative drop between consecutive validations that counts as falling",
                              rule=_TOLERANCE)
    val_patience: int = opt(
        2, "Validations in a row that val_drop or proxy_val_divergence needs before it acts (a score is noisy)",
        rule=_STEPS)

    # Rollbacks: how they tighten, how many, which re-anchor the reference, which checkpoints they restore
    rollback_kl_coef_factor: float = opt(6.0, "kl_coef multiplier after a rollback", rule=_FACTOR)
    rollback_lr_factor: float = opt(0.5, "lr scale multiplier after a rollback (1 = keep the lr)", rule=_SHARE)
    max_rollbacks: int = opt(3, "Rollbacks allowed in a run; the next trigger pauses", rule=_COUNT)
    hold_steps: int = opt(
        0, "Calm steps after a rollback that show its tightening held; a trigger sooner pauses (0 = off)",
        rule=_COUNT)
    reanchor_on_rollback: bool = opt(
        True, "After a rollback the reference becomes the restored policy (KL then holds the run near it)"
    )
    reanchor_rollbacks: int = opt(
        1, "Only the first N rollbacks re-anchor the reference (at 3 the demo's reference moves into the leak)",
        rule=_COUNT)
    reanchor_rules: list[str] = opt(
        list(REANCHOR_RULES), "Rollbacks by these rules may re-anchor (not kl_hard: the restored policy had strayed)")
    stable_kl_share: float = opt(
        0.5, "KL to the reference above this share of kl_hard_limit: no rollback target (headroom once restored)",
        rule=interval("(0, 1]"))
    stable_length_growth: float = opt(
        0.1, "Recent mean length above (1 + this) x baseline: no rollback target (at 0.2 the demo re-anchors to leaks)",
        rule=_TOLERANCE,
    )
    stable_length_window: int = opt(5, "Steps in that recent mean length", rule=_STEPS)

    # Warm-up
    warmup_ratio: float = opt(0.2, "Share of total steps during which kl_coef is frozen", rule=interval("[0, 1]"))
    warmup_kl_coef: float | None = opt(
        None, "kl_coef held during warm-up (null: no freeze; a freeze at 0 makes no measurable difference on the demo)",
        rule=at_least(0, or_null=True),
    )

    # The hacking alarm (its signals need no gold score)
    baseline_window: int = opt(10, "First steps averaged into the length/entropy baseline", rule=_STEPS)
    hacking_signals: list[str] = opt(
        DEFAULT_HACKING_SIGNALS, "Signals that raise the hacking alarm (the others are only logged as guard/hack_*)")
    hacking_action: HackingAction = opt(
        "rollback", f"Response to a hacking alarm: {choices(HackingAction, rollback='then tighten')}"
    )
    hacking_kl_coef_factor: float = opt(2.0, "kl_coef multiplier on a hacking alarm", rule=_FACTOR)

    def __init__(self, **values: Any) -> None:
        for f in fields(self):
            if f.name in values:
                value = values.pop(f.name)
            else:
                value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            setattr(self, f.name, value)
        if values:
            raise TypeError(f"GuardConfig has no keys {', '.join(sorted(values))}")

    def __repr__(self) -> str:
        return f"GuardConfig({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in fields(self))})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self))

    def check(self, key: str) -> None:
        """What no single field's rule says: every number finite, each signal and rollback rule named exists, and
        each rule's own checks over its keys."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                fail(f"{key}.{f.name}", value, "must be finite")
        signals = registry.names("signal")
        for name in self.hacking_signals:
            if name not in signals:
                fail(f"{key}.hacking_signals", name, f"is not a signal; known: {', '.join(signals)}")
        rollbacks = registry.rollback_rules()
        for name in self.reanchor_rules:
            if name not in rollbacks:
                fail(f"{key}.reanchor_rules", name, f"is not a rule that rolls back; known: {', '.join(rollbacks)}")
        for rule in registry.rules():
            if rule.check is not None:
                rule.check(self, key)

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field (klguard's config loader raises the same as ConfigError)."""
        try:
            check_tree(self, "guard")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


_OWN_KEYS = tuple(f.name for f in fields(GuardConfig))


def _declared_fields() -> dict[str, tuple[Any, dataclasses.Field]]:
    """Each declared key as a dataclass field (and its type), in the rules' order."""
    specs = []
    for _, key in registry.declared_keys():
        tp = key.type if key.type is not None else type(key.default)
        specs.append((key.name, tp, opt(key.default, key.help, rule=key.rule)))
    made = dataclasses.make_dataclass("DeclaredKeys", specs)
    hints = {name: tp for name, tp, _ in specs}
    return {f.name: (hints[f.name], f) for f in fields(made)}


def _add_declared_keys(_rule: object = None) -> None:
    """Give GuardConfig the keys of the rules declared now (in place: the schema holds the class), in their order."""
    declared = _declared_fields()
    own = {name: GuardConfig.__dataclass_fields__[name] for name in _OWN_KEYS}
    for name in list(GuardConfig.__dataclass_fields__):
        if name not in own:
            del GuardConfig.__dataclass_fields__[name]
            GuardConfig.__annotations__.pop(name, None)
            if name in vars(GuardConfig):
                delattr(GuardConfig, name)
    for name, (tp, f) in declared.items():
        GuardConfig.__dataclass_fields__[name] = f
        GuardConfig.__annotations__[name] = tp
        if f.default is not dataclasses.MISSING:
            setattr(GuardConfig, name, f.default)
    type_hints.cache_clear()


_add_declared_keys()
registry.on_register(_add_declared_keys)

EXTERNAL_HOST_DEFAULTS: dict[str, object] = registry.external_defaults()
"""The guard's defaults on any model but the built-in demo's: where it watches another trainer's model (the TRL
callback, the verl plugin, `klguard watch` on any log but klguard's own) and in klguard's own trainer on a Hugging
Face model (klguard.config.loader); each key's `external` in its rule's declaration. They replace the built-in task's:
``kl_hard_limit`` 0.1 was set on its 0.35M model. Measured on 17 public training logs (docs/watch.md,
benchmarks/watch_reallogs.py): healthy runs of 0.5B-8B models reach a per-token KL of 0.35 and a single logged step
of 0.94, while the failing ones hold a KL above 0.5 for many steps (KL blow-up, KL-in-reward collapse, reward
hacking); healthy entropy falls to 0.096x its first steps' mean over hundreds of steps and the mean length to 0.52x,
collapsed runs reach 0.011x and 0.05x (one-token answers); a gradient norm NaN from step 1 is a failure no threshold
sees. A user's `guard.*` keys still win."""


def default_target_kl(nnodes: int) -> float:
    """The scale rule: target_kl 0.015 up to 32 nodes (8 GPUs each), 0.01 beyond."""
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise ValueError(f"nnodes must be an integer >= 1, got {nnodes!r}")
    return 0.015 if nnodes <= 32 else 0.01
