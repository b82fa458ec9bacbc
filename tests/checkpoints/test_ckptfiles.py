"""tune_magic.checkpoints.files: torch.save zip files and safetensors headers read without torch.

Files are written by real torch.save / safetensors here (the test process may import torch; the
module under test never does, checked in a fresh interpreter)."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tune_magic.checkpoints.files import (
    CheckpointFileError,
    Opaque,
    TensorStub,
    read_safetensors_header,
    read_torch_file,
)


def _save(obj, path: Path) -> Path:
    torch.save(obj, path)
    return path


def test_reads_structure_and_small_values_not_tensor_bytes(tmp_path):
    state = {
        "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(4, 6), "exp_avg_sq": torch.zeros(4, 6)}},
                      "param_groups": [{"lr": 0.5, "betas": (0.9, 0.999), "initial_lr": 1.0, "params": [0]}]},
        "seed": 7, "epochs_run": 2, "total_epochs": 3, "max_steps_per_epoch": None,
        "dataloader": OrderedDict(a=1, b=[1, 2], c=b"raw", d={"x": None}),
        "bf16": torch.ones(3, dtype=torch.bfloat16),
    }
    tf = read_torch_file(_save(state, tmp_path / "rs.pt"))
    obj = tf.obj
    assert (obj["seed"], obj["epochs_run"], obj["total_epochs"], obj["max_steps_per_epoch"]) == (7, 2, 3, None)
    assert obj["dataloader"] == {"a": 1, "b": [1, 2], "c": b"raw", "d": {"x": None}}
    pg = obj["optimizer"]["param_groups"][0]
    assert pg["lr"] == 0.5 and pg["betas"] == (0.9, 0.999) and pg["params"] == [0]
    exp_avg = obj["optimizer"]["state"][0]["exp_avg"]
    assert isinstance(exp_avg, TensorStub) and exp_avg.shape == (4, 6) and exp_avg.numel == 24
    assert exp_avg.storage.dtype == "Float" and exp_avg.storage.location == "cpu"
    assert obj["optimizer"]["state"][0]["step"].shape == ()
    assert obj["bf16"].storage.dtype == "BFloat16"
    # 1 + 24 + 24 float32 elements and 3 bf16 ones
    assert tf.storage_bytes == (1 + 24 + 24) * 4 + 3 * 2
    assert len(tf.storages) == 4 and tf.size == (tmp_path / "rs.pt").stat().st_size


def test_a_huge_sparse_torch_file_is_read_without_its_data(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        big = {"optimizer": {"state": {i: {"exp_avg": torch.empty(32768, 32768)} for i in range(4)}}, "epochs_run": 1}
    path = tmp_path / "big.pt"
    with torch.serialization.skip_data(materialize_fake_tensors=True):  # storage bytes left as holes
        torch.save(big, path)
    assert path.stat().st_size > 16 << 30  # 16 GiB apparent; reading it whole would take minutes here
    tf = read_torch_file(path)
    assert tf.storage_bytes == 4 * 32768 * 32768 * 4
    assert tf.obj["optimizer"]["state"][3]["exp_avg"].shape == (32768, 32768)


@pytest.mark.parametrize("keep", [0.5, 0.98])
def test_truncated_torch_file_is_reported_as_truncated(tmp_path, keep):
    path = _save({"epochs_run": 1, "t": torch.arange(5000.0)}, tmp_path / "rs.pt")
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointFileError, match="truncated"):
        read_torch_file(path)


def test_a_torch_file_cut_inside_its_pickle_is_damaged(tmp_path):
    path = tmp_path / "rs.pt"
    good = _save({"epochs_run": 1, "nested": {"k": list(range(200))}}, tmp_path / "good.pt")
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info.filename, data[: len(data) // 2] if info.filename.endswith("data.pkl") else data)
    with pytest.raises(CheckpointFileError, match="damaged: its data.pkl does not unpickle"):
        read_torch_file(path)


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "not a torch file: it is empty"),
        (b"hello, this is a text file\n" * 10, "not a torch file: it starts with bytes 68 65 6c"),
        (bytes(range(256)) * 40, "not a torch file"),
    ],
)
def test_garbage_is_not_a_torch_file(tmp_path, content, reason):
    path = tmp_path / "recipe_state.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointFileError, match=reason):
        read_torch_file(path)


def test_the_legacy_format_is_named(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"epochs_run": 1}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointFileError, match="legacy non-zip format"):
        read_torch_file(path)


def test_a_zip_that_is_not_torch(tmp_path):
    path = tmp_path / "x.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hi")
    with pytest.raises(CheckpointFileError, match="not a torch file"):
        read_torch_file(path)


def test_a_missing_storage_record_is_damage(tmp_path):
    good = _save({"t": torch.ones(3)}, tmp_path / "good.pt")
    path = tmp_path / "bad.pt"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            if "/data/" not in info.filename:
                dst.writestr(info.filename, src.read(info))
    with pytest.raises(CheckpointFileError, match="no data/0 entry"):
        read_torch_file(path)


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


def test_a_pickle_that_would_run_code_runs_none(tmp_path):
    marker = tmp_path / "pwned"
    _Evil.marker = marker
    payload = pickle.dumps({"epochs_run": 1, "evil": _Evil(), "obj": io.BytesIO}, protocol=2)
    path = tmp_path / "recipe_state.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("recipe_state/data.pkl", payload)
        z.writestr("recipe_state/version", "3\n")
    tf = read_torch_file(path)
    assert not marker.exists()
    assert isinstance(tf.obj["evil"], Opaque) and tf.obj["evil"].name in ("posix.system", "os.system")
    assert tf.obj["epochs_run"] == 1


def test_reading_never_imports_torch(tmp_path):
    path = _save({"epochs_run": 1, "t": torch.ones(2)}, tmp_path / "rs.pt")
    st = _safetensors(tmp_path)
    code = ("import sys\nfrom tune_magic.checkpoints.files import read_torch_file, read_safetensors_header\n"
            f"assert read_torch_file({str(path)!r}).obj['epochs_run'] == 1\n"
            f"assert read_safetensors_header({str(st)!r}).data_bytes == 406\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def _safetensors(tmp_path: Path, name="model-00001-of-00001.safetensors") -> Path:
    path = tmp_path / name
    save_file({"a": torch.ones(10, 10), "b": torch.zeros(3, dtype=torch.bfloat16)}, path, metadata={"format": "pt"})
    return path


def test_reads_a_safetensors_header(tmp_path):
    h = read_safetensors_header(_safetensors(tmp_path))
    assert h.tensors == {"a": ("F32", (10, 10)), "b": ("BF16", (3,))}
    assert h.metadata == {"format": "pt"} and h.data_bytes == 400 + 6


@pytest.mark.parametrize("cut", [4, 20, -1])
def test_truncated_safetensors(tmp_path, cut):
    path = _safetensors(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:cut])
    with pytest.raises(CheckpointFileError, match="truncated"):
        read_safetensors_header(path)


def test_garbage_safetensors(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 5) + b"nope!" + b"\0" * 10)
    with pytest.raises(CheckpointFileError, match="bad header"):
        read_safetensors_header(path)
    path.write_bytes(struct.pack("<Q", 1 << 40))
    with pytest.raises(CheckpointFileError, match="impossible"):
        read_safetensors_header(path)
    path.write_bytes(struct.pack("<Q", 2) + json.dumps([]).encode())
    with pytest.raises(CheckpointFileError, match="not a mapping"):
        read_safetensors_header(path)
