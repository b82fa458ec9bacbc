"""Validation losses where the user reads them, from the command line, on a real tiny job (issue 28).

torchtune 0.6.1's own ``lora_finetune_single_device`` with ``--val-split 0.1`` (CPU, 2 epochs of 2
steps): each ``epoch_N/`` it saves is evaluated by a job of its own. ``tune-magic run --wait``
streams the log, then a line per evaluation as it ends, then how the job ended with its validation
loss; ``tune-magic jobs`` lists the VAL LOSS and what each evaluation job validates; ``--json`` and
``tune-magic metrics`` carry the values the evaluations wrote. The card and the table in a notebook:
tests/e2e/test_notebooks.py (the quickstart) and tests/e2e/test_browser.py (JupyterLab).
"""

from __future__ import annotations

import json
import subprocess
import sys

import tune_magic

ARGS = ["lora_finetune_single_device", "--config", "tiny/builtin_lora_single", "epochs=2", "max_steps_per_epoch=2"]


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "tune_magic", *args], capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def test_run_wait_jobs_and_metrics_show_the_checkpoints_evaluations(tiny_assets, tmp_path):
    r = cli("run", "--wait", "--name", "val-views", "--val-split", "0.1", *ARGS, f"output_dir={tmp_path / 'out'}")
    job_id = r.stdout.splitlines()[0].strip()
    job = tune_magic.get_job(job_id)
    evals = job.evaluations()
    assert [(e.epoch, e.step, e.status) for e in evals] == [(0, 2, "succeeded"), (1, 4, "succeeded")], evals
    # --wait: after the log, a line per evaluation as it ended, then the end line with the val loss
    tail = r.stdout.splitlines()[-3:]
    assert tail[:2] == [f"step {e.step} | val_loss {e.val_loss:.6g}" for e in evals], tail
    best = min(evals, key=lambda e: e.val_loss)
    assert tail[2].startswith(f"job {job_id} succeeded · step 4 loss ") and f" · val loss {best.val_loss:.6g}" in tail[2]

    listing = cli("jobs").stdout.splitlines()
    header, rows = listing[0], {line.split()[0]: line for line in listing[1:]}
    at = header.index("VAL LOSS")
    assert rows[job_id][at:].startswith(f"{best.val_loss:.4g}"), rows[job_id]
    for e in evals:  # each evaluation is a job of its own, saying what it validates
        assert f"validates epoch_{e.epoch} (step {e.step}) of job {job_id}" in rows[e.job_id]
        assert rows[e.job_id][at:].startswith(f"{e.val_loss:.4g}"), rows[e.job_id]
    listed = {j["id"]: j for j in json.loads(cli("jobs", "--json").stdout)}
    assert listed[job_id]["validation"] == {"mode": "checkpoints", "every_n_steps": None}
    assert (listed[job_id]["val_loss"], listed[job_id]["best_val_loss"]) == (evals[-1].val_loss, best.val_loss)
    assert listed[evals[0].job_id]["evaluates"] == {"job": job_id, "epoch": 0, "step": 2}

    points = json.loads(cli("metrics", job_id, "--json").stdout)
    assert [(p["step"], p["value"], p["source"]) for p in points if p["name"] == "val_loss"] == [
        (e.step, e.val_loss, "evaluation") for e in evals]
    frame = job.metrics_frame()
    assert frame[frame["name"] == "val_loss"]["value"].tolist() == [e.val_loss for e in evals]
    logs = subprocess.run([sys.executable, "-m", "tune_magic", "logs", job_id], capture_output=True, text=True,
                          timeout=60)
    assert f"val loss {best.val_loss:.6g}" in logs.stderr.splitlines()[-1]
