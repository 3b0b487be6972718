"""klguard.builtin.trl_task's held-out sampling (shared with the real-model tasks' TRL evaluation): completions cut
after EOS, reproducible by seed, figures in range."""

from __future__ import annotations

from transformers import AutoModelForCausalLM, AutoTokenizer

from klguard.builtin.trl_task import builtin_policy, builtin_prompts, evaluate_sampled, sample_completions


def test_sampled_completions_end_at_eos_and_repeat_by_seed():
    folder = builtin_policy()
    model, tok = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    prompts = list(builtin_prompts(tok, 16, split="val")["prompt"])
    tok.padding_side = "right"  # as a training tokenizer may be: sampling pads on the left and puts it back
    ids, texts = sample_completions(model, tok, prompts, seed=3, max_new_tokens=24)
    assert len(ids) == len(texts) == 16 and tok.padding_side == "right"
    for row in ids:
        assert 0 < len(row) <= 24 and tok.eos_token_id not in row[:-1]  # nothing after the first EOS
    assert sample_completions(model, tok, prompts, seed=3, max_new_tokens=24) == (ids, texts)
    figures = evaluate_sampled(model, tok, n=16, seed=3, max_new_tokens=24)
    assert 0 <= figures["gold"] <= 1 and 0 <= figures["hacking_rate"] <= 1 and 0 < figures["response_length"] <= 24
