"""kl_spike: the KL above `spike_factor` x the median of its previous `spike_window` values (at least
`spike_min_history` of them, the median at least `spike_median_floor` x target_kl) and above target_kl: lower
target_kl. Under a fixed KL coefficient no controller chases target_kl, so lowering it changes nothing in
training; with `spike_kl_coef_factor` > 1 the spike raises the coefficient by that factor there instead."""

from __future__ import annotations

from klguard.fields import at_least, fail
from klguard.guard.actions import Action
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import REF_KL, REF_KL_LOSS, median
from klguard.guard.step import Step
from klguard.guard.tighten import lower_target_kl, raise_kl_coef

NAME = "kl_spike"


def measure(step: Step) -> float | None:
    """The spike threshold (None without enough history or with a median under the floor)."""
    kl, st, cfg = step.obs.kl, step.st, step.cfg
    if kl is None:
        st.alarms[NAME] = False
        return None
    hist = step.memory(NAME)["history"]
    threshold = None
    # Early in a run the policy is its reference and the KL estimates are rounding noise around 0: a median of
    # them is no baseline (its sign alone, which differs between CPUs, would decide whether any KL is a spike).
    if len(hist) >= cfg.spike_min_history and median(hist) >= cfg.spike_median_floor * st.target_kl:
        threshold = cfg.spike_factor * median(hist)
    st.alarms[NAME] = threshold is not None and kl > threshold and kl > st.target_kl
    hist.append(kl)
    del hist[:-cfg.spike_window]
    return threshold


def act(step: Step) -> list[Action]:
    st, cfg, obs, now = step.st, step.cfg, step.obs, step.step
    if obs.kl is None or not st.alarms[NAME] or not st.ready(NAME, now, cfg.cooldown):
        return []
    why = f"{obs.kl_name} {obs.kl:.4g} spiked above {cfg.spike_factor:g}x its running median"
    if not step.kl_controlled and cfg.spike_kl_coef_factor > 1:
        action = raise_kl_coef(cfg, st, now, NAME, cfg.spike_kl_coef_factor, why, obs.kl_name, obs.kl,
                               step.found[NAME])
    else:
        action = lower_target_kl(cfg, st, now, NAME, why, obs.kl_name, obs.kl, step.found[NAME])
    if action is None:
        return []
    st.fired(NAME, now)
    return [action]


def check(cfg, key: str) -> None:
    if cfg.spike_min_history > cfg.spike_window:
        fail(f"{key}.spike_min_history", cfg.spike_min_history, f"must be <= spike_window ({cfg.spike_window})")


register(GuardRule(
    name=NAME, kind="alarm", order=50, reads=((REF_KL, REF_KL_LOSS),),
    says=lambda c: f"KL > {c.spike_factor:g}x its running median: lower target_kl" + (
        f" (a fixed coefficient: raise it {c.spike_kl_coef_factor:g}x)" if c.spike_kl_coef_factor > 1 else ""),
    sees="a KL spike", actions=("lower_target_kl", "raise_kl_coef"),
    # the raise (under a fixed coefficient) tightens the KL's control as a lower target does under a controller:
    # neither says anything against the weights, whose KL stable_kl_share judges
    advisory=True, do="lower the target KL or raise the KL coefficient; look at the batch of the spike",
    keys=(Key("spike_factor", 3.0, "KL above this times its running median (and above target_kl) is a spike",
              at_least(1)),
          Key("spike_window", 20, "Steps in the running median of the KL", at_least(1)),
          Key("spike_min_history", 5, "KL values needed before spikes are detected (<= spike_window)", at_least(1)),
          Key("spike_median_floor", 0.1, "Spikes need a running median of at least this share of target_kl (near 0 "
              "it is float noise)", at_least(0)),
          Key("spike_kl_coef_factor", 1.0, "Under a fixed KL coefficient a spike raises it by this factor (1: it "
              "lowers target_kl only)", at_least(1))),
    memory={"history": []}, check=check, measure=measure, act=act))
