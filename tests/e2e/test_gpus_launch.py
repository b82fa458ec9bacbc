"""GPU ids relative to the kernel's CUDA_VISIBLE_DEVICES, through real launches of the toy recipe,
against a FAKE nvidia-smi listing 4 GPUs (there is no GPU here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tune_magic.job as J
import tune_magic.job.launch as L
from tune_magic.gpus import GpuError
from tune_magic.ui.watch import JobWatcher

from jobhelpers import fake_gpu_uuid, toy_args
from waiting import wait_for


def workers_environ(job, timeout=60):
    wait_for(lambda: len(job.refresh().record.workers) >= int(job.record.nproc_per_node), timeout=timeout,
             what=f"every worker of {job.id}", describe=lambda: job.tail(20))
    return [dict(kv.split(b"=", 1) for kv in Path(f"/proc/{w.pid}/environ").read_bytes().split(b"\0") if b"=" in kv)
            for w in job.record.workers]


def test_FAKE_gpus_typed_in_a_kernel_with_cuda_visible_devices_2_3_reach_physical_2_3(fake_gpus, cleanup_jobs):
    kernel = {**os.environ, "CUDA_VISIBLE_DEVICES": "2,3"}
    job = L.launch(toy_args("steps=1000", "step_s=0.1", nproc=None), gpus="0,1", env=kernel)
    cleanup_jobs.append(job)
    assert [e[b"CUDA_VISIBLE_DEVICES"] for e in workers_environ(job)] == [b"2,3", b"2,3"]
    assert (job.record.gpus, job.record.physical_gpus) == ([0, 1], [2, 3])
    assert JobWatcher(job, tail_lines=1).poll_once().summary().splitlines()[1].startswith("GPUs 0,1 (physical 2,3)")
    # clashes compare physical GPUs: a kernel that sees every GPU finds 2 busy, 0 free
    with pytest.raises(GpuError, match="GPU 2 is used by running job " + job.id):
        L.launch(toy_args(nproc=None), gpus="2")
    with pytest.raises(GpuError, match=r"gpus='auto' needs 1 free GPU but 0 of the 2 visible are free"):
        L.launch(toy_args(nproc=None), gpus="auto", env=kernel)
    with pytest.raises(GpuError, match=r"GPU 2 is not visible to this kernel: CUDA_VISIBLE_DEVICES='2,3'"):
        L.launch(toy_args(nproc=None), gpus="2", env=kernel, force=True)
    assert job.stop(grace_s=5) == "stopped"


def test_FAKE_gpus_by_uuid_are_passed_as_the_kernel_names_them(fake_gpus, cleanup_jobs):
    kernel = {**os.environ, "CUDA_VISIBLE_DEVICES": f"{fake_gpu_uuid(3)},{fake_gpu_uuid(1)}"}
    job = L.launch(toy_args("steps=1000", "step_s=0.1", nproc=1), gpus="auto", env=kernel)
    cleanup_jobs.append(job)
    assert [e[b"CUDA_VISIBLE_DEVICES"] for e in workers_environ(job)] == [fake_gpu_uuid(3).encode()]
    assert (job.record.gpus, job.record.physical_gpus) == ([0], [3])
    assert job.stop(grace_s=5) == "stopped"


def test_empty_cuda_visible_devices_refuses_gpus_but_plans_stay_buildable(fake_gpus):
    kernel = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    with pytest.raises(GpuError, match="CUDA_VISIBLE_DEVICES is empty in this kernel's environment"):
        L.launch(toy_args(nproc=None), gpus="0", env=kernel)
    assert L.launch(toy_args(nproc=None), gpus="5", env=kernel, dry_run=True).gpus == [5]
