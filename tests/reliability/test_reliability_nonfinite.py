"""NaN/Inf in rewards, losses or gradients: the step is skipped, logged in events.jsonl, never saved."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from klguard.commands.cli import main
from klguard.ppo.update import NonFiniteError, PPOBatch, _run_updates, check_finite

REWARD = '''
CALLS = [0]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    CALLS[0] += 1
    step = (CALLS[0] - 1) // {batch} + 1  # {batch} responses a step, no validation before the last step
    return float("nan") if step in {nan_steps} else float(solution_str.strip().startswith("####"))
'''


def _run(fast_overrides, tmp_path, nan_steps, *extra) -> int:
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD.format(batch=16, nan_steps=set(nan_steps)))
    return main(["train", *fast_overrides, f"custom_reward_function.path={reward}", "proxy_reward.enable=false",
                 *extra])


def _weights(folder):
    return {**load_file(folder / "actor" / "model.safetensors"), **load_file(folder / "critic" / "model.safetensors")}


def test_nan_reward_skips_the_step_logs_it_and_stays_out_of_checkpoints(fast_overrides, tmp_path):
    assert _run(fast_overrides, tmp_path, {2}, "trainer.total_training_steps=4") == 0
    run = tmp_path / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["training/nonfinite_skipped"] for m in metrics] == [0.0, 1.0, 0.0, 0.0]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [(e["step"], e["kind"], e["where"]) for e in events] == [(2, "nonfinite_skip", "rewards")]
    ckpt = {step: _weights(run / f"global_step_{step}") for step in (1, 2, 3, 4)}
    assert all(torch.isfinite(t).all() for weights in ckpt.values() for t in weights.values())
    assert all(torch.equal(ckpt[1][k], ckpt[2][k]) for k in ckpt[1])  # step 2 changed nothing
    assert not all(torch.equal(ckpt[2][k], ckpt[3][k]) for k in ckpt[2])  # step 3 trained again


def test_repeated_non_finite_steps_pause_the_run(fast_overrides, tmp_path, capsys):
    code = _run(fast_overrides, tmp_path, range(2, 100), "trainer.total_training_steps=8",
                "trainer.max_nonfinite_steps=2")
    assert code == 0
    err = capsys.readouterr().err
    assert "klguard: paused at step 3: 2 steps in a row had non-finite values" in err
    run = tmp_path / "run"
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert all(torch.isfinite(t).all() for t in _weights(run / "global_step_3").values())


def _linear_batch(n: int = 4) -> PPOBatch:
    zeros = torch.zeros(n, 3)
    return PPOBatch(torch.zeros(n, 3, dtype=torch.long), torch.ones(n, 3, dtype=torch.long), torch.ones(n, 3),
                    zeros, zeros, zeros)


@pytest.mark.parametrize(("loss_of", "where"), [
    (lambda w: (w * float("nan")).sum(), "actor/pg_loss"),  # NaN loss: never back-propagated
    (lambda w: w.abs().sqrt().sum(), "actor/grad_norm"),  # finite loss, NaN gradient at w = 0
])
def test_a_non_finite_loss_or_gradient_skips_the_optimizer_step(loss_of, where):
    weight = torch.nn.Parameter(torch.zeros(3))
    optim = torch.optim.AdamW([weight], lr=0.1)

    def loss_fn(part):
        loss = loss_of(weight)
        return loss, {"actor/pg_loss": loss.item()}

    acc, found = _run_updates([weight], optim, _linear_batch(), loss_fn, epochs=2, mini_batch_size=2,
                              micro_batch_size=1, shuffle=False, grad_clip=1.0, generator=None, prefix="actor")
    assert found == [where]
    assert acc["actor/skipped_steps"] == [1.0] * 4 and "actor/grad_norm" not in acc
    assert torch.equal(weight.detach(), torch.zeros(3)) and not optim.state


def test_check_finite_names_the_tensor_and_ignores_padding():
    mask = torch.tensor([[1.0, 0.0]])
    check_finite({"kl": torch.tensor([[0.5, math.inf]])}, mask)  # the Inf sits on padding
    with pytest.raises(NonFiniteError) as info:
        check_finite({"rewards": torch.tensor([1.0]), "kl": torch.tensor([[math.nan, 0.0]])}, mask)
    assert info.value.where == "kl"
