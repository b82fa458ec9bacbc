"""A launch waits for its supervisor without polling: the supervisor wakes it through a pipe once
the job's first process is recorded, or by exiting. (Ten launches from threads at once used to
spend half their process's CPU re-reading their records every 5 ms; bench row 10b.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import tune_magic.job as J
import tune_magic.job.launch as L
from tune_magic.registry import store as jobstore

from jobhelpers import toy_args

SLOW_START_S = 0.6


def _slow_python(tmp_path, body: str) -> dict:
    """An environment whose every Python process first runs ``body`` (a sitecustomize)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(body)
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_a_slow_supervisor_is_waited_for_without_polling_the_record(tmp_path, monkeypatch, cleanup_jobs):
    env = _slow_python(tmp_path, f"import time\ntime.sleep({SLOW_START_S})\n")
    reads = []
    real_read = jobstore.read
    monkeypatch.setattr(jobstore, "read", lambda d: reads.append((Path(d).name, time.monotonic())) or real_read(d))
    t0 = time.monotonic()
    job = L.launch(toy_args("steps=1000", "step_s=0.1", nproc=None), env=env)
    waited = time.monotonic() - t0
    cleanup_jobs.append(job)
    assert job.record.agent is not None and job.status == "running"
    assert waited >= SLOW_START_S
    # polling every 5 ms read it > 100 times in this wait; woken by the pipe, with a look every 0.1 s
    # should no wake-up come, it is read about waited / 0.1 times
    during = [at for job_id, at in reads if job_id == job.id and at <= t0 + waited]  # (listings read the others)
    assert len(during) <= waited / 0.1 + 4, (len(during), waited)
    assert job.stop(grace_s=5) == "stopped"


def test_wait_ends_when_the_record_changes_not_at_the_next_poll(cleanup_jobs):
    # a poll spacing no test waits for: only the notification on the job's directory can end it
    job = L.launch(toy_args("steps=3", "step_s=0.2", nproc=None))
    cleanup_jobs.append(job)
    t0 = time.monotonic()
    assert job.wait(timeout=120, poll_s=3600) == "succeeded"
    assert time.monotonic() - t0 < 60
    assert job.record.ended_at is not None


def test_wait_still_ends_where_the_filesystem_never_notifies(cleanup_jobs, monkeypatch):
    import sys
    from pathlib import Path

    from tune_magic.logs import notify

    # tests/logs is on sys.path only once pytest collected a test module there: this file alone too
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "logs"))
    from test_notify import DeafBackend  # accepts every watch, never reports an event (NFS, Lustre)

    deaf = notify.Notifier(DeafBackend)
    monkeypatch.setattr(J, "get_notifier", lambda: deaf)
    job = L.launch(toy_args("steps=3", "step_s=0.2", nproc=None))
    cleanup_jobs.append(job)
    try:
        assert job.wait(timeout=120, poll_s=0.2) == "succeeded"
        assert deaf.watches == {}  # the wait's directory watch went with it
    finally:
        deaf.close()


def test_wait_keeps_its_timeout_whatever_the_poll_spacing(cleanup_jobs):
    import pytest

    job = L.launch(toy_args("steps=1000", "step_s=0.1", nproc=None))
    cleanup_jobs.append(job)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=f"job {job.id} still running after 0.5 s"):
        job.wait(timeout=0.5, poll_s=3600)
    assert time.monotonic() - t0 < 30  # not the hour of poll_s
    assert job.stop(grace_s=5) == "stopped"
