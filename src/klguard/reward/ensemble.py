"""Several reward models scoring as one (`reward_model.model.path=a,b,c`, or the built-in learned RM's members).

PPO optimises one reduction of the members' scores (`reward_model.ensemble_reduce`): their mean, their minimum
(Coste et al. 2024's worst case), or `mean - uwo_weight x variance` (their uncertainty-weighted optimisation).
The members' spread (standard deviation over members, per response) is the gold-free hacking signal
`hacking/rm_ensemble_std`: members fit to resamples of one dataset agree where the data pins them down and
disagree where the policy has left it (Eisenstein et al. 2023).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from klguard.config.schema import Config
from klguard.errors import UserError
from klguard.reward.model_rm import KEY, ModelReward, share_body


@dataclass
class EnsembleScores:
    scores: torch.Tensor  # [N] the reduction PPO optimises
    spread: torch.Tensor | None  # [N] the members' standard deviation; None for a single RM
    features: torch.Tensor | None = None  # [N, H] the first member's last-layer features, where asked for


def user_rm_folders(path: str) -> list[Path]:
    """The folders `reward_model.model.path` names: one, or several separated by commas."""
    folders = [part.strip() for part in str(path).split(",")]
    if any(not f for f in folders):
        raise UserError(f"{KEY}={path} has an empty entry; name folders separated by single commas")
    return [Path(f) for f in folders]


def member_folders(folder: Path) -> list[Path]:
    """The reward models a built-in learned-RM folder holds: itself, or its `member-<i>` folders (an ensemble)."""
    members = sorted(folder.glob("member-*"), key=lambda p: int(p.name.split("-")[1]))
    return members or [folder]


def reduce_scores(member_scores: torch.Tensor, how: str, uwo_weight: float) -> torch.Tensor:
    """[k, N] member scores -> [N]: mean, min, or mean - uwo_weight x (population) variance."""
    if how == "mean":
        return member_scores.mean(0)
    if how == "min":
        return member_scores.min(0).values
    if how == "uwo":
        return member_scores.mean(0) - uwo_weight * member_scores.var(0, correction=0)
    raise ValueError(f"unknown ensemble reduction {how!r}")


class RewardEnsemble:
    """The reward models of a run; `user`: the folders come from `reward_model.model.path`."""

    def __init__(self, config: Config, device: torch.device, folders: Sequence[Path], *, user: bool) -> None:
        # a member that differs from the first only in its score head is read on the first's forward
        self.body = ModelReward(config, device, folders[0], user=user)
        self.members = [self.body, *(share_body(self.body, ModelReward(config, device, folder, user=user))
                                     for folder in folders[1:])]
        self.reduce = config.reward_model.ensemble_reduce
        self.uwo_weight = config.reward_model.uwo_weight

    def __call__(self, prompts: Sequence[Sequence[dict[str, str]]], responses: Sequence[str], *,
                 features: bool = False) -> EnsembleScores:
        """`features`: also the last-layer features of the first member (an ensemble's members read the same
        text; one member's latent space is the one a feature baseline can be fit in)."""
        first, states = self.body.score(prompts, responses, features=features)
        member_scores = torch.stack([first, *(member(prompts, responses) for member in self.members[1:])])
        if len(self.members) == 1:
            return EnsembleScores(member_scores[0], None, states)
        return EnsembleScores(reduce_scores(member_scores, self.reduce, self.uwo_weight),
                              member_scores.std(0, correction=0), states)
