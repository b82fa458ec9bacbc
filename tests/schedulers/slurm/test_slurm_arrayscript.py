"""The batch script of a sweep run as one SLURM job array: its ``#SBATCH`` lines (``--array``, a
per-task ``%A_%a`` output) and its body, which runs trial ``SLURM_ARRAY_TASK_ID``'s own batch
script. Run here with bash (no SLURM needed): the body is plain bash; sbatch is not involved."""

from __future__ import annotations

import os
import subprocess

import pytest

from tune_magic.errors import PlanError
from tune_magic.schedulers.base import SchedulerOptions
from tune_magic.schedulers.slurm.array import array_option, task_output_pattern
from tune_magic.schedulers.slurm.submit import sbatch_lines
from tune_magic.schedulers.slurm.submit import array_script, directives

#: Directory names a user's TUNE_MAGIC_HOME may hold: every one must reach bash literally.
ODD = ["plain", "with space", "dollar$HOME", "quote'single", 'quote"double', "back`tick`", "semi;colon", "100%"]


def write_trials(root, names):
    dirs = []
    for i, name in enumerate(names):
        d = root / f"{name}-{i}"
        d.mkdir()
        (d / "job.sbatch").write_text(f'#!/bin/bash\n#SBATCH --job-name=x\necho "trial {i} $0"\n')
        dirs.append(str(d))
    return dirs


def run_task(script_path, task):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    if task is not None:
        env["SLURM_ARRAY_TASK_ID"] = str(task)
    return subprocess.run(["bash", str(script_path)], capture_output=True, text=True, env=env, timeout=30)


def test_each_task_runs_its_own_trials_script_whatever_its_directory_is_called(tmp_path):
    dirs = write_trials(tmp_path, ODD)
    lines = directives(job_id="sweep-1", job_dir=str(tmp_path), cwd=str(tmp_path), nodes=1, gpus_per_node=None,
                       cpus_per_node=1, partition=None, time_limit=None, account=None, user_options=(), requeue=False,
                       output=task_output_pattern(f"{tmp_path}/logs/"), array=array_option(len(dirs), 2))
    text = array_script(sweep_id="sweep-1", job_dirs=dirs, script_name="job.sbatch", sbatch_lines=lines)
    path = tmp_path / "array.sbatch"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True).returncode == 0
    for i in range(len(dirs)):
        out = run_task(path, i)
        assert (out.returncode, out.stdout) == (0, f"trial {i} {dirs[i]}/job.sbatch\n"), (i, out.stderr)
    for task in (len(dirs), None):
        out = run_task(path, task)
        assert out.returncode == 1 and "no trial for array task" in out.stderr


def test_the_arrays_sbatch_lines_come_before_any_command_and_ask_one_task_per_trial(tmp_path):
    lines = sbatch_lines(SchedulerOptions("slurm", {"cpus_per_node": 2, "partition": "debug",
                                                    "sbatch": ("--qos=high",)}),
                         job_id="sweep-7", job_dir=str(tmp_path), cwd="/work dir", nodes=2,
                         output=task_output_pattern("/home/u/100%/logs/"), array=array_option(8, 2))
    text = array_script(sweep_id="sweep-7", job_dirs=["/a"] * 8, script_name="job.sbatch", sbatch_lines=lines)
    head = text.splitlines()
    assert head[0] == "#!/bin/bash"
    directives_seen = [line for line in head if line.startswith("#SBATCH ")]
    assert head[1:1 + len(directives_seen)] == directives_seen  # sbatch reads directives only before a command
    assert "#SBATCH --array=0-7%2" in directives_seen and "#SBATCH --job-name=tune_magic-sweep-7" in directives_seen
    assert "#SBATCH --output=/home/u/100%%/logs/%A_%a.log" in directives_seen  # the user's % is literal
    assert "#SBATCH --error=/home/u/100%%/logs/%A_%a.log" in directives_seen
    assert '#SBATCH "--chdir=/work dir"' in directives_seen and "#SBATCH --nodes=2" in directives_seen
    assert "#SBATCH --qos=high" in directives_seen and "#SBATCH --cpus-per-task=2" in directives_seen
    assert array_option(8, 8) == "--array=0-7"  # a cap that limits nothing is left out


def test_an_array_with_a_backslash_in_its_log_folder_is_refused():
    with pytest.raises(PlanError, match="backslash"):
        task_output_pattern("/home/u/a\\b/logs/")


def test_a_slurm_sweep_is_capped_only_when_asked(tmp_path, monkeypatch):
    """The array is the queue: without --max-parallel no %K (the cluster decides); with it, %K."""
    import tune_magic
    from jobhelpers import toy_args

    monkeypatch.delenv("TUNE_MAGIC_SCHEDULER", raising=False)
    args = toy_args("start_loss=1,2,3", "steps=1", nproc=1)
    free = tune_magic.sweep(args, scheduler="slurm", dry_run=True, cwd=tmp_path)
    capped = tune_magic.sweep(args, scheduler="slurm", dry_run=True, cwd=tmp_path, max_parallel=2)
    local = tune_magic.sweep(args, dry_run=True, cwd=tmp_path)
    assert (free.slots.max_parallel, capped.slots.max_parallel, local.slots.max_parallel) == (3, 2, 1)
    assert [array_option(3, d.slots.max_parallel) for d in (free, capped)] == ["--array=0-2", "--array=0-2%2"]


def test_a_slurm_sweeps_dry_run_shows_the_one_array_it_would_submit(tmp_path, monkeypatch):
    import tune_magic
    from tune_magic.registry import store as jobstore
    from tune_magic.sweeping import store as sweepstore
    from jobhelpers import toy_args

    monkeypatch.delenv("TUNE_MAGIC_SCHEDULER", raising=False)
    args = toy_args("start_loss=1,2,3", "steps=1", nproc=1)
    dry = tune_magic.sweep(args, scheduler="slurm", dry_run=True, cwd=tmp_path, max_parallel=2, cpus_per_node=1)
    sweep_dir = sweepstore.sweeps_root() / dry.id
    command, _, script = dry.engine_job.partition("\n\n")
    assert command == f"sbatch --parsable {sweep_dir}/array.sbatch"
    assert "#SBATCH --array=0-2%2" in script and f"#SBATCH --output={sweep_dir}/logs/%A_%a.log" in script
    assert f"#SBATCH --job-name=tune_magic-{dry.id}" in script
    for i, plan in enumerate(dry.plans):
        assert f"    {i}) job_dir={jobstore.jobs_root(create=False) / plan.job_id} ;;" in script
    assert dry.text().endswith(dry.engine_job) and "submitted as one job" in dry.text()
    path = tmp_path / "array.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    assert tune_magic.sweep(args, dry_run=True, cwd=tmp_path).engine_job is None  # local: each trial alone
