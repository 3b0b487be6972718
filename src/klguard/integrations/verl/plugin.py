"""The `verl.plugins` entry point: registers trainer mode `klguard` when verl is imported."""

from __future__ import annotations

from klguard.integrations.verl.trainer import KLGuardTrainer

__all__ = ["KLGuardTrainer"]
