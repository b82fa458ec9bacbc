"""Issue 28 on the two-node SLURM test cluster: a torchtune 0.6.1 built-in recipe, unmodified, whose
checkpoints are evaluated by SLURM jobs of their own (the evaluator runs on the submitting machine,
each evaluation is one sbatch job on the job's partition), each value equal to an independent
computation from the checkpoint's files."""

from __future__ import annotations

import os

import pytest

import tune_magic
from tune_magic.schedulers import slurm as slurm_sched

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
