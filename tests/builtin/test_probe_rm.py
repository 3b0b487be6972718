"""The learned RM probe's head (klguard.builtin.probe_rm): the logistic fit on raw features, its AUC, and
the strength chosen on the held-out fifth."""

from __future__ import annotations

import math

import pytest
import torch

from klguard.builtin.probe_rm import auc, fit_head


def test_auc_counts_pairs_and_ties() -> None:
    labels = torch.tensor([1.0, 1.0, 0.0, 0.0])
    assert auc(torch.tensor([3.0, 2.0, 1.0, 0.0]), labels) == 1.0
    assert auc(torch.tensor([0.0, 1.0, 2.0, 3.0]), labels) == 0.0
    assert auc(torch.tensor([1.0, 1.0, 1.0, 1.0]), labels) == 0.5
    assert math.isnan(auc(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0])))


def test_the_head_on_raw_features_separates_what_the_labels_separate() -> None:
    gen = torch.Generator().manual_seed(0)
    n, h = 400, 32
    scales = torch.linspace(0.1, 10.0, h)
    x = torch.randn(n, h, generator=gen) * scales + 5.0  # features of unequal scale and a common offset
    signal = (x[:, 3] - 5.0) / scales[3]  # the labels follow feature 3 alone
    y = (signal + 0.3 * torch.randn(n, generator=gen) > 0.5).float()
    weight, metrics = fit_head(x, y, seed=0)
    assert weight.shape == (h,)
    assert metrics["samples"] == n and metrics["held_out_n"] == 80
    assert metrics["held_out_auc"] > 0.95 and metrics["held_out_accuracy"] > 0.85
    assert auc(x @ weight, y) > 0.95  # the head reads raw features: the standardisation is folded into it
    assert weight.abs().argmax().item() == 3


def test_one_class_fits_without_error_and_says_nan() -> None:
    x = torch.randn(50, 4, generator=torch.Generator().manual_seed(1))
    weight, metrics = fit_head(x, torch.zeros(50), seed=0)
    assert torch.isfinite(weight).all()
    assert math.isnan(metrics["held_out_auc"]) and metrics["gold_rate"] == 0.0
    assert metrics["held_out_accuracy"] == pytest.approx(1.0)
