"""tune_magic.checkpoints.diskspace: the bytes a job's checkpoints will take, from the input
checkpoint's headers, and the pre-flight's verdict. (tests/e2e/test_generate.py compares the
estimate with the folders a real run writes.)"""

from __future__ import annotations

import json
import os
import numpy as np
import pytest
from safetensors.numpy import save_file

from tune_magic import assets as A
from tune_magic.checkpoints.catalog import ADAPTER_ONLY, FULL, LORA_MERGED, CheckpointError
from tune_magic.checkpoints.diskspace import (CheckpointSize, ModelFiles, checkpoint_bytes, checkpoint_file_names,
                                              copied_bytes, disk_preflight, estimate_for_config, free_bytes,
                                              lora_params, peak_checkpoints, read_model_files)

GB = 10**9


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> A.AssetPaths:
    return A.make_assets(tmp_path_factory.mktemp("assets") / "a")


def test_checkpoint_files_in_both_forms_torchtune_takes():
    assert checkpoint_file_names(["a.safetensors", "b.safetensors"]) == ["a.safetensors", "b.safetensors"]
    assert checkpoint_file_names({"filename_format": "model-{}-of-{}.safetensors", "max_filename": "00003"}) == [
        "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]
    with pytest.raises(CheckpointError, match="neither a list"):
        checkpoint_file_names("model.safetensors")


def test_the_tiny_checkpoint_read_from_its_header(tiny):
    files = read_model_files(tiny.model_dir, [A.CHECKPOINT_FILE])
    assert files.elements == 139_584  # as torchtune's llama2 builder counts them (tests/test_assets.py)
    assert files.tensor_bytes == 139_584 * 4
    assert files.shapes["model.layers.0.self_attn.k_proj.weight"] == (32, 64)
    # copy_files brings config.json and tokenizer.model into every epoch folder
    assert files.copied_bytes == sum((tiny.model_dir / n).stat().st_size for n in ("config.json", "tokenizer.model"))


def test_copied_bytes_follow_torchtunes_copy_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / ".hidden").write_text("secret")
    (tmp_path / "original").mkdir()
    (tmp_path / "original" / "tokenizer.model").write_bytes(b"t" * 10)
    (tmp_path / "original" / "consolidated.00.pth").write_bytes(b"w" * 100)
    big = tmp_path / "big.txt"
    big.write_bytes(b"")
    os.truncate(big, 101 * 1024 * 1024)  # over copy_files' 100 MB cap: not copied
    # torchtune's suffix test is endswith("adapter_config"), which adapter_config.json is not: copied
    assert copied_bytes(tmp_path) == 2 + 2 + 10


def test_a_missing_or_damaged_input_file_is_named(tiny, tmp_path):
    with pytest.raises(CheckpointError, match="no-such.safetensors"):
        read_model_files(tiny.model_dir, ["no-such.safetensors"])
    (tmp_path / "m.safetensors").write_bytes(b"\x05")
    with pytest.raises(CheckpointError, match="truncated"):
        read_model_files(tmp_path, ["m.safetensors"])


def test_torch_bin_inputs_are_read_too(tmp_path):
    import torch

    torch.save({"w": torch.zeros(3, 4, dtype=torch.bfloat16)}, tmp_path / "pytorch_model.bin")
    files = read_model_files(tmp_path, ["pytorch_model.bin"])
    assert (files.elements, files.tensor_bytes, files.shapes) == (12, 24, {"w": (3, 4)})


TINY_LORA = {"rank": 8, "attn_modules": ["q_proj", "v_proj", "output_proj"], "mlp": True, "output": True}


def test_lora_parameters_match_what_torchtunes_builder_creates(tiny):
    """The count from the checkpoint's shapes equals the LoRA parameters lora_llama2 builds."""
    from torchtune.models.llama2 import lora_llama2

    shapes = read_model_files(tiny.model_dir, [A.CHECKPOINT_FILE]).shapes
    for kwargs in (TINY_LORA, {"rank": 4, "attn_modules": ["q_proj", "k_proj"], "mlp": False, "output": False}):
        model = lora_llama2(lora_attn_modules=kwargs["attn_modules"], apply_lora_to_mlp=kwargs["mlp"],
                            apply_lora_to_output=kwargs["output"], lora_rank=kwargs["rank"], lora_alpha=16,
                            **A.TINY_MODEL)
        built = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
        assert lora_params(shapes, **kwargs) == built


def test_lora_parameters_of_an_unknown_layout_are_unknown():
    fused = {"model.layers.0.self_attn.qkv_proj.weight": (96, 32)}
    assert lora_params(fused, rank=8, attn_modules=["q_proj"], mlp=False, output=False) is None
    assert lora_params({"layers.0.attn.q_proj.weight": (8, 4)}, rank=2, attn_modules=["q_proj"], mlp=False,
                       output=False, dora=True) == 2 * (8 + 4) + 8


MODEL = ModelFiles((), tensor_bytes=4_000, elements=1_000, shapes={}, copied_bytes=50)


