"""kl_growth: `actor/kl_seq_sum` (the KL per sequence) above `kl_growth_factor` x its baseline and above
`kl_growth_min` (the first steps' KL is near 0, so a ratio alone would fire on any learning).

The baseline takes the first steps even where ``baseline_settle`` keeps other metrics' start-up out: the KL starts
at 0 because the policy starts as the reference, so its first steps are the rise the rule measures; a baseline taken
after them (steps 11-20 on a Hugging Face model) is taken once a hacking run's KL is already high and 3x of it is
never reached."""

from __future__ import annotations

from klguard.fields import at_least
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import KL_SEQ_SUM
from klguard.guard.step import Evidence, Step

NAME = "kl_growth"


def measure(step: Step) -> Evidence | None:
    value, cfg = step.value(KL_SEQ_SUM), step.cfg
    kl0 = step.baseline("kl_seq", value, settle=False)
    limit = None if kl0 is None else max(cfg.kl_growth_factor * kl0, cfg.kl_growth_min)
    return step.limit(NAME, KL_SEQ_SUM, value, limit, True, "KL per sequence")


register(GuardRule(
    name=NAME, kind="signal", order=140, reads=((KL_SEQ_SUM,),),
    says=lambda c: (f"{KL_SEQ_SUM} > {c.kl_growth_factor:g}x its first {c.baseline_window} steps and > "
                    f"{c.kl_growth_min:g}: hacking"),
    sees="the KL per sequence growing",
    keys=(Key("kl_growth_factor", 3.0, "actor/kl_seq_sum above this x baseline (and above kl_growth_min): hacking "
              "signal", at_least(1)),
          Key("kl_growth_min", 1.0, "KL per sequence (nats) the kl_growth signal needs at least", at_least(0))),
    reference_baselines=("kl_seq",), measure=measure))
