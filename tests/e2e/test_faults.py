"""Faults that must lose nothing: our own processes dying, the registry damaged or deleted.

Every test uses real torchrun jobs of the stand-in recipe (tests/recipes/toy_recipe.py: real
workers with a gloo process group, no model) and real signals.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import psutil
import pytest

import tune_magic.job as J
import tune_magic.job.launch as L
from tune_magic import faultpoints
from tune_magic.registry import store as jobstore
from tune_magic.schedulers.local import procs

import waiting
from jobhelpers import registry_problem, toy_args

TIMEOUT = 120


#: this file's waits: 60 s deadlines unless a test says less, polled every 50 ms
wait_for = partial(waiting.wait_for, timeout=60, interval=0.05)


def started(job: J.Job, n: int = 2) -> J.Job:
    wait_for(lambda: len(job.refresh().record.workers) >= n and job.record.rendezvous_endpoint,
             what=f"{n} workers of {job.id}", describe=lambda: job.tail(10))
    return job


def members(job: J.Job) -> list[int]:
    """Pids of every live process in the job's sessions (agent and each worker)."""
    r = job.record
    return sorted(p.pid for p in procs.job_processes(r.agent, r.workers))


def rank_children(job: J.Job) -> list[int]:
    kids = []
    for w in job.record.workers:
        try:
            kids += [c.pid for c in psutil.Process(w.pid).children()]
        except psutil.Error:
            pass
    return kids


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tune_magic", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=env)


def test_supervisor_killed_job_finishes_and_its_outcome_survives(cleanup_jobs):
    job = started(L.launch(toy_args("steps=12", "step_s=0.25")))
    cleanup_jobs.append(job)
    os.kill(job.record.supervisor.pid, signal.SIGKILL)
    assert job.wait(TIMEOUT) == "succeeded"
    assert job.returncode == 0 and job.error is None
    on_disk = jobstore.read(job.dir)  # a reader recorded it: a new process sees the same
    assert (on_disk.status, on_disk.returncode) == ("succeeded", 0)
    assert members(job) == []


def test_agent_sigkilled_workers_and_their_children_do_not_outlive_it(cleanup_jobs):
    job = started(L.launch(toy_args("steps=1000", "step_s=0.1", "spawn_sleep=true")))
    cleanup_jobs.append(job)
    sleeps = wait_for(lambda: len(rank_children(job)) >= 2 and rank_children(job), what="ranks' children")
    os.kill(job.pid, signal.SIGKILL)
    assert job.wait(TIMEOUT) == "failed"
    assert job.returncode == -9
    assert "SIGKILL" in job.error
    assert members(job) == []
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in sleeps)
    assert job.stop(grace_s=1) == "failed"  # a terminal status is never left


def test_stop_kills_ranks_that_ignore_sigterm_and_their_children(cleanup_jobs):
    job = started(L.launch(toy_args("steps=1000", "step_s=0.1", "ignore_sigterm=true", "spawn_sleep=true")))
    cleanup_jobs.append(job)
    wait_for(lambda: len(rank_children(job)) >= 2, what="ranks' children")
    assert len(members(job)) >= 5  # agent, 2 ranks, 2 sleeps
    assert job.stop(grace_s=2) == "stopped"
    assert job.returncode is not None  # a stopped job keeps its exit code
    assert members(job) == []


def test_orphans_without_supervisor_or_agent_are_still_stopped(cleanup_jobs):
    """Supervisor and wrapper SIGKILLed, then the agent: the workers run on with nobody watching;
    stop still finds them by session, and the outcome is stopped."""
    job = started(L.launch(toy_args("steps=1000", "step_s=0.1")))
    cleanup_jobs.append(job)
    wrapper = psutil.Process(job.pid).ppid()
    os.kill(job.record.supervisor.pid, signal.SIGKILL)
    os.kill(wrapper, signal.SIGKILL)
    os.kill(job.pid, signal.SIGKILL)
    time.sleep(0.5)
    workers = [w.pid for w in job.record.workers]
    assert all(psutil.pid_exists(p) for p in workers)
    assert job.status == "running"  # processes of it live: never a false failed
    assert job.stop(grace_s=2) == "stopped"
    assert members(job) == []


