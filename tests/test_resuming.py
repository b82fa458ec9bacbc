"""The resume pipeline's checks and plan (tune_magic.job.resume), on jobs written by hand (FAKE: no
process ran; their output_dirs hold what the stand-in recipe saves). Only dry runs here: nothing is
launched. Real resumes: tests/e2e/test_resume_api.py."""

from __future__ import annotations

import fcntl
import os
import sys

import pytest

import tune_magic
from tune_magic.errors import NothingToResume, PlanError
from tune_magic.registry import store as jobstore

from jobhelpers import TOY_CONFIG, TOY_RECIPE
from resumehelpers import fake_job, toy_checkpoint

BAR = "\r{e}|{s}|Loss: 2.5:  50%|█████     | {n}/2 [00:01<00:01,  2.00it/s]"


@pytest.fixture
def root(job_registry):
    return job_registry


def test_a_failed_job_with_a_checkpoint_resumes_in_its_own_output_dir(root, tmp_path):
    out = toy_checkpoint(tmp_path / "out")
    # an earlier release's record: no overrides or torchrun options of its own (read back from argv)
    fake_job(root, "a", out, nproc=2, log=BAR.format(e=2, s=3, n=1), overrides=("epochs=3", "steps=2", "seed=0"),
             gpus=None)
    plan = tune_magic.resume("a", ["step_s=0.01"], dry_run=True)
    assert plan.preflight.epoch == 0 and plan.preflight.lost_steps == 1 and plan.fresh is False
    assert plan.args == ["--nproc_per_node", "2", str(TOY_RECIPE), "--config", str(TOY_CONFIG), "epochs=3", "steps=2",
                         "seed=0", f"output_dir={out}", "step_s=0.01", "resume_from_checkpoint=True",
                         "checkpointer.checkpoint_files=[epoch_0/model-00001-of-00001.safetensors]",
                         "checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt"]
    assert plan.record_fields == {"resumed_from": "a", "resume_point": {
        "checkpoint": "epoch_0/", "epoch": 0, "step": 2, "first_step": 3, "case": "exact", "lost_steps": 1}}
    assert plan.launch_options["scheduler"] == "local" and plan.launch_options["name"] == "toy a"
    text = plan.summary()
    assert text.startswith("Resume job a: toy_recipe from epoch_0/ (1 of 3 epochs done, global step 2)")
    assert "  lost: 1 step (step 3), done again" in text and "  your overrides: step_s=0.01" in text
    # the command: the same output_dir (no per-job folder added), --standalone from the policy again
    argv = plan.launch_plan.argv
    assert argv[argv.index("torch.distributed.run") + 1:][:3] == ["--standalone", "--nproc_per_node", "2"]
    assert [a for a in argv if a.startswith("output_dir=")] == [f"output_dir={out}"]
    assert "  command: " in text and "resume_from_checkpoint=True" in text


def test_recorded_fields_win_and_a_resume_of_a_resume_replaces_its_keys(root, tmp_path):
    out = toy_checkpoint(tmp_path / "out", epochs_run=2)
    old = ["epochs=3", "steps=2", f"output_dir={out}", "resume_from_checkpoint=True",
           "checkpointer.checkpoint_files=[epoch_0/model-00001-of-00001.safetensors]",
           "checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt"]
    fake_job(root, "b", out, overrides=old[:2], torchrun_options=[], recipe_name=None, resumed_from="a")
    record = jobstore.read(root / "b")
    record.overrides, record.argv = old, record.argv[:-3] + old[2:]
    jobstore.write_record(root / "b", record)
    plan = tune_magic.resume("b", dry_run=True)
    assert plan.args[:3] == [str(TOY_RECIPE), "--config", str(TOY_CONFIG)]  # one process: no torchrun options
    assert plan.args[3:] == ["epochs=3", "steps=2", f"output_dir={out}", "resume_from_checkpoint=True",
                             "checkpointer.checkpoint_files=[epoch_1/model-00001-of-00001.safetensors]",
                             "checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt"]


