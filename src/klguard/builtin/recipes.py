"""Named KL settings that the demo and the reward-hacking benchmark compare, as config overrides."""

from __future__ import annotations

VERL_DEFAULT: tuple[str, ...] = (
    # verl's defaults: fixed beta 0.001, k1 ("kl") estimator in the reward, no KL loss, no guard
    "algorithm.kl_ctrl.type=fixed", "algorithm.kl_ctrl.kl_coef=0.001", "algorithm.kl_penalty=kl",
    "algorithm.use_kl_in_reward=true", "actor_rollout_ref.actor.use_kl_loss=false", "guard.enable=false",
)
SEED_RECIPE: tuple[str, ...] = (
    # adaptive target 0.015 with horizon 10000, no guard: adaptive, target 0.015, beta0 0.0005, horizon 10000, k3
    "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0.015", "algorithm.kl_ctrl.kl_coef=0.0005",
    "algorithm.kl_ctrl.horizon=10000", "algorithm.kl_penalty=low_var_kl", "algorithm.use_kl_in_reward=true",
    "actor_rollout_ref.actor.use_kl_loss=false", "guard.enable=false",
)
GUARDED_DEFAULT: tuple[str, ...] = ()  # `klguard train` as shipped
# the hacking signals that read no gold: the guard acts on them as on its defaults
GOLD_FREE_TRIGGERS: tuple[str, ...] = ("length_growth", "length_corr", "entropy_collapse", "proxy_val_divergence",
                                       "kl_growth", "rm_spread")
NO_GOLD_GUARD: tuple[str, ...] = (
    # a user without gold: the guard's validation score is the reward's own score on the held-out prompts and the
    # gold-free signals act (gold validation still runs, to measure the run; no rule reads it)
    "guard.val_metric=val-aux/*/score/*", f"guard.hacking_signals=[{','.join(GOLD_FREE_TRIGGERS)}]",
)


def fixed_coef(kl_coef: float) -> tuple[str, ...]:
    """A fixed coefficient with k1 in the reward and no guard: what a user finds by sweeping beta."""
    return ("algorithm.kl_ctrl.type=fixed", f"algorithm.kl_ctrl.kl_coef={kl_coef}", "algorithm.kl_penalty=kl",
            "algorithm.use_kl_in_reward=true", "actor_rollout_ref.actor.use_kl_loss=false", "guard.enable=false")


SCRATCH_RM: tuple[str, ...] = (
    # the learned-RM exploit's first recipe: 3 bootstrap members, each a 1-layer, hidden-64 Llama from scratch,
    # 5 epochs at a constant lr, no contrast pairs (about 0.66 accurate; gold falls from the first PPO steps)
    "proxy_reward.learned_rm.init=scratch", "proxy_reward.learned_rm.ensemble_size=3",
    "proxy_reward.learned_rm.epochs=5", "proxy_reward.learned_rm.lr_schedule=constant",
    "proxy_reward.learned_rm.contrast=0",
)

REVIEWS: tuple[str, ...] = (
    # the reviews task (klguard.builtin.reviews) on SmolLM2-135M-Instruct, sized for 2 CPU cores: GRPO groups of 4
    # over 8 prompts (32 rollouts, one optimizer step a batch), 48 new tokens, validation sampled as the rollouts
    "data.builtin_task=reviews", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
    "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "data.max_response_length=48",
    "data.max_prompt_length=64", "actor_rollout_ref.actor.optim.lr=1e-5",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "actor_rollout_ref.rollout.val_kwargs.n=2", "trainer.total_training_steps=40", "trainer.test_freq=5",
)
CONSTRAINTS: tuple[str, ...] = (
    # the constraints task (klguard.builtin.constraints): the reviews task's sizes and sampling, its own data and gold
    "data.builtin_task=constraints", *REVIEWS[1:],
)
REAL_MODEL_GUARD: tuple[str, ...] = (
    # the guard's settings for a 135M pretrained policy over 40 steps, on top of NO_GOLD_GUARD:
    # - a checkpoint every 5 steps, so a rollback at steps 10-13 (where kl_hard first fires on SmolLM2) finds a
    #   stable one instead of returning to the initial policy;
    # - kl_growth needs at least 4 nats a sequence: in the guard-off real-model runs that hacked, 3x the first 10
    #   steps' KL already exceeded 8, so the floor changes no firing there, while the run that optimised gold itself
    #   crossed the old floor of 1 at step 27, and a guard that restarts from a low KL re-measures a low baseline
    "trainer.save_freq=5", "guard.kl_growth_min=4",
)
CONSTRAINTS_RM: tuple[str, ...] = (
    # the constraints task against its probe reward model, as docs/real-model.md measures it: the head klguard ships
    # (fit on 768 of SmolLM2's own samples labelled by gold), lr 3e-5, where verl's default KL hacks it; the guard
    # reads no gold (a user of a learned RM has none)
    *CONSTRAINTS, "proxy_reward.kind=learned_rm", "proxy_reward.learned_rm.samples=768",
    "reward_model.micro_batch_size_per_gpu=32", "actor_rollout_ref.actor.optim.lr=3e-5", *NO_GOLD_GUARD,
)
# `klguard demo --task NAME`; constraints-rm: the guard as the real-model page's `guarded_real` runs set it, keeping
# the 2 newest checkpoints (and the one the guard last found stable, which retention spares): SmolLM2's checkpoint
# with its optimizer state is 1.6 GB, so keeping all 8 would take 13 GB a run
TASK_RECIPES: dict[str, tuple[str, ...]] = {
    "arith": (), "reviews": REVIEWS, "constraints": CONSTRAINTS,
    "constraints-rm": (*CONSTRAINTS_RM, *REAL_MODEL_GUARD, "trainer.max_actor_ckpt_to_keep=2"),
}
