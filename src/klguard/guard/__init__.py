"""The KL guard: a standalone monitor that turns a run's metrics into logged, automatic actions.

Metrics in (a dict with verl's names), actions out (`Action` records); the trainer applies
them, usually through a `GuardSession` that carries them out on a `GuardHost`. Pure Python: usable
from any trainer. Its rules and signals are declared one a file (klguard.guard.registry, klguard/guard/rules/).

    guard = KLGuard(GuardConfig(), total_steps=200, target_kl=0.015, kl_coef=0.001)
    for step in range(1, 201):
        metrics = train_step()
        for action in guard.observe(step, metrics):
            apply(action)
"""

from klguard.guard.actions import ACTION_KINDS, Action
from klguard.guard.config import HACKING_ACTIONS, GuardConfig, default_target_kl
from klguard.guard.guard import KLGuard
from klguard.guard.host import AdvisoryHost, GuardHost, HostKeys, KLSetup
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.session import GuardSession
from klguard.guard.signals import input_metrics

INPUT_METRICS: tuple[str, ...] = input_metrics()
"""Every metric the guard reads (its rules' and its own)."""

__all__ = ["ACTION_KINDS", "HACKING_ACTIONS", "INPUT_METRICS", "Action", "AdvisoryHost", "GuardConfig", "GuardHost",
           "GuardRule", "GuardSession", "HostKeys", "KLGuard", "KLSetup", "Key", "default_target_kl", "register"]
