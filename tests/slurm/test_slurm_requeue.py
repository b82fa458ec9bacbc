"""Issue 21 on the test cluster: a job launched with ``--requeue`` that SLURM requeues
(``scontrol requeue``) mid-epoch-2 continues from epoch 1's checkpoint in its next attempt (the
batch script runs the resume pre-flight itself) and ends ``succeeded`` with the losses of an
uninterrupted run; ``--resume-on-timeout 1`` requeues a job itself before its time limit.

The stand-in recipe (tests/recipes/toy_recipe.py) checkpoints like torchtune's full fine-tunes and
logs loss = 10 / global step, so an uninterrupted run's losses are known: steps 1..12 of 3 epochs
x 4 steps, the last 10/12. SLURM 22.05 holds a requeued job back (``BeginTime``, about two
minutes); the tests release it at once (``scontrol update StartTime=now``), as measured in
/work/shared/notes/slurm-and-multinode.md.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tune_magic
from tune_magic.checkpoints.lineage import notes
from tune_magic.registry import attempts as A
from tune_magic.schedulers import slurm as slurm_sched

from jobhelpers import toy_args
from resumehelpers import series
from waiting import wait_for

pytestmark = pytest.mark.slurm
TIMEOUT = 300
EPOCHS, STEPS = 3, 4
UNINTERRUPTED = {s: 10.0 / s for s in range(1, EPOCHS * STEPS + 1)}


def _fresh(job):
    job._checked = 0.0
    return job.refresh()


def _release(cluster, job):
    """Start a requeued job now instead of after 22.05's two-minute BeginTime."""
    wait_for(lambda: _fresh(job).status == "pending", timeout=90, interval=0.3, what="pending after the requeue",
             describe=lambda: (job.status, job.tail(10)))
    cluster.client(["scontrol", "update", f"jobid={job.engine_id}", "StartTime=now"])


def test_a_requeued_job_resumes_from_epoch_1s_checkpoint_and_ends_as_an_uninterrupted_run(cluster):
    job = tune_magic.launch(toy_args(f"epochs={EPOCHS}", f"steps={STEPS}", "step_s=1.0", "save_checkpoints=true",
                                     nproc=1), scheduler="slurm", nodes=1, cpus_per_node=1, requeue=True)
    cluster.started.append(job)
    assert "#SBATCH --requeue" in job.dir.joinpath("job.sbatch").read_text()
    # mid-epoch 2 (steps 5-8): epoch 1's checkpoint (epoch_0/) is written
    wait_for(lambda: (_fresh(job).summary().step or 0) >= STEPS + 2, timeout=TIMEOUT, interval=0.3,
             what="a step of epoch 2", describe=lambda: (job.status, job.tail(15)))
    reached = job.summary().step
    cluster.client(["scontrol", "requeue", job.engine_id])
    slurm_sched.WATCHER.forget()
    _release(cluster, job)
    assert job.wait(TIMEOUT) == "succeeded", job.tail(40)

    assert series(job) == UNINTERRUPTED and job.summary().step == EPOCHS * STEPS
    one, two = A.parse(job.record.attempts)
    assert one.reason == "requeued (scontrol requeue)" and STEPS + 2 <= one.step <= STEPS + 3, (one, reached)
    assert two.resumed_from == {"checkpoint": "epoch_0/", "epoch": 0, "step": STEPS}
    assert (two.reason, two.step, two.returncode) == (None, EPOCHS * STEPS, 0)
    assert one.started_at == job.started_at <= one.ended_at <= two.started_at < two.ended_at == job.ended_at
    assert job.record.backend["restarts"] == 1 and "resume_from_checkpoint=True" in job.argv
    # each attempt its own exit file: the first attempt (killed by the requeue) left none that ended the job
    assert (job.dir / "exit_code.attempt-2").is_file()
    assert f"attempt 2: resumed from epoch_0/ at step {STEPS} after requeued (scontrol requeue) " \
           f"(attempt 1 reached step {one.step})" in notes(job.record)
    assert "; attempt 2 resumes from epoch_0/ at step 4: resume_from_checkpoint=True" in "\n".join(job.tail(400))
    from tune_magic.ui.cards import JobCard

    card = JobCard(job, watch=False)
    card.watcher.poll_once()
    assert f"attempt 2: resumed from epoch_0/ at step {STEPS} after requeued (scontrol requeue)" in card.text()
    assert card.snapshot.resumed_at == (STEPS,)  # the chart's marker where attempt 2 resumed


