"""A job's card with validation losses (issue 28), asserted on its widgets' traits, no browser.

Jobs are directories written by hand in the real formats (test_card.py's ``Jobs``): DiskLogger
``Step N | val_loss:X `` lines for a recipe that validates in its loop; for one whose checkpoints
are evaluated by jobs of their own, the training job's ``evaluations.jsonl`` and each evaluation's
record and ``val_loss.json`` (``recipes/validate_checkpoint.py``'s result file). The job's keeper
(which launches the evaluations) is stood in for by holding its lock (alive) or writing ``keeper.done``. Real jobs: the notebook test
(tests/e2e/test_notebooks.py) and the browser test (tests/e2e/test_browser.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from tune_magic.checkpoints import validation
from tune_magic.job import evaluate
from tune_magic.job.evaluate import EVALUATIONS, Evaluation
from tune_magic.job.keeper import KEEPER_DONE as EVALUATOR_DONE, KEEPER_LOCK as EVALUATOR_LOCK
from tune_magic.registry import store as jobstore
from tune_magic.ui.cards import JobCard
from tune_magic.ui.snapshot import JobSnapshot
from tune_magic.ui.watch import stream_text

from test_card import Jobs, card_of, metric, text_of

IN_LOOP = {"mode": "in_loop", "every_n_steps": 2}
CHECKPOINTS = {"mode": "checkpoints", "every_n_steps": None}


def val_line(step: int, value: float) -> str:
    """A DiskLogger validation line as tune_magic's recipes write it (torchtune 0.6.1's format)."""
    return f"Step {step} | val_loss:{value} \n"


@pytest.fixture
def jobs(tmp_path):
    made = Jobs(tmp_path)
    yield made
    made.close()


@pytest.fixture
def no_revive(monkeypatch):
    """Record the keeper restarts the watchers ask for, starting nothing."""
    from tune_magic.job import Job

    calls = []
    monkeypatch.setattr(Job, "ensure_keeper", lambda job, env=None: calls.append(job.id) or False)
    return calls


def hold(path: Path) -> int:
    """Hold an flock on ``path`` as a live evaluator holds its lock; return the descriptor."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def evaluation_job(jobs: Jobs, train, epoch: int, step: int, status: str = "running", **fields):
    """An evaluation job of ``train``'s ``epoch_<epoch>`` and its line in evaluations.jsonl."""
    job = jobs.make(status, evaluates={"job": train.id, "epoch": epoch, "step": step}, **fields)
    with open(train.dir / EVALUATIONS, "a") as f:
        f.write(json.dumps({"epoch": epoch, "step": step, "job": job.id}) + "\n")
    return job


def write_result(job, epoch: int, step: int, value: float) -> None:
    """The evaluation's val_loss.json, written atomically as recipes/validate_checkpoint.py does."""
    out = Path(job.output_dir)
    tmp = out / ".val_loss.json.tmp"
    tmp.write_text(json.dumps({"epoch": epoch, "step": step, "val_loss": value, "tokens": 121, "examples": 13,
                               "checkpoint_dir": f"/x/epoch_{epoch}", "kind": "full", "seconds": 2.4}))
    os.replace(tmp, out / validation.RESULT_FILE)


def legend_items(value: str) -> list[tuple[str, str]]:
    """(colour, label) of each item of a chart's HTML legend, in order."""
    return re.findall(r"<span class='tm-legend-item'[^>]*><span style='color:([^;]*);[^>]*>[^<]*</span> ([^<]*)</span>",
                      value)


def parts(card) -> dict[str, str]:
    return {cls: text + suffix for cls, text, suffix in card.snapshot.progress_parts()}


# -- a recipe that validates in its loop ------------------------------------------------------------

def test_in_loop_val_points_are_their_own_series_with_a_legend_and_latest_and_best_on_the_progress_line(jobs):
    log = "INFO:torchtune.utils._logging:Writing logs to {out}/logs/log_1.txt\n"
    job = jobs.make(log=log, validation=IN_LOOP, epochs=1, max_steps_per_epoch=8,
                    metrics="".join(metric(s) for s in range(1, 5)) + val_line(2, 3.5) + val_line(4, 3.25))
    card = card_of(job)
    assert list(card.loss_line.x) == [1, 2, 3, 4]
    assert list(card.val_line.x) == [2, 4] and list(card.val_line.y) == [3.5, 3.25]  # own series
    assert card.val_line.colors != card.loss_line.colors and card.val_line.marker  # own colour, marked points
    assert card.val_line.labels == ["val_loss"] and card.loss_line.labels == ["loss"]
    assert card.legend.layout.display is None and legend_items(card.legend.value) == [("#1f77b4", "loss"),
                                                                                      ("#ff7f0e", "val_loss")]
    assert card.chart.marks[-1] is card.val_line  # drawn over the loss curve
    assert parts(card)["tm-val"] == "val loss 3.25" and "tm-val-best" not in parts(card)  # the latest is the best
    # a worse value later: the latest, and the best with its step
    Path(job.output_dir, "logs", "log_1.txt").write_text("".join(metric(s) for s in range(1, 7)) + val_line(2, 3.5)
                                                         + val_line(4, 3.25) + val_line(6, 3.375))
    card.watcher.poll_once()
    assert list(card.val_line.x) == [2, 4, 6]
    shown = text_of(card.progress.value)
    assert "loss 1.6667 · val loss 3.375 · best 3.25 (step 4) · " in shown, shown
    assert card.snapshot.val == validation.ValSummary(3.375, 6, 3.25, 4)
    text = card.text()
    assert "val loss 3.375 · best 3.25 (step 4)" in text
    assert "val_loss by step: 2: 3.5 · 4: 3.25 · 6: 3.375" in text
    assert (card._x_scale.min, card._x_scale.max) == (1.0, 6.0)


