"""The controller's word on our jobs (tune_magic.schedulers.slurm.status and .follow), with SLURM's
clients replaced by scripts first on PATH that print recorded output (tests/data/slurm/) or fail,
hang or stay silent as a paused or restarting controller does. The same faults against the real
test cluster: tests/slurm/test_slurm_faults.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import tune_magic.schedulers.slurm as S
from tune_magic.registry import store as jobstore
from tune_magic.registry.outcome import CANCELLED_OUTSIDE
from tune_magic.registry.store import JobRecord
from tune_magic.schedulers.slurm import exits as follow, status as queue
from tune_magic.schedulers.slurm import status as sq
from tune_magic.schedulers.slurm.exits import srun_error

from jobhelpers import DATA

SCONTROL = (DATA / "slurm" / "scontrol_22.05_show_job.txt").read_text()
INVALID = (DATA / "slurm" / "scontrol_22.05_invalid_id.txt").read_text().strip()


@pytest.fixture
def clients(tmp_path, monkeypatch):
    """``put(name, body)``: a fake SLURM client first on PATH; each run appends its name to ``calls``."""
    d = tmp_path / "bin"
    d.mkdir()
    calls = tmp_path / "calls"
    calls.write_text("")
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLURM_CONF", raising=False)

    def put(name: str, body: str) -> None:
        (d / name).write_text(f"#!/bin/sh\necho {name} >> {calls}\n{body}")
        (d / name).chmod(0o755)
    put.calls = lambda: calls.read_text().split()
    return put


def _answer(slurm_id="2", ids=()):
    """A fresh query's answer (forget: not the one a previous query left on disk)."""
    w = queue.QueueWatcher(lambda conf: list(ids))
    w.forget()
    return w, w.get(slurm_id, dict(os.environ))


def test_scontrol_lines_parse_with_restarts_exit_codes_and_signals():
    jobs = sq.parse_scontrol_jobs(SCONTROL)
    assert jobs["2"].name == "tune_magic-x y" and (jobs["2"].state, jobs["2"].restart_count) == ("RUNNING", 1)
    assert (jobs["3"].state, jobs["3"].exit_code, jobs["3"].signal) == ("FAILED", 3, None)
    assert (jobs["4"].state, jobs["4"].exit_code, jobs["4"].signal) == ("CANCELLED", 0, 15)
    assert jobs["1"].state == "COMPLETED" and jobs["3"].time_limit_minutes == 365 * 1440
    assert sq.scontrol_invalid_id(1, INVALID) and not sq.scontrol_invalid_id(
        1, "slurm_load_jobs error: Socket timed out on send/recv operation")


def test_a_squeue_that_fails_is_no_answer_and_the_note_says_since_when(clients):
    clients("squeue", "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n")
    w, a = _answer()
    assert a.kind == queue.NO_ANSWER and a.failing_since is not None
    assert w.note(dict(os.environ)) == "SLURM not answering since " + time.strftime("%H:%M",
                                                                                   time.localtime(a.failing_since))
    assert clients.calls() == ["squeue", "squeue"]  # --json, then the plain format; never scontrol


@pytest.mark.parametrize("squeue", ["exit 0\n", "echo 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n"])
def test_squeue_leaving_a_job_out_is_a_doubt_that_scontrol_settles(clients, squeue):
    clients("squeue", squeue)
    clients("scontrol", f"cat <<'EOF'\n{SCONTROL.splitlines()[2]}\nEOF\n")  # job 4, CANCELLED
    _, a = _answer("4")
    assert a.kind == queue.LISTED and (a.job.state, a.job.signal) == ("CANCELLED", 15)
    clients("scontrol", f"echo '{INVALID}' >&2\nexit 1\n")
    _, a = _answer("4")
    assert a.kind == queue.NOT_LISTED  # both said so: the controller answered and knows no such job
    clients("scontrol", "echo 'slurm_load_jobs error: Socket timed out on send/recv operation' >&2\nexit 1\n")
    _, a = _answer("4")
    assert a.kind == queue.NO_ANSWER


def test_a_cancelled_pending_array_task_that_scontrol_calls_not_found_on_stdout_is_not_listed(clients):
    # SLURM 22.05 after `scancel 2_2` of a pending task while 2_0 runs (issue 30): squeue leaves the
    # task out; `scontrol show job 2_2` prints "Job 2_2 not found" on stdout and exits 1
    clients("squeue", "exit 0\n")
    clients("scontrol", "echo 'Job 2_2 not found'\nexit 1\n")
    _, a = _answer("2_2")
    assert a.kind == queue.NOT_LISTED
    assert sq.scontrol_invalid_id(1, "", "Job 2_2 not found\n") and sq.scontrol_invalid_id(1, "Job 2_2 not found", "")
    assert not sq.scontrol_invalid_id(0, "", "Job 2_2 not found") and not sq.scontrol_invalid_id(1, "", "Job 2 found")


