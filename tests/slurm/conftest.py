"""The SLURM tests' shared fixture: the test cluster with this process set up as its client."""

from __future__ import annotations

import os

import pytest

from tune_magic.schedulers import slurm as slurm_sched


@pytest.fixture
def cluster(slurm_netns_cluster, monkeypatch):
    """The test cluster, with this process's environment set for its SLURM clients.

    Jobs a test appends to ``cluster.started`` (a list of :class:`tune_magic.job.Job`) are
    stopped afterwards, even when the test failed, and the cluster must then go idle within 60 s.
    A controller a test paused or killed is resumed or started again first.
    """
    c = slurm_netns_cluster
    for key in list(os.environ):
        if key.startswith(("SLURM_", "SBATCH_", "SQUEUE_")) or key == "TUNE_MAGIC_SCHEDULER":
            monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])
    monkeypatch.setenv("PATH", c.env["PATH"])
    slurm_sched.WATCHER.forget()
    c.started = []
    yield c
    c.heal_controller()
    slurm_sched.WATCHER.forget()
    for job in c.started:
        try:
            job.stop(grace_s=1)
        except Exception:  # the cluster's idle check below is what fails the test
            pass
    c.wait_idle(60)
