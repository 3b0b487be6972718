"""The shared metric map and the gold window: pure Python, no trainer."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from klguard.errors import UserError
from klguard.guard.inputs import rules_without_input
from klguard.guard.signals import read_metrics
from klguard.integrations.gold import GoldWindow
from klguard.integrations.metric_maps import (
    OPENRLHF_METRICS,
    TRL_METRICS,
    guard_names,
    split_target,
    to_klguard_names,
)


def test_trl_names_become_the_guards_inputs():
    logs = {"kl": 0.02, "beta": 0.04, "reward": 1.2, "grad_norm": 3.0, "learning_rate": 1e-5, "entropy": 0.4,
            "completions/mean_length": 12.5, "rewards/gold/mean": 0.5, "epoch": 0.1, "note": "text", "nan": math.nan,
            "flag": True}
    metrics = to_klguard_names(logs, "trl")
    assert "note" not in metrics and "nan" not in metrics and "flag" not in metrics  # numbers only, finite
    assert metrics["rewards/gold/mean"] == 0.5 and metrics["epoch"] == 0.1  # unmapped names kept
    obs = read_metrics(metrics)
    assert (obs.kl, obs.kl_name, obs.kl_coef) == (0.02, "actor/kl_loss", 0.04)
    assert (obs.score, obs.grad_norm, obs.lr, obs.entropy, obs.length) == (1.2, 3.0, 1e-5, 0.4, 12.5)
    assert len(set(TRL_METRICS.values())) == len(TRL_METRICS)  # one klguard name per TRL name


def test_the_kl_per_sequence_is_the_token_mean_times_the_mean_length():
    """TRL and verl log the KL as a mean over the batch's tokens: times the mean length it is the mean summed KL of a
    sequence, what kl_growth reads; a step that logs its own keeps it, and without a length there is none."""
    seqs = [[0.1, 0.3, 0.2], [0.5]]  # per-token KL of two sequences
    tokens = [k for s in seqs for k in s]
    logs = {"kl": sum(tokens) / len(tokens), "completions/mean_length": len(tokens) / len(seqs)}
    per_sequence = sum(sum(s) for s in seqs) / len(seqs)
    assert to_klguard_names(logs, "trl")["actor/kl_seq_sum"] == pytest.approx(per_sequence, rel=1e-6)
    assert guard_names(logs, "trl")["actor/kl_seq_sum"] == pytest.approx(per_sequence, rel=1e-6)
    verl = {"actor/reward_kl_penalty": 0.02, "actor/kl_loss": 0.5, "response_length/mean": 40.0}
    assert guard_names(verl, "verl")["actor/kl_seq_sum"] == pytest.approx(0.8)  # the in-reward KL first
    assert guard_names({**verl, "actor/kl_seq_sum": 3.0}, "verl")["actor/kl_seq_sum"] == 3.0
    assert "actor/kl_seq_sum" not in to_klguard_names({"kl": 0.02}, "trl")


def test_the_reward_kl_coefficient_wins_over_the_loss_one():
    obs = read_metrics({"actor/reward_kl_penalty": 0.01, "actor/reward_kl_penalty_coeff": 0.05,
                        "actor/kl_loss": 0.3, "actor/kl_coef": 0.001})
    assert (obs.kl, obs.kl_coef) == (0.01, 0.05)


def test_gold_window_means_every_size_values_and_skips_missing():
    window = GoldWindow(3)
    assert [window.add(v) for v in (0.2, None, 0.4, math.nan)] == [None] * 4
    assert window.add(0.9) == pytest.approx(0.5)
    copy = GoldWindow(1)
    window.add(0.1)
    copy.load_state_dict(window.state_dict())
    assert (copy.size, copy.values) == (3, [0.1])
    with pytest.raises(ValueError, match="gold window size"):
        GoldWindow(0)


def test_importing_klguard_imports_no_trainer_library():
    code = ("import sys, klguard, klguard.guard, klguard.integrations, klguard.integrations.metric_maps, "
            "klguard.commands.cli; bad = sorted(m for m in ('trl', 'verl') if m in sys.modules); "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("ppl", [4.47, 18.14, 1.0])
def test_a_perplexity_under_the_base_model_is_the_reference_nll(ppl):
    assert guard_names({"eval_perplexity": ppl}, "plain") == {"hacking/ref_nll": math.log(ppl)}
    assert to_klguard_names({"eval_perplexity": ppl}, "plain") == {"hacking/ref_nll": math.log(ppl)}
    assert guard_names({"eval_perplexity": ppl}, "trl") == {"eval_perplexity": ppl}  # plain loops' name only


@pytest.mark.parametrize("ppl", [0.0, -3.0, math.nan, math.inf])
def test_a_perplexity_that_has_no_log_is_skipped(ppl):
    assert guard_names({"eval_perplexity": ppl, "kl": 0.1}, "plain") == {"actor/kl_loss": 0.1}
    assert guard_names({"my_ppl": ppl}, "plain", {"my_ppl": "hacking/ref_nll:log"}) == {}


def test_a_logged_reference_nll_wins_over_a_perplexity():
    assert guard_names({"eval_perplexity": 8.0, "hacking/ref_nll": 1.5}, "plain") == {"hacking/ref_nll": 1.5}


def test_the_user_map_takes_a_transform():
    raw = {"my_ppl": 6.0, "eval_perplexity": 9.0, "r": 0.5}
    user = {"my_ppl": "hacking/ref_nll:log", "r": "critic/score/mean"}
    assert guard_names(raw, "plain", user) == {"hacking/ref_nll": math.log(6.0), "critic/score/mean": 0.5}
    assert split_target("hacking/ref_nll:log") == ("hacking/ref_nll", "log")
    assert split_target("critic/score/mean") == ("critic/score/mean", None)
    for bad, message in (("hacking/ref_nll:sqrt", "unknown transform 'sqrt'"), ("x:", "unknown transform ''"),
                         (":log", "no guard name")):
        with pytest.raises(UserError, match=message):
            split_target(bad)


def test_which_rules_a_trainers_map_leaves_without_input():
    """From the rules' declarations: TRL logs no actor/ppo_kl, OpenRLHF no KL coefficient (docs/integrations.md)."""
    trl, openrlhf = set(TRL_METRICS.values()), set(OPENRLHF_METRICS.values())
    assert "ppo_kl" in rules_without_input(trl) and "kl_hard" not in rules_without_input(trl)
    assert "kl_growth" not in rules_without_input(trl)  # the token-mean KL times the mean length
    assert "kl_growth" in rules_without_input(trl - {"response_length/mean"})
    assert "penalty_share" in rules_without_input(openrlhf) and "ppo_kl" not in rules_without_input(openrlhf)
    assert "val_drop" not in rules_without_input({"val-core/gsm8k/acc/mean@1"})
