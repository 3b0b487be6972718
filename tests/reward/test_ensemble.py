"""An RM ensemble's reductions and folder list, on hand-computed values."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from klguard.errors import UserError
from klguard.reward.ensemble import member_folders, reduce_scores, user_rm_folders

SCORES = torch.tensor([[1.0, -2.0, 0.5], [3.0, -2.0, 0.0], [2.0, -2.0, 1.0]])  # 3 members x 3 responses


def test_mean_min_and_uncertainty_weighted():
    assert reduce_scores(SCORES, "mean", 0.5).tolist() == [2.0, -2.0, 0.5]
    assert reduce_scores(SCORES, "min", 0.5).tolist() == [1.0, -2.0, 0.0]
    # population variances: 2/3, 0, 1/6; uwo = mean - 0.5 x variance
    expected = torch.tensor([2.0 - 0.5 * 2 / 3, -2.0, 0.5 - 0.5 / 6])
    assert torch.allclose(reduce_scores(SCORES, "uwo", 0.5), expected, atol=1e-6, rtol=0)
    assert torch.equal(reduce_scores(SCORES, "uwo", 0.0), reduce_scores(SCORES, "mean", 0.0))


def test_the_folders_a_path_names(tmp_path):
    assert user_rm_folders("/a") == [Path("/a")]
    assert user_rm_folders("/a, /b,/c") == [Path("/a"), Path("/b"), Path("/c")]
    with pytest.raises(UserError, match=r"reward_model.model.path=/a,,/b has an empty entry"):
        user_rm_folders("/a,,/b")
    assert member_folders(tmp_path) == [tmp_path]  # a single RM is its own folder
    for i in (10, 2, 0, 1):
        (tmp_path / f"member-{i}").mkdir()
    assert [p.name for p in member_folders(tmp_path)] == ["member-0", "member-1", "member-2", "member-10"]


def test_a_bad_reduction_is_refused_by_the_config(capsys):
    from klguard.commands.cli import main

    assert main(["train", "reward_model.ensemble_reduce=median"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("klguard: error: reward_model.ensemble_reduce='median' is not one of: mean, min, uwo"), err
