"""Which per-token KL the guard's KL rules read: the one the controller steers on, where the step has it."""

from __future__ import annotations

from guard_streams import QUIET, Driver, seed_config, steps

from klguard.config import load_config
from klguard.config.roles import guard_kl_metric
from klguard.guard import KLGuard
from klguard.guard.signals import KL_BATCH_TOKEN_MEAN, REF_KL, read_metrics

# a run-on minority: the mean of token means cancels (0.001), the batch's token mean does not (0.06)
LEAK = {REF_KL: 0.001, KL_BATCH_TOKEN_MEAN: 0.06}


def test_read_metrics_takes_the_named_kl_and_falls_back_to_verls():
    assert read_metrics(LEAK, kl_metric=KL_BATCH_TOKEN_MEAN).kl == 0.06
    assert read_metrics(LEAK).kl == 0.001
    fallback = read_metrics({REF_KL: 0.02}, kl_metric=KL_BATCH_TOKEN_MEAN)
    assert (fallback.kl, fallback.kl_name) == (0.02, REF_KL)


def _run(kl_metric: str) -> Driver:
    guard = KLGuard(seed_config(), total_steps=100, target_kl=0.015, kl_coef=0.1, kl_metric=kl_metric)
    driver = Driver(guard, beta=QUIET["actor/reward_kl_penalty_coeff"])
    driver.run(steps({s: LEAK for s in range(20, 31)}, 30, base={KL_BATCH_TOKEN_MEAN: 0.01}))
    return driver


def test_the_hard_limit_reads_the_batch_token_mean_when_the_controller_steers_on_it():
    # kl_hard_limit 0.05 (seed thresholds): 0.06 on the batch's token mean rolls back at step 20
    assert "rollback" in _run(KL_BATCH_TOKEN_MEAN).kinds(20)
    assert not any("rollback" in kinds for kinds in _run(REF_KL).fired().values())


def test_the_trainer_hands_the_guard_the_controllers_per_token_kl():
    steered = load_config(None, ["algorithm.kl_ctrl.kl_unit=batch_token_mean"]).config
    assert guard_kl_metric(steered) == KL_BATCH_TOKEN_MEAN
    assert guard_kl_metric(load_config().config) == REF_KL
    assert guard_kl_metric(load_config(None, ["algorithm.kl_ctrl.kl_unit=seq_sum"]).config) == REF_KL  # not per token
