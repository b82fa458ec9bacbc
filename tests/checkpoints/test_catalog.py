"""tune_magic.checkpoints.catalog: one Checkpoint per epoch_N/, its kind and whether it is complete,
decided from real files laid out as torchtune 0.6.1's checkpointers write them (tests/ckptfolders.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ckptfolders import truncate, write_adapter, write_copies, write_epoch, write_shards
from tune_magic.checkpoints.catalog import (ADAPTER_ONLY, FULL, LORA_MERGED, Checkpoint, CheckpointError, Pruned,
                                            SaveSettings, find_checkpoint, list_checkpoints, read_checkpoint,
                                            resume_epoch)

HF = "torchtune.training.FullModelHFCheckpointer"
FULL_S = SaveSettings(lora=False, adapter_weights_only=False, checkpointer=HF)
MERGED_S = SaveSettings(lora=True, adapter_weights_only=False, checkpointer=HF)
ADAPTER_S = SaveSettings(lora=True, adapter_weights_only=True, checkpointer=HF)


@pytest.mark.parametrize("kind, settings", [
    (FULL, FULL_S), (LORA_MERGED, MERGED_S), (ADAPTER_ONLY, ADAPTER_S),
    (FULL, None), (LORA_MERGED, None), (ADAPTER_ONLY, None),
])
def test_each_kind_is_told_from_its_files_and_is_complete(tmp_path, kind, settings):
    folder = write_epoch(tmp_path, 3, kind, shards=2)
    c = read_checkpoint(folder, settings)
    assert (c.epoch, c.name, c.kind, c.complete, c.problems) == (3, "epoch_3", kind, True, ())
    assert c.path == folder and "config.json" in c.files and "tokenizer.model" in c.files
    shards = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    assert c.model_files == (() if kind == ADAPTER_ONLY else shards)


def _drop(name):
    return lambda f: (f / name).unlink()


# (what is done to a complete folder, its kind, the settings, a word of the expected problem)
INCOMPLETE = [
    ("shard truncated", FULL, lambda f: truncate(f / "model-00002-of-00002.safetensors"), FULL_S, "truncated"),
    ("second shard not yet written", FULL, _drop("model-00002-of-00002.safetensors"), FULL_S, "1 of 2"),
    ("index not yet written", FULL, _drop("model.safetensors.index.json"), FULL_S, "index"),
    ("config.json not yet copied", FULL, _drop("config.json"), FULL_S, "config.json"),
    ("index unreadable", FULL, lambda f: (f / "model.safetensors.index.json").write_text("{"), FULL_S, "unreadable"),
    ("merged LoRA before its adapter", LORA_MERGED, lambda f: [(f / n).unlink() for n in
     ("adapter_model.pt", "adapter_model.safetensors", "adapter_config.json")], MERGED_S, "still being written"),
    ("adapter config not yet written", LORA_MERGED, _drop("adapter_config.json"), MERGED_S, "adapter_config.json"),
    ("PEFT adapter not yet written", ADAPTER_ONLY, _drop("adapter_model.safetensors"), ADAPTER_S, "adapter_model.safetensors"),
    ("torch adapter truncated", ADAPTER_ONLY, lambda f: truncate(f / "adapter_model.pt"), ADAPTER_S, "truncated"),
    ("adapter-only job, merged files", LORA_MERGED, lambda f: None, ADAPTER_S, "still being written"),
]


@pytest.mark.parametrize("what, kind, damage, settings, word", INCOMPLETE, ids=[r[0] for r in INCOMPLETE])
def test_a_folder_still_being_written_is_not_complete(tmp_path, what, kind, damage, settings, word):
    folder = write_epoch(tmp_path, 0, kind, shards=2)
    damage(folder)
    c = read_checkpoint(folder, settings)
    assert not c.complete
    assert any(word in p for p in c.problems), c.problems


def test_an_empty_folder_has_no_kind(tmp_path):
    (tmp_path / "epoch_0").mkdir()
    c = read_checkpoint(tmp_path / "epoch_0")
    assert (c.kind, c.complete, c.files, c.bytes_on_disk) == (None, False, (), 0)


def test_torchtunes_own_checkpointer_writes_bin_shards_without_index_or_config(tmp_path):
    folder = write_epoch(tmp_path, 0, "full", hf=False)
    settings = SaveSettings(lora=False, checkpointer="torchtune.training.FullModelTorchTuneCheckpointer")
    c = read_checkpoint(folder, settings)
    assert (c.kind, c.complete, c.model_files) == (FULL, True, ("model-00001-of-00001.bin",))


def test_sizes_are_blocks_on_disk_and_apparent_bytes(tmp_path):
    folder = write_epoch(tmp_path, 0, "lora_merged")
    (folder / "sparse.bin.part").write_bytes(b"")
    os.truncate(folder / "sparse.bin.part", 50 << 20)  # a hole: 50 MB apparent, ~no blocks
    c = read_checkpoint(folder)
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert c.apparent_bytes == sum(p.stat().st_size for p in files)
    assert c.bytes_on_disk == sum(p.stat().st_blocks * 512 for p in files)
    assert c.bytes_on_disk < c.apparent_bytes - (40 << 20)
    assert c.mtime == max(p.stat().st_mtime for p in files)


def test_listing_sorts_by_epoch_and_skips_what_is_not_an_epoch_folder(tmp_path):
    for e in (10, 2, 0):
        write_epoch(tmp_path, e)
    (tmp_path / "epoch_3").write_text("a file, not a folder")
    (tmp_path / "epoch_x").mkdir()
    (tmp_path / "recipe_state").mkdir()
    assert [c.epoch for c in list_checkpoints(tmp_path, FULL_S)] == [0, 2, 10]
    assert list_checkpoints(tmp_path / "missing") == []
    with pytest.raises(CheckpointError, match="epoch_<N>"):
        read_checkpoint(tmp_path / "epoch_x")


@pytest.mark.parametrize("cfg, kind, hf", [
    ({"model": {"_component_": "torchtune.models.llama2.llama2"},
      "checkpointer": {"_component_": HF}}, FULL, True),
    ({"model": {"_component_": "torchtune.models.llama2.lora_llama2", "lora_rank": 8}}, LORA_MERGED, None),
    ({"model": {"_component_": "torchtune.models.llama3_2.lora_llama3_2_1b"}, "save_adapter_weights_only": True,
      "checkpointer": {"_component_": "torchtune.training.FullModelMetaCheckpointer"}}, ADAPTER_ONLY, False),
    ({"model": {"_component_": "torchtune.models.llama2.qlora_llama2_7b"}}, LORA_MERGED, None),
    ({}, None, None),
])
def test_save_settings_from_a_config(cfg, kind, hf):
    s = SaveSettings.from_config(cfg)
    assert (s.expected_kind, s.hf) == (kind, hf)


def test_resume_epoch_is_the_one_the_recipe_state_names(tmp_path):
    import torch

    assert resume_epoch(tmp_path) is None
    (tmp_path / "recipe_state").mkdir()
    torch.save({"epochs_run": 2, "seed": 0, "total_epochs": 4, "max_steps_per_epoch": None},
               tmp_path / "recipe_state" / "recipe_state.pt")
    assert resume_epoch(tmp_path) == 1
    truncate(tmp_path / "recipe_state" / "recipe_state.pt")  # being overwritten
    assert resume_epoch(tmp_path) is None


def _ck(epoch, complete=True, val=None, pruned=None):
    return Checkpoint(epoch, Path(f"/o/epoch_{epoch}"), (), 0, 0, FULL, complete, () if complete else ("x",),
                      val_loss=val, pruned=pruned)


CKPTS = [_ck(0, val=0.9), _ck(1, val=0.5), _ck(2, val=math.nan, pruned=Pruned(1.0, 10)), _ck(3, val=0.7),
         _ck(4, complete=False)]


@pytest.mark.parametrize("name, epoch", [("last", 3), ("best", 1), ("epoch_0", 0), (3, 3), ("epoch_3", 3)])
def test_find_a_checkpoint_by_name(name, epoch):
    assert find_checkpoint(CKPTS, name).epoch == epoch


@pytest.mark.parametrize("name, word", [
    ("epoch_9", "there is no epoch_9"), ("epoch_2", "pruned"), ("epoch_4", "not complete"),
    ("newest", "names no checkpoint"), (True, "names no checkpoint"),
])
def test_a_bad_checkpoint_name_says_what_there_is(name, word):
    with pytest.raises(CheckpointError, match=word) as got:
        find_checkpoint(CKPTS, name)
    assert "epoch_0, epoch_1, epoch_3" in str(got.value)


def test_best_needs_a_finite_validation_loss():
    nans = [replace(c, val_loss=v) for c, v in zip(CKPTS[:2], (math.nan, math.inf))]
    with pytest.raises(CheckpointError, match="no checkpoint has a validation loss"):
        find_checkpoint(nans, "best")
    with pytest.raises(CheckpointError, match="no complete checkpoint yet"):
        find_checkpoint([_ck(0, complete=False)], "last")


def test_the_pure_modules_never_import_torch():
    code = ("import sys\nimport tune_magic.checkpoints.catalog, tune_magic.checkpoints.retention, "
            "tune_magic.checkpoints.diskspace, tune_magic.checkpoints.export\n"
            "assert 'torch' not in sys.modules and 'omegaconf' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_write_order_of_the_hf_checkpointer_matches_the_rule(tmp_path):
    """Replay torchtune's write order for a merged LoRA save: complete only after the last step."""
    folder = tmp_path / "epoch_0"
    steps = [lambda: write_shards(folder, 2, index=False),
             lambda: (folder / "model.safetensors.index.json").write_text(json.dumps(
                 {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})),
             lambda: write_adapter(folder),
             lambda: write_copies(folder)]
    seen = []
    for step in steps:
        step()
        seen.append(read_checkpoint(folder, MERGED_S).complete)
    assert seen == [False, False, False, True]
