"""policy_ratio: the update's mean importance ratio pi/pi_old (`actor/policy_ratio`) far from 1: the median of its last
`robust_window` values, or of their inverse, above `policy_ratio_max`: the policy moves further per update than the
samples it learns from can vouch for (no clipping, or too many epochs on a batch). Advice: a ratio is noisy on a small
batch and the tune half holds one run that logs it unclipped. Off in klguard's own runs (0)."""

from __future__ import annotations

from klguard.fields import at_least
from klguard.guard.registry import Key, register
from klguard.guard.shapes import level_advice
from klguard.guard.signals import POLICY_RATIO


def _spread(ratio: float) -> float:
    """How far a ratio is from 1 either way (2 for 2 and for 0.5); infinite at 0 or below."""
    return max(ratio, 1 / ratio) if ratio > 0 else float("inf")


register(level_advice(
    "policy_ratio", 105, POLICY_RATIO, what="the policy ratio's distance from 1 (max(r, 1/r))", fold=_spread,
    sees="a policy-ratio explosion",
    limit=Key("policy_ratio_max", 0.0, "Recent median policy ratio (or its inverse) above this: advise (0: off)",
              at_least(0), external=3.0),
    do="clip the policy ratio (PPO's clip, 0.2) or take fewer epochs per batch; a ratio this far from 1 is an "
       "off-policy update"))
