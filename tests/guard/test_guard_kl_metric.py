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


def test_kl_setup_reads_klguards_config_and_verls_alike():
    """klguard's trainer steers the KL loss's coefficient with the KL a loss only; verl's controller steers the
    in-reward one alone, and its guard then raises the KL loss's for the next launch."""
    from klguard.config import load_config
    from klguard.config.roles import kl_coef_key, kl_setup

    loss_only = load_config(None, ["algorithm.use_kl_in_reward=false", "actor_rollout_ref.actor.use_kl_loss=true",
                                   "actor_rollout_ref.actor.kl_loss_coef=0.2", "algorithm.kl_ctrl.type=adaptive",
                                   "algorithm.kl_ctrl.target_kl=0.03"]).config
    ours = kl_setup(loss_only)
    assert (ours.kl_coef, ours.target_kl, ours.controlled, ours.metric) == (0.2, 0.03, True, REF_KL)
    verls = kl_setup(loss_only, loss_steered=False)
    assert (verls.kl_coef, verls.controlled) == (0.2, False)
    neither = load_config(None, ["algorithm.use_kl_in_reward=false",
                                 "actor_rollout_ref.actor.use_kl_loss=false"]).config
    assert kl_coef_key(neither) == "algorithm.kl_ctrl.kl_coef"
    assert kl_coef_key(neither, loss_steered=False) == "actor_rollout_ref.actor.kl_loss_coef"
