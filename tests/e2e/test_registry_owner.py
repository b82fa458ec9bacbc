"""Whose registry it is (issue 23), with a second local user made and removed by the fixture.

Another user who can write into your TUNE_MAGIC_HOME plants records naming a process of yours (pid
and start time copied from /proc, as an attacker would): your ``tune-magic stop --all``, ``stop``
and ``rm`` act on nothing of it, while your real jobs still stop. That user reading your registry
is told "permission denied", not "no job". A group project registry (setgid, umask 002) keeps
working, and a job of an earlier release (no token) still stops by pid and create time.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import psutil
import pytest

import tune_magic
from tune_magic.registry import owner as owners
from tune_magic.registry import store as jobstore

from jobhelpers import processes_mentioning, toy_args
from waiting import wait_for

TIMEOUT = 120


@pytest.fixture
def other_user():
    """A second local user (``useradd``), removed by name afterwards (``userdel``), even when the test fails."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to make a second local user")
    name = f"tmo{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                   capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture
def open_home(monkeypatch):
    """A TUNE_MAGIC_HOME another user can reach (mode 0755), this process's for the test."""
    home = Path(tempfile.mkdtemp(prefix="tm-owner-"))
    home.chmod(0o755)
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(home))
    yield home
    shutil.rmtree(home, ignore_errors=True)


# the venv's interpreter may sit in a directory only its owner reaches (pyenv under /root): the
# other user runs the system's Python of the same version with the venv's packages and this checkout
SYSTEM_PYTHON = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin:/bin")
PACKAGES = os.pathsep.join([sysconfig.get_paths()["purelib"], str(Path(tune_magic.__file__).resolve().parents[1])])


def _as(user, *args):
    """Run ``python ARGS`` as ``user`` (its own uid, gid and no other groups), text output captured."""
    if SYSTEM_PYTHON is None:
        pytest.skip(f"no python{sys.version_info.major}.{sys.version_info.minor} in /usr/bin for the other user")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TUNE_MAGIC_HOME": os.environ["TUNE_MAGIC_HOME"],
           "PYTHONPATH": PACKAGES}
    return subprocess.run([SYSTEM_PYTHON, *args], user=user.pw_uid, group=user.pw_gid, extra_groups=[], env=env,
                          cwd="/tmp", capture_output=True, text=True, timeout=60)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tune_magic", *args], capture_output=True, text=True, timeout=TIMEOUT)


PLANT = r"""
import json, os, sys
jobs, job_id, pid, ctime, token = sys.argv[1:6]
d = os.path.join(jobs, job_id)
os.mkdir(d)
ref = {"pid": int(pid), "create_time": float(ctime), "rank": None}
record = {"id": job_id, "name": "planted", "argv": ["sleep", "600"], "env": {}, "cwd": "/",
          "log_path": os.path.join(d, "output.log"), "started_at": float(ctime), "status": "running",
          "scheduler": "local", "supervisor": ref, "agent": ref, "workers": [dict(ref, rank=0)], "schema": 3}
if token != "-":
    record["env"]["TUNE_MAGIC_JOB_TOKEN"] = token
with open(os.path.join(d, "record.json"), "w") as f:
    json.dump(record, f)
with open(os.path.join(d, "procs.json"), "w") as f:
    json.dump({"supervisor": ref, "agent": ref, "workers": [dict(ref, rank=0)], "scheduler": "local"}, f)
"""


