"""Guard inputs found by what a metric's name means, for the names no trainer's map knows.

A name is cut into words at any separator (`/`, `_`, `-`, `.`, `@`, spaces) and at camelCase, so `reward_avg`,
`env/all/reward/total`, `avgResponseLen` and `Training Loss` are read alike. Each guard input has the words a name
must carry (MEANINGS: a KL, a reward, a length, ...) and the words that make it something else (a statistic such as
`_std`, `_min`, `_max` is not the mean; an `eval`/`val`/`test` name is the validation score, never the training
one; a critic's or value model's gradient norm, loss or learning rate is not the policy's; a KL's coefficient is not
a KL). A name means at most one input: the first of MEANINGS whose words it carries.

Where several names mean one input, a fixed priority picks one (each meaning's `prefer`: the words that make a name
the better reading, then the higher version suffix, `_v2` over `_v1`); two names equally good are an ambiguity,
reported with the `--map` that reads the other, and the shorter name (then the first in alphabetical order) is read.
An input the log already has under a known name, or that `--map` names, is never inferred. Rewards that name a
function (`format_reward`, `reward/f`) are per-function rewards: the training reward only where no overall reward is
logged and exactly one of them is.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from klguard.guard.rules import NONFINITE_INPUTS
from klguard.guard.signals import (
    ENTROPY,
    GRAD_NORM,
    INPUT_METRICS,
    LENGTH,
    LR,
    PPO_KL,
    REF_KL,
    REF_KL_LOSS,
    SCORE,
)

VAL_INPUT = "val-core/*/acc/*"
PG_LOSS, CLIP_FRACTION, POLICY_RATIO = "actor/pg_loss", "actor/pg_clipfrac", "actor/policy_ratio"
GUARD_READS = frozenset((*INPUT_METRICS, *NONFINITE_INPUTS, CLIP_FRACTION))
"""The guard's names: never candidates for a meaning."""

ALIASES = {"len": ("length",), "lengths": ("length",), "acc": ("accuracy",), "gnorm": ("grad", "norm"),
           "grads": ("grad",), "gradient": ("grad",), "approxkl": ("approx", "kl"), "kld": ("kl",),
           "clipfrac": ("clip", "frac"), "learning": ("lr",), "rewards": ("reward",), "scores": ("score",),
           "returns": ("return",), "fraction": ("frac",), "coeff": ("coef",), "coefficient": ("coef",)}
EVAL = frozenset({"eval", "val", "valid", "validation", "test", "heldout", "dev"})
STATS = frozenset({"std", "stdev", "var", "variance", "min", "max", "median", "best", "worst", "maj", "lower",
                   "upper", "high", "low"})
CRITIC = frozenset({"critic", "value", "values", "vf", "vpred", "rm", "discriminator"})
COEF = frozenset({"coef", "beta", "ctl", "ctrl", "target", "weight", "lambda", "alpha"})
BOOKKEEPING = frozenset({"time", "timing", "runtime", "elapsed", "timestamp", "perf", "throughput", "second",
                         "seconds", "ms", "memory", "gb", "mfu", "epoch", "progress", "slowest", "fastest"})
"""Words of timing and progress metrics, which mean no guard input."""
POLICY_STEP = frozenset({"ppo", "approx", "old", "sample", "sampler", "behavior", "behaviour", "mismatch"})
REWARD = frozenset({"reward", "score", "return"})
NOT_REWARD = frozenset({"kl", "penalty", "frac", "zero", "ratio", "advantage", "advantages", "baseline", "loss",
                        "length", "tokens", "token", "count", "num", "coef", "clip", "clipped", "model",
                        "entropy", "lr", "grad", "norm"})
CONTEXT = frozenset({"train", "training", "env", "all", "batch", "rollout", "rollouts", "mean", "avg", "average",
                     "total", "overall", "sum", "fn", "func", "function", "step", "episode", "ep", "per",
                     "trajectory", "traj", "policy", "actor", "critic", "metrics", "stats", "objective", "raw",
                     "final", "grpo", "ppo", "rl", "rlhf", "agent", "reward", "score", "return"})