def test_nothing_left_and_no_exit_code_is_outcome_unknown(cleanup_jobs):
    job = started(L.launch(toy_args("steps=1000", "step_s=0.1")))
    cleanup_jobs.append(job)
    wrapper = psutil.Process(job.pid).ppid()
    everything = [job.record.supervisor.pid, wrapper, *members(job)]
    for pid in everything:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: job.refresh().status != "running", timeout=30, what="status change")
    assert job.status == "unknown"
    assert job.status.label == "outcome unknown"
    assert "outcome unknown" in cli("jobs").stdout
    assert json.loads(cli("jobs", "--json").stdout)[-1]["status"] == "unknown"
    # the exit code turns up later (e.g. a slow filesystem): unknown settles
    (job.dir / jobstore.EXIT_CODE).write_text(json.dumps({"returncode": 0, "ended_at": time.time()}))
    job._checked = 0.0
    assert job.status == "succeeded"


def test_damaged_record_never_makes_a_live_job_unstoppable(cleanup_jobs):
    job = started(L.launch(toy_args("steps=1000", "step_s=0.1")))
    cleanup_jobs.append(job)
    record = job.dir / jobstore.RECORD
    record.write_text(record.read_text()[:40])  # truncated
    # at once, before the supervisor repairs it:
    r = cli("rm", job.id)
    assert r.returncode == 2 and "stop it first" in r.stderr
    assert job.dir.exists()
    same = J.get_job(job.id)
    assert members(same) != []
    # the supervisor rewrites it within a couple of seconds
    wait_for(lambda: not J.Job(job.dir).damaged, timeout=5, what="the record's repair")
    assert jobstore.read(job.dir).status == "running"
    record.write_text("{")
    r = cli("stop", "--all")
    assert r.returncode == 0 and f"{job.id} stopped" in r.stdout, (r.stdout, r.stderr)
    assert members(job) == []
    assert cli("rm", job.id).returncode == 0


def test_deleted_job_directory_is_recreated_and_the_job_stays_stoppable(cleanup_jobs):
    job = started(L.launch(toy_args("steps=1000", "step_s=0.1", "lines_per_step=1")))
    cleanup_jobs.append(job)
    shutil.rmtree(job.dir)
    t0 = time.monotonic()
    wait_for(lambda: (job.dir / jobstore.RECORD).exists(), timeout=5, what="the directory's return")
    assert time.monotonic() - t0 < 5
    assert job.id in [j.id for j in J.jobs()]
    again = J.get_job(job.id)
    assert again.record.log_lost_at is not None and again.status == "running"
    log = Path(again.log_path)
    wait_for(lambda: "filler line" in log.read_text(), timeout=10, what="new log lines")
    assert "the log before this moment is gone" in log.read_text().splitlines()[0]
    assert again.stop(grace_s=2) == "stopped"
    assert members(again) == []


LAUNCHER = """
import sys
import tune_magic.job as J
import tune_magic.job.launch as L
from tune_magic import faultpoints
L.launch(sys.argv[1])
"""


def _registry_is_consistent(root: Path) -> str | None:
    """None when every job directory has a record and every live record has a live process."""
    return registry_problem(root)


def _check_within_5s(root: Path, what: str) -> None:
    wait_for(lambda: _registry_is_consistent(root) is None, timeout=5, interval=0.1,
             what=f"a consistent registry: {what}", describe=lambda: _registry_is_consistent(root))


def test_launcher_killed_at_any_moment_leaves_a_consistent_registry(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(home))
    env = {**os.environ, "TUNE_MAGIC_HOME": str(home)}
    args = toy_args("steps=2", "step_s=0.05", nproc=None)
    root = home / "jobs"
    # at each step boundary, through the test hook
    for step in faultpoints.LAUNCH_STEPS:
        p = subprocess.run([sys.executable, "-c", LAUNCHER, args], env={**env, faultpoints.KILL_ENV: step},
                           capture_output=True, timeout=TIMEOUT)
        assert p.returncode == -signal.SIGKILL, (step, p.stderr[-2000:])
        _check_within_5s(root, f"killed at step {step}")
    # at 30 moments spread over one launch
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", LAUNCHER, args], env=env, check=True, timeout=TIMEOUT)
    one = time.monotonic() - t0
    for i in range(30):
        p = subprocess.Popen([sys.executable, "-c", LAUNCHER, args], env=env, stderr=subprocess.DEVNULL)
        time.sleep(one * (i + 0.5) / 30)
        p.kill()
        p.wait()
        _check_within_5s(root, f"killed {one * (i + 0.5) / 30:.3f} s into a {one:.2f} s launch")
    for d in root.iterdir():  # let the survivors finish (two short steps each)
        if not d.name.startswith("."):
            J.Job(d).wait(TIMEOUT)


