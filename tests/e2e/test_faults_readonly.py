"""A read-only TUNE_MAGIC_HOME that holds a finished job can be listed and read (tests/faults.py).

The job is real (the toy recipe, one process) and ran while the home was writable; each command
then runs in a child that sees the home as a read-only bind mount.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import faults
from jobhelpers import TOY_CONFIG, TOY_RECIPE

CLI = [sys.executable, "-m", "tune_magic"]


@pytest.fixture(scope="module")
def home_with_a_job():
    """(home, job id, log bytes): a TUNE_MAGIC_HOME holding one succeeded toy job."""
    home = Path(tempfile.mkdtemp(prefix="tune_magic_ro_home_"))
    env = {**os.environ, "TUNE_MAGIC_HOME": str(home)}
    r = subprocess.run([*CLI, "run", "--wait", "--name", "ro", str(TOY_RECIPE), "--config", str(TOY_CONFIG),
                        "steps=1", "step_s=0"], capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.splitlines()[0]
    listed = json.loads(subprocess.run([*CLI, "jobs", "--json"], capture_output=True, text=True, env=env,
                                       timeout=120).stdout)
    assert [(j["id"], j["status"]) for j in listed] == [(job_id, "succeeded")]
    log = Path(listed[0]["log_path"]).read_bytes()
    yield home, job_id, log
    shutil.rmtree(home)


def run_ro(home: Path, *args: str) -> faults.ChildResult:
    faults.require()
    return faults.run_readonly(home, [*CLI, *args], env={**os.environ, "TUNE_MAGIC_HOME": str(home)})


def test_jobs_lists_a_finished_job_on_a_read_only_home(home_with_a_job):
    home, job_id, _ = home_with_a_job
    r = run_ro(home, "jobs")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    assert [(row[0], row[1], row[2]) for row in rows] == [(job_id, "ro", "succeeded")]


def test_jobs_json_on_a_read_only_home(home_with_a_job):
    home, job_id, _ = home_with_a_job
    r = run_ro(home, "jobs", "--json")
    assert r.returncode == 0, r.stderr
    assert [(j["id"], j["status"]) for j in json.loads(r.stdout)] == [(job_id, "succeeded")]


def test_logs_of_a_finished_job_on_a_read_only_home(home_with_a_job):
    home, job_id, log = home_with_a_job
    r = run_ro(home, "logs", job_id)
    assert (r.returncode, r.stdout.encode("utf-8", "surrogateescape")) == (0, log), r.stderr


def test_ls_on_a_read_only_home(home_with_a_job):
    home, _, _ = home_with_a_job
    r = run_ro(home, "ls")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout.splitlines()[0].split() == ["RECIPE", "CONFIG"]
    assert "lora_finetune_distributed" in r.stdout and "tiny/builtin_lora" in r.stdout