"""Words that leave a reward overall; any other word names a reward function (a per-function reward)."""


@dataclass(frozen=True)
class Meaning:
    target: str  # the guard input; VAL_INPUT: `val-core/<name>/acc/mean@1`
    needs: tuple[frozenset[str], ...]  # a word of each
    refuse: frozenset[str]  # none of these
    prefer: tuple[frozenset[str], ...] = ()  # rank: the first set a name has a word of (none: last)


def _w(*words: str) -> frozenset[str]:
    return frozenset(words)


MEANINGS: tuple[Meaning, ...] = (
    Meaning(VAL_INPUT, (EVAL, _w("accuracy", "correct", "correctness", "pass", "em", "exact", "f1", "success",
                                 "solve", "solved", "win", *REWARD)),
            STATS | _w("kl", "loss", "length", "tokens", "token", "perplexity", "ppl", "entropy", "distinct", "samples",
                       "steps", "num", "count", "frac"),
            (_w("accuracy", "correct", "correctness", "pass", "em", "exact", "f1", "success", "solve", "solved"),
             _w("reward", "score"))),
    Meaning(PPO_KL, (_w("kl"), POLICY_STEP), STATS | EVAL | CRITIC | COEF),
    Meaning(REF_KL, (_w("kl"), _w("penalty", "reward")), STATS | EVAL | CRITIC | COEF | POLICY_STEP),
    Meaning(REF_KL_LOSS, (_w("kl"),), STATS | EVAL | CRITIC | COEF | POLICY_STEP | _w("penalty", "reward"),
            (_w("loss", "ref", "reference", "base"),)),
    Meaning(ENTROPY, (_w("entropy"),), STATS | EVAL | CRITIC | COEF | _w("bonus"), (_w("actor", "policy"),)),
    Meaning(GRAD_NORM, (_w("grad"), _w("norm")), STATS | EVAL | CRITIC, (_w("actor", "policy"),)),
    Meaning(LENGTH, (_w("length", "tokens", "token"),),
            STATS | EVAL | _w("prompt", "input", "query", "context", "ob", "obs", "observation", "num", "total",
                              "sum", "count", "clip", "clipped", "ratio", "frac", "reward", "kl", "loss", "terminated",
                              "seqlen", "global"),
            (_w("response", "completion", "completions", "generation", "generated", "output", "answer", "ac",
                "action", "sample"),)),
    Meaning(CLIP_FRACTION, (_w("clip", "clipped"), _w("frac", "ratio")),
            STATS | EVAL | CRITIC | _w("response", "completion", "completions", "length", "prompt", "grad")),
    Meaning(POLICY_RATIO, (_w("ratio"), _w("policy", "importance", "ppo", "pg", "is")),
            STATS | EVAL | CRITIC | _w("clip", "clipped", "frac", "length", "response", "completion", "completions",
                                       "reward", "kl", "loss")),
    Meaning(LR, (_w("lr"),), EVAL | CRITIC, (_w("actor", "policy"),)),
    Meaning(PG_LOSS, (_w("loss"),), STATS | EVAL | CRITIC | COEF | _w("kl", "entropy", "sft", "aux", "lm", "reward"),
            (_w("pg", "policy", "actor", "surrogate"),)),
    Meaning(SCORE, (REWARD,), STATS | EVAL | NOT_REWARD, (_w("reward", "score"),)),
)


def words(name: str) -> tuple[str, ...]:
    """The name's words, lower case, aliases spelled out (`len` -> `length`, `gnorm` -> `grad`, `norm`)."""
    spaced = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name)
    out: list[str] = []
    for word in re.findall(r"[A-Za-z]+|\d+", spaced):
        word = word.lower()
        out.extend(ALIASES.get(word, (word,)))
    return tuple(out)


def meaning_of(name: str) -> Meaning | None:
    """The first meaning whose words `name` carries, None for none."""
    have = set(words(name))
    if have & BOOKKEEPING:
        return None
    for meaning in MEANINGS:
        if all(have & need for need in meaning.needs) and not have & meaning.refuse:
            return meaning
    return None


