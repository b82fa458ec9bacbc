"""--max-resumes' decision (tune_magic.schedulers.local.autoresume): after which ends a job is started
again from its checkpoint, with which command, and the attempt record. Jobs and their output_dirs are
written by hand (FAKE: no process ran); a real relaunch: tests/e2e/test_resume_api.py."""

from __future__ import annotations

import pytest

from tune_magic.registry import store as jobstore
from tune_magic.schedulers.local import autoresume as R

from resumehelpers import fake_job, toy_checkpoint

CRASH = "[rank1]: RuntimeError: toy recipe crashed on purpose\n"


def job(tmp_path, *, checkpoint=True, **fields):
    out = tmp_path / "out"
    out.mkdir(parents=True, exist_ok=True)
    if checkpoint:
        toy_checkpoint(out)
    rec = fake_job(tmp_path / "jobs", "j", out, status="running", log="x" * 10 + "\n" + CRASH, max_resumes=1,
                   overrides=("epochs=3", "steps=2"), **fields)
    rec.overrides = ["epochs=3", "steps=2", f"output_dir={out}"]
    return rec


def test_a_failure_after_a_checkpoint_is_started_again_from_it(tmp_path):
    rec = job(tmp_path)
    nxt = R.next_attempt(tmp_path / "jobs" / "j", rec, 1, stop=False, step=3, now=1000.0)
    tail = ["resume_from_checkpoint=True", "checkpointer.checkpoint_files=[epoch_0/model-00001-of-00001.safetensors]",
            "checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt"]
    assert nxt.changes["argv"] == rec.argv + tail and nxt.changes["overrides"] == rec.overrides + tail
    one, two = nxt.changes["attempts"]
    assert (one["number"], one["started_at"], one["ended_at"], one["step"], one["returncode"]) == (
        1, rec.started_at, 1000.0, 3, 1)
    assert one["reason"] == "RuntimeError: toy recipe crashed on purpose"  # the failure line the log gives
    assert (two["number"], two["started_at"], two["resumed_from"], two["log_offset"]) == (
        2, 1000.0, {"checkpoint": "epoch_0/", "epoch": 0, "step": 2}, len("x" * 10 + "\n" + CRASH))
    assert nxt.message.startswith("[tune_magic] attempt 1 failed (RuntimeError: toy recipe crashed on purpose) "
                                  "at step 3; attempt 2 of at most 2 resumes from epoch_0/ at step 2")


@pytest.mark.parametrize("code, stop, why", [(0, False, None), (1, True, None), (-15, False, None), (None, False, None)])
def test_a_success_a_stop_or_an_outside_cancel_ends_the_job(tmp_path, code, stop, why):
    nxt = R.next_attempt(tmp_path / "jobs" / "j", job(tmp_path), code, stop=stop, step=3, now=1.0)
    assert nxt.changes == {} and nxt.message == why


def test_no_resume_left_or_nothing_saved_ends_it_saying_why(tmp_path):
    rec = job(tmp_path)
    rec.attempts = [{"number": 1, "started_at": 1.0, "ended_at": 2.0}, {"number": 2, "started_at": 3.0}]
    nxt = R.next_attempt(tmp_path / "jobs" / "j", rec, 1, stop=False, step=5, now=9.0)
    assert nxt.changes == {} and "no resume left (--max-resumes 1): the job ends failed" in nxt.message
    jobstore.remove_tree(tmp_path / "jobs" / "j")
    rec = job(tmp_path / "x", checkpoint=False)
    nxt = R.next_attempt(tmp_path / "x" / "jobs" / "j", rec, 1, stop=False, step=1, now=9.0)
    assert nxt.changes == {} and "is not resumed: nothing to resume from" in nxt.message


def test_the_exit_file_is_set_aside_for_the_next_attempt(tmp_path):
    (tmp_path / jobstore.EXIT_CODE).write_text('{"returncode": 1, "ended_at": 1.0}')
    R.set_exit_file_aside(tmp_path, 1)
    assert not (tmp_path / jobstore.EXIT_CODE).exists()
    assert (tmp_path / "exit_code.attempt-1").read_text() == '{"returncode": 1, "ended_at": 1.0}'
    R.set_exit_file_aside(tmp_path, 2)  # none: nothing to do
