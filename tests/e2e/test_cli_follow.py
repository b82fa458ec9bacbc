"""The CLI while following a job: Ctrl-C leaves the job running and says how to stop it (exit 130,
no traceback); run --wait ends with one summary line; help works like --help."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import tune_magic.job as J

from jobhelpers import toy_args

TIMEOUT = 120


def cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "tune_magic", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, **kw)


def _ctrl_c(argv: list[str]) -> tuple[subprocess.CompletedProcess, str]:
    # as at a terminal: a test run started in the background (`cmd &` in a script) hands its children
    # SIGINT ignored, and Python then never turns Ctrl-C into KeyboardInterrupt
    p = subprocess.Popen([sys.executable, "-m", "tune_magic", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    first = p.stdout.readline().strip()
    while "Loss" not in (line := p.stdout.readline()):  # following: the log streams
        assert time.monotonic() < deadline and line, "no progress streamed"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    return subprocess.CompletedProcess(argv, p.returncode, out, err), first


def test_ctrl_c_in_run_wait_and_logs_follow_leaves_the_job_running(cleanup_jobs):
    r, job_id = _ctrl_c(["run", "--wait", *toy_args("steps=1000", "step_s=0.2").split()])
    job = J.get_job(job_id)
    cleanup_jobs.append(job)
    assert r.returncode == 130 and "Traceback" not in r.stderr, r.stderr
    assert f"job {job_id} keeps running (tune-magic stop {job_id} stops it)" in r.stderr
    assert job.status == "running"
    r, _ = _ctrl_c(["logs", "--follow", job_id])
    assert r.returncode == 130 and "Traceback" not in r.stderr and "keeps running" in r.stderr
    assert job.status == "running"
    assert job.stop(grace_s=2) == "stopped"


def test_run_wait_ends_with_one_summary_line():
    ok = cli("run", "--wait", *toy_args("steps=3").split())
    job_id = ok.stdout.splitlines()[0]
    assert ok.returncode == 0 and ok.stdout.splitlines()[-1] == f"job {job_id} succeeded · step 3 loss 3.33333"
    bad = cli("run", "--wait", *toy_args("crash_rank=1").split())
    job_id = bad.stdout.splitlines()[0]
    assert bad.returncode == 1
    # rank 0 gets a step or two further before torchrun stops it: its loss is 10/step
    m = re.fullmatch(rf"job {job_id} failed · step (\d+) loss (\S+) · rank 1: RuntimeError: toy recipe crashed on "
                     "purpose", bad.stdout.splitlines()[-1])
    assert m and float(m[2]) == round(10 / int(m[1]), 5), bad.stdout.splitlines()[-1]


def test_help_command_and_top_level_help():
    top = cli("--help")
    assert top.returncode == 0 and "TUNE_MAGIC_HOME" in top.stdout and "help" in top.stdout
    for command in ("run", "jobs", "stop", "cmd"):
        a, b = cli("help", command), cli(command, "--help")
        assert a.returncode == b.returncode == 0 and a.stdout == b.stdout and a.stdout.strip()
    assert cli("help").stdout == top.stdout
    r = cli("help", "nosuch")
    assert r.returncode == 2 and "no command 'nosuch'" in r.stderr