def test_a_planted_record_names_nothing_a_stop_may_kill(other_user, open_home, cleanup_jobs):
    real = tune_magic.launch(toy_args("steps=100000", "step_s=0.2", nproc=None), name="mine")
    cleanup_jobs.append(real)
    wait_for(lambda: real.summary().step, timeout=TIMEOUT, interval=0.2, what="a step of the real job")
    victim = subprocess.Popen(["sleep", "600"])  # any process of yours: an editor, a notebook server...
    try:
        ctime = psutil.Process(victim.pid).create_time()
        jobs = open_home / "jobs"
        jobs.chmod(0o777)  # a registry others may write into, whatever the reason
        planted = {"20261201-000000-aaaaaa": "-",  # as a record of an earlier release: no token
                   "20261201-000000-bbbbbb": "20261201-000000-bbbbbb." + "0" * 32,  # a made-up token
                   "20261201-000000-cccccc": real.record.env[owners.TOKEN_ENV]}  # a real job's token, copied
        for job_id, token in planted.items():
            r = _as(other_user, "-c", PLANT, str(jobs), job_id, str(victim.pid), repr(ctime), token)
            assert r.returncode == 0, r.stderr
            assert os.stat(jobs / job_id / "record.json").st_uid == other_user.pw_uid
        r = _cli("stop", "--grace", "1", "--all")
        assert r.returncode == 0, r.stderr
        assert f"{jobs} is writable by its group and every user: others can plant job records there" in r.stderr
        assert f"{real.id} stopped" in r.stdout.splitlines()
        assert victim.poll() is None and psutil.Process(victim.pid).status() != psutil.STATUS_ZOMBIE
        for job_id in planted:
            r = _cli("stop", "--grace", "1", job_id)
            assert r.returncode == 0 and victim.poll() is None, (r.stdout, r.stderr)
            assert tune_magic.get_job(job_id).status in ("stopped", "unknown")  # nothing of it ran
            r = _cli("rm", job_id)  # nothing of ours runs for it: it can go
            assert r.returncode == 0 and not (jobs / job_id).exists() and victim.poll() is None, r.stderr
        assert real.status == "stopped" and processes_mentioning(real.id) == []
    finally:
        victim.kill()
        victim.wait()


def test_another_user_reading_your_registry_is_told_permission_denied(other_user, open_home):
    d = jobstore.jobs_root() / "20261201-000000-dddddd"
    jobstore.create(jobstore.JobRecord(id=d.name, name="private", argv=["x"], env={}, cwd="/",
                                       log_path=str(d / "output.log"), started_at=time.time(), status="succeeded"))
    assert (open_home / "jobs").stat().st_mode & 0o777 == 0o700
    for args in (("logs", d.name), ("stop", d.name), ("rm", d.name)):
        r = _as(other_user, "-m", "tune_magic", *args)
        assert r.returncode == 2 and "permission denied" in r.stderr and "no job" not in r.stderr, (args, r.stderr)
    r = _as(other_user, "-m", "tune_magic", "jobs")
    assert r.returncode == 2 and "Permission denied" in r.stderr, r.stderr
    assert d.exists()


def test_a_group_project_registry_keeps_working_without_a_warning(open_home, cleanup_jobs):
    project = open_home / "project"
    project.mkdir()
    project.chmod(0o2775)  # setgid, group-writable: a shared project directory
    old = os.umask(0o002)
    try:
        os.environ["TUNE_MAGIC_HOME"] = str(project / "tm")
        job = tune_magic.launch(toy_args("steps=100000", "step_s=0.2", nproc=None))
        cleanup_jobs.append(job)
        wait_for(lambda: job.summary().step, timeout=TIMEOUT, interval=0.2, what="a step")
        (project / "tm" / "jobs").chmod(0o2770)  # the group may write: trusted by design, no warning
        r = _cli("stop", "--grace", "1", "--all")
        assert r.returncode == 0 and r.stdout.split() == [job.id, "stopped"], (r.stdout, r.stderr)
        assert "writable by" not in r.stderr
    finally:
        os.umask(old)


def test_a_job_of_an_earlier_release_without_a_token_still_stops(open_home, cleanup_jobs):
    job = tune_magic.launch(toy_args("steps=100000", "step_s=0.2", nproc=None))
    cleanup_jobs.append(job)
    wait_for(lambda: job.summary().step, timeout=TIMEOUT, interval=0.2, what="a step")
    with jobstore.locked(job.dir) as record:  # what an earlier release wrote: no token anywhere
        record.env.pop(owners.TOKEN_ENV)
    procs = json.loads((job.dir / jobstore.PROCS).read_text())
    procs.pop("token")
    (job.dir / jobstore.PROCS).write_text(json.dumps(procs))
    agent = job.record.agent
    assert job.stop(grace_s=2) == "stopped"
    assert not psutil.pid_exists(agent.pid) or psutil.Process(agent.pid).create_time() != agent.create_time
