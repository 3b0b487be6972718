"""GSM8K's rule reward, as verl implements it in `verl/utils/reward_score/gsm8k.py`.

- strict: the LAST match of `#### (-?[0-9.,]+)` in the (last 300 characters of the) response,
  with `,` and `$` removed. Because the pattern requires a digit, `.`, `,` or `-` right after
  `#### `, a `$` there (`#### $5`) means no match; the `$` removal is kept for parity with verl.
- flexible: the last `-?[0-9.,]+` in the text that is not just `.`, returned as written (commas
  kept). Verl quirk kept: if every candidate is `.`, the first `.` is returned.

`compute_score` gives `score` when the extracted answer equals the ground truth string exactly,
`format_score` when an answer was extracted but differs, and 0 when none was found.
"""

from __future__ import annotations

import re

# verl matches only the tail: answers come last, and regexes on long strings are slow.
SOLUTION_CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")
_INVALID_FLEXIBLE = ("", ".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """Return the answer string the GSM8K rule reads from `solution_str`, or None."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    if len(solution_str) > SOLUTION_CLIP_CHARS:
        solution_str = solution_str[-SOLUTION_CLIP_CHARS:]
    if method == "strict":
        solutions = _STRICT.findall(solution_str)
        if not solutions:
            return None
        # The last answer counts: text after a first answer can overturn it.
        return solutions[-1].replace(",", "").replace("$", "")
    candidates = _FLEXIBLE.findall(solution_str)
    if not candidates:
        return None
    for candidate in reversed(candidates):
        if candidate not in _INVALID_FLEXIBLE:
            return candidate
    return candidates[0]  # verl's loop variable ends on the first candidate


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Score a response against the ground-truth answer string (see the module docstring)."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return float(score) if answer == ground_truth else float(format_score)
