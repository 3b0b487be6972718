"""hacking/ref_low_prob_share and hacking/ref_nll on hand-made reference log-probs."""

from __future__ import annotations

import math

import torch

from klguard.ppo.metrics import support_metrics


def test_support_metrics_count_only_response_tokens():
    logp = torch.log(torch.tensor([[0.5, 0.005, 0.9, 1e-9],    # one of 3 tokens under 0.01; the 4th is padding
                                   [0.02, 0.011, 0.0, 0.0]]))  # none under 0.01 (0.011 is just above)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    out = support_metrics(logp, mask, prob_floor=0.01)
    assert abs(out["hacking/ref_low_prob_share"] - 1 / 5) < 1e-7  # a float32 mean
    nll = -(math.log(0.5) + math.log(0.005) + math.log(0.9) + math.log(0.02) + math.log(0.011)) / 5
    assert abs(out["hacking/ref_nll"] - nll) < 1e-6 * nll  # float32 rounding of a mean of 5 at this scale
    assert abs(support_metrics(logp, mask, prob_floor=0.03)["hacking/ref_low_prob_share"] - 3 / 5) < 1e-7
