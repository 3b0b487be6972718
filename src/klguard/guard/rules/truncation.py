"""truncation: the share of responses cut off at the length limit (`response_length/clip_ratio`, TRL's
`completions/clipped_ratio`), as the median of its last `robust_window` values, above `truncation_max`: most answers
are judged on text that was cut, and a length-limit penalty, if any, is most of the reward. Advice, never a stop
(truncation is a setting to fix, not a policy to roll back). Off in klguard's own runs (0)."""

from __future__ import annotations

from klguard.fields import interval
from klguard.guard.registry import Key, register
from klguard.guard.shapes import level_advice
from klguard.guard.signals import TRUNCATED

register(level_advice(
    "truncation", 110, TRUNCATED, what="the share of responses cut at the length limit",
    sees="responses truncated at the length limit",
    limit=Key("truncation_max", 0.0, "Share of responses cut at the length limit above this: advise (0: off)",
              interval("[0, 1)"), external=0.5),
    do="raise the response length limit or reward shorter answers (an overlong penalty, DAPO's soft one); check that "
       "a cut answer is not scored as a finished one"))
