"""proxy_val_divergence: at a validation, the validation score (`guard.val_metric`) fell while the mean training
(proxy) score since the previous validation rose, both by more than `val_fall_tol` relative to the previous
validation interval, at `val_patience` validations in a row. The signal lasts until the next validation."""

from __future__ import annotations

from klguard.guard.registry import GuardRule, register
from klguard.guard.signals import SCORE, VAL_METRIC
from klguard.guard.step import Evidence, Step

NAME = "proxy_val_divergence"


def measure(step: Step) -> Evidence | None:
    st, cfg, memory, score = step.st, step.cfg, step.memory(NAME), step.obs.score
    if score is not None:  # the proxy score, averaged between validations
        memory["proxy_sum"] += score
        memory["proxy_n"] += 1
    if step.validation.val is not None:
        proxy = memory["proxy_sum"] / memory["proxy_n"] if memory["proxy_n"] else None
        before = memory["prev_proxy"]
        diverged = (st.val_falling and proxy is not None and before is not None
                    and proxy - before > cfg.val_fall_tol * abs(before))
        memory["streak"] = memory["streak"] + 1 if diverged else 0
        st.hack[NAME] = memory["streak"] >= cfg.val_patience
        if proxy is not None:
            memory["prev_proxy"] = proxy
        memory["proxy_sum"], memory["proxy_n"] = 0.0, 0
    if not st.hack[NAME]:
        return None
    return Evidence(NAME, cfg.val_metric, st.prev_val, None, "validation fell while the proxy score rose")


register(GuardRule(
    name=NAME, kind="signal", order=210, reads=((VAL_METRIC,), (SCORE,)), needs_gold=True, default_on=True,
    says=lambda c: (f"validation falling while the score rises, {c.val_patience} validations in a row "
                    f"(by {c.val_fall_tol:.0%}): hacking"),
    sees="validation falling while the reward rises",
    memory={"streak": 0, "proxy_sum": 0.0, "proxy_n": 0, "prev_proxy": None}, measure=measure))
