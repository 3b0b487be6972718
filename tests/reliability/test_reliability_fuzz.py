"""Fuzzed bad input: malformed configs and dataset rows each end in one line and exit code 2, no traceback."""

from __future__ import annotations

import string
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from klguard.builtin.arith import make_arith_rows
from klguard.builtin.warm_start import ensure_builtin_tokenizer
from klguard.commands.cli import main
from klguard.config import Config
from klguard.config.loader import _schema_keys, schema_fields
from klguard.config.schema import SFTConfig
from klguard.config.verl_keys import verl_keys
from klguard.data.dataset import load_rl_dataset
from klguard.errors import UserError
from klguard.model.loading import load_tokenizer

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
LEAVES = {path: str(f.type) for path, f in schema_fields()}
SCALARS = sorted(k for k, t in LEAVES.items() if t in ("int", "float", "bool", "int | None", "float | None",
                                                       "bool | None", "str", "str | None"))
NUMERIC = [k for k in SCALARS if not k.endswith(("str", "str | None")) and "str" not in LEAVES[k]]
# values that break a documented range, by key
OUT_OF_RANGE = {
    "data.train_batch_size": st.integers(max_value=0), "data.max_prompt_length": st.integers(max_value=0),
    "data.max_response_length": st.integers(max_value=0), "trainer.total_epochs": st.integers(max_value=0),
    "trainer.total_training_steps": st.integers(max_value=0), "trainer.max_nonfinite_steps": st.integers(max_value=-1),
    "trainer.save_freq": st.integers(max_value=-2) | st.just(0), "trainer.test_freq": st.integers(max_value=-2),
    "trainer.max_actor_ckpt_to_keep": st.integers(max_value=0),
    "actor_rollout_ref.rollout.n": st.integers(max_value=0),
    "actor_rollout_ref.actor.ppo_epochs": st.integers(max_value=0),
    "algorithm.kl_ctrl.horizon": st.integers(max_value=0),
    "actor_rollout_ref.actor.optim.lr": st.floats(max_value=0) | st.sampled_from([".nan", ".inf"]),
    "algorithm.kl_ctrl.kl_coef": st.floats(max_value=-1e-9) | st.just(".nan"),
    "algorithm.kl_ctrl.target_kl": st.floats(max_value=0) | st.just(".nan"),
    "algorithm.gamma": st.floats(min_value=1.0001) | st.floats(max_value=-1e-9) | st.just(".nan"),
    "algorithm.lam": st.floats(min_value=1.0001) | st.floats(max_value=-1e-9),
    "actor_rollout_ref.actor.clip_ratio": st.floats(min_value=1) | st.floats(max_value=0),
    "actor_rollout_ref.actor.clip_ratio_c": st.floats(max_value=1),
    "actor_rollout_ref.rollout.top_p": st.floats(min_value=1.0001) | st.floats(max_value=0),
    "actor_rollout_ref.rollout.temperature": st.floats(max_value=0),
    "actor_rollout_ref.actor.ppo_mini_batch_size": st.integers(max_value=0),
}
CHOICES = ["algorithm.kl_ctrl.type", "algorithm.kl_penalty", "algorithm.adv_estimator", "data.truncation",
           "trainer.device", "trainer.resume_mode", "actor_rollout_ref.actor.loss_agg_mode", "data.builtin_form",
           "actor_rollout_ref.actor.strategy", "actor_rollout_ref.rollout.name", "algorithm.kl_ctrl.kl_unit"]
WORD = st.text(string.ascii_lowercase + "_", min_size=1, max_size=12)
NOT_YAML_SCALAR = WORD.map(lambda w: "zq" + w)  # never a YAML bool, null or number


def _unknown_key(draw) -> str:
    base = draw(st.sampled_from(sorted(LEAVES)))
    key = base + draw(NOT_YAML_SCALAR) if draw(st.booleans()) else f"{base.rsplit('.', 1)[0]}.{draw(NOT_YAML_SCALAR)}"
    ours, free_form = _schema_keys()
    known = ours | verl_keys() | free_form
    parts = key.split(".")
    if any(".".join(parts[:i]) in known for i in range(1, len(parts) + 1)):
        key = "zq" + key  # under a free-form dict or a verl key: move it out of every known tree
    return f"{key}=1"


