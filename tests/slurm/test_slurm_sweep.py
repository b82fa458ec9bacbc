"""A sweep on SLURM is ONE job array (issue 20), on the real two-node test cluster: each array task
one trial of the stand-in recipe, with its own log, status (squeue's task line, its pending reason),
exit file and stop; the array's stop cancels the queued tasks; an array larger than the cluster's
MaxArraySize is refused before sbatch."""

from __future__ import annotations

import os
import subprocess

import pytest

import tune_magic
from tune_magic.errors import PlanError
from tune_magic.registry import store as jobstore
from tune_magic.sweeping import store as sweepstore
from tune_magic.schedulers.slurm.array import parse_array_limits

from jobhelpers import toy_args
from waiting import wait_for

pytestmark = pytest.mark.slurm
TIMEOUT = 240


def array_sweep(c, tmp_path, losses, *overrides, max_parallel=2):
    sweep = tune_magic.sweep(toy_args("start_loss=" + ",".join(map(str, losses)), *overrides, nproc=1),
                             scheduler="slurm", max_parallel=max_parallel, cpus_per_node=1, cwd=tmp_path)
    c.started.extend(sweep.jobs)
    return sweep


def statuses(sweep) -> list[str]:
    return [str(t.status) for t in sweep.trials]


def squeue_array(c, array_id: str) -> dict[str, str]:
    """squeue's own word, task id -> state, for every task of the array (``-r``: one line a task)."""
    out = c.client(["squeue", "-r", f"--jobs={array_id}", "--states=all", "--noheader", "--format=%i %T"]).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def not_ended(sweep) -> list[str]:
    """The trials' statuses; fails at once when one ended (a wait for a queue state can then never end)."""
    now = statuses(sweep)
    assert not {"succeeded", "failed", "stopped"} & set(now), now
    return now


