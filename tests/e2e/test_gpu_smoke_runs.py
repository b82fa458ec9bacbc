"""scripts/gpu-smoke run for real where no GPU is: its dry run, its CPU mode (real torchrun jobs on
gloo), its failure exit, and its refusal to run the GPU mode without a CUDA torch."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from jobhelpers import processes_mentioning

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv" / "bin" / "python"


def run_smoke(tmp_path, *args, timeout=400, **env):
    environ = {**os.environ, "TUNE_MAGIC_HOME": str(tmp_path / "home"), "GPU_SMOKE_SITE": str(tmp_path / "site"),
               **env}
    return subprocess.run([str(REPO / "scripts" / "gpu-smoke"), *args], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=timeout)


def test_dry_run_prints_the_gpu_plans_and_starts_nothing(tmp_path):
    proc = run_smoke(tmp_path, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    plans = [line for line in proc.stdout.splitlines() if "torch.distributed.run" in line]
    assert len(plans) == 3
    for line in plans[:2]:
        assert "CUDA_VISIBLE_DEVICES=0 " in line and "--standalone --nproc_per_node 1 " in line
        assert "/recipes/lora_finetune_distributed.py --config " in line and line.count("builtin_lora.yaml") == 1
    assert "CUDA_VISIBLE_DEVICES=0,1 " in plans[2] and "--nproc_per_node 2 " in plans[2]
    assert "lora_finetune.py --config" in plans[2] and "device=cuda dtype=bf16" in plans[2]
    assert not (tmp_path / "home" / "jobs").exists() or not any((tmp_path / "home" / "jobs").iterdir())


def test_cpu_mode_runs_both_phases_on_gloo_and_passes(tmp_path):
    proc = run_smoke(tmp_path, "--cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "torchtune's lora_finetune_distributed imports: yes" in out
    rows = re.findall(r"^(project-lora-\S+)\s+(\S+)\s+(\S+)\s+(\d+)\s+([0-9.]+)\s+(\d+)\s", out, re.M)
    assert [(name, status, step) for name, _, status, step, _, _ in rows] == [
        ("project-lora-a", "succeeded", "5"), ("project-lora-b", "succeeded", "5"),
        ("project-lora-gloo-2p", "succeeded", "5")]
    assert rows[0][5] != rows[1][5]  # the two concurrent jobs rendezvoused on their own ports
    assert all(float(loss) > 0 for *_, loss, _ in rows)
    assert re.search(r"^gpu-smoke: passed in \d+ s \(3 jobs;", out, re.M)


def test_a_job_past_the_deadline_is_stopped_and_the_run_fails(tmp_path):
    proc = run_smoke(tmp_path, "--cpu", "--timeout", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    stopped = re.findall(r"^job (\S+) \((\S+)\) still running after 1 s: stopping it", proc.stdout, re.M)
    assert [name for _, name in stopped] == ["project-lora-a", "project-lora-b", "project-lora-gloo-2p"]
    assert "gpu-smoke: FAILED" in proc.stdout
    assert f"project-lora-a ({stopped[0][0]}) ended stopped" in proc.stdout
    assert all(processes_mentioning(job_id) == [] for job_id, _ in stopped)


def test_gpu_mode_refuses_a_python_without_cuda_torch(tmp_path):
    proc = run_smoke(tmp_path, timeout=120, GPU_SMOKE_PYTHON=str(VENV_PYTHON))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"gpu-smoke: {VENV_PYTHON} has no CUDA build of torch; run this on the GPU "
                                   "machine (or pass --cpu / set GPU_SMOKE_PYTHON)")