@st.composite
def bad_override(draw) -> str:
    kind = draw(st.sampled_from(["unknown", "type", "container", "range", "choice", "syntax"]))
    if kind == "unknown":
        return _unknown_key(draw)
    if kind == "type":
        return f"{draw(st.sampled_from(NUMERIC))}={draw(NOT_YAML_SCALAR)}"
    if kind == "container":
        return f"{draw(st.sampled_from(SCALARS))}={draw(st.sampled_from(['[1, 2]', '{a: 1}', '[]']))}"
    if kind == "range":
        key = draw(st.sampled_from(sorted(OUT_OF_RANGE)))
        return f"{key}={draw(OUT_OF_RANGE[key])}"
    if kind == "choice":
        return f"{draw(st.sampled_from(CHOICES))}={draw(NOT_YAML_SCALAR)}"
    text = draw(st.text(string.printable.strip(), min_size=1, max_size=20))
    return draw(st.sampled_from([text.replace("=", ""), "=" + text, "1" + text + "=1", f"a..b{text}=1"]))


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("klguard: error: ") and "Traceback" not in captured.err + captured.out, lines
    return lines[0]


def test_fuzzed_override_strings_give_one_line_and_exit_2(capsys):
    seen = []

    @FUZZ
    @given(st.lists(bad_override(), min_size=1, max_size=2), st.lists(st.just("trainer.seed=3"), max_size=1))
    def check(bad, good):
        capsys.readouterr()
        assert main(["train", "--print-config", *good, *bad]) == 2, bad
        _one_error_line(capsys)
        seen.append(bad)

    check()
    assert len(seen) >= 200


def _nest(override: str) -> dict:
    key, _, raw = override.partition("=")
    value = yaml.safe_load(raw) if raw else ""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


@st.composite
def bad_yaml_text(draw) -> str:
    kind = draw(st.sampled_from(["tree", "section", "not_mapping", "syntax"]))
    if kind == "tree":  # a valid YAML mapping holding one bad key or value
        override = draw(bad_override().filter(lambda o: "=" in o and _valid_dotted(o.partition("=")[0])))
        return yaml.safe_dump(_nest(override))
    if kind == "section":
        section = draw(st.sampled_from(["trainer", "algorithm", "data", "actor_rollout_ref", "algorithm.kl_ctrl"]))
        return yaml.safe_dump(_nest(f"{section}={draw(st.sampled_from(['5', 'zq', '[1, 2]', 'true']))}"))
    if kind == "not_mapping":
        return yaml.safe_dump(draw(st.lists(st.integers(), min_size=1) | st.integers() | NOT_YAML_SCALAR))
    return draw(st.sampled_from(["a: [", "a: {b", "- a\nb: c", "a:\n  - b\n c: d", "'unclosed"])) + draw(WORD)


def _valid_dotted(key: str) -> bool:
    return all(part.isidentifier() for part in key.split("."))


def test_fuzzed_yaml_files_give_one_line_and_exit_2(capsys, tmp_path_factory):
    path, seen = tmp_path_factory.mktemp("yaml") / "bad.yaml", []

    @FUZZ
    @given(bad_yaml_text())
    def check(text):
        path.write_text(text)
        capsys.readouterr()
        assert main(["train", "--config", str(path), "--print-config"]) == 2, text
        _one_error_line(capsys)
        seen.append(text)

    check()
    assert len(seen) >= 200


# ---------------------------------------------------------------------------------------------- dataset rows
MESSAGES_BAD = st.sampled_from([
    None, "a plain string", [], ["not a message"], [{"role": "user"}], [{"content": "1+1=?"}],
    [{"role": "user", "content": None}], [{"role": 1, "content": "1+1=?"}], [{"role": "user", "content": 5}],
    [{"role": "user", "content": "1+1=?" * 200}],  # longer than data.max_prompt_length
])
REWARD_BAD = st.sampled_from([None, {"style": "rule", "ground_truth": None}, {"style": "rule"}, "12", 12])
SOURCE_BAD = st.sampled_from([None, "", 7])


