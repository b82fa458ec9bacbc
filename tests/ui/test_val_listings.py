"""Validation losses in the listings (issue 28): the live jobs table's ``val loss`` column, ``tune-magic
jobs`` (its ``VAL LOSS`` column, ``--json``), an evaluation job's row, and ``tune-magic metrics`` /
``Job.metrics_frame()`` carrying the ``val_loss`` points.

Registries are written here by hand in the real formats: records, ``summary.json`` (what a
supervisor keeps; the listings read nothing else of a job that validates in its loop), DiskLogger
metric files, ``evaluations.jsonl`` and each evaluation's ``val_loss.json``. Real jobs:
tests/e2e/test_notebooks.py.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import re
import time
from pathlib import Path

import pytest

from tune_magic.checkpoints.validation import RESULT_FILE
from tune_magic.job import get_job
from tune_magic.job.evaluate import EVALUATIONS
from tune_magic.job.keeper import KEEPER_DONE as EVALUATOR_DONE
from tune_magic.logs import summary as S
from tune_magic.registry import store as jobstore
from tune_magic.registry.store import JobRecord
from tune_magic.ui import cli
from tune_magic.ui.views import JobsTable

IN_LOOP = {"mode": "in_loop", "every_n_steps": 2}
CHECKPOINTS = {"mode": "checkpoints", "every_n_steps": None}


HELD: list[int] = []  # supervisor locks held for the running jobs made


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path))
    (tmp_path / "jobs").mkdir()
    yield tmp_path
    while HELD:
        os.close(HELD.pop())


def make(home: Path, job_id: str, *, status: str = "succeeded", started: float | None = None, log: str = "",
         metrics: str | None = None, **fields) -> Path:
    """A job's directory: its record, its combined log, and (``metrics``) a DiskLogger file."""
    d = home / "jobs" / job_id
    d.mkdir()
    out = home / "out" / job_id
    (out / "logs").mkdir(parents=True)
    if metrics is not None:
        (out / "logs" / "log_1.txt").write_text(metrics)
    (d / jobstore.OUTPUT_LOG).write_text(log.replace("{out}", str(out)))
    started = started or time.time() - 100
    rec = JobRecord(id=job_id, name=fields.pop("name", job_id), argv=["python", "r.py"], env={}, cwd=str(home),
                    log_path=str(d / jobstore.OUTPUT_LOG), started_at=started, status=status,
                    output_dir=str(out), metric_log_dir=str(out / "logs"),
                    ended_at=started + 60 if status in ("succeeded", "failed", "stopped") else None,
                    returncode={"succeeded": 0, "failed": 1}.get(status), **fields)
    jobstore.write_record(d, rec)
    if status == "running":  # the test is this job's supervisor: it holds the lock (released at exit)
        fd = os.open(d / jobstore.SUPERVISOR_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        HELD.append(fd)
    return d


def summary(d: Path, step: int, loss: float, vals: list[tuple[int, float]] = ()) -> None:
    """The job's summary.json as its supervisor keeps it: last loss, latest and lowest val_loss."""
    s = S.Summary(step=step, loss=loss, metric_step=step, metric_loss=loss, updated_at=time.time())
    if vals:
        s.val_step, s.val_loss = vals[-1]
        s.min_val_step, s.min_val_loss = min(vals, key=lambda p: p[1])
    S.write_summary(d, s)


def evaluation(home: Path, train: str, eval_id: str, epoch: int, step: int, value: float | None, *,
               status: str = "succeeded", **fields) -> Path:
    """An evaluation job of ``train``'s ``epoch_<epoch>``, its line in evaluations.jsonl, its result."""
    d = make(home, eval_id, status=status, name=f"validate {train} epoch_{epoch}",
             evaluates={"job": train, "epoch": epoch, "step": step}, **fields)
    if value is not None:  # its result file, and its summary from the line it printed
        (home / "out" / eval_id / RESULT_FILE).write_text(json.dumps({"epoch": epoch, "step": step, "val_loss": value}))
        S.write_summary(d, S.Summary(val_step=step, val_loss=value, min_val_step=step, min_val_loss=value))
    with open(home / "jobs" / train / EVALUATIONS, "a") as f:
        f.write(json.dumps({"epoch": epoch, "step": step, "job": eval_id}) + "\n")
    return d


def registry(home: Path) -> None:
    """Three jobs: one without validation, one validating in its loop, one whose checkpoints were
    evaluated (epoch_0 and epoch_1, whose evaluations succeeded, and epoch_2's, still running)."""
    t0 = time.time() - 500
    summary(make(home, "a-plain", started=t0), 8, 2.0)
    summary(make(home, "b-inloop", started=t0 + 1, validation=IN_LOOP), 8, 1.5, [(2, 3.5), (4, 3.25), (6, 3.375)])
    train = make(home, "c-ckpt", started=t0 + 2, validation=CHECKPOINTS)
    summary(train, 12, 1.25)
    (train / EVALUATOR_DONE).touch()
    evaluation(home, "c-ckpt", "d-val0", 0, 4, 3.0, started=t0 + 3)
    evaluation(home, "c-ckpt", "e-val1", 1, 8, 2.75, started=t0 + 4)


def test_the_jobs_table_shows_best_and_latest_val_loss_after_the_loss_and_what_an_evaluation_evaluates(home):
    registry(home)
    table = JobsTable(live=False)
    assert table._heads["val"].layout.display is None and table._heads["val"].value == "<b>val loss</b>"
    cells = {job_id: re.sub(r"<[^>]+>", "", row["val"].value) for job_id, row in table.rows.items()}
    assert cells == {"a-plain": "", "b-inloop": "3.25 (latest 3.375)", "c-ckpt": "2.75", "d-val0": "3",
                     "e-val1": "2.75"}
    assert table.grid.layout.grid_template_columns == "auto auto repeat(6, max-content) minmax(76px, max-content)"
    header, *lines = table.text().splitlines()
    assert header.split()[:8] == ["id", "name", "status", "step", "loss", "val", "loss", "elapsed"]
    # the evaluation job's row says what it evaluates, on its note line (grey: no failure)
    note = table.rows["e-val1"]["reason"]
    assert note.layout.display is None and "tm-reason-evaluates" in note.value
    assert re.sub(r"<[^>]+>", "", note.value).strip() == "validates epoch_1 (step 8) of job c-ckpt"
    assert table.rows["a-plain"]["reason"].layout.display == "none"


def test_a_table_row_says_evaluating_while_a_checkpoint_is_evaluated_and_keeps_looking_once_its_job_ended(home):
    registry(home)
    running = evaluation(home, "c-ckpt", "f-val2", 2, 12, None, status="running")
    table = JobsTable(live=False)
    assert re.sub(r"<[^>]+>", "", table.rows["c-ckpt"]["val"].value) == "2.75 · evaluating…"
    train_row = next(r for r in table._slots if r.job is not None and r.job.id == "c-ckpt")
    assert not train_row.done  # ended, yet its evaluations are to come: looked at again
    (home / "out" / "f-val2" / RESULT_FILE).write_text(json.dumps({"epoch": 2, "step": 12, "val_loss": 2.5}))
    jobstore.update(running, status="succeeded", returncode=0, ended_at=time.time())
    table.refresh_once()
    assert re.sub(r"<[^>]+>", "", table.rows["c-ckpt"]["val"].value) == "2.5"
    assert train_row.done  # nothing more to come: never read again


def test_a_table_without_validation_has_no_val_column_until_a_job_has_one(home):
    summary(make(home, "a-plain"), 8, 2.0)
    table = JobsTable(live=False)
    assert table._heads["val"].layout.display == "none" and table.rows["a-plain"]["val"].layout.display == "none"
    assert "val" not in table.text().splitlines()[0].split()
    assert table.grid.layout.grid_template_columns == "auto auto repeat(5, max-content) minmax(76px, max-content)"
    summary(make(home, "b-inloop", status="running", validation=IN_LOOP), 2, 3.0, [(2, 3.5)])
    table.refresh_once()
    assert table._heads["val"].layout.display is None
    assert [table.rows[j]["val"].layout.display for j in ("a-plain", "b-inloop")] == [None, None]
    assert re.sub(r"<[^>]+>", "", table.rows["b-inloop"]["val"].value) == "3.5"


def test_tune_magic_jobs_val_loss_column_and_json(home, capsys):
    registry(home)
    capsys.readouterr()
    cli.main(["jobs"])
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split()[:8] == ["ID", "NAME", "STATUS", "STEP", "LOSS", "VAL", "LOSS", "ELAPSED"]
    at = header.index("VAL LOSS")
    rows = {line.split()[0]: line for line in lines}
    assert rows["b-inloop"][at:].startswith("3.25 (latest 3.375) ")
    assert rows["c-ckpt"][at:].startswith("2.75 ") and rows["a-plain"][at:].startswith("- ")
    assert "validates epoch_1 (step 8) of job c-ckpt" in rows["e-val1"][header.index("REASON"):]
    cli.main(["jobs", "--json"])
    listed = {j["id"]: j for j in json.loads(capsys.readouterr().out)}
    assert {k: listed["b-inloop"][k] for k in ("val_loss", "val_step", "best_val_loss", "best_val_step",
                                                "validation", "evaluates")} == {
        "val_loss": 3.375, "val_step": 6, "best_val_loss": 3.25, "best_val_step": 4, "validation": IN_LOOP,
        "evaluates": None}
    assert (listed["c-ckpt"]["val_loss"], listed["c-ckpt"]["best_val_loss"]) == (2.75, 2.75)
    assert listed["c-ckpt"]["validation"] == CHECKPOINTS and listed["c-ckpt"]["val_pending"] == 0
    assert listed["e-val1"]["evaluates"] == {"job": "c-ckpt", "epoch": 1, "step": 8}
    assert listed["a-plain"]["val_loss"] is None and listed["a-plain"]["validation"] is None
    cli.main(["jobs", "--name", "a-*"])  # the column goes with the jobs that need it
    assert "VAL LOSS" not in capsys.readouterr().out


def test_metrics_json_csv_and_the_frame_carry_the_val_loss_points(home, capsys):
    log = "INFO:torchtune.utils._logging:Writing logs to {out}/logs/log_1.txt\n"
    lines = "".join(f"Step {s} | loss:{4 - s / 4} lr:0.001 \n" + (f"Step {s} | val_loss:{5 - s / 4} \n" if s % 2 == 0
                                                                   else "") for s in range(1, 5))
    make(home, "b-inloop", log=log, metrics=lines, validation=IN_LOOP)
    train = make(home, "c-ckpt", log=log, metrics="".join(f"Step {s} | loss:{4 - s / 4} \n" for s in range(1, 9)),
                 validation=CHECKPOINTS)
    (train / EVALUATOR_DONE).touch()
    evaluation(home, "c-ckpt", "d-val0", 0, 4, 3.0)
    evaluation(home, "c-ckpt", "e-val1", 1, 8, 2.75)
    for job_id, want in (("b-inloop", [(2, 4.5, None, "disklogger"), (4, 4.0, None, "disklogger")]),
                         ("c-ckpt", [(4, 3.0, 1, "evaluation"), (8, 2.75, 2, "evaluation")])):
        capsys.readouterr()
        cli.main(["metrics", job_id, "--json"])
        points = json.loads(capsys.readouterr().out)
        got = [(p["step"], p["value"], p.get("epoch"), p["source"]) for p in points if p["name"] == "val_loss"]
        assert got == want, points
        assert [p["step"] for p in points if p["name"] == "loss"][:4] == [1, 2, 3, 4]  # the loss series as it was
        cli.main(["metrics", job_id, "--csv"])
        rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
        assert [(int(r["step"]), float(r["value"])) for r in rows if r["name"] == "val_loss"] == [w[:2] for w in want]
        frame = get_job(job_id).metrics_frame()
        val = frame[frame["name"] == "val_loss"]
        assert list(zip(val["step"], val["value"])) == [w[:2] for w in want]
