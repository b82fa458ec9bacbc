"""tune_magic's own recipes resume exactly: the remaining steps of a resumed 3-epoch tiny run give
the losses (within 1e-6) and learning rates of the uninterrupted run with the same seed, with its
global step numbers, with max_steps_per_epoch set and null, one process and two.

Every run is a real job through ``tune_magic.launch`` (torchrun, CPU, gloo). "Stopped after epoch
1's checkpoint" is made two ways: epoch_1/ and the recipe state of an uninterrupted run copied into
a fresh output_dir, and a real interruption: the run paused after step 10 by the recipes'
test-only knob (TUNE_MAGIC_TEST_PAUSE_AFTER_STEP) and stopped with SIGTERM (Job.stop), then resumed
in the same output_dir.
"""

from __future__ import annotations

import pytest

from resumehelpers import assert_same, copy_checkpoint, preflight_of, run_job, series, wait_for_file
from tune_magic.checkpoints import preflight as R

pytestmark = pytest.mark.e2e

EPOCHS = 3
# max_steps_per_epoch=4: 4 of the epoch's 64 batches; null: every batch of the epoch (batch_size 16: 8)
SETTINGS = {4: ["max_steps_per_epoch=4"], None: ["max_steps_per_epoch=null", "batch_size=16"]}
STEPS_PER_EPOCH = {4: 4, None: 8}
_reference: dict[tuple, tuple] = {}


def overrides(max_steps: int | None, out) -> list[str]:
    return [f"output_dir={out}", f"epochs={EPOCHS}", "seed=0", *SETTINGS[max_steps]]


def reference(recipe: str, max_steps: int | None, nproc: int, tmp_path_factory, cleanup: list):
    """The uninterrupted run (run once per setting in this module)."""
    key = (recipe, max_steps, nproc)
    if key not in _reference:
        out = tmp_path_factory.mktemp(f"ref_{recipe}_{max_steps}_{nproc}")
        ov = overrides(max_steps, out)
        job = run_job(f"--nproc_per_node {nproc} {recipe} --config tiny/{recipe.split('_')[0]} {' '.join(ov)}",
                      cleanup=cleanup)
        _reference[key] = (job, out, series(job), series(job, "lr"))
    return _reference[key]


@pytest.mark.parametrize("max_steps", [4, None], ids=["max_steps_4", "max_steps_null"])
@pytest.mark.parametrize("recipe", ["lora_finetune", "full_finetune"])
def test_resumed_from_a_copied_checkpoint_gives_the_uninterrupted_losses(recipe, max_steps, tiny_assets, tmp_path,
                                                                         tmp_path_factory, cleanup_jobs):
    job, out, ref_loss, ref_lr = reference(recipe, max_steps, 1, tmp_path_factory, cleanup_jobs)
    spe = STEPS_PER_EPOCH[max_steps]
    assert sorted(ref_loss) == list(range(1, EPOCHS * spe + 1))
    fresh = copy_checkpoint(out, tmp_path / "out", epoch=1)
    ov = overrides(max_steps, fresh)
    p = preflight_of(job, fresh, ov)
    assert p.case == R.CASE_EXACT and (p.epoch, p.epochs_done, p.total_epochs) == (1, 2, EPOCHS)
    assert p.recipe_state.max_steps_per_epoch == max_steps and p.recipe_state.seed == 0
    if max_steps is not None:
        assert (p.resume_step, p.first_step) == (2 * spe, 2 * spe + 1)
    resumed = run_job(f"--nproc_per_node 1 {recipe} --config tiny/{recipe.split('_')[0]} "
                      + " ".join(p.resumed_overrides(ov)), cleanup=cleanup_jobs)
    tail = range(2 * spe + 1, EPOCHS * spe + 1)  # epoch 3's steps, numbered as the uninterrupted run
    assert_same(series(resumed), ref_loss, tail)
    assert_same(series(resumed, "lr"), ref_lr, tail, tol=1e-12)
    assert (fresh / "epoch_2").is_dir()


def test_two_processes_resume_exactly(tiny_assets, tmp_path, tmp_path_factory, cleanup_jobs):
    job, out, ref_loss, ref_lr = reference("lora_finetune", 4, 2, tmp_path_factory, cleanup_jobs)
    fresh = copy_checkpoint(out, tmp_path / "out", epoch=1)
    ov = overrides(4, fresh)
    p = preflight_of(job, fresh, ov)
    resumed = run_job("--nproc_per_node 2 lora_finetune --config tiny/lora " + " ".join(p.resumed_overrides(ov)),
                      cleanup=cleanup_jobs)
    assert len(resumed.record.workers) == 2
    assert_same(series(resumed), ref_loss, range(9, 13))
    assert_same(series(resumed, "lr"), ref_lr, range(9, 13), tol=1e-12)


def test_a_run_stopped_by_sigterm_in_epoch_3_resumes_in_place(tiny_assets, tmp_path, tmp_path_factory, cleanup_jobs):
    import tune_magic.job.launch as L
    from resumehelpers import OFFLINE
    import os

    _, _, ref_loss, _ = reference("full_finetune", 4, 1, tmp_path_factory, cleanup_jobs)
    out, paused = tmp_path / "out", tmp_path / "paused"
    ov = overrides(4, out)
    args = "--nproc_per_node 1 full_finetune --config tiny/full " + " ".join(ov)
    job = L.launch(args, env={**os.environ, **OFFLINE, "TUNE_MAGIC_TEST_PAUSE_AFTER_STEP": "10",
                              "TUNE_MAGIC_TEST_PAUSE_FILE": str(paused)})
    cleanup_jobs.append(job)
    wait_for_file(paused, job)  # epochs 1 and 2 saved, steps 9 and 10 of epoch 3 done
    assert job.stop(grace_s=10) == "stopped"
    assert sorted(series(job)) == list(range(1, 11))
    assert not (out / "epoch_2").exists() and (out / "epoch_1").is_dir()

    p = preflight_of(job, out, ov, log_path=job.log_path)
    assert (p.epoch, p.resume_step, p.last_step, p.lost_steps) == (1, 8, 10, 2)
    assert "lost: 2 steps (steps 9-10), done again" in p.summary()
    resumed = run_job(args.replace(" ".join(ov), " ".join(p.resumed_overrides(ov))), cleanup=cleanup_jobs)
    assert resumed.record.output_dir == str(out)
    assert_same(series(resumed), ref_loss, range(9, 13))
    # the steps the stopped run did again gave the same values too
    for s in (9, 10):
        assert abs(series(job)[s] - ref_loss[s]) <= 1e-6