@st.composite
def bad_rows(draw) -> tuple[list[dict], int, str]:
    """Good rows with one column broken from row `first` on (all rows when pyarrow cannot mix the types)."""
    rows = make_arith_rows(draw(st.integers(1, 6)), "train", draw(st.integers(0, 5)))
    column, values = draw(st.sampled_from([("prompt", MESSAGES_BAD), ("reward_model", REWARD_BAD),
                                           ("data_source", SOURCE_BAD), ("extra_info", st.just("drop"))]))
    value = draw(values)
    first = draw(st.integers(0, len(rows) - 1))
    for row in rows[first:]:
        if value == "drop":  # the required columns are fine; remove one entirely instead
            row.pop(draw(st.sampled_from(["prompt", "reward_model", "data_source"])), None)
        else:
            row[column] = value
    try:
        pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        first = 0
        for row in rows:
            row[column] = value
    return rows, first, column


def _write_parquet(path: Path, rows: list[dict]) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    _write_parquet(folder / "good.parquet", make_arith_rows(8, "val", 0))
    return folder


def _train_on(data_dir: Path, train: Path, *extra: str) -> int:
    return main(["train", f"data.train_files={train}", f"data.val_files={data_dir / 'good.parquet'}",
                 f"sft.cache_dir={data_dir / 'cache'}", f"trainer.default_local_dir={data_dir / 'run'}",
                 "trainer.progress_bar=false", "data.max_prompt_length=256", "trainer.logger=[jsonl]", *extra])


def test_fuzzed_dataset_rows_give_one_line_naming_the_row(data_dir):
    """The loader `klguard train` calls first: every bad row is a one-line UserError (exit 2 in cli.main)."""
    train, seen = data_dir / "train.parquet", []
    tokenizer = load_tokenizer(ensure_builtin_tokenizer(SFTConfig(cache_dir=str(data_dir / "cache"))), Config())

    @FUZZ
    @given(bad_rows())
    def check(case):
        rows, first, _ = case
        _write_parquet(train, rows)
        with pytest.raises(UserError) as info:
            load_rl_dataset(train, tokenizer, max_prompt_length=256)
        message = str(info.value)
        assert message.startswith(f"{train}: row {first}: ") and "\n" not in message, message
        seen.append(case)

    check()
    assert len(seen) >= 200


def test_fuzzed_dataset_rows_through_the_command_line_exit_2_before_sft(capsys, data_dir):
    train = data_dir / "train.parquet"

    @settings(FUZZ, max_examples=20)
    @given(bad_rows())
    def check(case):
        rows, first, _ = case
        _write_parquet(train, rows)
        capsys.readouterr()
        assert _train_on(data_dir, train) == 2, rows[first]
        assert f"{train}: row {first}: " in _one_error_line(capsys)

    check()
    assert not list(data_dir.glob("cache/sft-*"))  # every error came before the SFT warm start


@pytest.mark.parametrize("content", [b"", b"PAR1 not really parquet", bytes(range(256))],
                         ids=["empty", "magic-only", "binary"])
def test_files_that_are_not_parquet_give_one_line(capsys, data_dir, content):
    bad = data_dir / "bad.parquet"
    bad.write_bytes(content)
    assert _train_on(data_dir, bad) == 2
    assert f"{bad}: cannot read as parquet" in _one_error_line(capsys)


def test_a_real_process_exits_2_without_a_traceback(data_dir):
    rows = make_arith_rows(3, "train", 0)
    rows[1]["data_source"] = ""
    _write_parquet(data_dir / "real.parquet", rows)
    proc = subprocess.run([sys.executable, "-m", "klguard", "train", f"data.train_files={data_dir / 'real.parquet'}",
                           f"data.val_files={data_dir / 'good.parquet'}", f"sft.cache_dir={data_dir / 'cache'}",
                           f"trainer.default_local_dir={data_dir / 'run'}", "trainer.progress_bar=false"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"klguard: error: {data_dir / 'real.parquet'}: row 1: missing "
                                                "'data_source' (the reward function is chosen by it)"]
