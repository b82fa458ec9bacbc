"""What `tune-magic jobs` and `tune-magic logs` print for real (toy recipe) jobs: hostile names stay
in their cell, and a 200 MB log streams through a bounded amount of memory."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tune_magic
from tune_magic.ui.cli import CHUNK_BYTES

from jobhelpers import toy_args
from waiting import wait_for

CLI = [sys.executable, "-m", "tune_magic"]
TIMEOUT = 180
BIG = 200 * 1024 * 1024  # bytes added to the log
# Runs a command and reports its peak RSS (KiB, ru_maxrss of the waited child) on stderr's last line.
MEASURE = ("import resource, subprocess, sys\n"
           "rc = subprocess.call(sys.argv[1:])\n"
           "sys.stderr.write(f'\\nMAXRSS_KIB={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n')\n"
           "sys.exit(rc)\n")


@pytest.fixture
def launched():
    jobs = []
    yield jobs
    for job in jobs:
        job.stop(grace_s=2)
        tune_magic.job.remove(job.id)


def finished_toy_job(launched, name=None, *overrides):
    job = tune_magic.launch(toy_args("steps=1", "step_s=0", *overrides, nproc=None), name=name)
    launched.append(job)
    wait_for(lambda: job.status != "running", timeout=TIMEOUT, what=f"job {job.id} to end")
    assert job.status == "succeeded", job.record.error
    return job


def test_jobs_table_escapes_control_characters_and_cuts_long_names(launched):
    name = "a\nb\tc\x00d\x1b[31m\u202e" + "x" * 60
    job = finished_toy_job(launched, name)
    r = subprocess.run([*CLI, "jobs"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if job.id in line]
    assert len(rows) == 1  # the name did not break the row
    shown = "a\\nb\\tc\\x00d\\x1b[31m\\u202e" + "x" * 14 + "…"  # 40 characters of escaped name, then …
    assert len(shown) == 41
    assert rows[0].split()[1] == shown
    assert "\x1b" not in r.stdout and "\x00" not in r.stdout and "\u202e" not in r.stdout
    listed = json.loads(subprocess.run([*CLI, "jobs", "--json"], capture_output=True, text=True, timeout=120).stdout)
    assert [j["name"] for j in listed if j["id"] == job.id] == [name]  # --json keeps the whole name


def measured(argv: list[str]) -> tuple[int, int, str, str]:
    """Run ``argv``; return (peak RSS in bytes, stdout bytes, stdout sha256, stderr without the report)."""
    proc = subprocess.Popen([sys.executable, "-c", MEASURE, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    digest, size = hashlib.sha256(), 0
    while chunk := proc.stdout.read(1 << 20):
        digest.update(chunk)
        size += len(chunk)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=TIMEOUT) == 0, err
    body, _, report = err.rstrip().rpartition("\n")
    assert report.startswith("MAXRSS_KIB="), err
    return int(report.split("=")[1]) * 1024, size, digest.hexdigest(), body


def file_digest(path: str) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def grow(path: str, extra: int) -> None:
    """Add ``extra`` bytes to a log quickly: a sparse run of zeros, then one text line."""
    with open(path, "ab") as f:
        f.truncate(os.path.getsize(path) + extra)
    with open(path, "ab") as f:
        f.write(b"\nlast line after the big gap\n")


def test_logs_streams_a_200_mb_log_in_bounded_memory(launched):
    job = finished_toy_job(launched)
    small_peak, small_size, small_sha, _ = measured([*CLI, "logs", job.id])
    assert (small_size, small_sha) == file_digest(job.log_path) and small_size > 0
    grow(job.log_path, BIG)
    peak, size, sha, _ = measured([*CLI, "logs", job.id])
    assert (size, sha) == file_digest(job.log_path) and size > BIG
    # the anchor is the same command on the small log: memory must not grow with the log
    assert peak - small_peak < 8 * CHUNK_BYTES, (peak, small_peak)
    assert peak < BIG // 4


def test_logs_follow_streams_a_200_mb_log_of_a_running_job_in_bounded_memory(launched):
    anchor = finished_toy_job(launched)
    small_peak, *_ = measured([*CLI, "logs", "-f", anchor.id])
    job = tune_magic.launch(toy_args("steps=4", "step_s=1", nproc=None))
    launched.append(job)
    wait_for(lambda: Path(job.log_path).exists(), timeout=TIMEOUT, what="the log to appear")
    grow(job.log_path, BIG)
    assert job.status == "running"
    peak, size, sha, _ = measured([*CLI, "logs", "-f", job.id])
    assert job.status == "succeeded"  # -f returned because the job ended...
    assert (size, sha) == file_digest(job.log_path) and size > BIG  # ...and printed all of it
    assert peak - small_peak < 8 * CHUNK_BYTES, (peak, small_peak)


NOT_A_LOG = ("the job's log {log} is {what}, not a regular file: tune_magic writes a regular file there, so something "
             "else replaced it; refusing to read it (links are never followed inside the job registry)")


@pytest.mark.parametrize("kind,what", [("symlink", "a symbolic link"), ("fifo", "a FIFO")])
def test_logs_and_metrics_read_only_a_regular_log(kind, what, launched, tmp_path):
    """A link at output.log is never followed (nothing outside the registry is printed) and a FIFO
    never blocks: logs, logs -f and metrics say what is there, exit 2."""
    job = finished_toy_job(launched)
    log = Path(job.log_path)
    secret = tmp_path / "secret"
    secret.write_text("SECRET LINE\n")
    log.unlink()
    if kind == "symlink":
        log.symlink_to(secret)
    else:
        os.mkfifo(log)
    for args in (["logs", job.id], ["logs", "-f", job.id], ["metrics", job.id]):
        r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (args, r)
        assert "SECRET" not in r.stdout + r.stderr and "Traceback" not in r.stderr
        assert r.stderr.strip().splitlines() == [f"tune-magic {args[0]}: error: " + NOT_A_LOG.format(log=log, what=what)]


def test_run_wait_stops_following_a_log_replaced_by_a_link(launched, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("SECRET LINE\n")
    p = subprocess.Popen([*CLI, "run", "--wait", *toy_args("steps=200", "step_s=0.1", nproc=None).split()],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job = tune_magic.get_job(p.stdout.readline().strip())
        launched.append(job)
        log = Path(job.log_path)
        wait_for(lambda: "Loss" in log.read_text(), timeout=TIMEOUT, what=f"job {job.id} to log a step")
        link = log.with_name("link.tmp")
        link.symlink_to(secret)
        os.replace(link, log)  # the job still writes to the file it opened; the name is a link now
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 2
    assert "SECRET" not in out + err and "Traceback" not in err
    assert err.strip().splitlines()[-1] == "tune-magic run: error: " + NOT_A_LOG.format(log=log, what="a symbolic link")
