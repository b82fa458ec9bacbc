"""The outcome table on the SLURM scheduler, on the real test cluster: the shared rows of
tests/outcomerows.py end with the same status and reason as on the local scheduler
(tests/e2e/test_outcome_table.py), and SLURM's own verdicts — a time limit, a node failure, a
requeue, no answer from the controller — are read by the same rule."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

import tune_magic
from tune_magic.schedulers import slurm as slurm_sched

from jobhelpers import toy_args
from outcomerows import LONG, SHARED, Row, play, reason_of
from waiting import wait_for

pytestmark = pytest.mark.slurm
TIMEOUT = 240


def _launch(cluster, overrides, nproc=2, **kw):
    job = tune_magic.launch(toy_args(*overrides, nproc=nproc), scheduler="slurm",
                            **{"nodes": 1, "cpus_per_node": 2, **kw})
    cluster.started.append(job)
    return job


@pytest.mark.parametrize("row", SHARED, ids=lambda r: r.name)
def test_slurm_jobs_end_as_the_outcome_table_says(row: Row, cluster):
    job = _launch(cluster, row.overrides, row.nproc)
    play(row, job, lambda j: cluster.client(["scancel", j.engine_id]), timeout=TIMEOUT)
    assert (job.status, reason_of(job.error)) == (row.status, row.reason), job.tail(15)


def _running(job):
    return job.summary().step and job.status == "running"


# A job at its time limit fails saying so: tests/slurm/test_slurm_requeue.py runs it beside the job
# that --resume-on-timeout requeues (one minute, SLURM's shortest limit, waited for once).


def test_a_job_whose_node_failed_failed_saying_so(cluster):
    job = _launch(cluster, LONG)
    wait_for(lambda: _running(job), timeout=180, interval=0.2, what="the first step")
    (node,) = job.nodes
    try:
        cluster.client(["scontrol", "update", f"nodename={node}", "state=down", "reason=tm-outcome-test"])
        for p in cluster.node_processes(node):  # the node's crash takes the job's processes with it
            try:
                if p.name() != "slurmd":
                    p.kill()
            except psutil.Error:
                pass
        assert job.wait(TIMEOUT) == "failed", job.tail(15)
        assert job.error == "NODE_FAIL: a node of the job failed"
    finally:
        cluster.client(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)


def test_a_requeued_job_is_pending_again_whatever_its_log_held(cluster):
    job = _launch(cluster, LONG, sbatch=["--requeue"])
    wait_for(lambda: _running(job), timeout=180, interval=0.2, what="the first step")
    cluster.client(["scontrol", "requeue", job.engine_id])
    slurm_sched.WATCHER.forget()
    wait_for(lambda: job.status == "pending", timeout=60, interval=0.2, what="pending after the requeue")
    assert job.summary().step  # the first attempt's steps are in the log, and do not outvote SLURM
    assert job.stop(grace_s=2) == "stopped"


def test_no_answer_from_squeue_never_ends_a_job(cluster, tmp_path, monkeypatch):
    job = _launch(cluster, LONG)
    wait_for(lambda: _running(job), timeout=180, interval=0.2, what="the first step")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "squeue").write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller "
                                 "(connect failure)' >&2\nexit 1\n")
    (fake / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    for _ in range(3):
        slurm_sched.WATCHER.forget()
        job._checked = 0.0
        assert job.status == "running" and job.record.ended_at is None
        time.sleep(0.5)
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])
    slurm_sched.WATCHER.forget()
    assert job.stop(grace_s=2) == "stopped"
