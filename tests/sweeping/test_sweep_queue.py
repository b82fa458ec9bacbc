"""The queue's logic (tune_magic.sweeping.runner.Runner, process.needs_runner) on a registry of its own,
without starting a job: which trials a sweep process adopts, which slots are held, when a trial
waits, is refused, or is never started. The real sweep process runs in tests/e2e/test_sweeps.py."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import psutil
import pytest

from tune_magic.registry import store as jobstore
from tune_magic.sweeping import store as sweepstore
from tune_magic.registry.store import JobRecord, ProcessRef
from tune_magic.sweeping.record import NOT_STARTED, QUEUED, STARTED, SweepRecord, TrialState
from tune_magic.sweeping import start as process
from tune_magic.sweeping.runner import Runner

from jobhelpers import TOY_CONFIG, TOY_RECIPE, write_fake_nvidia_smi

SWEEP_ID = "sweep-20261201-100000-abcdef"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A registry of this test's own (TUNE_MAGIC_HOME), with its jobs/ and sweeps/ folders."""
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path))
    jobstore.jobs_root()
    sweepstore.sweeps_root(create=True)
    return tmp_path


def make_sweep(home: Path, n: int = 4, slots=(None, None), config: Path = TOY_CONFIG, **changes) -> Path:
    d = sweepstore.sweeps_root() / SWEEP_ID
    d.mkdir()
    rec = SweepRecord(id=SWEEP_ID, name="grid", created_at=time.time(), cwd=str(home),
                      args=[str(TOY_RECIPE), "--config", str(config), "steps=1", "start_loss=" + ",".join(
                          str(i + 1) for i in range(n))],
                      axes=[{"key": "start_loss", "texts": [str(i + 1) for i in range(n)], "position": 4}],
                      trials=[TrialState(index=i, name=f"start_loss={i + 1}", words=[f"start_loss={i + 1}"])
                              for i in range(n)], slots=[list(s) if s else None for s in slots], **changes)
    sweepstore.write(d, rec)
    sweepstore.write_env(d, dict(os.environ))
    return d


def make_job(job_id: str, trial: int | None, status: str, *, sweep_id: str = SWEEP_ID, gpus=None,
             slot: int | None = None) -> Path:
    """A job record in the registry (a trial of the sweep when ``trial`` is given)."""
    me = psutil.Process()
    rec = JobRecord(id=job_id, name=f"trial {trial}", argv=["python", "x.py"], env={}, cwd="/", log_path="/dev/null",
                    started_at=time.time(), status=status, gpus=gpus, physical_gpus=gpus,
                    supervisor=ProcessRef(me.pid, me.create_time()), agent=ProcessRef(me.pid, 0.0),
                    sweep=None if trial is None else {"id": sweep_id, "trial": trial, "name": "grid", "slot": slot})
    return jobstore.create(rec)


