"""rm_outlier: `hacking/rm_feature_outlier_share` (the share of rollouts whose reward-model features are Mahalanobis
outliers from the first steps' rollouts, klguard.reward.rm_outliers) above its baseline + `rm_outlier_rise`: the
policy's responses leave the region of the RM's latent space it started in (InfoRM, Miao et al. 2024)."""

from __future__ import annotations

from klguard.fields import at_least, interval
from klguard.guard.registry import Key, register
from klguard.guard.shapes import rise_signal
from klguard.guard.signals import RM_OUTLIER

register(rise_signal(
    "rm_outlier", 190, RM_OUTLIER, baseline="rm_outlier", what="share of rollouts with outlying RM features",
    sees="responses outside the ground the reward model was fit on",
    keys=(Key("rm_outlier_quantile", 0.99, "RM-feature outlier: past this quantile of the baseline rollouts' own "
              "Mahalanobis distances", interval("(0, 1)")),),
    rise=Key("rm_outlier_rise", 0.05, "hacking/rm_feature_outlier_share (RM-feature outliers) above baseline + this: "
             "hacking signal", at_least(0))))
