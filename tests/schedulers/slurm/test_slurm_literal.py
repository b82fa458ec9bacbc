"""The batch script is as literal as the local launch, and the new job does not inherit the
surrounding allocation: what bash makes of the script's srun line, run by bash itself with srun
replaced by a function that prints its arguments (no SLURM needed). The same on the test cluster:
tests/slurm/test_slurm_faults.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tune_magic import build_plan
from tune_magic.errors import PlanError
from tune_magic.schedulers import slurm as S
from tune_magic.schedulers.base import SchedulerOptions
from tune_magic.schedulers.slurm.options import check_sbatch_options, sbatch_env

from jobhelpers import TOY_CONFIG, TOY_RECIPE

JOB = "20261201-000000-abcdef"
# what bash would expand in a word it does not quote: the scheduler's own variables among them
OVERRIDES = ("tag=${SLURM_JOB_ID}", "note=${TUNE_MAGIC_RDZV_ENDPOINT}", "nodes=${SLURM_JOB_NUM_NODES}",
             "shell=$(echo no) `echo no` $HOME", "quote=it's \"q\" \\ back")


def _prepared(tmp_path: Path, args: list[str], nodes: int = 2, sbatch=(), job_dir: Path | None = None,
              cwd: Path | None = None):
    env = {"PATH": os.environ["PATH"], "HOME": "/home/u", "TUNE_MAGIC_HOME": str(tmp_path / "home")}
    opts = SchedulerOptions("slurm", {"nodes": nodes, "cpus_per_node": 1, "sbatch": tuple(sbatch)})
    plan = build_plan(args, env=env, cwd=str(cwd or tmp_path), job_id=JOB, scheduler="slurm", nodes=nodes)
    return plan, S.SlurmScheduler().prepare(plan, opts, env, job_dir or tmp_path / "jobs" / JOB)


def _srun_words(script: str, values: dict[str, str]) -> list[str]:
    """The arguments srun gets when bash runs the script's srun line (srun a function here)."""
    start = script.index("\nsrun ") + 1
    end = script.index("\nrc=$?")
    line = script[start:end]
    setup = "".join(f"export {k}={v}\n" for k, v in values.items())
    prog = setup + "srun() { printf '%s\\0' \"$@\"; }\n" + line + "\n"
    out = subprocess.run(["bash", "-c", prog], capture_output=True, check=True).stdout.decode()
    return out.split("\0")[:-1]


def test_every_user_word_reaches_the_recipe_exactly_as_typed(tmp_path):
    conf_dir = tmp_path / "cfg-${SLURM_JOB_ID}"
    conf_dir.mkdir()
    config = conf_dir / "toy.yaml"
    shutil.copy(TOY_CONFIG, config)
    args = ["--nproc_per_node", "1", str(TOY_RECIPE), "--config", str(config), *OVERRIDES]
    plan, prepared = _prepared(tmp_path, args)
    script = prepared["batch_script"]
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    words = _srun_words(script, {"SLURM_JOB_ID": "26", "SLURM_JOB_NUM_NODES": "2",
                                 "TUNE_MAGIC_RDZV_ENDPOINT": "10.0.0.1:29400", "HOME": "/root"})
    command = words[words.index("--") + 1:]
    # the scheduler's own placeholders are filled in on the node...
    assert command[command.index("--nnodes") + 1] == "2"
    assert command[command.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
    assert command[command.index("--rdzv-id") + 1] == "26"
    # ...and nothing else is: the overrides and the config path as typed
    assert command[command.index("--config") + 1] == str(config)
    for override in OVERRIDES:
        assert override in command, (override, command)
    filled = {"${SLURM_JOB_NUM_NODES}": "2", "${TUNE_MAGIC_RDZV_ENDPOINT}": "10.0.0.1:29400", "${SLURM_JOB_ID}": "26"}
    # word for word the plan's command, with only the scheduler's own three values filled in
    assert command == [filled.get(a, a) if i in (4, 10, 12) else a for i, a in enumerate(plan.argv)], command


def test_a_user_endpoint_that_looks_like_the_placeholder_is_still_the_users(tmp_path):
    args = ["--nproc_per_node", "1", "--rdzv-endpoint", "head:29400", str(TOY_RECIPE), "--config", str(TOY_CONFIG),
            "x=${TUNE_MAGIC_RDZV_ENDPOINT}"]
    _, prepared = _prepared(tmp_path, args)
    words = _srun_words(prepared["batch_script"], {"SLURM_JOB_ID": "26", "SLURM_JOB_NUM_NODES": "2",
                                                   "TUNE_MAGIC_RDZV_ENDPOINT": "10.0.0.1:29400"})
    assert words[words.index("--rdzv-endpoint") + 1] == "head:29400"
    assert "x=${TUNE_MAGIC_RDZV_ENDPOINT}" in words


def test_a_percent_in_the_home_is_doubled_in_output_and_a_backslash_is_refused_before_submitting(tmp_path):
    args = ["--nproc_per_node", "1", str(TOY_RECIPE), "--config", str(TOY_CONFIG)]
    _, prepared = _prepared(tmp_path, args, job_dir=tmp_path / "100%home" / "jobs" / JOB)
    lines = [line for line in prepared["batch_script"].splitlines() if line.startswith("#SBATCH --output=")]
    assert lines == [f"#SBATCH --output={tmp_path}/100%%home/jobs/{JOB}/output.log"]
    with pytest.raises(PlanError, match="backslash.*nothing was submitted"):
        _prepared(tmp_path, args, job_dir=tmp_path / "a\\b" / "jobs" / JOB)


def test_srun_variables_of_the_surrounding_allocation_are_dropped_unless_named():
    env = {"PATH": "/usr/bin", "SLURM_CONF": "/c", "SLURM_JOB_ID": "7", "SRUN_CPUS_PER_TASK": "4",
           "SBATCH_PARTITION": "debug"}
    assert sbatch_env(env)[0] == {"PATH": "/usr/bin", "SLURM_CONF": "/c", "SBATCH_PARTITION": "debug"}
    named = check_sbatch_options(["--export=SRUN_CPUS_PER_TASK,FOO=1", "--qos=high"])
    assert named.exports == ("SRUN_CPUS_PER_TASK", "FOO=1") and named.groups == (("--qos=high",),)
    assert named.argv == ("--qos=high",) and named.exported_names() == {"SRUN_CPUS_PER_TASK", "FOO"}
    assert sbatch_env(env, keep=named.exported_names())[0]["SRUN_CPUS_PER_TASK"] == "4"
    assert check_sbatch_options(["--export ALL,X"]).exports == ("X",)
    for refused in ("--export=NONE", "--export=NIL", "--export=ALL", "--export=1"):
        with pytest.raises(PlanError, match="the scheduler owns sbatch's --export"):
            check_sbatch_options([refused])


def test_named_exports_join_the_schedulers_export_line(tmp_path):
    args = ["--nproc_per_node", "1", str(TOY_RECIPE), "--config", str(TOY_CONFIG)]
    _, prepared = _prepared(tmp_path, args, sbatch=["--export=SRUN_CPUS_PER_TASK=4"])
    lines = [line for line in prepared["batch_script"].splitlines() if "--export" in line]
    assert lines == ["#SBATCH --export=ALL,SRUN_CPUS_PER_TASK=4"]
