"""What `klguard watch` says before it judges a log: which guard inputs the log has, which rules therefore run
(with which values) and which cannot fire; and after: which failures the rules that could not fire would have seen
(a log a rule has no input for is not calm for that rule, only unseen)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from klguard.guard import GuardConfig
from klguard.guard.rules import NONFINITE_INPUTS
from klguard.guard.signals import (
    ENTROPY,
    GRAD_NORM,
    KL_COEF,
    KL_LOSS_COEF,
    KL_SEQ_SUM,
    LENGTH,
    PPO_KL,
    REF_KL,
    REF_KL_LOSS,
    REF_NLL,
    SCORE,
)

VAL = "val-core/*/acc/*"
KL = (REF_KL, REF_KL_LOSS)


@dataclass(frozen=True)
class Rule:
    name: str
    needs: tuple[tuple[str, ...], ...]  # all of these groups, one name of each
    says: Callable[[GuardConfig], str]  # what it does, with its values
    sees: str  # the failure it catches, for the summary of a log it has no input in
    on: Callable[[GuardConfig], bool] = lambda cfg: True


RULES = (
    Rule("kl_hard", (KL,), lambda c: f"KL to the reference > {c.kl_hard_limit:g} for {c.kl_hard_patience} steps: "
         "roll back", "a KL blow-up"),
    Rule("kl_spike", (KL,), lambda c: f"KL > {c.spike_factor:g}x its running median: lower target_kl (advice)",
         "a KL spike"),
    Rule("ppo_kl", ((PPO_KL,),), lambda c: f"actor/ppo_kl > {c.ppo_kl_max:g}: cut the lr, {c.patience} steps: pause",
         "policy steps too large"),
    Rule("penalty_share", ((KL_COEF, KL_LOSS_COEF), (KL_SEQ_SUM,), (SCORE,)),
         lambda c: f"KL penalty > {c.penalty_share_max:.0%} of the score: raise kl_coef",
         "a KL penalty that swamps the reward"),
    Rule("grad_norm", ((GRAD_NORM,),), lambda c: f"actor/grad_norm > {c.grad_norm_max:g}: clip (advice)",
         "exploding gradients"),
    Rule("val_drop", ((VAL,),), lambda c: f"validation {c.val_drop_max:.0%} below its best: roll back",
         "a validation score falling"),
    Rule("entropy_collapse", ((ENTROPY,),),
         lambda c: f"actor/entropy < {c.entropy_collapse_ratio:g}x its first {c.baseline_window} steps: hacking",
         "an entropy collapse", lambda c: "entropy_collapse" in c.hacking_signals),
    Rule("length_growth", ((LENGTH,),),
         lambda c: f"response length > {1 + c.length_growth_max:g}x its first {c.baseline_window} steps: hacking",
         "responses growing long", lambda c: "length_growth" in c.hacking_signals),
    Rule("ref_nll", ((REF_NLL,),),
         lambda c: f"{REF_NLL} > {c.ref_nll_rise:g} nats over its first {c.baseline_window} steps: hacking",
         "samples drifting from the reference model's text", lambda c: "ref_nll" in c.hacking_signals),
    Rule("length_collapse", ((LENGTH,),),
         lambda c: f"response length < {c.length_collapse_ratio:g}x its first steps: roll back",
         "responses collapsing to a few tokens", lambda c: c.length_collapse_ratio > 0),
    Rule("nonfinite", (NONFINITE_INPUTS,), lambda c: f"NaN/inf gradient norm, loss, KL or score for "
         f"{c.nonfinite_patience} steps: pause", "NaN or infinite training", lambda c: c.nonfinite_patience > 0),
)


def has(names: Collection[str], wanted: str) -> bool:
    if wanted == VAL:
        return any(n.startswith("val-core/") and "/acc/" in n for n in names)
    return wanted in names


def inputs_line(names: Collection[str]) -> str:
    """The guard inputs among a log's (mapped) metric names."""
    wanted = (*KL, PPO_KL, KL_COEF, KL_LOSS_COEF, KL_SEQ_SUM, SCORE, GRAD_NORM, LENGTH, ENTROPY, REF_NLL, VAL)
    found = [w for w in wanted if has(names, w)]
    return "guard inputs found: " + (", ".join(found) if found else "none")


def rules_lines(cfg: GuardConfig, names: Collection[str]) -> tuple[list[str], list[str]]:
    """(the rules that run, with their values; the rules that cannot fire, with the input they lack)."""
    run, cannot = [], []
    for rule in RULES:
        if not rule.on(cfg):
            continue
        lacks = _lacks(rule, names)
        if lacks:
            cannot.append(f"{rule.name} (no {lacks})")
        else:
            run.append(f"{rule.name}: {rule.says(cfg)}")
    return run, cannot


def blind_to(cfg: GuardConfig, names: Collection[str]) -> list[str]:
    """The failures no rule can see in a log with these names, each with the rule and the input it lacks."""
    return [f"{rule.sees} ({rule.name}: no {lacks})" for rule in RULES if rule.on(cfg)
            and (lacks := _lacks(rule, names))]


def _lacks(rule: Rule, names: Collection[str]) -> str:
    """The first input group the rule lacks in `names` (its first two names), or "" when it has them all."""
    missing = [group for group in rule.needs if not any(has(names, name) for name in group)]
    return " or ".join(missing[0][:2]) if missing else ""