@pytest.mark.parametrize("status, match", [
    ("succeeded", "job s succeeded: its training finished"),
    ("running", "job s is running: a resume continues a job that has ended"),
    ("pending", "job s is pending"),
])
def test_status_refusals(root, tmp_path, status, match):
    fake_job(root, "s", toy_checkpoint(tmp_path / "out"), status=status)
    fd = None
    if status == "running":  # FAKE supervisor: this test holds the job's lock, as a supervisor does
        fd = os.open(root / "s" / jobstore.SUPERVISOR_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(PlanError, match=match) as caught:
            tune_magic.resume("s", dry_run=True)
        assert isinstance(caught.value, NothingToResume) is (status == "succeeded")
    finally:
        if fd is not None:
            os.close(fd)


def test_unknown_is_refused_while_something_of_it_may_run_and_resumed_once_nothing_does(root, tmp_path):
    fake_job(root, "u", toy_checkpoint(tmp_path / "out"), status="unknown")
    fd = os.open(root / "u" / jobstore.SUPERVISOR_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # FAKE: the scheduler sees a live supervisor
    try:
        jobstore.update(root / "u", status="unknown")
        with pytest.raises(PlanError, match="outcome is unknown and its scheduler has not confirmed that nothing of it"):
            tune_magic.resume("u", dry_run=True)
    finally:
        os.close(fd)
    assert tune_magic.resume("u", dry_run=True).preflight.epoch == 0


def test_a_job_resumed_already_names_the_newer_one(root, tmp_path):
    out = toy_checkpoint(tmp_path / "out")
    fake_job(root, "a", out)
    fake_job(root, "b", out, resumed_from="a", status="stopped")  # its old side never linked (a killed resume)
    with pytest.raises(PlanError, match="job a was resumed already, by job b \\(stopped\\); resume that one instead"):
        tune_magic.resume("a", dry_run=True)
    assert tune_magic.resume("b", dry_run=True).job_id == "b"


def test_a_live_job_in_the_same_output_dir_is_refused(root, tmp_path):
    out = toy_checkpoint(tmp_path / "out")
    fake_job(root, "a", out)
    fake_job(root, "other", out / "nested", status="running")
    fd = os.open(root / "other" / jobstore.SUPERVISOR_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # FAKE supervisor of the other job
    try:
        with pytest.raises(PlanError, match="job other \\(running\\) writes to .*nested, which shares the output_dir"):
            tune_magic.resume("a", dry_run=True)
    finally:
        os.close(fd)


@pytest.mark.parametrize("extra, match", [
    (["output_dir=/elsewhere"], "a resume continues in the job's own output_dir"),
    (["checkpointer.recipe_checkpoint=x.pt"], "the resume sets checkpointer.recipe_checkpoint itself"),
    (["resume_from_checkpoint=False"], "the resume sets resume_from_checkpoint itself"),
    (["not an override"], "is not key=value"),
])
def test_extra_overrides_that_cannot_go_with_a_resume(root, tmp_path, extra, match):
    fake_job(root, "a", toy_checkpoint(tmp_path / "out"))
    with pytest.raises(PlanError, match=match):
        tune_magic.resume("a", extra, dry_run=True)


def test_nothing_saved_offers_a_fresh_start_and_fresh_refuses_a_checkpoint(root, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    fake_job(root, "f", out)
    with pytest.raises(NothingToResume, match="no checkpoint .*tune-magic resume f --fresh") as caught:
        tune_magic.resume("f", dry_run=True)
    assert caught.value.fresh_start
    plan = tune_magic.resume("f", fresh=True, dry_run=True)
    assert plan.preflight is None and plan.record_fields["resume_point"] == {"fresh": True, "step": 0}
    assert "resume_from_checkpoint=True" not in plan.args and plan.args[-1] == f"output_dir={out}"
    assert plan.summary().startswith("Start job f again from the beginning: it saved no checkpoint")
    toy_checkpoint(out)
    with pytest.raises(PlanError, match="job f saved a checkpoint to resume from; a fresh start would train over it"):
        tune_magic.resume("f", fresh=True, dry_run=True)


def test_a_truncated_recipe_state_is_reported_as_truncated(root, tmp_path):
    out = toy_checkpoint(tmp_path / "out")
    state = out / "recipe_state" / "recipe_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    fake_job(root, "t", out)
    with pytest.raises(PlanError, match="recipe_state.pt is truncated"):
        tune_magic.get_job("t").resume(dry_run=True)
    state.write_bytes(b"not a torch file at all")
    with pytest.raises(PlanError, match="recipe_state.pt is not a torch file"):
        tune_magic.resume("t", dry_run=True)


def test_options_default_to_the_old_jobs_and_given_ones_win(root, tmp_path):
    fake_job(root, "g", toy_checkpoint(tmp_path / "out"), name="mine", max_resumes=2)
    plan = tune_magic.resume("g", dry_run=True)
    assert (plan.launch_options["name"], plan.launch_options["max_resumes"]) == ("mine", 2)
    plan = tune_magic.resume("g", dry_run=True, name="again", max_resumes=1)
    assert (plan.launch_options["name"], plan.launch_options["max_resumes"]) == ("again", 1)
    assert "runs as: 'again' on scheduler local (max_resumes=1)" in plan.summary()


def test_a_cell_body_config_is_handed_on_as_text(root, tmp_path):
    out = toy_checkpoint(tmp_path / "out")
    rec = fake_job(root, "c", out)
    body = (root / "c" / "config.yaml")
    body.write_text(TOY_CONFIG.read_text())
    record = jobstore.read(root / "c")
    record.config = str(body)
    record.argv = [a if a != str(TOY_CONFIG) else str(body) for a in rec.argv]
    jobstore.write_record(root / "c", record)
    plan = tune_magic.resume("c", dry_run=True)
    assert "--config" not in plan.args and plan.config_overlay == TOY_CONFIG.read_text()
    assert plan.launch_options["config_overlay"] == plan.config_overlay


def test_job_resume_and_the_public_api_are_one(root, tmp_path):
    fake_job(root, "a", toy_checkpoint(tmp_path / "out"))
    assert tune_magic.get_job("a").resume(dry_run=True).args == tune_magic.resume("a", dry_run=True).args
    assert sys.modules["tune_magic.job.resume"].resume is tune_magic.resume