@pytest.fixture
def held_locks():
    """Supervisor locks this test holds, as a live job's supervisor would (so the job counts as live)."""
    fds = []

    def hold(job_dir: Path) -> None:
        fd = os.open(job_dir / jobstore.SUPERVISOR_LOCK, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        fds.append(fd)

    yield hold
    for fd in fds:
        os.close(fd)


def test_a_new_sweep_process_adopts_the_jobs_a_killed_one_registered_and_never_starts_them_again(home):
    d = make_sweep(home)
    make_job("20261201-100001-aaaaaa", 1, "succeeded", slot=1)  # registered, then the old process died
    make_job("20261201-100002-bbbbbb", 2, "succeeded", sweep_id="sweep-20261201-100000-other0")  # another sweep
    make_job("20261201-100003-cccccc", None, "succeeded")  # a plain job
    runner = Runner(d)
    runner.adopt()
    rec = sweepstore.read(d)
    assert [(t.status, t.job_id, t.slot) for t in rec.trials] == [
        (QUEUED, None, None), (STARTED, "20261201-100001-aaaaaa", 1), (QUEUED, None, None), (QUEUED, None, None)]
    assert runner.start(1, 0) == "skipped"  # started already: never a second job for it


def test_slots_are_held_by_live_trials_only(home, held_locks):
    d = make_sweep(home)
    live = make_job("20261201-100001-aaaaaa", 0, "running", slot=1)
    held_locks(live)
    make_job("20261201-100002-bbbbbb", 1, "succeeded", slot=0)
    with sweepstore.locked(d) as rec:
        for t, job_id, slot in ((rec.trials[0], "20261201-100001-aaaaaa", 1), (rec.trials[1], "20261201-100002-bbbbbb", 0)):
            t.status, t.job_id, t.slot = STARTED, job_id, slot
    runner = Runner(d)
    assert runner.live_slots(sweepstore.read(d)) == {1: 0}
    assert runner.ended == {1}  # an ended trial is never looked at again


def test_a_stopped_sweep_starts_nothing(home):
    d = make_sweep(home, stop_requested_at=time.time())
    assert Runner(d).start(0, 0) == "stopped"
    assert sweepstore.read(d).trials[0].status == QUEUED
    assert not process.needs_runner(sweepstore.read(d))


def test_a_trial_the_launch_refuses_is_not_started_with_the_reason_and_the_queue_goes_on(home):
    config = home / "gone.yaml"
    config.write_text(TOY_CONFIG.read_text())
    d = make_sweep(home, config=config)
    config.unlink()  # after the sweep was checked: every trial's launch now refuses it
    assert Runner(d).start(0, 0) == "failed"
    trial = sweepstore.read(d).trials[0]
    assert trial.status == NOT_STARTED and "gone.yaml" in trial.error
    assert [t.status for t in sweepstore.read(d).trials[1:]] == [QUEUED] * 3
    assert jobstore.list_records() == []  # nothing registered for it


def test_a_trial_whose_gpus_another_live_job_holds_waits_saying_why_with_FAKE_gpus(home, held_locks, monkeypatch):
    write_fake_nvidia_smi(home / "bin", 2)
    monkeypatch.setenv("PATH", f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    d = make_sweep(home, slots=([0], [1]))
    sweepstore.write_env(d, dict(os.environ))
    other = make_job("20261201-100001-aaaaaa", None, "running", gpus=[0])  # not of this sweep, whoever launched it
    held_locks(other)
    runner = Runner(d)
    assert runner.start(0, 0) == "busy"
    trial = sweepstore.read(d).trials[0]
    assert trial.status == QUEUED and "GPU 0 is used by running job 20261201-100001-aaaaaa" in trial.waiting
    assert [r.id for r in jobstore.list_records()] == ["20261201-100001-aaaaaa"]  # nothing registered


def test_needs_runner():
    base = dict(id=SWEEP_ID, name="g", created_at=1.0, cwd="/", args=["r", "--config", "c", "a=1,2"],
                axes=[{"key": "a", "texts": ["1", "2"], "position": 3}],
                trials=[TrialState(0, "a=1", ["a=1"]), TrialState(1, "a=2", ["a=2"])])
    assert process.needs_runner(SweepRecord(**base))
    assert not process.needs_runner(SweepRecord(**base, done_at=2.0))
    assert not process.needs_runner(SweepRecord(**base, stop_requested_at=2.0))
    assert not process.needs_runner(SweepRecord(**base, engine={"array": "7"}))  # the engine runs it
    started = SweepRecord(**base)
    for t in started.trials:
        t.status, t.job_id = STARTED, "x"
    assert not process.needs_runner(started)


def test_revive_takes_the_lock_so_a_sweep_never_gets_two_processes(home):
    d = make_sweep(home, stop_requested_at=None)
    fd = os.open(d / sweepstore.RUNNER_LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live sweep process
    try:
        assert sweepstore.runner_alive(d)
        assert not process.revive(d) and process.revive_all() == []
    finally:
        os.close(fd)
    # stopped: nothing to start again
    with sweepstore.locked(d) as rec:
        rec.stop_requested_at = time.time()
    assert not process.revive(d)


def test_listings_start_no_process_and_revive_is_the_step_that_does(home, tmp_path):
    # the sweep's interpreter is a script that only says it was started: a real process, no trials
    started = tmp_path / "started.txt"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho \"$@\" >> {started}\n")
    python.chmod(0o755)
    d = make_sweep(home, python=str(python))
    assert process.needs_runner(sweepstore.read(d))

    import tune_magic
    from tune_magic.sweeping.sweep import Sweep

    tune_magic.jobs()
    (listed,) = tune_magic.sweeps()
    got = tune_magic.get_sweep(SWEEP_ID)
    assert (listed.id, got.status, len(got.trials)) == (SWEEP_ID, "running", 4)
    Sweep(d).refresh()
    time.sleep(0.3)
    assert not started.exists(), "a listing started the sweep process"

    assert tune_magic.revive_sweeps() == [SWEEP_ID]
    deadline = time.monotonic() + 10
    while not (started.exists() and started.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.05)  # the shell creates the file before it writes the line
    assert started.read_text().split()[:3] == ["-m", "tune_magic.sweeping.runner", str(d)]
    # a Sweep object looks at most every REVIVE_CHECK_S: a second call at once starts nothing
    sweep = Sweep(d)
    assert sweep.revive() is True and sweep.revive() is False
