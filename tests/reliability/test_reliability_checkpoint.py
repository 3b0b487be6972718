"""Checkpoint manifests, fallback past damaged checkpoints, retention of the stable one, safe loading."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from klguard.errors import UserError
from klguard.ppo.checkpointing import Checkpoints
from klguard.runtime.checkpoint import (
    LATEST_FILE,
    MANIFEST_FILE,
    STATE_FILE,
    CheckpointManager,
    load_tensors,
    save_tensors,
)
from klguard.runtime.events import truncate_logs

SRC = Path(__file__).resolve().parents[2] / "src" / "klguard"


def _write(folder: Path) -> None:
    (folder / "actor").mkdir()
    (folder / "actor" / "model.safetensors").write_bytes(bytes(range(256)) * 8)
    save_tensors({"state": {0: {"exp_avg": torch.ones(3)}}}, folder / "actor_optim.pt")


def _manager(tmp_path: Path, max_to_keep: int | None = None) -> tuple[CheckpointManager, list[str]]:
    warnings: list[str] = []
    manager = CheckpointManager(tmp_path / "run", max_to_keep, warn=warnings.append)
    return manager, warnings


def _save(manager: CheckpointManager, *steps: int) -> None:
    for step in steps:
        manager.save(step, _write, {"global_step": step})


def test_manifest_lists_every_file_with_size_and_checksum(tmp_path):
    manager, warnings = _manager(tmp_path)
    _save(manager, 1)
    manifest = json.loads((manager.path(1) / MANIFEST_FILE).read_text())["files"]
    assert sorted(manifest) == ["actor/model.safetensors", "actor_optim.pt", STATE_FILE]
    assert manifest["actor/model.safetensors"]["size"] == 2048 and len(manifest[STATE_FILE]["sha256"]) == 64
    assert manager.latest() == manager.path(1) and not warnings


@pytest.mark.parametrize(("damage", "why"), [
    (lambda f: f.write_bytes(f.read_bytes()[:100]), "actor/model.safetensors has 100 bytes, the manifest says 2048"),
    (lambda f: f.write_bytes(b"\xff" + f.read_bytes()[1:]), "actor/model.safetensors does not match its sha256"),
    (lambda f: f.unlink(), "actor/model.safetensors is missing"),
    (lambda f: (f.parents[1] / MANIFEST_FILE).unlink(), f"no {MANIFEST_FILE}"),
    (lambda f: (f.parents[1] / MANIFEST_FILE).write_text("{not json"), f"unreadable {MANIFEST_FILE}"),
])
def test_a_damaged_newest_checkpoint_is_skipped_with_one_warning(tmp_path, damage, why):
    manager, warnings = _manager(tmp_path)
    _save(manager, 1, 2)
    damage(manager.path(2) / "actor" / "model.safetensors")
    assert manager.latest() == manager.path(1)
    assert manager.latest() == manager.path(1)
    assert len(warnings) == 1 and why in warnings[0] and str(manager.path(2)) in warnings[0]


def test_the_pointer_decides_and_partials_and_garbage_are_ignored(tmp_path):
    manager, warnings = _manager(tmp_path)
    _save(manager, 1, 2, 3)
    (manager.run_dir / LATEST_FILE).write_text("2")  # 3 renamed in place, then killed before the pointer moved
    assert manager.latest() == manager.path(2)
    (manager.run_dir / LATEST_FILE).write_text("garbage")
    assert manager.latest() == manager.path(3)
    (manager.run_dir / ".global_step_4.partial").mkdir()  # a write killed halfway
    assert manager.latest() == manager.path(3)
    _save(manager, 4)
    assert not list(manager.run_dir.glob(".global_step_*")) and not warnings


def test_retention_spares_the_checkpoints_it_is_given(tmp_path):
    """max_to_keep=2, checkpoint 2 spared (the newest stable one): 1 and 3 go."""
    manager, _ = _manager(tmp_path, max_to_keep=2)
    _save(manager, 1, 2)
    for step in (3, 4, 5):
        manager.save(step, _write, {"global_step": step}, keep=[2])
    assert manager.steps() == [2, 4, 5]


def test_rollback_to_a_gone_damaged_or_untrusted_checkpoint_finds_none(tmp_path):
    manager, _ = _manager(tmp_path)
    checkpoints = Checkpoints(manager.run_dir, None)
    checkpoints.manager = manager
    _save(manager, 1, 2, 3)
    (manager.run_dir / LATEST_FILE).write_text("2")  # 3: renamed in place, then killed before the pointer moved
    (manager.path(1) / STATE_FILE).write_text("{}")  # damaged
    assert [checkpoints.rollback_to(step, state=None) for step in (1, 3, 4)] == [None, None, None]


def test_resume_path_to_a_damaged_checkpoint_is_a_user_error(tmp_path):
    manager, _ = _manager(tmp_path)
    _save(manager, 1)
    (manager.path(1) / "actor_optim.pt").write_bytes(b"junk")
    with pytest.raises(UserError, match=r"is a damaged checkpoint: actor_optim\.pt has 4 bytes"):
        Checkpoints(manager.run_dir, None).find_resume_checkpoint("resume_path", str(manager.path(1)))


class _Payload:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def test_optimizer_files_never_unpickle_code(tmp_path, capsys):
    torch.save({"x": _Payload()}, tmp_path / "evil.pt")
    with pytest.raises(UserError, match="is not a plain tensor file"):
        load_tensors(tmp_path / "evil.pt")
    assert "pickled code ran" not in capsys.readouterr().out


def test_every_torch_load_in_the_package_uses_weights_only():
    calls = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("torch.load", "pickle.load", "pickle.loads"):
                calls.append((path.name, {k.arg: ast.unparse(k.value) for k in node.keywords}))
    assert calls and all(kw.get("weights_only") == "True" for _, kw in calls), calls


def test_truncate_logs_keeps_the_lines_up_to_the_resumed_step(tmp_path):
    lines = [json.dumps({"step": s, "x": s}) for s in (0, 1, 2, 3)] + ['{"step": 4, "x"']  # torn last line
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    (tmp_path / "events.jsonl").write_text(json.dumps({"step": 3, "kind": "cut_lr"}) + "\n")
    truncate_logs(tmp_path, 2)
    assert (tmp_path / "metrics.jsonl").read_text() == "\n".join(lines[:3]) + "\n"
    assert (tmp_path / "events.jsonl").read_text() == ""


class _Full(Exception):
    """A writer's own error for a full disk, as safetensors raises it."""


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"),
                                   _Full("Error while serializing: I/O error: No space left on device (os error 28)")])
def test_a_full_disk_is_one_line_naming_the_checkpoint_and_leaves_no_partial(tmp_path, error):
    manager, _ = _manager(tmp_path)
    _save(manager, 5)

    def write(folder: Path) -> None:
        _write(folder)
        raise error

    with pytest.raises(UserError, match=r"cannot write checkpoint .*global_step_10: no space left .*MiB free") as info:
        manager.save(10, write, {"global_step": 10})
    assert "\n" not in str(info.value) and "trainer.default_local_dir" in str(info.value)
    assert sorted(p.name for p in manager.run_dir.iterdir()) == ["global_step_5", LATEST_FILE]
    assert manager.latest() == manager.path(5)


def test_another_write_error_is_raised_as_it_is_and_leaves_no_partial(tmp_path):
    manager, _ = _manager(tmp_path)

    def write(folder: Path) -> None:
        raise ValueError("a bug in the writer")

    with pytest.raises(ValueError, match="a bug in the writer"):
        manager.save(5, write, {"global_step": 5})
    assert list(manager.run_dir.iterdir()) == []
