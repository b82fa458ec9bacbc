"""Checkpoints on the two-node SLURM test cluster (issues 28 and 29):

- a torchtune 0.6.1 built-in recipe, unmodified, whose checkpoints are evaluated by SLURM jobs of
  their own (the job's keeper runs on the submitting machine, each evaluation is one sbatch job on
  the job's partition), each value equal to an independent computation from the checkpoint's files;
- a job keeping one checkpoint, requeued by SLURM in its third epoch, continues from the checkpoint
  the keeper kept and ends with the losses it would have had.
"""

from __future__ import annotations

import os

import pytest

import tune_magic
from tune_magic.schedulers import slurm as slurm_sched

from resumehelpers import series
from valreference import reference_for_folder, val_examples
from waiting import wait_for

pytestmark = pytest.mark.slurm
TIMEOUT = 300


def test_a_builtin_recipes_checkpoints_are_evaluated_by_slurm_jobs_of_their_own(cluster, tiny_assets, tmp_path):
    from resumehelpers import OFFLINE

    out = cluster.shared_dir / f"val-{tmp_path.name}"
    job = tune_magic.launch(f"lora_finetune_single_device --config tiny/builtin_lora_single epochs=2 "
                            f"max_steps_per_epoch=3 output_dir={out}", scheduler="slurm", nodes=1, cpus_per_node=1,
                            val_split=0.1, env={**os.environ, **OFFLINE})
    cluster.started.append(job)
    assert job.record.validation == {"mode": "checkpoints", "every_n_steps": None}
    assert job.wait(TIMEOUT) == "succeeded", job.tail(30)

    def settled():
        slurm_sched.WATCHER.forget()
        evals = job.evaluations()
        return len(evals) == 2 and all(e.status in ("succeeded", "failed") for e in evals)

    wait_for(settled, timeout=TIMEOUT, interval=1.0, what="both evaluations to end",
             describe=lambda: (job.evaluations(), (job.dir / "evaluator.log").read_text()))
    evals = job.evaluations()
    assert [(e.epoch, e.step, e.status) for e in evals] == [(0, 3, "succeeded"), (1, 6, "succeeded")]
    examples = val_examples(tiny_assets, tmp_path / "hf")  # --val-split 0.1: the last 10%
    for e in evals:
        ev = tune_magic.get_job(e.job_id)
        cluster.started.append(ev)
        assert ev.scheduler == "slurm" and ev.engine_id  # one sbatch job each
        assert ev.record.evaluates == {"job": job.id, "epoch": e.epoch, "step": e.step}
        expected = reference_for_folder(out / f"epoch_{e.epoch}", tiny_assets, examples)
        assert e.val_loss == pytest.approx(expected, rel=1e-4)
    assert [(p.step, p.value) for p in job.validation_points()] == [(e.step, e.val_loss) for e in evals]


def test_a_job_keeping_one_checkpoint_requeued_in_epoch_3_continues_from_what_was_kept(cluster, tiny_assets,
                                                                                       tmp_path):
    from resumehelpers import OFFLINE

    out = cluster.shared_dir / f"keep-{tmp_path.name}"
    paused = cluster.shared_dir / f"paused-{tmp_path.name}"
    job = tune_magic.launch(f"--nproc_per_node 1 full_finetune --config tiny/full output_dir={out} epochs=3 seed=0 "
                            "max_steps_per_epoch=4", scheduler="slurm", nodes=1, cpus_per_node=1, requeue=True,
                            keep_checkpoints=1, env={**os.environ, **OFFLINE, "TUNE_MAGIC_TEST_PAUSE_AFTER_STEP": "10",
                                                     "TUNE_MAGIC_TEST_PAUSE_FILE": str(paused)})
    cluster.started.append(job)
    wait_for(paused.exists, timeout=TIMEOUT, interval=0.5, what="step 10", describe=lambda: job.tail(15))
    wait_for(lambda: not (out / "epoch_0").exists(), timeout=60, interval=0.3, what="the keeper to remove epoch_0",
             describe=lambda: (job.dir / "keeper.log").read_text() if (job.dir / "keeper.log").exists() else "")
    assert (out / "epoch_1").is_dir()  # the newest, which the requeued attempt resumes from
    cluster.client(["scontrol", "requeue", job.engine_id])
    slurm_sched.WATCHER.forget()
    wait_for(lambda: job.refresh().status == "pending", timeout=90, interval=0.3, what="pending after the requeue")
    cluster.client(["scontrol", "update", f"jobid={job.engine_id}", "StartTime=now"])
    assert job.wait(TIMEOUT) == "succeeded", job.tail(40)
    assert sorted(series(job)) == list(range(1, 13))
    wait_for(lambda: (job.dir / "keeper.done").exists(), timeout=60, interval=0.5, what="the keeper to finish")
    assert [(c.epoch, c.pruned is not None) for c in job.checkpoints()] == [(0, True), (1, False), (2, False)]