def test_a_job_without_validation_has_no_legend_and_an_empty_val_series(jobs):
    job = jobs.make(metrics=metric(1) + metric(2))
    card = card_of(job)
    assert card.chart.layout.display is None and list(card.val_line.x) == []
    assert card.legend.layout.display == "none" and card.snapshot.val is None
    assert "val" not in text_of(card.progress.value) and card.watcher.evals is None


def test_news_and_summary_of_wait_show_val_points_in_step_order():
    base = dict(job_id="j", name="n", status="running", elapsed_s=1.0, gpus=None, physical_gpus=None, endpoint=None,
                output_dir=None, progress=None, tail=(), error=None, returncode=None)
    before = JobSnapshot(**base, steps=(1, 2), losses=(4.0, 3.0), step=2, loss=3.0, val_steps=(2,), val_losses=(3.5,))
    after = JobSnapshot(**base, steps=(1, 2, 3, 4), losses=(4.0, 3.0, 2.5, 2.0), step=4, loss=2.0,
                        val_steps=(2, 4), val_losses=(3.5, 3.25),
                        val=validation.ValSummary(3.25, 4, 3.25, 4))
    assert after.news(before) == ["step 3 | loss 2.5", "step 4 | loss 2", "step 4 | val_loss 3.25"]
    assert after.news(None)[:3] == ["step 1 | loss 4", "step 2 | loss 3", "step 2 | val_loss 3.5"]
    assert after.summary().splitlines()[-1] == "val loss 3.25 · val_loss by step: 2: 3.5 · 4: 3.25"


# -- checkpoints evaluated by jobs of their own -----------------------------------------------------

def test_evaluations_show_while_running_then_their_value_on_the_chart_and_the_watcher_ends_after_them(jobs):
    train = jobs.make("succeeded", validation=CHECKPOINTS, metrics="".join(metric(s) for s in range(1, 9)))
    lock = hold(train.dir / EVALUATOR_LOCK)  # the evaluator lives
    try:
        first = evaluation_job(jobs, train, 0, 4)
        card = card_of(train)
        assert parts(card)["tm-evaluating"] == f"evaluating epoch_0 (job {first.id})"
        assert card.legend.layout.display == "none" and not card.watcher.finished  # its value is to come
        assert card.snapshot.val.pending == 1 and card.snapshot.val.latest is None
        write_result(first, 0, 4, 3.5)
        card.watcher.poll_once()
        assert list(card.val_line.x) == [4] and list(card.val_line.y) == [3.5]  # at the step it was saved
        assert card.legend.layout.display is None
        assert parts(card)["tm-val"] == "val loss 3.5"
        jobstore.update(first.dir, status="succeeded", returncode=0, ended_at=time.time())
        second = evaluation_job(jobs, train, 1, 8)
        card.watcher.poll_once()
        assert parts(card)["tm-evaluating"] == f"evaluating epoch_1 (job {second.id})"
        write_result(second, 1, 8, 3.25)
        jobstore.update(second.dir, status="succeeded", returncode=0, ended_at=time.time())
        card.watcher.poll_once()
        assert list(card.val_line.x) == [4, 8] and "tm-evaluating" not in parts(card)
        assert text_of(card.header.value).count("succeeded") == 1  # the training job's status, unchanged
        assert not card.watcher.finished  # its evaluator has not said it is done
    finally:
        os.close(lock)
    (train.dir / EVALUATOR_DONE).touch()
    card.watcher.evals.evaluator_every_s = 0.0
    card.watcher.poll_once()
    assert card.watcher.finished
    assert [e.val_loss for e in card.snapshot.evaluations] == [3.5, 3.25]


def test_a_failed_evaluation_is_a_note_and_never_marks_the_training_job_failed(jobs, no_revive):
    train = jobs.make("succeeded", validation=CHECKPOINTS, metrics="".join(metric(s) for s in range(1, 5)))
    (train.dir / EVALUATOR_DONE).touch()
    bad = evaluation_job(jobs, train, 1, 8, "failed", returncode=1,
                         error="rank 0: FileNotFoundError: no model-00001-of-00001.safetensors")
    with open(train.dir / EVALUATIONS, "a") as f:  # one the launch refused
        f.write(json.dumps({"epoch": 2, "step": 12, "error": "no GPU is free"}) + "\n")
    card = card_of(train)
    notes = text_of(card.notes.value).splitlines()
    assert notes == [f"evaluation of epoch_1 failed: rank 0: FileNotFoundError: no model-00001-of-00001.safetensors; "
                     f"tune-magic logs {bad.id} --error", "evaluation of epoch_2 could not start: no GPU is free"]
    assert card.notes.layout.display is None
    assert card.error.layout.display == "none" and card.snapshot.label == "succeeded"  # not failed
    assert card.snapshot.val.failed == 2 and card.watcher.finished and no_revive == []
    assert notes[0] in card.text()