def test_pathological_records_never_break_listings_stop_logs_or_rm(cleanup_jobs):
    good = L.launch(toy_args("steps=2", nproc=None))
    cleanup_jobs.append(good)
    assert good.wait(TIMEOUT) == "succeeded"
    root = good.dir.parent
    bad = {"deep": "[" * 50_000 + "]" * 50_000,
           "huge": json.dumps({**good.record.to_dict(), "id": "huge"}).replace(
               f'"started_at": {json.dumps(good.record.started_at)}', '"started_at": 1' + "0" * 400)}
    for name, text in bad.items():
        (root / name).mkdir()
        (root / name / jobstore.RECORD).write_text(text)
    try:
        r = cli("jobs")
        assert r.returncode == 0 and good.id in r.stdout
        skipped = [line for line in r.stderr.splitlines() if "skipped" in line]
        assert len(skipped) == 2 and any("deep" in s for s in skipped) and any("huge" in s for s in skipped)
        assert cli("jobs", "--json").returncode == 0
        assert cli("stop", "--all").returncode == 0
        assert "toy recipe done" in cli("logs", good.id).stdout
        for name in bad:
            assert cli("rm", name).returncode == 0
            assert not (root / name).exists()
    finally:
        for name in bad:
            shutil.rmtree(root / name, ignore_errors=True)


def test_planted_symlinks_never_make_files_outside_the_registry(tmp_path, cleanup_jobs):
    home = tmp_path / "home"
    outside = tmp_path / "outside"
    outside.mkdir()
    env = {**os.environ, "TUNE_MAGIC_HOME": str(home)}
    (home / "jobs").mkdir(parents=True)
    (home / "jobs" / jobstore.LAUNCH_LOCK).symlink_to(outside / "launch-victim")
    r = cli("run", *toy_args("steps=2", nproc=None).split(), env=env)
    assert r.returncode == 0, r.stderr  # the link itself was replaced by a real lock file, never followed
    assert not (outside / "launch-victim").exists()
    assert not (home / "jobs" / jobstore.LAUNCH_LOCK).is_symlink()
    # a running job's record.lock replaced by a link: the job still ends recorded, nothing outside
    job = started(L.launch(toy_args("steps=8", "step_s=0.2", nproc=1), env=env), 1)
    cleanup_jobs.append(job)
    (job.dir / jobstore.LOCK).unlink()
    (job.dir / jobstore.LOCK).symlink_to(outside / "lock-victim")
    assert J.Job(job.dir).wait(TIMEOUT) == "succeeded"
    assert not (outside / "lock-victim").exists()
    # a job directory that is a link is refused by name, and rm never follows it
    (outside / "evil").mkdir()
    (outside / "evil" / jobstore.RECORD).write_text(json.dumps({**job.record.to_dict(), "id": "evil"}))
    (home / "jobs" / "evil").symlink_to(outside / "evil")
    for args in (["rm", "evil"], ["stop", "evil"], ["logs", "evil"]):
        r = cli(*args, env=env)
        assert r.returncode == 2 and "symbolic link" in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert (outside / "evil" / jobstore.RECORD).exists()


def test_home_and_jobs_may_be_symlinks(tmp_path, cleanup_jobs):
    real = tmp_path / "scratch" / "tm"
    real.mkdir(parents=True)
    (tmp_path / "cache").symlink_to(real)
    env = {**os.environ, "TUNE_MAGIC_HOME": str(tmp_path / "cache")}
    job = L.launch(toy_args("steps=2", nproc=None), env=env)
    cleanup_jobs.append(job)
    assert job.wait(TIMEOUT) == "succeeded"
    assert (real / "jobs" / job.id / jobstore.RECORD).exists()
    r = cli("jobs", env=env)
    assert r.returncode == 0 and job.id in r.stdout