def test_resume_on_timeout_requeues_the_job_once_before_its_limit_then_it_ends_at_its_limit(cluster):
    # 1 minute limit, USR1 45 s before it (SLURM looks every ~30 s: the first attempt may run up to
    # its whole minute, saving epoch_1 at step 8); 20 steps of 6 s fit in neither attempt
    job = tune_magic.launch(toy_args("epochs=5", f"steps={STEPS}", "step_s=6.0", "save_checkpoints=true",
                                     nproc=1), scheduler="slurm", nodes=1, cpus_per_node=1, time_limit="1",
                            resume_on_timeout=1)
    cluster.started.append(job)
    # beside it (SLURM's shortest limit is a minute: one wait serves both), a job without
    # --resume-on-timeout at its limit: the outcome table's row "hit the --time limit"
    plain = tune_magic.launch(toy_args("steps=1000", "step_s=0.5", nproc=2), scheduler="slurm", nodes=1,
                              cpus_per_node=2, time_limit="1")
    cluster.started.append(plain)
    script = job.dir.joinpath("job.sbatch").read_text()
    assert "#SBATCH --requeue" in script and "#SBATCH --signal=B:USR1@45" in script
    wait_for(lambda: (job.dir / "requeued-on-timeout.attempt-1").exists(), timeout=TIMEOUT, interval=0.5,
             what="the time-limit trap", describe=lambda: (_fresh(job).status, job.tail(15)))
    slurm_sched.WATCHER.forget()
    _release(cluster, job)
    # the second attempt has no resume left: its trap says so, and SLURM ends it at its limit
    assert job.wait(TIMEOUT) == "failed", job.tail(30)
    assert "time limit" in job.error, job.error
    log = "\n".join(job.tail(400))
    assert "requeueing job " in log and "(resume 1 of 1)" in log and "--resume-on-timeout 1 is used up" in log
    assert not (job.dir / "requeued-on-timeout.attempt-2").exists() and job.record.backend["restarts"] == 1
    one, two = A.parse(job.record.attempts)
    assert one.reason == "requeued (time limit near; --resume-on-timeout 1)", one
    assert two.number == 2 and two.ended_at == job.ended_at
    # the step it reached before SLURM ended it at its limit (issue 30: it was null)
    assert isinstance(two.step, int) and two.step == job.summary().step >= 1, (two, job.summary())
    assert plain.wait(TIMEOUT) == "failed", plain.tail(15)
    assert plain.error == "hit the --time limit 1", plain.tail(15)
    assert "#SBATCH --requeue" not in plain.dir.joinpath("job.sbatch").read_text()