def per_function(name: str) -> bool:
    """Whether a reward's name names a reward function (a word that is not CONTEXT, nor a number)."""
    return any(not w.isdigit() and w not in CONTEXT for w in words(name))


def _rank(meaning: Meaning, name: str) -> tuple[int, int]:
    have = set(words(name))
    place = next((i for i, prefer in enumerate(meaning.prefer) if have & prefer), len(meaning.prefer))
    version = re.search(r"v(\d+)$", name)
    return place, -int(version.group(1)) if version else 0


def target_name(meaning: Meaning, name: str) -> str:
    return f"val-core/{name}/acc/mean@1" if meaning.target == VAL_INPUT else meaning.target


@dataclass
class Inference:
    """What the names of a log mean: `renames` (log name -> guard name), `ambiguous` (one line each),
    `per_function` (per-function rewards left as they are), `unmapped` (names no meaning reads)."""

    renames: dict[str, str] = field(default_factory=dict)
    ambiguous: list[str] = field(default_factory=list)
    per_function: list[str] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)


def infer(candidates: Collection[str], present: Collection[str]) -> Inference:
    """The meanings of `candidates` (names no map renamed) for the guard inputs not in `present` (the log's guard
    names, `--map`'s targets and what was inferred before)."""
    found = Inference()
    groups: dict[str, list[str]] = {}
    for name in sorted(candidates):
        meaning = meaning_of(name)
        if meaning is None:
            found.unmapped.append(name)
        elif meaning.target == SCORE and per_function(name):
            found.per_function.append(name)
        else:
            groups.setdefault(meaning.target, []).append(name)
    for meaning in MEANINGS:
        names = groups.pop(meaning.target, [])
        if _has(present, meaning.target) or not names:
            found.unmapped.extend(names)
            continue
        best = min(names, key=lambda n: (_rank(meaning, n), len(n), n))
        tied = [n for n in names if n != best and _rank(meaning, n) == _rank(meaning, best)]
        found.renames[best] = target_name(meaning, best)
        found.unmapped.extend(n for n in names if n != best)
        if tied:
            found.ambiguous.append(_ambiguity(meaning, best, tied))
    if not _has(present, SCORE) and SCORE not in found.renames.values() and len(found.per_function) == 1:
        found.renames[found.per_function.pop()] = SCORE
    found.unmapped.sort()
    return found


def _has(present: Collection[str], target: str) -> bool:
    if target == VAL_INPUT:
        return any(n.startswith("val-core/") and "/acc/" in n for n in present)
    return target in present


def _ambiguity(meaning: Meaning, best: str, tied: Iterable[str]) -> str:
    others = ", ".join(tied)
    other = next(iter(tied))
    return (f"{best} and {others} are equally good readings of {meaning.target}: read {best}; "
            f"--map {other}={target_name(meaning, other)} reads {other} instead")


def is_candidate(name: str) -> bool:
    """Whether `name` may be read by meaning: not one of the guard's own names."""
    return name not in GUARD_READS and not name.startswith(("val-core/", "hacking/"))


def function_target(name: str) -> str:
    """The guard's name of a per-function reward: `critic/score/<fn>/mean` (TRL's `rewards/<fn>/mean` and
    `reward/<fn>` as `<fn>`; any other name whole, its `/` as `_`)."""
    fn = re.sub(r"^rewards?/", "", name)
    fn = re.sub(r"/mean$", "", fn) if name.startswith(("rewards/", "reward/")) else fn
    return f"critic/score/{fn.replace('/', '_')}/mean"


def rename(metrics: dict[str, float], renames: dict[str, str]) -> dict[str, float]:
    """One step's metrics with the inferred names; a name the step logs itself is never replaced."""
    out = dict(metrics)
    for name, target in renames.items():
        if name in out and target not in out:
            out[target] = out.pop(name)
    return out


def example_name(names: Iterable[str]) -> str:
    """The first of `names` that may be a metric of training (not timing or progress), for a `--map` hint; "NAME"
    where none is."""
    return next((n for n in names if not set(words(n)) & BOOKKEEPING and "step" not in words(n)), "NAME")
