"""Failure reasons and log forms through real jobs: the record's error, the full traceback one
step away (Job.failure(), tune-magic logs --error), and --redirects jobs whose workers write only
to torchrun's --log-dir."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tune_magic.job as J
import tune_magic.job.launch as L
from tune_magic.registry import store as jobstore

from jobhelpers import toy_args

TIMEOUT = 180


def test_failed_job_has_its_line_and_the_whole_traceback_one_step_away(cleanup_jobs):
    job = L.launch(toy_args("crash_rank=1"))
    cleanup_jobs.append(job)
    assert job.wait(TIMEOUT) == "failed"
    assert job.error == "rank 1: RuntimeError: toy recipe crashed on purpose"
    reason = job.failure()
    assert (reason.rank, reason.exc_type, reason.kind) == (1, "RuntimeError", "exception")
    assert "Traceback (most recent call last)" in reason.traceback and "raise RuntimeError" in reason.traceback
    r = subprocess.run([sys.executable, "-m", "tune_magic", "logs", job.id, "--error"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == job.error and "raise RuntimeError" in r.stdout
    ok = L.launch(toy_args("steps=1", nproc=None))
    cleanup_jobs.append(ok)
    assert ok.wait(TIMEOUT) == "succeeded" and ok.failure() is None
    r = subprocess.run([sys.executable, "-m", "tune_magic", "logs", ok.id, "--error"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "not failed" in r.stderr


def test_redirected_workers_are_followed_through_the_jobs_ranks_dir(cleanup_jobs):
    job = L.launch("--redirects 3 " + toy_args("steps=5"))
    cleanup_jobs.append(job)
    assert job.wait(TIMEOUT) == "succeeded", job.tail(20)
    assert job.record.rank_log_dir == str(job.dir / "ranks")
    assert "--log-dir" in job.argv and str(job.dir / "ranks") in job.argv
    assert "Loss" not in Path(job.log_path).read_text()  # the workers wrote elsewhere
    s = job.summary()
    assert (s.step, s.loss) == (5, 2.0)
    losses = [p for p in job.metric_points() if p.name == "loss"]
    assert [p.step for p in losses] == [1, 2, 3, 4, 5] and losses[-1].value == 2.0
    crashed = L.launch("--redirects 3 " + toy_args("crash_rank=1"))
    cleanup_jobs.append(crashed)
    assert crashed.wait(TIMEOUT) == "failed"
    assert crashed.error == "rank 1: RuntimeError: toy recipe crashed on purpose"


@pytest.mark.parametrize("args,error", [
    # one process (no torchrun): the handled traceback, more progress, then sys.exit(3) / SIGKILL
    (toy_args("handled_rank=0", "exit_rank=0", "steps=6", nproc=None), "exited with code 3"),
    (toy_args("handled_rank=0", "kill_rank=0", "steps=6", nproc=None), "killed by SIGKILL (signal 9)"),
    # rank 0 printed the handled traceback and went on; rank 1 exited with code 3
    (toy_args("handled_rank=0", "exit_rank=1", "steps=6"), "rank 1: exited with code 3"),
])
def test_a_traceback_the_recipe_handled_is_not_the_failure(args, error, cleanup_jobs):
    job = L.launch(args + " step_s=0.3")
    cleanup_jobs.append(job)
    assert job.wait(TIMEOUT) == "failed"
    assert "CUDA out of memory" in Path(job.log_path).read_text()  # printed, handled, survived
    assert job.error == error
