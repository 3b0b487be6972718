"""The FLOP-ceiling arithmetic of benchmarks/throughput.py (the benchmark itself is not run here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "throughput.py"
_spec = importlib.util.spec_from_file_location("bench_throughput", _PATH)
throughput = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = throughput  # dataclasses look their module up there
_spec.loader.exec_module(throughput)


def test_ppo_with_reward_model_counts_every_pass():
    w = throughput.Work("ppo", "model", n_policy=10, n_value=9, n_rm=8, rollouts=4, prompt_tokens=2,
                        response_tokens=3)
    flops = throughput.step_flops(w)
    tokens = 4 * 5
    assert flops == {"gen": 2 * 10 * tokens, "ref": 2 * 10 * tokens, "values": 2 * 9 * tokens,
                     "reward": 2 * 8 * tokens, "update": 6 * 10 * tokens + 4 * 9 * tokens}
    assert flops["values"] + flops["update"] - 6 * 10 * tokens == 6 * 9 * tokens  # the critic: one forward+backward


def test_grpo_with_rule_reward_has_no_critic_and_no_reward_model():
    w = throughput.Work("grpo", "rule", n_policy=10, n_value=9, n_rm=8, rollouts=4, prompt_tokens=2,
                        response_tokens=3)
    flops = throughput.step_flops(w)
    assert flops == {"gen": 400, "ref": 400, "values": 0.0, "reward": 0.0, "update": 1200}
    assert sum(flops.values()) == 10 * 10 * 20  # 2N gen + 2N ref + 6N update per token


def test_a_groups_prompt_counts_once_except_in_the_reward_model():
    w = throughput.Work("grpo", "model", n_policy=10, n_value=9, n_rm=8, rollouts=8, prompt_tokens=4,
                        response_tokens=3, group=4)
    flops = throughput.step_flops(w)
    assert w.policy_tokens == 1 + 3
    assert flops["ref"] == 2 * 10 * 8 * 4 and flops["update"] == 6 * 10 * 8 * 4
    assert flops["reward"] == 2 * 8 * 8 * 7


def test_matmul_params_are_the_linear_weights():
    cfg = LlamaConfig(vocab_size=23, hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                      num_key_value_heads=6, intermediate_size=1024, tie_word_embeddings=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    per_layer = 4 * 384 * 384 + 3 * 384 * 1024
    assert throughput.matmul_params(model) == 6 * per_layer + 23 * 384  # + the LM head, not the embedding
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(10.65e6, rel=0.01)  # the issue's ~10.7M


def test_the_trl_venv_is_checked_against_every_pin(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# a comment\ntorch==2.13.0\ntrl==1.12.0  # why\nTransformers==5.25.0\nplain\n")
    pins = throughput.pinned(requirements)
    assert pins == {"torch": "2.13.0", "trl": "1.12.0", "transformers": "5.25.0"}
    found = {"torch": "2.13.0+cpu", "trl": "1.12.0", "transformers": "5.25.0"}
    assert throughput.venv_matches(found, pins)  # torch's local build tag is not a version change
    assert not throughput.venv_matches({**found, "transformers": "5.24.0"}, pins)
    assert not throughput.venv_matches({**found, "trl": None}, pins)


def test_installed_versions_reads_this_interpreter():
    found = throughput.installed_versions(sys.executable, ("torch", "no-such-package-klguard"))
    assert set(found) == {"torch", "no-such-package-klguard"} and found["no-such-package-klguard"] is None
    assert found["torch"].split("+")[0] == torch.__version__.split("+")[0]
