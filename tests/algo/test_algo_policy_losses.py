"""verl 0.9.1's policy losses in klguard's registry, each on a 2x3 batch worked out by hand in the comments (float64,
so the tolerances are tight); the last token of row 1 is padding with a garbage value that must not count.
One test compares every loss with verl's own function on random inputs, where verl is installed."""

from __future__ import annotations

import math

import pytest
import torch

from extras import import_extra
from klguard.algo.policy_loss_registry import get_policy_loss, policy_loss_names
from klguard.config.schema_policy import ActorConfig, PolicyLossConfig

REL = 1e-9
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
LN = math.log


def T(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def settings(loss_mode: str, policy_loss: dict | None = None, **actor) -> ActorConfig:
    return ActorConfig(policy_loss=PolicyLossConfig(loss_mode=loss_mode, **(policy_loss or {})), **actor)


def run(name: str, old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor, cfg: ActorConfig, mask=MASK):
    """The loss's output and d pg_loss / d logprob."""
    new = new.clone().requires_grad_(True)
    out = get_policy_loss(name)(old, new, adv, mask, cfg)
    out.pg_loss.backward()
    return out, new.grad


def test_every_verl_loss_but_bypass_mode_is_registered():
    assert set(policy_loss_names()) == {"vanilla", "gspo", "cispo", "sapo", "gpg", "dro", "geo_mean", "dppo_tv",
                                        "dppo_kl", "clip_cov", "kl_cov"}


# ---------------------------------------------------------------- log-prob objectives: gpg, dro, cispo
OLD = T([[-1.0, -1.0, -2.0], [-1.0, -2.0, -1.0]])
D = T([[0.5, -0.5, 0.1], [0.0, 0.2, 3.0]])  # log-ratios
NEW = OLD + D  # [[-0.5, -1.5, -1.9], [-1.0, -1.8, 2.0]]
ADV = T([[1.0, 1.0, -1.0], [-1.0, -1.0, 7.0]])


def test_gpg_is_the_plain_policy_gradient():
    # -A * logprob: 0.5, 1.5, -1.9 | -1.0, -1.8 -> sum -2.7, token-mean over 5 valid tokens -0.54
    out, grad = run("gpg", OLD, NEW, ADV, settings("gpg"))
    assert out.pg_loss.item() == pytest.approx(-0.54, rel=REL)
    assert out.pg_clipfrac.item() == 0.0 and out.pg_clipfrac_lower.item() == 0.0
    assert out.ppo_kl.item() == pytest.approx(-0.06, rel=REL)  # mean(old - new) = -(0.5 - 0.5 + 0.1 + 0 + 0.2) / 5
    torch.testing.assert_close(grad, -ADV * MASK / 5)


def test_dro_adds_a_quadratic_log_ratio_penalty():
    # gpg's -2.7 plus beta/2 * sum d^2 = 0.25 * (0.25 + 0.25 + 0.01 + 0 + 0.04) = 0.1375 -> (-2.7 + 0.1375) / 5
    out, grad = run("dro", OLD, NEW, ADV, settings("dro", {"dro_beta": 0.5}))
    assert out.pg_loss.item() == pytest.approx(-2.5625 / 5, rel=REL)
    torch.testing.assert_close(grad, (-ADV + 0.5 * D) * MASK / 5)  # d/dlogprob: -A + beta * d
    with pytest.raises(ValueError, match="dro_beta must be > 0"):
        run("dro", OLD, NEW, ADV, settings("dro"))


def test_cispo_truncates_the_weight_and_keeps_every_gradient():
    # clip_ratio_low 10 (no lower bound), high 0.2: weights min(e^d, 1.2) = 1.2 (e^0.5 = 1.65), e^-0.5, e^0.1 | 1,
    # 1.2 (e^0.2 = 1.22); loss -w * A * logprob = 1.2 * 0.5, e^-0.5 * 1.5, -e^0.1 * 1.9 | -1.0, -1.2 * 1.8
    cfg = settings("cispo", clip_ratio_low=10.0, clip_ratio_high=0.2)
    out, grad = run("cispo", OLD, NEW, ADV, cfg)
    total = 0.6 + math.exp(-0.5) * 1.5 - math.exp(0.1) * 1.9 - 1.0 - 2.16
    assert out.pg_loss.item() == pytest.approx(total / 5, rel=REL)
    assert out.pg_clipfrac.item() == pytest.approx(2 / 5, rel=REL)  # two weights truncated
    # the gradient is -w * A / 5 on every valid token, the truncated ones included (PPO's clip would zero them)
    weights = T([[1.2, math.exp(-0.5), math.exp(0.1)], [1.0, 1.2, 0.0]])
    torch.testing.assert_close(grad, -weights * ADV * MASK / 5)


# ---------------------------------------------------------------- ratio objectives: gspo, sapo, geo_mean
def test_gspo_clips_the_sequence_ratio_and_follows_loss_agg_mode():
    # log-ratios 0.5, 0.4, 0.3 | 0.5, 0.3 (and 9 in the padding): both sequence means are 0.4, ratio s = e^0.4 = 1.49.
    # Row 0, A = +1, +1, -1: max(-s, -1.2) = -1.2 twice (clipped), max(s, 1.2) = s; row 1, A = -1: s, s.
    old = torch.full((2, 3), -1.0, dtype=torch.float64)
    new = old + T([[0.5, 0.4, 0.3], [0.5, 0.3, 9.0]])
    adv = T([[1.0, 1.0, -1.0], [-1.0, -1.0, 5.0]])
    s = math.exp(0.4)
    out, grad = run("gspo", old, new, adv, settings("gspo", loss_agg_mode="seq-mean-token-mean"))
    assert out.pg_loss.item() == pytest.approx(((-2.4 + s) / 3 + s) / 2, rel=REL)
    assert out.pg_clipfrac.item() == pytest.approx(2 / 5, rel=REL)
    out, grad = run("gspo", old, new, adv, settings("gspo", loss_agg_mode="token-mean"))
    assert out.pg_loss.item() == pytest.approx((-2.4 + 3 * s) / 5, rel=REL)
    # each token's gradient is its own: -A * s / 5 where unclipped, 0 where clipped
    torch.testing.assert_close(grad, T([[0.0, 0.0, s], [s, s, 0.0]]) / 5)


def test_sapo_gates_the_ratio_and_always_aggregates_by_sequence():
    # tau_pos 1 (A > 0), tau_neg 1.05; gate(r) = 4/tau * sigmoid(tau (r - 1)), at r = 1: 2/tau.
    # Row 0, r = 1, 1, 1, A = 1, 1, -1: -2, -2, +2/1.05. Row 1, r = 2 (A = 1): -4 sigmoid(1); r = 1 (A = -1): 2/1.05.
    old = torch.full((2, 3), -1.0, dtype=torch.float64)
    new = old + T([[0.0, 0.0, 0.0], [LN(2.0), 0.0, 4.0]])
    adv = T([[1.0, 1.0, -1.0], [1.0, -1.0, 3.0]])
    sigmoid1 = 1 / (1 + math.exp(-1))
    row0, row1 = (-4 + 2 / 1.05) / 3, (-4 * sigmoid1 + 2 / 1.05) / 2
    out, grad = run("sapo", old, new, adv, settings("sapo", loss_agg_mode="token-mean"))
    assert out.pg_loss.item() == pytest.approx((row0 + row1) / 2, rel=REL)  # seq-mean-token-mean all the same
    # at r = 1 the gradient is PPO's, -A, times the token's weight 1/6 (row 0) or 1/4 (row 1)
    torch.testing.assert_close(grad[0], T([-1.0, -1.0, 1.0]) / 6)
    assert grad[1, 1].item() == pytest.approx(1 / 4, rel=REL)


def test_geo_mean_clips_token_log_ratios_pessimistically_and_averages_them_per_sequence():
    # clip 0.2 on the log-ratio. Row 0, A = +1: d = 0.5, -0.5, 0.1 -> min(d, clip(d)) = 0.2, -0.5, 0.1, mean -1/15,
    # loss -e^(-1/15). Row 1, A = -1 (the padding's 7 does not count): d = 0.5, -0.5 -> max(d, clip(d)) = 0.5, -0.2,
    # mean 0.15, loss +e^0.15. pg_loss: the mean over the two sequences.
    old = torch.full((2, 3), -1.0, dtype=torch.float64)
    new = old + T([[0.5, -0.5, 0.1], [0.5, -0.5, 9.0]])
    adv = T([[1.0, 1.0, 1.0], [-1.0, -1.0, 7.0]])
    out, _ = run("geo_mean", old, new, adv, settings("geo_mean", loss_agg_mode="seq-mean-token-sum"))
    assert out.pg_loss.item() == pytest.approx((-math.exp(-1 / 15) + math.exp(0.15)) / 2, rel=REL)
    assert out.pg_clipfrac.item() == pytest.approx(2 / 5, rel=REL)  # outside the range with A > 0
    assert out.pg_clipfrac_lower.item() == pytest.approx(2 / 5, rel=REL)  # outside with A < 0
    # a response without valid tokens is left out of the mean
    only_row0 = T([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    out, _ = run("geo_mean", old, new, adv, settings("geo_mean"), mask=only_row0)
    assert out.pg_loss.item() == pytest.approx(-math.exp(-1 / 15), rel=REL)


# ---------------------------------------------------------------- probability trust regions: dppo_tv, dppo_kl
P_OLD = T([[0.5, 0.5, 0.5], [0.1, 0.5, 0.5]])
P_NEW = T([[0.6, 0.75, 0.2], [0.5, 0.4, 1.0]])
DPPO_ADV = T([[1.0, 1.0, -1.0], [-1.0, -1.0, 2.0]])
DPPO = settings("dppo_tv", clip_ratio=0.2, clip_ratio_c=3.0)
# Inside the region: loss -A * min(r, 3) * logprob. Row 0 token 0 (A = 1, r = 1.2): 1.2 * -ln 0.6 > 0;
# row 1 token 0 (A = -1, r = 5 -> 3): 3 ln 0.5; row 1 token 1 (A = -1, r = 0.8): 0.8 ln 0.4.
INSIDE_BOTH = -1.2 * LN(0.6) + 3 * LN(0.5) + 0.8 * LN(0.4)


def test_dppo_tv_keeps_tokens_whose_probability_moved_little():
    # p - p_old: 0.1 (A > 0, <= 0.2: in), 0.25 (A > 0: out), -0.3 (A < 0, < -0.2: out) | 0.4 (A < 0: in), -0.1 (in)
    out, grad = run("dppo_tv", P_OLD.log(), P_NEW.log(), DPPO_ADV, DPPO)
    assert out.pg_loss.item() == pytest.approx(INSIDE_BOTH / 5, rel=REL)
    assert out.pg_clipfrac.item() == pytest.approx(2 / 5, rel=REL)  # outside the region
    assert out.pg_clipfrac_lower.item() == pytest.approx(1 / 5, rel=REL)  # inside, ratio 5 truncated to 3
    torch.testing.assert_close(grad, T([[-1.2, 0.0, 0.0], [3.0, 0.8, 0.0]]) / 5)


def test_dppo_kl_measures_the_move_by_the_binary_kl():
    # binary KL(p_old || p) = p_old ln(p_old/p) + (1 - p_old) ln((1 - p_old)/(1 - p)):
    # 0.5 -> 0.75 (A > 0): 0.5 ln(2/3) + 0.5 ln 2 = 0.144 <= 0.2: in (dppo_tv had it out), loss -1.5 ln 0.75;
    # 0.5 -> 0.2 (A < 0, probability fell): 0.5 ln 2.5 + 0.5 ln(0.625) = 0.223 > 0.2: out;
    # 0.5 -> 0.6 (A > 0): 0.020: in; 0.1 -> 0.5 (A < 0, probability rose): in; 0.5 -> 0.4 (A < 0): 0.020: in
    out, _ = run("dppo_kl", P_OLD.log(), P_NEW.log(), DPPO_ADV, DPPO)
    assert out.pg_loss.item() == pytest.approx((INSIDE_BOTH - 1.5 * LN(0.75)) / 5, rel=REL)
    assert out.pg_clipfrac.item() == pytest.approx(1 / 5, rel=REL)
    assert out.pg_clipfrac_lower.item() == pytest.approx(1 / 5, rel=REL)


# ---------------------------------------------------------------- covariance selections: clip_cov, kl_cov
COV_NEW = T([[-1.0, -2.0, -1.0], [-2.0, -1.0, 0.0]])
COV_ADV = T([[1.0, 1.0, -1.0], [-1.0, 1.0, 0.0]])
# mean A = 0.2, mean logprob = -1.4 over the 5 valid tokens; (A - 0.2) * (logprob + 1.4):
#   0.8 * 0.4 = 0.32, 0.8 * -0.6 = -0.48, -1.2 * 0.4 = -0.48 | -1.2 * -0.6 = 0.72, 0.8 * 0.4 = 0.32


def test_clip_cov_cuts_the_gradient_of_unclipped_tokens_in_the_covariance_window():
    # window (0.3, 0.5): tokens (0, 0) and (1, 1); (0, 0) has log-ratio 0.5, its clipped term chosen, so only (1, 1)
    # is cut (clip_cov_ratio 1: up to all candidates). Losses: max(-e^0.5, -1.2) = -1.2, -1, 1 | 1, 0 (cut)
    d = T([[0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    cfg = settings("clip_cov", {"clip_cov_ratio": 1.0, "clip_cov_lb": 0.3, "clip_cov_ub": 0.5})
    out, grad = run("clip_cov", COV_NEW - d, COV_NEW, COV_ADV, cfg)
    assert out.pg_loss.item() == pytest.approx(-0.2 / 5, rel=REL)
    assert out.pg_clipfrac.item() == pytest.approx(1 / 5, rel=REL)  # the share cut
    torch.testing.assert_close(grad, T([[0.0, -1.0, 1.0], [1.0, 0.0, 0.0]]) / 5)


def test_clip_cov_cuts_at_most_its_share_drawn_at_random():
    # no clipping: both (0, 0) and (1, 1) are candidates; clip_cov_ratio 0.0002 cuts max(1, int(0.001)) = 1 of them.
    # The five losses -A sum to -1 - 1 + 1 + 1 - 1 = -1; cutting either candidate (each -1) leaves 0
    cfg = settings("clip_cov", {"clip_cov_lb": 0.3, "clip_cov_ub": 0.5})
    for seed in range(4):
        torch.manual_seed(seed)
        out, grad = run("clip_cov", COV_NEW, COV_NEW, COV_ADV, cfg)
        assert out.pg_loss.item() == pytest.approx(0.0, abs=REL)
        assert out.pg_clipfrac.item() == pytest.approx(1 / 5, rel=REL)
        assert (grad[0, 0] == 0).item() + (grad[1, 1] == 0).item() == 1


def test_kl_cov_penalises_the_highest_covariance_tokens():
    # kl_cov_ratio 0.2 -> max(1, int(5 * 0.2)) = 1 token: (1, 0), covariance 0.72, log-ratio -0.4. Losses -A e^d:
    # -e^0.5, -1, 1 | e^-0.4 + 0.5 * |-0.4|, -1
    d = T([[0.5, 0.0, 0.0], [-0.4, 0.0, 0.0]])
    cfg = settings("kl_cov", {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.5})
    out, grad = run("kl_cov", COV_NEW - d, COV_NEW, COV_ADV, cfg)
    assert out.pg_loss.item() == pytest.approx((-math.exp(0.5) - 1 + math.exp(-0.4) + 0.2) / 5, rel=REL)
    assert out.pg_clipfrac.item() == pytest.approx(1 / 5, rel=REL)  # the share penalised
    assert out.ppo_kl.item() == pytest.approx(-0.1 / 5, rel=REL)  # k1: mean(old - new), not verl's mean |d|
    # the penalised token's gradient: e^-0.4 (from -A r) - 0.5 (from 0.5 |d|, d < 0)
    assert grad[1, 0].item() == pytest.approx((math.exp(-0.4) - 0.5) / 5, rel=REL)


# ---------------------------------------------------------------- against verl's own functions
# per loss: (actor keys, policy_loss keys), set the same on both sides; values chosen so that each loss clips, cuts
# or truncates some of the random tokens below
VERL_CASES = {
    "gspo": ({"clip_ratio_low": 0.02, "clip_ratio_high": 0.03}, {}),
    "cispo": ({"clip_ratio_low": 10.0, "clip_ratio_high": 0.2}, {}),
    "sapo": ({"tau_pos": 1.0, "tau_neg": 1.05}, {}),
    "gpg": ({}, {}),
    "dro": ({}, {"dro_beta": 0.3}),
    "geo_mean": ({"clip_ratio_low": 0.1, "clip_ratio_high": 0.15}, {}),
    "dppo_tv": ({"clip_ratio_low": 0.1, "clip_ratio_high": 0.4, "clip_ratio_c": 1.2}, {}),
    "dppo_kl": ({"clip_ratio_low": 0.002, "clip_ratio_high": 0.005, "clip_ratio_c": 1.2}, {}),
    "clip_cov": ({"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}, {"clip_cov_ratio": 0.1, "clip_cov_lb": -0.5,
                                                                   "clip_cov_ub": 0.5}),
    "kl_cov": ({}, {"kl_cov_ratio": 0.1, "ppo_kl_coef": 0.5}),
}


@pytest.fixture(scope="module")
def verl_side():
    core_algos = import_extra("verl.trainer.ppo.core_algos", "verl")
    workers = import_extra("verl.workers.config", "verl")
    return core_algos.get_policy_loss_fn, workers.ActorConfig, workers.PolicyLossConfig


def _random_batch() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    old = (torch.rand(4, 6, generator=g, dtype=torch.float64) * 0.9 + 0.05).log()
    new = (old + 0.5 * torch.randn(4, 6, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = (torch.arange(6) < torch.tensor([[6], [4], [5], [2]])).to(torch.float64)
    return old, new, adv, mask


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("name", sorted(VERL_CASES))
def test_each_loss_matches_verls_function(verl_side, name: str, agg: str):
    get_policy_loss_fn, VerlActorConfig, VerlPolicyLossConfig = verl_side
    actor, options = VERL_CASES[name]
    theirs_cfg = VerlActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=agg,
                                 policy_loss=VerlPolicyLossConfig(loss_mode=name, **options), **actor)
    old, new, adv, mask = _random_batch()
    theirs_new, ours_new = new.clone().requires_grad_(True), new.clone().requires_grad_(True)
    torch.manual_seed(1)  # clip_cov draws its tokens from torch's generator, on both sides alike
    theirs, metrics = get_policy_loss_fn(name)(old, theirs_new, adv, mask, agg, theirs_cfg)
    torch.manual_seed(1)
    ours = get_policy_loss(name)(old, ours_new, adv, mask, settings(name, options, loss_agg_mode=agg, **actor))
    theirs.backward()
    ours.pg_loss.backward()
    # verl divides sequence sums by (count + 1e-8): a relative 1e-8 per term of order 1, so absolute 1e-8
    assert ours.pg_loss.item() == pytest.approx(theirs.item(), rel=1e-7, abs=1e-8)
    torch.testing.assert_close(ours_new.grad, theirs_new.grad, rtol=1e-7, atol=1e-8)
    for key, value in metrics.items():
        if (name, key) != ("kl_cov", "actor/ppo_kl"):  # verl's is the mean |log-ratio| there; ours the k1 estimate
            assert getattr(ours, key.removeprefix("actor/")).item() == pytest.approx(value, rel=1e-7, abs=1e-8), key
