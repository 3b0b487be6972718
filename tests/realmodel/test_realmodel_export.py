"""`klguard export`: an HF folder from an HF policy folder or from a sharded DCP checkpoint (the FSDP2 layout)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp
from transformers import AutoModelForCausalLM, AutoTokenizer

from klguard.commands.cli import main
from klguard.commands.export import export_checkpoint, find_policy
from klguard.errors import UserError


def _logits(folder, ids):
    return AutoModelForCausalLM.from_pretrained(folder)(torch.tensor([ids])).logits


def test_export_of_a_dcp_checkpoint_merges_the_shards(assets, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(assets.policy)
    ckpt = tmp_path / "global_step_7" / "actor"
    dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt, no_dist=True)  # as FSDP2 writes, one rank here
    shutil.copytree(assets.policy, ckpt / "huggingface", ignore=shutil.ignore_patterns("*.safetensors"))
    assert find_policy(tmp_path / "global_step_7").layout == "dcp"
    out = export_checkpoint(tmp_path / "global_step_7", tmp_path / "out")
    ids = AutoTokenizer.from_pretrained(out)("Tom has 3 apples")["input_ids"]
    assert torch.allclose(_logits(out, ids), _logits(assets.policy, ids))


def test_export_bfloat16_and_refusals(assets, tmp_path, capsys):
    assert main(["export", str(assets.policy), str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "bf16").dtype == torch.bfloat16
    assert main(["export", str(assets.policy), str(tmp_path / "bf16")]) == 2  # OUT exists
    assert main(["export", str(tmp_path / "nope"), str(tmp_path / "x")]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert lines == [f"klguard: error: OUT={tmp_path / 'bf16'} already exists and is not an empty folder",
                     f"klguard: error: CHECKPOINT={tmp_path / 'nope'} does not exist"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no policy"):
        find_policy(tmp_path / "empty")
