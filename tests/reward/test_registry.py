"""Gold-reward dispatch by data_source."""

from __future__ import annotations

import pytest

from klguard.reward.registry import RuleReward, compute_gold_score


@pytest.mark.parametrize("source", ["openai/gsm8k", "klguard/arith"])
def test_known_sources_use_gsm8k_strict(source: str) -> None:
    assert compute_gold_score(source, "#### 61", "61") == 1.0
    assert compute_gold_score(source, "#### 61 Q:12+34-5=?A:#### 41", "61") == 0.0
    assert compute_gold_score(source, "the answer is 61", "61") == 0.0  # strict, not flexible


def test_unknown_source_is_named() -> None:
    with pytest.raises(ValueError, match=r"'my/data'.*klguard/arith, openai/gsm8k"):
        compute_gold_score("my/data", "#### 1", "1")


def test_custom_table_and_register() -> None:
    table = RuleReward({})
    table.register("echo", lambda text, truth: float(text == truth))
    assert table.data_sources == ("echo",)
    assert table("echo", "a", "a") == 1.0
    with pytest.raises(ValueError, match="openai/gsm8k"):
        table("openai/gsm8k", "#### 1", "1")
    assert compute_gold_score("openai/gsm8k", "#### 1", "1") == 1.0  # the default table is untouched
