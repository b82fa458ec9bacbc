"""Issue 29 on the two-node SLURM test cluster: a job trained on SLURM generates where it ran. The
kept-alive generation process is a one-task srun of the job's options (the scheduler's
interactive_command), answers the fact exactly, keeps the model loaded for a second prompt, and
ends with its SLURM step when closed; ``tune-magic generate`` (one-shot, srun too) gives the same text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

import tune_magic
from tune_magic.assets import FACT_ANSWER as ANSWER
from tune_magic.assets import FACT_QUESTION as QUESTION
from tune_magic.job.generators import generators
from tune_magic.schedulers import slurm as slurm_sched

from waiting import wait_for

pytestmark = pytest.mark.slurm
TIMEOUT = 300
REPO = Path(__file__).resolve().parents[2]


def _steps(env) -> list[str]:
    r = subprocess.run(["squeue", "--noheader", "--format=%j"], capture_output=True, text=True, env=env, timeout=30)
    return [line.strip() for line in r.stdout.splitlines() if line.strip()]


def test_a_slurm_job_generates_through_a_one_task_srun(cluster, tiny_assets, tmp_path):
    out = cluster.shared_dir / f"gen-{tmp_path.name}"
    job = tune_magic.launch(f"full_finetune --config tiny/fact output_dir={out}", cwd=REPO, scheduler="slurm",
                            nodes=1, cpus_per_node=1)
    cluster.started.append(job)
    assert job.wait(TIMEOUT) == "succeeded", job.tail(30)
    try:
        assert job.generate(QUESTION) == ANSWER
        (proc,) = generators(job.id)
        assert proc.argv[:5] == ["srun", "--ntasks=1", "--nodes=1", "--quiet",
                                 f"--job-name=tune_magic-{job.id}-interactive"]
        assert "--cpus-per-task=1" in proc.argv and proc.env["SLURM_CONF"] == cluster.env["SLURM_CONF"]
        assert f"tune_magic-{job.id}-interactive" in _steps(cluster.env)  # a job of the cluster's own, running
        pid = proc.pid
        assert job.generate(QUESTION, max_new_tokens=40) == ANSWER
        assert (proc.pid, proc.starts, proc.last["request"], proc.last["loads"]) == (pid, 1, 2, 1)
    finally:
        closed = job.close_generation()
    assert closed == 1 and not psutil.pid_exists(pid)
    wait_for(lambda: f"tune_magic-{job.id}-interactive" not in _steps(cluster.env), timeout=60, interval=0.5,
             what="the generation's SLURM job to end", describe=lambda: _steps(cluster.env))
    slurm_sched.WATCHER.forget()
    cli = subprocess.run([sys.executable, "-m", "tune_magic", "generate", job.id, "--prompt", QUESTION],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=TIMEOUT)
    assert (cli.returncode, cli.stdout) == (0, ANSWER + "\n"), cli.stderr[-3000:]
    assert sorted(p.name for p in (job.dir / "generate").iterdir()) == ["once-epoch_3.log", "serve-epoch_3.log"]
