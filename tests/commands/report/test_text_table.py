"""The terminal summary (`klguard demo`, `klguard report`) says how far each run trained and why one paused."""

from __future__ import annotations

from pathlib import Path

from klguard.commands.report.runs import RunRecord
from klguard.commands.report.summary import text_table


def test_a_paused_run_says_where_why_and_what_to_change():
    rows = [{"step": s, "critic/score/mean": 1.0} for s in range(0, 143)]
    pause = {"kind": "pause", "step": 142, "rule": "kl_coef_cap",
             "reason": "After a rollback: raising kl_coef from 1.8 by 6x would reach its cap guard.kl_coef_max=10",
             "to_go_on": "lower actor_rollout_ref.actor.optim.lr"}
    table = text_table([RunRecord("guarded", Path("a"), rows, [pause]),
                        RunRecord("plain", Path("b"), [{"step": s} for s in range(0, 201)], [])])
    lines = table.splitlines()
    assert lines[-3].split()[-2:] == ["142", "200"]  # steps trained
    assert lines[-2].startswith("trained to the end") and lines[-2].split()[-3:] == ["no,", "paused", "yes"]
    assert lines[-1] == ("guarded paused at step 142: After a rollback: raising kl_coef from 1.8 by 6x would reach "
                         "its cap guard.kl_coef_max=10 To go on: lower actor_rollout_ref.actor.optim.lr.")