def test_per_job_output_dir_is_private(tmp_path, cleanup_jobs):
    job = L.launch(toy_args("steps=1", nproc=None))
    cleanup_jobs.append(job)
    assert Path(job.output_dir).name == job.id
    assert (os.stat(job.output_dir).st_mode & 0o777) == 0o700
    assert job.wait(TIMEOUT) == "succeeded"
    mine = tmp_path / "mine"
    own = L.launch(toy_args("steps=1", f"output_dir={mine}", nproc=None))
    cleanup_jobs.append(own)
    assert own.wait(TIMEOUT) == "succeeded"
    umask = os.umask(0)
    os.umask(umask)
    assert (os.stat(mine).st_mode & 0o777) == 0o777 & ~umask  # the recipe made it; we left it alone


def test_stop_with_record_and_procs_file_both_damaged_still_stops_it(cleanup_jobs):
    job = started(L.launch(toy_args("steps=1000", "step_s=0.1")))
    cleanup_jobs.append(job)
    record = job.dir / jobstore.RECORD
    record.unlink()
    record.mkdir()  # the supervisor cannot even rewrite it
    (job.dir / jobstore.PROCS).write_text("garbage")
    t0 = time.monotonic()
    r = cli("stop", "--grace", "2", job.id)
    assert r.returncode == 0 and r.stdout.split() == [job.id, "stopped"], (r.stdout, r.stderr)
    assert time.monotonic() - t0 < 20
    assert members(job) == []


def test_a_job_that_ends_by_itself_after_a_stop_was_asked_is_stopped_with_its_exit_code(cleanup_jobs):
    # the outcome rule: a stop asked before the end is stopped (its exit code kept) unless the log
    # showed the run finished (last planned step and its save) when the stop was asked
    job = started(L.launch(toy_args("steps=6", "step_s=0.2")))
    cleanup_jobs.append(job)
    (job.dir / jobstore.STOP_REQUESTED).touch()  # a stop that never reached a process
    assert job.wait(TIMEOUT) == "stopped" and job.returncode == 0 and job.error is None


def test_a_planted_exit_code_never_ends_a_running_job(cleanup_jobs):
    job = started(L.launch(toy_args("steps=1000", "step_s=0.1")))
    cleanup_jobs.append(job)
    (job.dir / jobstore.EXIT_CODE).write_text(json.dumps({"returncode": 0, "ended_at": 1.0}))
    job._checked = 0.0
    assert job.status == "running"
    assert cli("stop", "--all").returncode == 0
    assert J.get_job(job.id).status == "stopped" and members(job) == []


def test_a_killed_exit_wrapper_is_not_blamed_on_the_job(cleanup_jobs):
    job = started(L.launch(toy_args("steps=15", "step_s=0.2")))
    cleanup_jobs.append(job)
    wrapper = psutil.Process(job.pid).ppid()
    os.kill(wrapper, signal.SIGKILL)
    assert job.wait(TIMEOUT) == "succeeded", (job.error, job.tail(10))
    assert job.returncode == 0 and "toy recipe done" in job.tail(3)


def test_stop_from_a_read_only_view_of_the_home_is_stopped(tmp_path):
    import faults

    faults.require()
    home = tmp_path / "home"
    env = {**os.environ, "TUNE_MAGIC_HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "tune_magic", "run", *toy_args("steps=1000", "step_s=0.1").split()],
                       env=env, capture_output=True, text=True, timeout=TIMEOUT)
    job_id = r.stdout.strip()
    job = started(J.Job(home / "jobs" / job_id))
    try:
        with faults.MountNamespace(readonly=[home]) as ns:
            out = ns.run([sys.executable, "-m", "tune_magic", "stop", "--grace", "2", job_id], env=env)
            assert out.returncode == 0 and out.stdout.split() == [job_id, "stopped"], (out.stdout, out.stderr)
        assert J.Job(home / "jobs" / job_id).wait(30) == "stopped"
    finally:
        J.Job(home / "jobs" / job_id).stop(grace_s=1)
