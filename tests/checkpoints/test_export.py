"""tune_magic.checkpoints.export: the layout of an export of each checkpoint kind, and the refusals.
(tests/e2e/test_generate.py loads a real export with transformers.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptfolders import truncate, write_epoch
from tune_magic.checkpoints.catalog import ADAPTER_ONLY, FULL, LORA_MERGED, CheckpointError
from tune_magic.checkpoints.export import export_checkpoint

MODEL_FILES = ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
               "model.safetensors.index.json", "tokenizer.model"]
ADAPTER_FILES = ["adapter_config.json", "adapter_model.pt", "adapter_model.safetensors"]


def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("kind, layout", [
    (FULL, MODEL_FILES),
    (LORA_MERGED, MODEL_FILES + [f"adapter/{f}" for f in ADAPTER_FILES]),
    (ADAPTER_ONLY, ADAPTER_FILES + ["config.json", "tokenizer.model"]),
])
def test_each_kind_exports_in_its_layout(tmp_path, kind, layout):
    src = write_epoch(tmp_path / "out", 2, kind, shards=2)
    (tmp_path / "resolved_config.yaml").write_text("seed: 0\n")
    result = export_checkpoint(src, tmp_path / "export", config_files=[tmp_path / "resolved_config.yaml"],
                               base_checkpoint_dir=tmp_path / "base", model_type="LLAMA2")
    dest = tmp_path / "export"
    assert result.dest == dest and result.kind == kind and result.hf_layout
    assert sorted(result.files) == sorted(layout + ["README.md", "torchtune/resolved_config.yaml"])
    assert sorted(_bytes(dest)) == sorted(result.files)
    assert result.bytes == sum(len(b) for b in _bytes(dest).values())
    source = _bytes(src)
    for name in layout:
        assert _bytes(dest)[name] == source[name.removeprefix("adapter/")] or name == "adapter_config.json"
    readme = (dest / "README.md").read_text()
    assert "epoch_2" in readme and str(src) in readme
    if kind == ADAPTER_ONLY:
        config = json.loads((dest / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str(tmp_path / "base")  # null in torchtune's file
        assert "AutoPeftModelForCausalLM" in readme and "not copied" in readme
    else:
        assert "AutoModelForCausalLM.from_pretrained" in readme and "model_type: LLAMA2" in readme
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".export")]  # no temp folder left


def test_the_jobs_tokenizer_is_copied_where_the_checkpoint_lacks_it_or_differs(tmp_path):
    src = write_epoch(tmp_path / "out", 0, FULL)
    (src / "tokenizer.model").unlink()
    tok = tmp_path / "tok" / "tokenizer.model"
    tok.parent.mkdir()
    tok.write_bytes(b"the job's tokenizer")
    result = export_checkpoint(src, tmp_path / "e1", tokenizer_path=tok)
    assert (tmp_path / "e1" / "tokenizer.model").read_bytes() == b"the job's tokenizer"
    src2 = write_epoch(tmp_path / "out", 1, FULL)  # copies a different tokenizer.model
    result = export_checkpoint(src2, tmp_path / "e2", tokenizer_path=tok)
    assert (tmp_path / "e2" / "torchtune" / "tokenizer.model").read_bytes() == b"the job's tokenizer"
    assert "differs" in (tmp_path / "e2" / "README.md").read_text()
    assert "torchtune/tokenizer.model" in result.files


def test_an_empty_destination_folder_is_used(tmp_path):
    src = write_epoch(tmp_path / "out", 0, FULL)
    (tmp_path / "empty").mkdir()
    assert export_checkpoint(src, tmp_path / "empty").dest == tmp_path / "empty"
    assert (tmp_path / "empty" / "README.md").is_file()


@pytest.mark.parametrize("make, word", [
    (lambda d: (d.mkdir(), (d / "keep.txt").write_text("x")), "exists and is not empty; choose a new folder"),
    (lambda d: d.write_text("a file"), "is not a folder"),
])
def test_a_destination_in_use_is_refused_and_left_alone(tmp_path, make, word):
    src = write_epoch(tmp_path / "out", 0, FULL)
    dest = tmp_path / "dest"
    make(dest)
    before = _bytes(tmp_path)
    with pytest.raises(CheckpointError, match=word):
        export_checkpoint(src, dest)
    assert _bytes(tmp_path) == before


def test_refusals_name_the_fix(tmp_path):
    src = write_epoch(tmp_path / "out", 0, FULL)
    with pytest.raises(CheckpointError, match="into itself"):
        export_checkpoint(src, src / "export")
    with pytest.raises(CheckpointError, match="the job's config .*missing.yaml: no such file; put it back"):
        export_checkpoint(src, tmp_path / "e", config_files=[tmp_path / "missing.yaml"])
    with pytest.raises(CheckpointError, match=r"the job's tokenizer \(tokenizer.path\) .*tok.model: no such file"):
        export_checkpoint(src, tmp_path / "e", tokenizer_path=tmp_path / "tok.model")
    truncate(src / "model-00001-of-00001.safetensors")
    with pytest.raises(CheckpointError, match="not a complete checkpoint.*truncated"):
        export_checkpoint(src, tmp_path / "e")
    with pytest.raises(CheckpointError, match="is not a directory"):
        export_checkpoint(tmp_path / "out" / "epoch_7", tmp_path / "e")
    assert not (tmp_path / "e").exists()
