"""length_corr: `hacking/length_reward_corr` above `length_corr_max` while the length is above
(1 + `length_corr_min_growth`) x its baseline: reward bought with length. Off at its default threshold 1."""

from __future__ import annotations

from klguard.fields import at_least, interval
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import LENGTH, LENGTH_CORR
from klguard.guard.step import Evidence, Step

NAME = "length_corr"


def measure(step: Step) -> Evidence | None:
    cfg, length, corr = step.cfg, step.obs.length, step.value(LENGTH_CORR)
    length0 = step.baseline("length", length)
    grow = length0 is not None and length0 > 0 and length is not None
    fired = step.st.hack[NAME] = (grow and corr is not None and corr > cfg.length_corr_max
                                  and length > (1 + cfg.length_corr_min_growth) * length0)
    if not fired:
        return None
    return Evidence(NAME, LENGTH_CORR, corr, cfg.length_corr_max, f"reward-length correlation {corr:.2f} while length "
                    "grows")


register(GuardRule(
    name=NAME, kind="signal", order=120, reads=((LENGTH_CORR,), (LENGTH,)), default_on=True,
    says=lambda c: (f"{LENGTH_CORR} > {c.length_corr_max:g} while the length is {1 + c.length_corr_min_growth:g}x "
                    f"its first {c.baseline_window} steps: hacking"),
    sees="reward bought with length",
    on=lambda guard: NAME in guard.cfg.hacking_signals and guard.cfg.length_corr_max < 1,
    keys=(Key("length_corr_max", 1.0, "hacking/length_reward_corr above this while length grows: hacking signal (1 = "
              "off)", interval("[-1, 1]")),
          Key("length_corr_min_growth", 0.1, "Relative length growth that counts as 'growing' for the correlation "
              "signal", at_least(0))),
    measure=measure))
