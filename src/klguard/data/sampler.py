"""Epoch-based prompt sampling whose position is part of the checkpoint, so resume continues exactly."""

from __future__ import annotations

import torch


class PromptSampler:
    """Yields batches of dataset indices; each epoch is a permutation seeded by (seed, epoch)."""

    def __init__(self, dataset_size: int, batch_size: int, *, shuffle: bool, seed: int) -> None:
        if dataset_size < batch_size:
            raise ValueError(f"the dataset has {dataset_size} prompts, fewer than one batch of {batch_size}")
        self.dataset_size = dataset_size
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.position = 0  # batches already taken in this epoch

    @property
    def batches_per_epoch(self) -> int:
        return self.dataset_size // self.batch_size  # drop_last, as verl's dataloader

    def _order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.dataset_size)
        return torch.randperm(self.dataset_size, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))

    def next_batch(self) -> list[int]:
        if self.position >= self.batches_per_epoch:
            self.epoch += 1
            self.position = 0
        start = self.position * self.batch_size
        self.position += 1
        return self._order(self.epoch)[start : start + self.batch_size].tolist()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position, self.seed = int(state["epoch"]), int(state["position"]), int(state["seed"])
