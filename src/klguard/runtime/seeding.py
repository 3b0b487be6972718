"""Seeds: every RNG from `trainer.seed`, and per-step generators derived from (seed, step, stream)."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def step_generator(seed: int, step: int, stream: int, device: torch.device) -> torch.Generator:
    """A generator derived from (seed, step, stream): rollouts are reproducible and resume-safe
    without carrying generator state, as nanochat derives its sampling seeds."""
    mixed = (seed * 0x9E3779B1 + step * 0x85EBCA77 + stream * 0xC2B2AE3D) % (2**63 - 1)
    return torch.Generator(device=device).manual_seed(mixed)