def test_a_sweep_is_one_array_whose_tasks_wait_run_and_succeed_each_with_its_own_loss(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_MAGIC_SLURM_INTERVAL_S", "1")  # squeue's word (the pending reason) within a second
    sweep = array_sweep(cluster, tmp_path, [1, 2, 3, 4], "steps=3", "step_s=2")
    array_id = sweep.record.engine["array_job_id"]
    jobs = sweep.jobs
    assert [j.engine_id for j in jobs] == [f"{array_id}_{i}" for i in range(4)]
    assert [j.scheduler for j in jobs] == ["slurm"] * 4 and [j.record.sweep["trial"] for j in jobs] == [0, 1, 2, 3]
    assert not sweepstore.runner_alive(sweep.dir)  # the array is the queue: no sweep process
    named = cluster.client(["squeue", f"--name=tune_magic-{sweep.id}", "--states=all", "--noheader",
                            "--format=%F"]).stdout.split()
    assert set(named) == {array_id}  # one sbatch: every task belongs to the one array
    # %2: two tasks run while the other two wait, and SLURM's reason reaches their records
    wait_for(lambda: not_ended(sweep) == ["running", "running", "pending", "pending"]
             and {j.refresh().record.pending_reason for j in jobs[2:]} == {"JobArrayTaskLimit"},
             timeout=TIMEOUT, interval=0.3, what="tasks 0-1 running, 2-3 pending (JobArrayTaskLimit)",
             describe=lambda: [(t.status, t.job.record.pending_reason) for t in sweep.trials])
    assert sweep.wait(TIMEOUT) == {"succeeded": 4}
    for i, (job, start) in enumerate(zip(jobs, [1, 2, 3, 4])):
        job.refresh()
        assert job.log_path == str(sweep.dir / "logs" / f"{array_id}_{i}.log")  # --output=...%A_%a.log
        assert jobstore.read_exit_code(job.dir).returncode == 0  # its own exit file, in its own job directory
        losses = sorted((p.step, p.value) for p in job.metric_points() if p.name == "loss")
        assert losses == [(1, start / 1), (2, start / 2), (3, start / 3)], (i, losses)
    assert set(squeue_array(cluster, array_id).values()) == {"COMPLETED"}
    assert sweep.frame()["final_loss"].tolist() == [1 / 3, 2 / 3, 1.0, 4 / 3]


def test_one_trial_stops_alone_then_the_array_stops_and_its_queued_tasks_never_start(cluster, tmp_path):
    sweep = array_sweep(cluster, tmp_path, [1, 2, 3, 4], "steps=400", "step_s=0.5")
    array_id = sweep.record.engine["array_job_id"]
    jobs = sweep.jobs
    wait_for(lambda: not_ended(sweep) == ["running", "running", "pending", "pending"] and jobs[1].metric_points(),
             timeout=TIMEOUT, interval=0.3, what="tasks 0-1 running (1 logging its loss), 2-3 pending",
             describe=lambda: statuses(sweep))
    assert jobs[1].stop(grace_s=2) == "stopped"  # scancel of task 1 alone
    wait_for(lambda: statuses(sweep)[2] == "running", timeout=TIMEOUT, interval=0.3,
             what="task 2 to take the freed place", describe=lambda: statuses(sweep))
    assert statuses(sweep)[:2] == ["running", "stopped"] and statuses(sweep)[3] == "pending"
    # SLURM's word on task 1: ended (the polite SIGTERM ends its batch script: FAILED or CANCELLED)
    assert squeue_array(cluster, array_id)[f"{array_id}_1"] in ("CANCELLED", "FAILED")
    assert sweep.stop(grace_s=2) == {"stopped": 4}
    assert not os.path.exists(sweep.dir / "logs" / f"{array_id}_3.log")  # task 3 never started
    assert jobs[3].refresh().record.nodes == [] and jobstore.read_exit_code(jobs[3].dir) is None
    left = squeue_array(cluster, array_id)
    assert not {s for s in left.values()} & {"PENDING", "RUNNING", "COMPLETING"}, left
    assert sweep.status == "stopped"


def test_a_pending_task_cancelled_outside_ends_stopped_cancelled_outside_not_pending_for_good(
        cluster, tmp_path, monkeypatch):
    # issue 30: `scancel A_2` of a queued task while A_0 runs; scontrol then says "Job A_2 not found"
    # (on stdout, exit 1, in 22.05), which read as "SLURM not answering" and left the trial pending
    monkeypatch.setenv("TUNE_MAGIC_SLURM_INTERVAL_S", "1")
    monkeypatch.setenv("TUNE_MAGIC_SLURM_GRACE_S", "1")
    monkeypatch.setenv("TUNE_MAGIC_SLURM_MISSING_ANSWERS", "2")
    sweep = array_sweep(cluster, tmp_path, [1, 2, 3], "steps=400", "step_s=0.5", max_parallel=1)
    array_id = sweep.record.engine["array_job_id"]
    jobs = sweep.jobs
    wait_for(lambda: not_ended(sweep) == ["running", "pending", "pending"], timeout=TIMEOUT, interval=0.3,
             what="task 0 running, 1-2 pending", describe=lambda: statuses(sweep))
    cluster.client(["scancel", f"{array_id}_2"])
    said = cluster.client(["scontrol", "--oneliner", "show", "job", f"{array_id}_2"], check=False)
    assert said.returncode == 1 and f"{array_id}_2 not found" in said.stdout + said.stderr, said
    wait_for(lambda: jobs[2].refresh().status == "stopped", timeout=60, interval=0.5,
             what="the cancelled task to end stopped", describe=lambda: (statuses(sweep), jobs[2].record.error))
    assert jobs[2].record.error == "cancelled outside tune_magic" and jobs[2].record.ended_at is not None
    assert statuses(sweep)[:2] == ["running", "pending"]  # the others go on as they were
    assert not os.path.exists(sweep.dir / "logs" / f"{array_id}_2.log")  # it never started
    assert sweep.stop(grace_s=2) == {"stopped": 3}


def test_an_array_larger_than_max_array_size_is_refused_before_sbatch(cluster, tmp_path):
    limit = parse_array_limits(cluster.client(["scontrol", "show", "config"]).stdout).max_array_size
    before = sorted(os.listdir(jobstore.jobs_root()))
    queued = cluster.client(["squeue", "--states=all", "--noheader", "--format=%i"]).stdout.split()
    with pytest.raises(PlanError, match=f"MaxArraySize is {limit:,}") as caught:
        tune_magic.sweep(toy_args(f"start_loss=range(1,{limit + 2})", "steps=1", nproc=1), scheduler="slurm",
                         max_trials=limit + 1, cpus_per_node=1, cwd=tmp_path)
    assert f"{limit + 1:,} trials" in str(caught.value)
    assert sorted(os.listdir(jobstore.jobs_root())) == before  # no trial registered
    assert cluster.client(["squeue", "--states=all", "--noheader", "--format=%i"]).stdout.split() == queued
    assert not [r for r in sweepstore.list_records() if len(r.trials) == limit + 1]


SUBMITTER = """
import sys
import tune_magic
tune_magic.sweep(sys.argv[1], scheduler="slurm", max_parallel=2, cpus_per_node=1, cwd=sys.argv[2])
"""


def test_a_submitter_killed_after_sbatch_leaves_trials_that_find_their_tasks_by_the_arrays_name(cluster, tmp_path):
    import sys

    from tune_magic import faultpoints
    from tune_magic.sweeping.sweep import Sweep

    before = set(sweepstore.list_dirs())
    p = subprocess.run([sys.executable, "-c", SUBMITTER, toy_args("start_loss=1,2,3", "steps=2", nproc=1), str(tmp_path)],
                       env={**os.environ, faultpoints.KILL_ENV: "array-sbatch-returned"}, capture_output=True,
                       timeout=120)
    assert p.returncode == -9, p.stderr[-2000:]
    (new,) = [d for d in sweepstore.list_dirs() if d not in before]
    sweep = Sweep(new)
    assert sweep.record.engine == {"array_job_id": None}  # the array's id never got written
    on_disk = [jobstore.read(jobstore.jobs_root() / t.job_id) for t in sweep.record.trials]
    assert [(r.backend.get("job_id"), r.backend.get("array_task")) for r in on_disk] == [(None, 0), (None, 1), (None, 2)]
    cluster.started.extend(sweep.jobs)
    assert sweep.wait(TIMEOUT) == {"succeeded": 3}
    array_ids = {j.refresh().engine_id.split("_")[0] for j in sweep.jobs}
    assert len(array_ids) == 1 and [j.engine_id for j in sweep.jobs] == [f"{min(array_ids)}_{i}" for i in range(3)]
    for i, job in enumerate(sweep.jobs):  # each found its own log, %A_%a, and its own loss
        assert job.log_path == str(new / "logs" / f"{job.engine_id}.log")
        assert sorted((q.step, q.value) for q in job.metric_points() if q.name == "loss") == [(1, i + 1), (2, (i + 1) / 2)]


def test_an_array_cancelled_outside_tune_magic_stops_every_trial_the_queued_ones_too(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_MAGIC_SLURM_INTERVAL_S", "1")
    sweep = array_sweep(cluster, tmp_path, [1, 2, 3], "steps=400", "step_s=0.5", max_parallel=1)
    array_id = sweep.record.engine["array_job_id"]
    wait_for(lambda: not_ended(sweep) == ["running", "pending", "pending"] and sweep.jobs[0].metric_points(),
             timeout=TIMEOUT, interval=0.3, what="task 0 running, 1-2 pending", describe=lambda: statuses(sweep))
    cluster.client(["scancel", array_id])  # by hand, not through tune_magic
    # well before the 60 s after which a job SLURM no longer lists would be called failed
    wait_for(lambda: statuses(sweep) == ["stopped"] * 3, timeout=40, interval=0.5,
             what="every trial stopped", describe=lambda: [(t.status, t.error) for t in sweep.trials])
    assert [j.refresh().record.error for j in sweep.jobs] == ["cancelled outside tune_magic"] * 3
    assert not os.path.exists(sweep.dir / "logs" / f"{array_id}_1.log")  # never started
