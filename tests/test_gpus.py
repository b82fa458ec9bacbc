"""GPU counting without CUDA, against a FAKE nvidia-smi on PATH (there is no GPU here)."""

import os

import pytest

from tune_magic import gpus
from tune_magic.gpus import GpuError

from jobhelpers import write_fake_nvidia_smi


@pytest.fixture
def fake_4_gpus_env(tmp_path):
    write_fake_nvidia_smi(tmp_path / "bin", 4)
    return {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def test_count_with_fake_nvidia_smi(fake_4_gpus_env):
    assert gpus.gpu_ids(fake_4_gpus_env) == [0, 1, 2, 3]
    assert gpus.count_gpus(fake_4_gpus_env) == 4


def test_no_nvidia_smi_means_zero_gpus(tmp_path):
    assert gpus.count_gpus({"PATH": str(tmp_path)}) == 0


def test_case8_counting_never_touches_torch_cuda(fake_4_gpus_env, monkeypatch):
    import torch

    def boom(*a, **k):
        raise AssertionError("torch.cuda touched")

    for name in ("init", "_lazy_init", "is_available", "device_count"):
        monkeypatch.setattr(torch.cuda, name, boom)
    assert gpus.count_gpus(fake_4_gpus_env) == 4


def test_pick_free_skips_busy(fake_4_gpus_env):
    assert gpus.pick_free(2, {0: "a", 1: "a"}, fake_4_gpus_env) == [2, 3]
    with pytest.raises(GpuError, match="needs 3 free GPU"):
        gpus.pick_free(3, {0: "a", 1: "a"}, fake_4_gpus_env)


def test_check_gpus_out_of_range_and_busy(fake_4_gpus_env, tmp_path):
    with pytest.raises(GpuError, match="GPU 7 does not exist"):
        gpus.check_gpus([7], {}, env=fake_4_gpus_env)
    with pytest.raises(GpuError, match="0 GPUs"):
        gpus.check_gpus([0], {}, env={"PATH": str(tmp_path)})
    with pytest.raises(GpuError, match="used by running job abc"):
        gpus.check_gpus([1], {1: "abc"}, env=fake_4_gpus_env)
    gpus.check_gpus([1], {1: "abc"}, force=True, env=fake_4_gpus_env)