def _pending(tmp_path: Path) -> tuple[Path, JobRecord]:
    d, rec = _record(tmp_path)
    return d, jobstore.update(d, status="pending")


def test_a_pending_job_slurm_forgets_before_it_ran_stays_pending_then_is_cancelled_outside(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_MAGIC_SLURM_GRACE_S", "0")
    monkeypatch.setenv("TUNE_MAGIC_SLURM_MISSING_ANSWERS", "3")
    d, rec = _pending(tmp_path)
    t = time.time()
    for n in (0, 1):  # within the answers it waits for: still pending, never "unknown"
        rec = jobstore.update(d, **follow.not_listed(d, rec, "42", queue.Answer(queue.NOT_LISTED, at=t + n)))
        assert rec.status == "pending" and rec.backend["missing_answers"] == n + 1
    rec = jobstore.update(d, **follow.not_listed(d, rec, "42", queue.Answer(queue.NOT_LISTED, at=t + 2)))
    assert (rec.status, rec.error) == ("stopped", CANCELLED_OUTSIDE) and rec.ended_at is not None
    d2 = tmp_path / "ours"
    d2.mkdir()
    d, rec = _pending(d2)
    assert jobstore.mark_stop_requested(d)
    rec = jobstore.read(d)
    for n in range(3):
        rec = jobstore.update(d, **follow.not_listed(d, rec, "42", queue.Answer(queue.NOT_LISTED, at=t + n)))
    assert (rec.status, rec.error) == ("stopped", None)  # our own stop: no "outside" reason
    d3 = tmp_path / "started"
    d3.mkdir()
    d, rec = _pending(d3)
    Path(rec.log_path).write_text("it started\n")  # a log: it ran, so the outcome is not known
    rec = jobstore.update(d, **follow.not_listed(d, rec, "42", queue.Answer(queue.NOT_LISTED, at=t)))
    assert rec.status == "unknown"


def test_a_hanging_squeue_is_cut_at_the_query_timeout_and_leaves_nothing(clients, monkeypatch):
    monkeypatch.setenv("TUNE_MAGIC_SLURM_QUERY_TIMEOUT_S", "1")
    clients("squeue", "sleep 30 &\nwait\n")  # a child of its own, too: the whole session goes
    t0 = time.monotonic()
    _, a = _answer()
    took = time.monotonic() - t0
    assert a.kind == queue.NO_ANSWER and took < 2.5, took
    assert clients.calls() == ["squeue"]  # the deadline passed: no second query


def test_one_query_answers_every_job_and_other_processes_read_it_from_disk(clients, tmp_path):
    squeue_json = (DATA / "slurm" / "squeue_22.05_live.json").read_text()
    clients("squeue", f"cat <<'EOF'\n{squeue_json}\nEOF\n")
    w = queue.QueueWatcher(lambda conf: ["1", "2", "3"])
    env = dict(os.environ)
    assert [w.get(i, env).kind for i in "123"] == [queue.LISTED] * 3
    assert clients.calls() == ["squeue"] and w.queries == 1
    other = queue.QueueWatcher(lambda conf: ["1", "2", "3"])  # another process, within the interval
    assert other.get("2", env).job.reason == "Resources" and other.queries == 0
    kept = json.loads(next((tmp_path / "home" / "cache").glob("slurm-queue-*.json")).read_text())
    assert sorted(kept["answered"]) == ["1", "2", "3"] and kept["failing_since"] is None
    other.forget()
    other.get("2", env)
    assert other.queries == 1 and clients.calls() == ["squeue", "squeue"]


def _record(tmp_path: Path, **kw) -> tuple[Path, JobRecord]:
    d = tmp_path / "j1"
    d.mkdir(exist_ok=True)
    rec = JobRecord(id="j1", name="n", argv=["x"], env={}, cwd=str(tmp_path), log_path=str(d / "output.log"),
                    started_at=time.time() - 100, status="running", scheduler="slurm",
                    backend={"job_id": "42"}, **kw)
    jobstore.write_record(d, rec)
    return d, rec


def test_a_vanished_job_fails_only_after_repeated_answers_over_the_grace_and_never_while_its_log_grows(
        tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_MAGIC_SLURM_GRACE_S", "0")
    monkeypatch.setenv("TUNE_MAGIC_SLURM_MISSING_ANSWERS", "3")
    d, rec = _record(tmp_path)
    t = time.time()
    changes = follow.not_listed(d, rec, "42", queue.Answer(queue.NOT_LISTED, at=t))
    assert changes["status"] == "unknown" and changes["backend"]["missing_answers"] == 1
    rec = jobstore.update(d, **changes)
    assert follow.not_listed(d, rec, "42", queue.Answer(queue.NOT_LISTED, at=t)) == {}  # the same answer again
    for n in (2, 3):
        changes = follow.not_listed(d, rec, "42", queue.Answer(queue.NOT_LISTED, at=t + n))
        rec = jobstore.update(d, **changes)
    assert rec.status == "failed" and "SLURM no longer lists job 42" in rec.error
    d2 = tmp_path / "growing"
    d2.mkdir()
    d, rec = _record(d2)
    rec = jobstore.update(d, **follow.not_listed(d, rec, "42", queue.Answer(queue.NOT_LISTED, at=t)))
    assert rec.status == "unknown"  # its log is quiet: nothing known to run
    for n in range(1, 6):  # then it writes its log after each answer: processes of it run
        time.sleep(0.02)
        Path(rec.log_path).write_text(f"step {n}\n")
        changes = follow.not_listed(d, rec, "42", queue.Answer(queue.NOT_LISTED, at=t + n))
        rec = jobstore.update(d, **changes)
        assert rec.status == "running", rec


def test_a_job_cancelled_outside_with_exit_0_and_signal_15_is_stopped_not_succeeded(tmp_path):
    d, rec = _record(tmp_path)
    job = sq.parse_scontrol_jobs(SCONTROL)["4"]  # CANCELLED, ExitCode=0:15
    changes = follow.listed(d, rec, job, started=True)
    assert (changes["status"], changes["error"]) == ("stopped", CANCELLED_OUTSIDE)


def test_no_news_changes_nothing_and_a_requeue_wait_is_not_run_time(tmp_path, monkeypatch):
    d, rec = _record(tmp_path)
    monkeypatch.setattr(S.WATCHER, "get", lambda slurm_id, env: queue.Answer(queue.NO_ANSWER, at=time.time()))
    assert S.SlurmScheduler().describe(d, rec) == {}
    pending = sq.SlurmJob("42", "tune_magic-j1", "PENDING", reason="BeginTime", restart_count=1)
    changes = follow.listed(d, rec, pending, started=True)  # the log of the first attempt says started
    assert changes["status"] == "pending" and changes["pending_reason"] == "BeginTime"
    rec = jobstore.update(d, **changes)
    rec.backend["queued_at"] -= 30  # 30 s in the queue again
    assert 29 < follow.queued_s(rec) < 32
    changes = follow.listed(d, rec, sq.SlurmJob("42", "tune_magic-j1", "RUNNING", restart_count=1), started=True)
    assert changes["status"] == "running" and 29 < changes["backend"]["waited_s"] < 32
    assert "queued_at" not in changes["backend"]


def test_srun_s_own_error_line_is_found_and_task_ends_are_not():
    text = ("rendezvous 10.0.0.2:1234\nsrun: error: Unable to create step for job 7: More processors requested "
            "than permitted\nsrun: error: n1: task 0: Exited with exit code 1\n")
    assert srun_error(text) == "srun: error: Unable to create step for job 7: More processors requested than permitted"
    assert srun_error("srun: error: n1: task 0: Exited with exit code 1\nsrun: error: n2: tasks 0-1: Killed\n") is None


def test_a_job_or_array_task_cancelled_before_it_ran_is_stopped_not_succeeded(tmp_path):
    """squeue and scontrol give such a job ExitCode 0 (measured, 22.05: ``scancel`` of an array
    whose tasks were pending, ``JobState=CANCELLED ExitCode=0:0 NodeList=``): no run's exit code."""
    d, rec = _record(tmp_path)
    line = ("JobId=31 ArrayJobId=31 ArrayTaskId=1 JobName=tune_magic-sweep-s JobState=CANCELLED "
            "Reason=JobArrayTaskLimit Restarts=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED NodeList= NumNodes=1")
    job = sq.parse_scontrol_jobs(line)["31_1"]
    changes = follow.listed(d, rec, job, started=False)
    assert (changes["status"], changes["error"]) == ("stopped", CANCELLED_OUTSIDE)
