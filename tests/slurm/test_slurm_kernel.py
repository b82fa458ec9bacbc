"""A SLURM job from a real Jupyter kernel: a new kernel lists it, follows it and stops it."""

from __future__ import annotations

import os

import pytest

import tune_magic
import tune_magic.job as J

from jobhelpers import toy_args
from kernelhelpers import Kernel
from waiting import wait_for

pytestmark = pytest.mark.slurm
TIMEOUT = 180


def test_a_new_kernel_lists_follows_and_stops_a_running_slurm_job(slurm_netns_cluster, tmp_path):
    c = slurm_netns_cluster
    env = {**c.env, "TUNE_MAGIC_HOME": os.environ["TUNE_MAGIC_HOME"]}
    first = Kernel(cwd=str(tmp_path), env=env)
    try:
        first.run("%load_ext tune_magic")
        first.run(f"%tune_run --scheduler slurm --nodes 2 --cpus-per-node 1 "
                  f"{toy_args('steps=100000', 'step_s=0.3', nproc=1)}")
        job_id = first.value("_.id")
    finally:
        first.shutdown()  # the job belongs to no kernel
    try:
        _follow_and_stop(c, env, job_id, tmp_path)
    finally:  # a failed check leaves no job holding the cluster's nodes for the next test
        job = J.get_job(job_id)
        if not job.status.is_terminal:
            job.stop(grace_s=2)


def _follow_and_stop(c, env, job_id, tmp_path):
    k = Kernel(cwd=str(tmp_path), env=env)
    try:
        k.run("%load_ext tune_magic")
        listed = k.run("%tune_jobs").text
        assert job_id in listed and ("pending" in listed or "running" in listed)
        k.run(f"%tune_logs {job_id}")
        k.run(f"from tune_magic.ui.cards import JobCard; card = JobCard.for_job({job_id!r})")

        def at_step_2() -> bool:
            step = k.value("card.snapshot.step if card.snapshot else None")
            return step is not None and step >= 2

        wait_for(at_step_2, timeout=TIMEOUT, interval=1, what="step 2 on the card",
                 describe=lambda: k.value("card.text()"))
        assert k.value("card.snapshot.status") == "running"
        out = k.run(f"%tune_stop --grace 2 {job_id}").stdout
        assert out.split() == [job_id, "stopped"], out
    finally:
        k.shutdown()
    job = J.get_job(job_id)
    assert job.status == "stopped"
    leftovers = [p for node in c.node_names for p in c.node_processes(node)
                 if any(job_id in a for a in p.cmdline())]
    assert leftovers == []
