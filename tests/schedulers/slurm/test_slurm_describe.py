"""How the SLURM scheduler reads a job's status from squeue's answer and the job's own log.

The controller is asked at most once per 5 s (tune_magic.schedulers.slurm.status), so its answer can
be older than what the batch script already printed. These tests put a parsed squeue answer (the
plain format squeue prints for SQUEUE_FORMAT) in the watcher's view and a log in a real job directory.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import os

import tune_magic.schedulers.slurm as S
from tune_magic.schedulers.slurm import status as queue
from tune_magic.registry import store as jobstore
from tune_magic.registry.store import JobRecord
from tune_magic.schedulers.slurm import status as sq


def _job(tmp_path: Path, log: str) -> tuple[Path, JobRecord]:
    d = tmp_path / "j1"
    d.mkdir()
    (d / jobstore.OUTPUT_LOG).write_text(log)
    rec = JobRecord(id="j1", name="n", argv=["torchrun", "x.py"], env={}, cwd=str(tmp_path),
                    log_path=str(d / jobstore.OUTPUT_LOG), started_at=time.time() - 10, status="pending",
                    scheduler="slurm", backend={"job_id": "42"})
    jobstore.write_record(d, rec)
    return d, rec


@pytest.fixture
def squeue_says(monkeypatch):
    """Put one squeue line (job 42) in the watcher's view, as if asked just now."""
    w = queue.QueueWatcher(lambda conf: [])
    monkeypatch.setattr(S, "WATCHER", w)

    def put(line: str) -> None:
        w._views[os.environ.get("SLURM_CONF", "")] = queue._View(
            asked_at=time.time(), mono=time.monotonic(), ids=frozenset({"42"}), answered=frozenset({"42"}),
            jobs=sq.parse_squeue_format(line))
    return put


@pytest.mark.parametrize("log, started", [
    ("", False),
    ("node tmnode1 10.0.0.1\n", True),  # the batch script printed its nodes: SLURM started it
    ("rendezvous 10.0.0.1:29500\n", True),
    ("\r1|2|Loss: 2.5: 10%|#| 2/20 [00:01<00:09, 2.0it/s]\n", True),  # a step
])
def test_a_pending_answer_older_than_the_log_reads_running(tmp_path, squeue_says, log, started):
    d, rec = _job(tmp_path, log)
    squeue_says("42|PENDING|Resources|2|(null)|10:00|tune_magic-j1")
    changes = S.SlurmScheduler().describe(d, rec)
    if started:
        assert changes["status"] == "running" and changes["pending_reason"] is None, changes
    else:
        assert changes["status"] == "pending" and "Resources" in changes["pending_reason"], changes


def test_no_squeue_answer_yet_and_a_started_log_reads_running(tmp_path, monkeypatch):
    d, rec = _job(tmp_path, "node tmnode1 10.0.0.1\n")
    monkeypatch.setattr(S.WATCHER, "get", lambda slurm_id, env: queue.Answer(queue.NOT_ASKED))  # not asked yet
    assert S.SlurmScheduler().describe(d, rec)["status"] == "running"
    d2 = tmp_path / "other"
    d2.mkdir()
    d, rec = _job(d2, "")
    assert "status" not in S.SlurmScheduler().describe(d, rec)  # nothing known: stays pending


def test_a_schema_2_record_keeps_its_slurm_fields_through_migration(tmp_path, squeue_says):
    # written by release 0.1.0: SLURM's id, config file and time limit at the top level
    from tune_magic.job import Job

    d, rec = _job(tmp_path, "node tmnode1 10.0.0.1\n")
    data = rec.to_dict()
    del data["backend"], data["scheduler_options"]
    data.update(schema=2, slurm_job_id="42", slurm_conf="/etc/slurm/x.conf", time_limit="10")
    (d / jobstore.RECORD).write_text(__import__("json").dumps(data))
    squeue_says("42|PENDING|Resources|1|(null)|10:00|tune_magic-j1")
    job = Job(d)
    assert (job.engine_id, job.record.backend, job.record.scheduler_options) == (
        "42", {"job_id": "42", "conf": "/etc/slurm/x.conf"}, {"time_limit": "10"})
    assert job.refresh().status == "running"  # describe read the migrated id and the log
    written = __import__("json").loads((d / jobstore.RECORD).read_text())
    assert written["schema"] == 3 and written["backend"]["job_id"] == "42"


def test_a_slurm_jobs_card_collapses_slurms_own_lines_through_its_schedulers_rules(tmp_path):
    from tune_magic.job import Job
    from tune_magic.logs.cardtail import display_tail
    from tune_magic.schedulers.slurm.exits import TAIL_RULES

    d, _ = _job(tmp_path, "")
    job = Job(d)
    assert job.tail_rules is TAIL_RULES and TAIL_RULES
    lines = ["step 3", "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-12-01T10:00:00 ***",
             "srun: error: n1: task 0: Killed"]
    shown = display_tail(lines, 20, rules=job.tail_rules)
    assert shown[0] == "step 3" and not any("slurmstepd" in s for s in shown) and len(shown) == 2, shown


def test_after_our_stop_squeues_job_launch_failure_is_a_stop_not_a_failure(tmp_path, squeue_says):
    # measured on the two-node test cluster (SLURM 22.05): after tune_magic's scancel --signal=TERM --full,
    # `squeue -t all` says the job FAILED, reason JobLaunchFailure, and no exit file is written
    d, rec = _job(tmp_path, "node tmnode1 10.0.0.1\n" + "torchrun got SIGTERM\n")
    rec.status = "running"
    jobstore.write_record(d, rec)
    jobstore.mark_stop_requested(d)
    squeue_says("42|FAILED|JobLaunchFailure|2|tmnode[1-2]|10:00|tune_magic-j1")
    changes = S.SlurmScheduler().describe(d, rec)
    assert changes["status"] == "stopped" and changes.get("error") is None, changes
    assert not (d / jobstore.FAILURE).exists()  # no failure reason kept for a stop
    d2 = tmp_path / "nobody-stopped-it"  # the same answer without our stop: a failure
    d2.mkdir()
    d2, rec2 = _job(d2, "node tmnode1 10.0.0.1\n")
    rec2.status = "running"
    jobstore.write_record(d2, rec2)
    assert S.SlurmScheduler().describe(d2, rec2)["status"] == "failed"


@pytest.mark.parametrize("line", [
    "42|COMPLETED|None|2|tmnode[1-2]|10:00|tune_magic-j1",  # listed as ended
    None,  # not listed any more
])
def test_an_exit_file_written_while_the_controller_answered_wins(tmp_path, monkeypatch, line):
    # CI (a paused controller): the script wrote its exit file after describe() looked for it and
    # before squeue's slow answer came; the record's end time was then describe()'s own clock
    d, rec = _job(tmp_path, "node tmnode1 10.0.0.1\n")
    rec = jobstore.update(d, status="running")
    wrote_at = time.time() - 3.0

    def slow_answer(slurm_id, env):
        jobstore.write_atomic(d / jobstore.EXIT_CODE, f'{{"returncode": 0, "ended_at": {wrote_at}}}'.encode())
        if line is None:
            return queue.Answer(queue.NOT_LISTED, at=time.time())
        return queue.Answer(queue.LISTED, job=sq.parse_squeue_format(line)["42"], at=time.time())

    monkeypatch.setattr(S.WATCHER, "get", slow_answer)
    changes = S.SlurmScheduler().describe(d, rec)
    assert (changes["status"], changes["returncode"], changes["ended_at"]) == ("succeeded", 0, wrote_at), changes