def test_a_dead_evaluator_is_started_again_at_most_every_few_seconds(jobs, no_revive):
    train = jobs.make("running", validation=CHECKPOINTS, metrics=metric(1))
    card = card_of(train)
    for _ in range(5):
        card.watcher.poll_once()
    assert no_revive == [train.id]  # once, though polled six times within a second
    card.watcher.evals._evaluator_at -= card.watcher.evals.evaluator_every_s
    card.watcher.poll_once()
    assert no_revive == [train.id, train.id]


def test_a_poll_while_evaluations_are_pending_stats_their_result_files_and_reads_no_log(jobs, monkeypatch):
    train = jobs.make("succeeded", validation=CHECKPOINTS, metrics="".join(metric(s) for s in range(1, 5)))
    lock = hold(train.dir / EVALUATOR_LOCK)
    try:
        first = evaluation_job(jobs, train, 0, 4)
        card = card_of(train)
        card.watcher.poll_once()  # the first poll found the metric file: the second looks at it
        reads, follows = [], []
        real_read = validation.read_result
        monkeypatch.setattr(validation, "read_result", lambda d: reads.append(d) or real_read(d))
        monkeypatch.setattr(card.watcher, "_read", lambda status: follows.append(status))
        monkeypatch.setattr(evaluate, "read_evaluations", lambda d: pytest.fail("evaluations.jsonl re-read"))
        for _ in range(5):
            card.watcher.poll_once()
        assert reads == [] and follows == []  # nothing changed: stats only
        write_result(first, 0, 4, 3.5)
        card.watcher.poll_once()
        assert reads == [first.output_dir] and follows == [] and list(card.val_line.y) == [3.5]
    finally:
        os.close(lock)


def test_a_val_point_reaches_a_live_card_within_a_second_of_its_evaluation_writing_it(jobs):
    train = jobs.make("succeeded", validation=CHECKPOINTS, metrics=metric(1) + metric(2))
    lock = hold(train.dir / EVALUATOR_LOCK)
    try:
        first = evaluation_job(jobs, train, 0, 2)
        card = JobCard(train)  # its own watcher thread, as %%tune_run shows it
        arrived = threading.Event()
        card.val_line.observe(lambda _c: arrived.set(), names="y")
        deadline = time.monotonic() + 10
        while card.snapshot is None or not card.snapshot.evaluations:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        written = time.monotonic()
        write_result(first, 0, 2, 3.5)
        assert arrived.wait(5) and time.monotonic() - written < 1.0, time.monotonic() - written
        assert list(card.val_line.y) == [3.5]
        card.close()
    finally:
        os.close(lock)


def test_stream_text_of_wait_waits_for_the_evaluations_and_prints_their_points(jobs):
    train = jobs.make("succeeded", validation=CHECKPOINTS, metrics=metric(1) + metric(2))
    (train.dir / EVALUATOR_DONE).touch()
    first = evaluation_job(jobs, train, 0, 2)
    out: list[str] = []

    def finish():
        time.sleep(1.0)
        write_result(first, 0, 2, 3.5)
        jobstore.update(first.dir, status="succeeded", returncode=0, ended_at=time.time())

    threading.Thread(target=finish, daemon=True).start()
    snap = stream_text(train, out.append, interval_s=0.1)
    lines = "".join(out).splitlines()
    assert lines[:3] == ["step 1 | loss 10", "step 2 | loss 5", "step 2 | val_loss 3.5"], lines
    assert snap.val == validation.ValSummary(3.5, 2, 3.5, 2) and lines[-1].startswith("val loss 3.5 · ")


def test_evaluation_follower_keeps_what_ended_and_reads_a_removed_one_as_removed(jobs, no_revive):
    train = jobs.make("succeeded", validation=CHECKPOINTS)
    (train.dir / EVALUATOR_DONE).touch()
    done = evaluation_job(jobs, train, 0, 4, "succeeded", returncode=0)
    write_result(done, 0, 4, 3.5)
    follower = evaluate.EvaluationFollower(train)
    assert follower.poll() and follower.evaluations == (Evaluation(0, 4, done.id, "succeeded", 3.5),)
    assert not follower.poll() and not follower.open  # unchanged; nothing more to come
    assert follower._followed == {}  # ended and read: never looked at again
    gone = evaluation_job(jobs, train, 1, 8)
    follower.poll()
    jobstore.remove_tree(gone.dir)
    assert follower.poll() and follower.evaluations[1].status == "removed"
    assert follower.evaluations == tuple(evaluate.evaluations_of(train.dir))  # the same as Job.evaluations()
