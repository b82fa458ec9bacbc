"""recipes/validate_checkpoint.py's parts without a run (issue 28): its ``validate.*`` keys and where
its output may go, how it tells a checkpoint folder's kind, and the PEFT adapter mapped back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tune_magic.assets import TINY_MODEL
from tune_magic.recipes import validate_checkpoint as VC


def cfg_with(tmp_path: Path, **validate):
    return OmegaConf.create({"output_dir": str(tmp_path / "job"), "validate": validate})


def test_the_keys_are_read_and_taken_out_of_the_config(tmp_path):
    folder = tmp_path / "job" / "epoch_2"
    folder.mkdir(parents=True)
    cfg = cfg_with(tmp_path, checkpoint_dir="${output_dir}/epoch_2", step=12, output_dir=str(tmp_path / "val"))
    opts = VC.read_options(cfg)
    assert opts == VC.Options(checkpoint_dir=folder, step=12, output_dir=tmp_path / "val", epoch=2)
    assert "validate" not in cfg


@pytest.mark.parametrize("out,words", [
    ("job", "inside the training job's output_dir"),
    ("job/val", "inside the training job's output_dir"),
    ("job/epoch_2/val", "inside the checkpoint folder"),
])
def test_the_output_never_goes_into_the_job_folder(tmp_path, out, words):
    (tmp_path / "job" / "epoch_2").mkdir(parents=True)
    cfg = cfg_with(tmp_path, checkpoint_dir=str(tmp_path / "job" / "epoch_2"), step=12, output_dir=str(tmp_path / out))
    with pytest.raises(ValueError, match=words):
        VC.read_options(cfg)


def test_bad_keys_name_the_fix(tmp_path):
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(ValueError, match=r"validate.checkpoint_dir=<the epoch_N folder>"):
        VC.read_options(OmegaConf.create({"output_dir": "x"}))
    with pytest.raises(ValueError, match=r"unknown \['stp'\], missing \['step'\]"):
        VC.read_options(cfg_with(tmp_path, checkpoint_dir=str(tmp_path), stp=3, output_dir=str(tmp_path / "v")))
    with pytest.raises(ValueError, match="is not named epoch_N: give validate.epoch=N"):
        VC.read_options(cfg_with(tmp_path, checkpoint_dir=str(tmp_path / "ckpt"), step=3, output_dir=str(tmp_path / "v")))
    with pytest.raises(ValueError, match="validate.step must be a non-negative int"):
        VC.read_options(cfg_with(tmp_path, checkpoint_dir=str(tmp_path / "ckpt"), step="x", epoch=1,
                                 output_dir=str(tmp_path / "v")))


@pytest.mark.parametrize("files,is_lora,kind", [
    (["model-00001-of-00001.safetensors", "config.json"], False, VC.KIND_FULL),
    (["model-00001-of-00002.bin", "model-00002-of-00002.bin"], False, VC.KIND_FULL),
    (["model-00001-of-00001.safetensors", "adapter_model.pt", "adapter_config.json"], True, VC.KIND_MERGED),
    (["adapter_model.pt", "adapter_model.safetensors", "adapter_config.json"], True, VC.KIND_ADAPTER),
    (["adapter_model.safetensors"], True, VC.KIND_ADAPTER),
])
def test_the_kind_of_a_folder(tmp_path, files, is_lora, kind):
    for name in files:
        (tmp_path / name).write_bytes(b"")
    got, weights = VC.checkpoint_kind(tmp_path, is_lora)
    assert got == kind
    assert weights == sorted(f for f in files if f.startswith("model-"))


def test_a_folder_without_weights_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="no model-"):
        VC.checkpoint_kind(tmp_path, True)
    (tmp_path / "adapter_model.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="not a LoRA model"):
        VC.checkpoint_kind(tmp_path, False)


def test_peft_to_tune_inverts_torchtunes_conversion():
    from torchtune.models.convert_weights import tune_to_peft_adapter_weights
    from torchtune.models.llama2 import lora_llama2
    from torchtune.modules.peft import get_adapter_params

    with torch.device("meta"):
        model = lora_llama2(lora_attn_modules=["q_proj", "k_proj", "v_proj", "output_proj"], apply_lora_to_mlp=True,
                            apply_lora_to_output=True, lora_rank=8, lora_alpha=16, **TINY_MODEL)
    shapes = {k: p.shape for k, p in get_adapter_params(model).items()}
    torch.manual_seed(0)
    adapter = {k: torch.randn(s) for k, s in shapes.items()}
    hf = {"num_attention_heads": TINY_MODEL["num_heads"], "num_key_value_heads": TINY_MODEL["num_kv_heads"],
          "hidden_size": TINY_MODEL["embed_dim"]}
    peft = tune_to_peft_adapter_weights({k: v.clone() for k, v in adapter.items()}, num_heads=4, num_kv_heads=2, dim=64)
    back = VC.peft_to_tune(peft, shapes, hf)
    assert back.keys() == adapter.keys()
    for k in adapter:
        assert torch.equal(back[k], adapter[k]), k
    assert not torch.equal(peft["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"],
                           adapter["layers.0.attn.q_proj.lora_b.weight"])  # a permutation was undone
