"""The session's host tests: what every host of the guard must show, written once for any host a `Harness` drives
as its trainer would (a helper module: tests/guard/test_host_contract.py runs it on a fifth host, a plain training
loop; tests/integrations/test_verl_host_contract.py on verl's).

Each check takes `make(run="run", **guard_keys) -> Harness`: a fresh run of 20 steps in its own folder `run`, its KL in
the reward, steered by an adaptive controller from 0.05 towards a target of 0.01, with the given `guard.*` keys.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from klguard.guard import GuardSession
from klguard.guard.state import STATE_VERSION

DECISION = ("kind", "rule", "step", "metric", "old", "new")


class Harness(Protocol):
    session: GuardSession

    def run(self, step: int, kl: float = 0.01, *, save: bool = False) -> None:
        """Train step `step` (its KL to the reference `kl`), writing a checkpoint of it when `save`, with the host's
        own timing, and give its metrics to the session."""

    def coefficient(self) -> float:
        """The KL coefficient the trainer's next step uses."""

    def restored(self) -> list[int]:
        """The checkpoints the host restored, in order."""

    def paused(self) -> bool:
        """Whether the trainer stops after this step."""

    def said(self) -> list[str]:
        """The lines the host said to its user."""

    def events(self) -> list[dict[str, Any]]:
        """The decisions written to events.jsonl."""

    def written_state(self, step: int) -> dict[str, Any]:
        """The guard's state written beside checkpoint `step`."""

    def resume(self) -> Harness:
        """A new process on the same run, resumed from its newest checkpoint."""


Make = Callable[..., Harness]


def decisions(events: list[dict[str, Any]], after: int = 0) -> list[dict[str, Any]]:
    return [{k: e.get(k) for k in DECISION} for e in events if e["step"] > after]


def check_the_guard_is_built_from_the_config_and_the_hosts_kl(make: Make) -> None:
    h = make(kl_hard_patience=2, ppo_kl_max=0.05)
    guard = h.session.guard
    assert (guard.cfg.kl_hard_patience, guard.cfg.ppo_kl_max) == (2, 0.05)
    assert (guard.kl_coef, guard.target_kl, guard.kl_controlled) == (h.coefficient(), 0.01, True)


def check_a_checkpoint_is_stable_once_the_next_step_is_calm(make: Make) -> None:
    """Checkpoints 2, 4 and 6; step 7, on checkpoint 6's weights, blows up: 6 is no rollback target, 4 is."""
    h = make(kl_hard_patience=1)
    for step in range(1, 8):
        h.run(step, kl=5.0 if step == 7 else 0.01, save=step % 2 == 0)
    assert h.session.stable == [2, 4]
    assert h.restored() == [4]
    assert [e["kind"] for e in h.events()][:1] == ["rollback"] and h.events()[0]["step"] == 7
    assert h.coefficient() > 0.05  # the tightening after a rollback
    assert not h.paused()


def check_the_state_is_versioned_and_resumes_the_same_decisions(make: Make) -> None:
    """A run resumed from checkpoint 6 decides as the run that went on: the rollback at 9 restores 6 in both."""
    whole = make("whole", kl_hard_patience=1)
    part = make("part", kl_hard_patience=1)
    for step in range(1, 11):
        for h in (whole, part) if step <= 6 else (whole,):
            h.run(step, kl=5.0 if step == 9 else 0.01, save=step % 2 == 0)
    state = part.written_state(6)
    assert (state["version"], state["guard"]["version"], state["pending"]) == (STATE_VERSION, STATE_VERSION, 6)
    resumed = part.resume()
    for step in range(7, 11):
        resumed.run(step, kl=5.0 if step == 9 else 0.01, save=step % 2 == 0)
    assert decisions(resumed.events(), after=6) == decisions(whole.events(), after=6) != []
    assert resumed.restored()[-1:] == whole.restored() == [6]
    assert resumed.session.state_dict() == whole.session.state_dict()
    assert resumed.coefficient() == whole.coefficient()


def check_the_warmup_holds_the_coefficient(make: Make) -> None:
    """warmup_kl_coef 0.02 for the first quarter (5 steps): steps 2-5 use it whatever the KL; step 6 the 0.05 it had
    before; then the controller moves it (the KL is above its target)."""
    h = make(warmup_kl_coef=0.02, warmup_ratio=0.25, kl_hard_limit=10.0)
    used = {}
    for step in range(1, 9):
        used[step] = h.coefficient()
        h.run(step, kl=0.05)
    assert [used[s] for s in range(2, 6)] == [0.02] * 4
    assert used[6] == 0.05 and used[7] > 0.05


def check_a_pause_stops_the_run_and_says_why(make: Make) -> None:
    h = make(kl_hard_patience=1, max_rollbacks=0)
    h.run(1)
    h.run(2, kl=5.0, save=True)
    assert h.paused()
    reason = h.session.pause_reason
    assert "To go on: raise " in reason and "kl_hard_limit" in reason
    assert f"klguard: paused at step 2: {reason}" in h.said()
    assert decisions(h.events())[-1]["kind"] == "pause"


CHECKS = [check_the_guard_is_built_from_the_config_and_the_hosts_kl,
          check_a_checkpoint_is_stable_once_the_next_step_is_calm,
          check_the_state_is_versioned_and_resumes_the_same_decisions, check_the_warmup_holds_the_coefficient,
          check_a_pause_stops_the_run_and_says_why]
"""The session's host tests, for `pytest.mark.parametrize("check", CHECKS)`."""
