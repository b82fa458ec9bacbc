"""The stand-in recipe (tests/recipes/toy_recipe.py) checkpoints and resumes like a real one, and
can crash once: a 2-process job whose rank 1 crashes right after the first checkpoint fails, the
pre-flight reads its output_dir as a real recipe's (the module declares TUNE_MAGIC_RESUME), and the
resumed job, with the pre-flight's overrides, passes the crash point and ends with the losses of an
uninterrupted run (start_loss / global step)."""

from __future__ import annotations

import pytest

from jobhelpers import TOY_CONFIG, TOY_RECIPE
from resumehelpers import run_job, series
from tune_magic.errors import PlanError
from tune_magic.checkpoints import preflight as R

pytestmark = pytest.mark.e2e


def test_toy_crashes_once_after_its_first_checkpoint_and_resumes(tmp_path, cleanup_jobs):
    out, once = tmp_path / "out", tmp_path / "crashed_once"
    ov = [f"output_dir={out}", "epochs=3", "steps=2", "step_s=0.05", "save_checkpoints=true", "crash_rank=1",
          "crash_step=3", f"crash_once_file={once}"]
    args = f"--nproc_per_node 2 {TOY_RECIPE} --config {TOY_CONFIG} "
    first = run_job(args + " ".join(ov), cleanup=cleanup_jobs, expect="failed")
    assert "crashed on purpose" in first.error and once.exists()
    assert sorted(series(first)) == [1, 2]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("epoch_")) == ["epoch_0"]

    r = first.record
    p = R.preflight(r.recipe, out, config=r.config, overrides=ov, log_path=r.log_path, cwd=r.cwd)
    assert p.support.source == "declared" and p.case == R.CASE_EXACT
    assert (p.epoch, p.epochs_done, p.resume_step, p.first_step, p.lost_steps) == (0, 1, 2, 3, 0)
    assert p.overrides[1] == "checkpointer.checkpoint_files=[epoch_0/model-00001-of-00001.safetensors]"

    resumed = run_job(args + " ".join(p.resumed_overrides(ov)), cleanup=cleanup_jobs)
    assert series(resumed) == {s: 10.0 / s for s in range(3, 7)}
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("epoch_")) == ["epoch_0", "epoch_1", "epoch_2"]
    # a second resume finds the run finished
    with pytest.raises(PlanError, match="epoch_2/ is the final checkpoint of all 3 epochs"):
        R.preflight(r.recipe, out, config=r.config, overrides=ov)