def test_tune_magics_full_finetune_requeued_mid_epoch_2_ends_with_the_uninterrupted_runs_losses(cluster, tiny_assets,
                                                                                               tmp_path):
    import os

    from resumehelpers import OFFLINE, assert_same

    def launch(out, env=None, **kw):
        words = f"output_dir={out} epochs={EPOCHS} seed=0 max_steps_per_epoch={STEPS}"
        job = tune_magic.launch(f"--nproc_per_node 1 full_finetune --config tiny/full {words}", scheduler="slurm",
                                nodes=1, cpus_per_node=1, env={**os.environ, **OFFLINE, **(env or {})}, **kw)
        cluster.started.append(job)
        return job

    reference = launch(tmp_path / "ref")
    assert reference.wait(TIMEOUT) == "succeeded", reference.tail(30)
    paused = tmp_path / "paused"  # the recipe holds after step 6 (mid-epoch 2), once
    job = launch(tmp_path / "out", {"TUNE_MAGIC_TEST_PAUSE_AFTER_STEP": str(STEPS + 2),
                                    "TUNE_MAGIC_TEST_PAUSE_FILE": str(paused)}, requeue=True)
    wait_for(paused.exists, timeout=TIMEOUT, interval=0.5, what="step 6", describe=lambda: job.tail(15))
    assert (tmp_path / "out" / "epoch_0").is_dir() and not (tmp_path / "out" / "epoch_1").exists()
    cluster.client(["scontrol", "requeue", job.engine_id])
    slurm_sched.WATCHER.forget()
    _release(cluster, job)
    assert job.wait(TIMEOUT) == "succeeded", job.tail(40)
    ref = series(reference)
    assert sorted(ref) == list(range(1, EPOCHS * STEPS + 1))
    assert_same(series(job), ref, range(1, EPOCHS * STEPS + 1))  # the final loss (step 12) included
    one, two = A.parse(job.record.attempts)
    assert (one.reason, one.step) == ("requeued (scontrol requeue)", STEPS + 2)
    assert two.resumed_from == {"checkpoint": "epoch_0/", "epoch": 0, "step": STEPS}


def _requeue_at(cluster, job, ready, what: str) -> None:
    wait_for(ready, timeout=TIMEOUT, interval=0.3, what=what, describe=lambda: (job.status, job.tail(15)))
    cluster.client(["scontrol", "requeue", job.engine_id])
    slurm_sched.WATCHER.forget()
    _release(cluster, job)


def test_a_requeued_attempt_that_cannot_continue_says_why_in_the_record_the_card_and_logs_error(cluster):
    # issue 30: the recipe state truncated before attempt 2 starts ended the job "exited with code 3",
    # attempts [], the reason only in the log
    job = tune_magic.launch(toy_args(f"epochs={EPOCHS}", f"steps={STEPS}", "step_s=3.0", "save_checkpoints=true",
                                     nproc=1), scheduler="slurm", nodes=1, cpus_per_node=1, requeue=True)
    cluster.started.append(job)
    state = Path(job.record.output_dir) / "recipe_state" / "recipe_state.pt"

    def epoch_1_saved() -> bool:
        if (_fresh(job).summary().step or 0) < STEPS + 1 or not state.is_file():
            return False
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
        return True

    _requeue_at(cluster, job, epoch_1_saved, "epoch 1 saved, its recipe state then truncated")
    assert job.wait(TIMEOUT) == "failed", ("\n".join(job.tail(60)), job.record.attempts, job.error)
    assert job.error.startswith("attempt 2 cannot continue the job: ") and "recipe_state.pt is truncated" in job.error
    one, two = A.parse(job.record.attempts)
    assert one.reason == "requeued (scontrol requeue)" and two.number == 2 and two.returncode == 3
    assert "recipe_state.pt is truncated" in two.reason
    said = subprocess.run([sys.executable, "-m", "tune_magic", "logs", job.id, "--error"], capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert said.returncode == 0 and job.error in said.stdout.splitlines()[0], said
    from tune_magic.ui.cards import JobCard

    card = JobCard(job, watch=False)
    card.watcher.poll_once()
    assert "attempt 2 cannot continue the job" in card.text()


def test_a_requeue_that_lands_after_the_final_checkpoint_ends_the_job_succeeded(cluster):
    job = tune_magic.launch(toy_args("epochs=1", "steps=2", "step_s=0.5", "save_checkpoints=true", "linger_s=120",
                                     nproc=1), scheduler="slurm", nodes=1, cpus_per_node=1, requeue=True)
    cluster.started.append(job)
    final = Path(job.record.output_dir) / "epoch_0" / "model.safetensors.index.json"
    _requeue_at(cluster, job, lambda: final.is_file() and _fresh(job).summary().step == 2,
                "the final checkpoint, while the job lingers")
    assert job.wait(TIMEOUT) == "succeeded", (job.error, job.tail(30))
    assert job.returncode == 0 and job.error is None
    one, two = A.parse(job.record.attempts)
    assert one.reason == "requeued (scontrol requeue)" and two.reason.startswith("training had finished: ")
