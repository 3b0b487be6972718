"""penalty_share: the KL penalty's share of the reward, beta x KL per sequence / |mean score|, above its max: raise
kl_coef.

Odd at first sight (a large share means KL is already expensive), but it reads: the policy pays a lot of KL for its
reward, i.e. it is drifting from the reference faster than the penalty holds it, and tightening stops the drift.
Raising beta raises the share at once (beta x KL), so the rule leans on its cooldown and on ``kl_coef_max``; the
share falls only as the KL falls.
"""

from __future__ import annotations

import math

from klguard.fields import at_least, greater
from klguard.guard.actions import Action
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import KL_COEF, KL_LOSS_COEF, KL_SEQ_SUM, SCORE, SCORE_MAX, SCORE_MIN, Observation
from klguard.guard.step import Step
from klguard.guard.tighten import KL_COEF_CHANGE, raise_kl_coef

NAME = "penalty_share"


def penalty_share(obs: Observation) -> float | None:
    """Share of the KL penalty in the reward: ``beta * S / |m|``.

    ``beta`` is the KL coefficient (``actor/reward_kl_penalty_coeff``, or the KL loss's), ``S`` is
    ``actor/kl_seq_sum`` (the KL summed over each response's tokens, averaged over the batch, so ``beta * S`` is the
    mean penalty a sequence pays) and ``m`` is ``critic/score/mean``. ``|m|`` stands in for the mean absolute score;
    the two agree when all scores have one sign, as with the built-in proxy reward. None when an input is missing,
    ``m`` is 0, the share overflows, or the batch's scores have both signs (``critic/score/min`` < 0 <
    ``critic/score/max``, as a reward model's logits do): a score centred near 0 makes the share as large as it
    likes. Measured per sequence, not per token, so length hacking (one costly skipped EOS spread over many tokens)
    still shows up in full.
    """
    seq_sum, score = obs.get(KL_SEQ_SUM), obs.get(SCORE)
    if obs.kl_coef is None or seq_sum is None or score is None or score == 0:
        return None
    low, high = obs.get(SCORE_MIN), obs.get(SCORE_MAX)
    if low is not None and high is not None and low < 0 < high:
        return None
    share = obs.kl_coef * seq_sum / abs(score)
    return share if math.isfinite(share) else None


def measure(step: Step) -> None:
    share = step.memory(NAME)["value"] = penalty_share(step.obs)
    step.st.alarms[NAME] = share is not None and share > step.cfg.penalty_share_max


def act(step: Step) -> list[Action]:
    st, cfg, now, share = step.st, step.cfg, step.step, step.memory(NAME)["value"]
    if share is None or not st.alarms[NAME] or not st.ready(NAME, now, cfg.cooldown) \
            or not st.ready(KL_COEF_CHANGE, now, cfg.cooldown):
        return []
    why = f"The KL penalty is {share:.1%} of the score (max {cfg.penalty_share_max:.1%}), the policy is drifting"
    action = raise_kl_coef(cfg, st, now, NAME, cfg.kl_coef_raise_factor, why, KL_SEQ_SUM, share,
                           cfg.penalty_share_max)
    if action is None:
        return []
    st.fired(NAME, now)
    return [action]


register(GuardRule(
    name=NAME, kind="alarm", order=30, reads=((KL_COEF, KL_LOSS_COEF), (KL_SEQ_SUM,), (SCORE,)),
    optional=(SCORE_MIN, SCORE_MAX),
    says=lambda c: f"KL penalty > {c.penalty_share_max:.0%} of the score: raise kl_coef",
    sees="a KL penalty that swamps the reward", actions=("raise_kl_coef", "pause"),
    keys=(Key("penalty_share_max", 0.5, "beta*KL per sequence / |mean score| above this: raise kl_coef (a raise "
              "lifts the share too)", greater(0)),
          Key("kl_coef_raise_factor", 1.5, "kl_coef multiplier of the penalty-share rule", at_least(1))),
    memory={"value": None}, logs=True,
    hint="lower {lr}, or raise {guard}penalty_share_max if the reward's scale is near 0 (a learned RM's often is)",
    measure=measure, act=act))