@pytest.mark.parametrize("kind, kwargs, expected", [
    # (model, adapter, copied, recipe state, trainable)
    (FULL, {"dtype_bytes": 2}, (2_000, 0, 50, 1_000 * 2 * 2, 1_000)),
    (FULL, {}, (4_000, 0, 50, 1_000 * 4 * 2, 1_000)),  # as stored: fp32
    (FULL, {"saves_recipe_state": False}, (4_000, 0, 50, 0, 1_000)),
    (LORA_MERGED, {"adapter_params": 100}, (4_000, 100 * 4 * 2, 50, 100 * 4 * 2, 100)),
    (ADAPTER_ONLY, {"adapter_params": 100, "hf": False}, (0, 100 * 4, 50, 100 * 4 * 2, 100)),
    (ADAPTER_ONLY, {"adapter_params": 100, "optimizer_moments": 0}, (0, 800, 50, 0, 100)),
])
def test_one_checkpoint_and_the_recipe_state(kind, kwargs, expected):
    size = checkpoint_bytes(MODEL, kind=kind, **kwargs)
    assert (size.model_bytes, size.adapter_bytes, size.copied_bytes, size.recipe_state_bytes,
            size.trainable_params) == expected
    assert size.per_checkpoint == sum(expected[:3])


def test_the_hf_index_and_an_unknown_adapter_are_accounted_for():
    size = checkpoint_bytes(ModelFiles((), 400, 100, {"a.weight": (10, 10)}, 0), kind=LORA_MERGED, hf=True)
    assert size.model_bytes == 400 + len("a.weight") + 48
    assert size.notes and "unknown" in size.notes[0]
    with pytest.raises(ValueError, match="kind must be"):
        checkpoint_bytes(MODEL, kind="merged")


@pytest.mark.parametrize("epochs, keep, expected", [
    (8, None, (8, 8)), (8, 1, (1, 2)), (8, 3, (3, 4)), (2, 3, (2, 2)), (8, "best", (2, 3)), (1, "best", (1, 1)),
])
def test_checkpoints_on_disk_at_once(epochs, keep, expected):
    assert peak_checkpoints(epochs, keep) == expected


SIZE = CheckpointSize(FULL, model_bytes=2 * GB, adapter_bytes=0, copied_bytes=0, recipe_state_bytes=4 * GB,
                      trainable_params=1_000_000_000)


@pytest.mark.parametrize("free, keep, verdict, words", [
    (100 * GB, 3, "fits", ["2.0 GB", "4.0 GB", "4 on disk at once need 12.0 GB", "100.0 GB free"]),
    (10 * GB, 3, "warn", ["need 12.0 GB", "10.0 GB free", "will fill the disk", "Keep fewer"]),
    (10 * GB, 1, "fits", ["2 on disk at once need 8.0 GB"]),
    (5 * GB, "best", "refuse", ["not even one checkpoint fits", "5.0 GB free"]),
])
def test_the_verdict_states_the_numbers(free, keep, verdict, words):
    v = disk_preflight(SIZE, epochs=8, keep=keep, free=free, where="/data/out")
    assert v.verdict == verdict
    assert v.needed == v.peak * 2 * GB + 4 * GB and v.free == free
    for w in words + ["/data/out", "1,000,000,000 trainable"]:
        assert w in v.message, v.message


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="epochs"):
        disk_preflight(SIZE, epochs=0, keep=1, free=GB)
    with pytest.raises(ValueError, match="keep"):
        disk_preflight(SIZE, epochs=2, keep=0, free=GB)


def test_free_bytes_of_a_folder_not_made_yet(tmp_path):
    assert free_bytes(tmp_path / "a" / "b" / "c") == free_bytes(tmp_path) > 0


def _config(tiny, **over):
    cfg = {"model": {"_component_": "torchtune.models.llama2.llama2"}, "dtype": "fp32", "epochs": 4,
           "checkpointer": {"_component_": "torchtune.training.FullModelHFCheckpointer",
                            "checkpoint_dir": str(tiny.model_dir), "checkpoint_files": [A.CHECKPOINT_FILE]},
           "optimizer": {"_component_": "torch.optim.AdamW"}, "output_dir": "/nowhere/out"}
    return {**cfg, **over}


def test_estimate_from_a_config(tiny):
    full = estimate_for_config(_config(tiny), keep=2, free=10**12)
    assert (full.verdict, full.kept, full.peak, full.size.kind) == ("fits", 2, 3, FULL)
    assert full.size.recipe_state_bytes == 139_584 * 4 * 2
    lora = estimate_for_config(_config(tiny, model={"_component_": "torchtune.models.llama2.lora_llama2",
                                                    "lora_rank": 8, "apply_lora_to_mlp": True,
                                                    "apply_lora_to_output": True,
                                                    "lora_attn_modules": ["q_proj", "v_proj", "output_proj"]},
                                      save_adapter_weights_only=True, dtype="bf16",
                                      optimizer={"_component_": "torch.optim.SGD"}), keep="best", free=1)
    assert (lora.verdict, lora.size.kind, lora.size.trainable_params) == ("refuse", ADAPTER_ONLY, 19_456)
    assert lora.size.adapter_bytes == 19_456 * 2 * 2 and lora.size.recipe_state_bytes == 0  # SGD without momentum
    with pytest.raises(CheckpointError, match="checkpoint_dir"):
        estimate_for_config({"epochs": 1}, keep=1)


def test_estimate_of_a_sharded_bf16_checkpoint(tmp_path):
    for i in (1, 2):
        save_file({f"w{i}": np.zeros((10, 10), dtype=np.float16)}, str(tmp_path / f"model-0000{i}-of-00002.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({}))
    cfg = {"checkpointer": {"checkpoint_dir": str(tmp_path), "checkpoint_files":
                            {"filename_format": "model-{}-of-{}.safetensors", "max_filename": "00002"}},
           "dtype": "bf16", "epochs": 1, "output_dir": str(tmp_path / "out")}
    v = estimate_for_config(cfg, keep=None, free=10**9)
    assert v.size.model_bytes == 200 * 2 + 2 * (2 + 48)  # in bf16, plus the HF index (assumed when not named)
    assert v.size.recipe_state_bytes == 0 and v.peak == 1
