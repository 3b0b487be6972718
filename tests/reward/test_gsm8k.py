"""GSM8K's rule as verl implements it, with hand-computed cases."""

from __future__ import annotations

import pytest

from klguard.reward.gsm8k import compute_score, extract_solution


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### 61", "61"),
        ("#### 61 Q:12+34-5=?A:#### 41", "41"),  # the LAST answer counts
        ("so 2+3=5\n#### 1,234", "1234"),  # commas removed
        ("#### -7", "-7"),
        ("#### 3.50", "3.50"),
        ("####61", None),  # the space after #### is required
        ("#### $5", None),  # `$` before the number defeats the pattern, as in verl
        ("the answer is 61", None),
        ("", None),
    ],
)
def test_strict(text: str, expected: str | None) -> None:
    assert extract_solution(text, "strict") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### 61 Q:12+34-5=?A:#### 41", "41"),
        ("it costs $1,234.", "1,234."),  # flexible keeps the number as written
        ("12 apples, then 7.", "7."),
        ("the end .", "."),  # verl quirk: only '.' candidates -> the first one is returned
        ("no numbers", None),
    ],
)
def test_flexible(text: str, expected: str | None) -> None:
    assert extract_solution(text, "flexible") == expected


def test_only_the_last_300_characters_are_read() -> None:
    text = "#### 61" + " " * 300
    assert extract_solution(text, "strict") is None
    assert extract_solution("#### 61" + " " * 293, "strict") == "61"


def test_compute_score() -> None:
    assert compute_score("#### 61", "61") == 1.0
    assert compute_score("#### 61 Q:12+34-5=?A:#### 41", "61") == 0.0
    assert compute_score("#### 1,234", "1234") == 1.0
    assert compute_score("#### 60", "61", format_score=0.1) == 0.1
    assert compute_score("61", "61", format_score=0.1) == 0.0  # no `####`: nothing extracted
    assert compute_score("x 61", "61", method="flexible", score=2.0) == 2.0
    assert isinstance(compute_score("#### 61", "61"), float)
    with pytest.raises(ValueError, match="method"):
        extract_solution("#### 1", "loose")
