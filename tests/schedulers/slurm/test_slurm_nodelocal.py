"""A SLURM job's paths on a node's own disk (/tmp, /dev/shm, $TMPDIR) are warned about — the paths
its config writes, TUNE_MAGIC_HOME and the Python every node runs — in the dry run (the plan's
warnings, printed by %%tune_run --dry-run and tune-magic cmd) and so on the card (the record keeps
the plan's warnings). A warning, never a refusal; the local scheduler does not warn. Nothing is
submitted: every case is a dry run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import tune_magic
from tune_magic.schedulers.slurm.nodelocal import node_local_warnings

from jobhelpers import own_python_warnings, toy_args

SHARED = "/srv/shared-runs"  # not under any node-local directory (need not exist for a dry run)


@pytest.fixture
def shared_home(monkeypatch):
    """TUNE_MAGIC_HOME on a path that is not node-local (the session's own is under /tmp)."""
    monkeypatch.setenv("TUNE_MAGIC_HOME", "/srv/tune_magic_home")
    monkeypatch.delenv("TMPDIR", raising=False)


def slurm_warnings(args: str, gpus_per_node: int | None = None, **env) -> list[str]:
    """The plan's node-local warnings, but the one for this test run's own interpreter (a clone
    under /tmp), which must be there exactly when that interpreter is node-local."""
    env = {**os.environ, **env}
    plan = tune_magic.launch(args, scheduler="slurm", nodes=2, cpus_per_node=2, gpus_per_node=gpus_per_node,
                             dry_run=True, env=env)
    own = own_python_warnings(plan, env)
    assert [w for w in plan.warnings if w in own] == own, plan.warnings
    return [w for w in plan.warnings if "which each node has for itself" in w and w not in own]


def test_the_70b_examples_output_dir_under_tmp_is_one_warning_naming_the_keys_written_there(shared_home):
    (w,) = slurm_warnings("lora_finetune_distributed --config llama3_1/70B_lora", gpus_per_node=8)
    assert w.startswith("output_dir /tmp/torchtune/llama3_1_70B/lora/")
    assert "(also checkpointer.output_dir, metric_logger.log_dir, profiler.output_dir) is under /tmp" in w
    assert "write to a directory on a filesystem every node shares" in w and "e.g. output_dir=$HOME/runs/..." in w


@pytest.mark.parametrize("override, root", [("output_dir=/dev/shm/run1", "/dev/shm"),
                                            ("output_dir=/scratch/local/me/run1", "/scratch/local"),
                                            ("metric_logger.log_dir=/tmp/logs", "/tmp")])
def test_any_written_path_under_a_node_local_directory_is_warned(shared_home, override, root):
    (w,) = slurm_warnings(toy_args(override, nproc=1), TMPDIR="/scratch/local")
    key, path = override.split("=")
    assert w.startswith(f"{key} {path}") and f" is under {root}, which each node has for itself" in w


def test_shared_paths_and_the_local_scheduler_get_no_such_warning(shared_home, tmp_path):
    assert slurm_warnings(toy_args(f"output_dir={SHARED}/run1", nproc=1)) == []
    local = tune_magic.launch(toy_args("output_dir=/tmp/run1", nproc=1), dry_run=True)
    assert not any("each node has for itself" in w for w in local.warnings)  # this machine's own /tmp is fine


def test_tune_magic_home_and_the_python_on_a_node_local_path(shared_home, monkeypatch):
    monkeypatch.setenv("TUNE_MAGIC_HOME", "/tmp/tm-home")
    (w,) = slurm_warnings(toy_args(f"output_dir={SHARED}/run1", nproc=1))
    assert w == ("TUNE_MAGIC_HOME /tmp/tm-home is under /tmp, which each node has for itself: the job's log, record "
                 "and exit code would be written where this machine cannot see them; point TUNE_MAGIC_HOME at a "
                 "directory on a filesystem every node shares (your home or project directory)")
    plan = tune_magic.build_plan(toy_args(f"output_dir={SHARED}/run1", nproc=1), job_id="x1")
    (w,) = node_local_warnings(plan, {}, home="/srv/h", python="/tmp/venv/bin/python")
    assert w.startswith("the Python every node runs, /tmp/venv/bin/python, is under /tmp")
    assert node_local_warnings(plan, {}, home="/srv/h", python="/srv/venv/bin/python") == []


def test_the_dry_run_prints_the_warnings(shared_home, tmp_path):
    r = subprocess.run([sys.executable, "-m", "tune_magic", "cmd", "--scheduler", "slurm", "--nodes", "2",
                        "--cpus-per-node", "2", *toy_args("output_dir=/tmp/run1", nproc=1).split()],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "tune-magic cmd: warning: output_dir /tmp/run1 is under /tmp, which each node has for itself" in r.stderr
    assert r.stdout.startswith("sbatch --parsable ")  # the command and script alone on stdout


def test_the_magics_dry_run_prints_them_too(shared_home, ip, capsys):
    ip.run_line_magic("tune_run", "--dry-run --scheduler slurm --nodes 2 --cpus-per-node 2 "
                      + toy_args("output_dir=/dev/shm/run1", nproc=1))
    out = capsys.readouterr()
    assert out.out.startswith("sbatch --parsable ")
    assert "warning: output_dir /dev/shm/run1 is under /dev/shm, which each node has for itself" in out.err
