"""The seam's interactive_command (issue 29): a command run once where a job ran (generation from its
checkpoint) is the command itself on this machine, a one-task srun of the job's allocation options
under its own SLURM_CONF on a cluster, and refused by a scheduler that cannot run one there."""

from __future__ import annotations

import time

import pytest

from tune_magic import schedulers
from tune_magic.errors import PlanError, UserError
from tune_magic.registry.store import JobRecord
from tune_magic.schedulers import MissingScheduler

ARGV = ["/venv/bin/python", "/repo/recipes/generate_text.py", "--config", "/cfg.yaml", "generate.serve=true"]


def record(**fields) -> JobRecord:
    return JobRecord(id="20261205-1-abc", name="fact", argv=["x"], env={}, cwd="/work/project", log_path="/l",
                     started_at=time.time(), **fields)


def test_on_this_machine_it_is_the_command_itself():
    env = {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "2"}
    argv, out = schedulers.get("local").interactive_command(record(), ARGV, env)
    assert argv == ARGV and argv is not ARGV and out == env and out is not env


def test_a_scheduler_that_cannot_run_one_there_says_so():
    with pytest.raises(UserError, match="scheduler 'gone' cannot run a command where its jobs ran"):
        MissingScheduler("gone").interactive_command(record(scheduler="gone"), ARGV, {})


def test_on_a_cluster_it_is_a_one_task_srun_with_the_jobs_options(tmp_path):
    (tmp_path / "srun").write_text("#!/bin/sh\n")
    (tmp_path / "srun").chmod(0o755)
    rec = record(scheduler="slurm", backend={"job_id": "41", "conf": "/clusters/b/slurm.conf"},
                 scheduler_options={"partition": "gpu", "account": "proj", "cpus_per_node": 8, "gpus_per_node": 4,
                                    "time_limit": "2:00:00", "nodes": 2})
    env = {"PATH": str(tmp_path), "SLURM_JOB_ID": "7", "SLURM_CONF": "/clusters/a/slurm.conf",
           "CUDA_VISIBLE_DEVICES": "0", "HOME": "/home/u"}
    argv, out = schedulers.get("slurm").interactive_command(rec, ARGV, env)
    assert argv == ["srun", "--ntasks=1", "--nodes=1", "--quiet", "--job-name=tune_magic-20261205-1-abc-interactive",
                    "--chdir=/work/project", "--partition=gpu", "--account=proj", "--cpus-per-task=8", "--gpus=1",
                    *ARGV]
    # the cluster the job went to; no surrounding allocation's variables; SLURM gives the task its GPU
    assert out == {"PATH": str(tmp_path), "SLURM_CONF": "/clusters/b/slurm.conf", "HOME": "/home/u"}
    bare, _ = schedulers.get("slurm").interactive_command(record(scheduler="slurm"), ARGV, env)
    assert bare == ["srun", "--ntasks=1", "--nodes=1", "--quiet", "--job-name=tune_magic-20261205-1-abc-interactive",
                    "--chdir=/work/project", *ARGV]


def test_the_sites_policy_and_placement_from_sbatch_words_go_to_srun_the_batch_jobs_own_do_not(tmp_path):
    (tmp_path / "srun").write_text("#!/bin/sh\n")
    (tmp_path / "srun").chmod(0o755)
    words = ["--qos=high", "--constraint=a100&ib", "--reservation=train week", "--mem=64G", "--requeue",
             "--signal=B:USR1@60", "--output=/x/%j.out", "--time=1:00:00", "--array=0-3", "-q", "--exclusive"]
    rec = record(scheduler="slurm", backend={"job_id": "41"}, scheduler_options={"partition": "gpu", "sbatch": words})
    argv, _ = schedulers.get("slurm").interactive_command(rec, ARGV, {"PATH": str(tmp_path)})
    assert argv[argv.index("--partition=gpu") + 1:] == ["--qos=high", "--constraint=a100&ib",
                                                          "--reservation=train week", "--mem=64G", *ARGV]


def test_on_a_cluster_without_srun_here_it_names_the_fix(tmp_path):
    with pytest.raises(PlanError, match=r"SLURM's client tools \(srun\) on PATH"):
        schedulers.get("slurm").interactive_command(record(scheduler="slurm"), ARGV, {"PATH": str(tmp_path)})
