"""Helpers of the resume end-to-end tests (not tests themselves): real jobs through
``tune_magic.launch``, their per-step losses, and "stopped after epoch K's checkpoint" made by
copying an uninterrupted run's ``epoch_K/`` and recipe state into a fresh ``output_dir``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import tune_magic.job as J
import tune_magic.job.launch as L
from tune_magic.checkpoints.preflight import RECIPE_STATE, ResumePreflight, preflight

from waiting import wait_for

TIMEOUT = 600
#: Keep the datasets library off the network and out of the user's cache.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def run_job(args: str, *, env: dict[str, str] | None = None, cleanup: list | None = None,
            expect: str = "succeeded") -> J.Job:
    """Launch ``args`` (``tune run`` words) through ``tune_magic.launch`` and wait for it."""
    job = L.launch(args, env={**os.environ, **OFFLINE, **(env or {})})
    if cleanup is not None:
        cleanup.append(job)
    status = job.wait(TIMEOUT)
    assert status == expect, (status, job.error, "\n".join(job.tail(40)))
    return job


def series(job: J.Job, name: str = "loss") -> dict[int, float]:
    """``{global step: value}`` of one metric, from the job's DiskLogger file (full precision)."""
    return {p["step"]: p["value"] for p in job.metrics() if p["name"] == name and p["source"] == "disklogger"}


def copy_checkpoint(src: Path, dst: Path, epoch: int) -> Path:
    """A fresh ``output_dir`` holding only ``epoch_<epoch>/`` and the recipe state of ``src``: the
    state of a run stopped right after that checkpoint (the recipe state of a finished run is that
    of its last non-final epoch)."""
    dst.mkdir(parents=True)
    shutil.copytree(src / f"epoch_{epoch}", dst / f"epoch_{epoch}")
    (dst / "recipe_state").mkdir()
    shutil.copy2(src / RECIPE_STATE, dst / RECIPE_STATE)
    return dst


def preflight_of(job: J.Job, output_dir: Path, overrides: list[str], **kw) -> ResumePreflight:
    """The pre-flight for ``job``'s recipe and config (as its record holds them) on ``output_dir``."""
    r = job.record
    return preflight(r.recipe, output_dir, config=r.config, overrides=overrides, cwd=r.cwd, **kw)


def wait_for_file(path: Path, job: J.Job, timeout: float = TIMEOUT) -> None:
    """Wait until ``path`` exists; fails at once if ``job`` stops running first."""
    def appeared() -> bool:
        if path.exists():
            return True
        assert job.status == "running", (job.status, "\n".join(job.tail(40)))
        return False

    wait_for(appeared, timeout=timeout, interval=0.1, what=f"{path} to appear")


def assert_same(resumed: dict[int, float], reference: dict[int, float], steps: range, tol: float = 1e-6) -> None:
    """The resumed run logged exactly ``steps`` and each value is within ``tol`` of the reference."""
    assert sorted(resumed) == list(steps), (sorted(resumed), list(steps))
    for s in steps:
        assert abs(resumed[s] - reference[s]) <= tol, (s, resumed[s], reference[s])


# -- jobs written by hand (unit tests: FAKE, no process ran) --------------------------------------


def toy_checkpoint(out: Path, epochs_run: int = 1, steps: int = 2, epochs: int = 3, seed: int = 0) -> Path:
    """What the stand-in recipe (tests/recipes/toy_recipe.py) leaves after ``epochs_run`` epochs of
    ``steps`` steps: ``epoch_0/ .. epoch_<epochs_run - 1>/`` and the recipe state (written with torch,
    which the test process may import)."""
    import json

    import torch
    from safetensors.torch import save_file

    for k in range(epochs_run):
        folder = out / f"epoch_{k}"
        folder.mkdir(parents=True, exist_ok=True)
        save_file({"global_step": torch.tensor([(k + 1) * steps])}, folder / "model-00001-of-00001.safetensors",
                  metadata={"format": "pt"})
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": 8}, "weight_map": {"global_step": "model-00001-of-00001.safetensors"}}))
    (out / "recipe_state").mkdir(parents=True, exist_ok=True)
    torch.save({"optimizer": {"state": {}, "param_groups": []}, "seed": seed, "epochs_run": epochs_run,
                "total_epochs": epochs, "max_steps_per_epoch": steps, "dataloader": {}}, out / RECIPE_STATE)
    return out


def fake_job(root: Path, job_id: str, out: Path, *, status: str = "failed", overrides=("epochs=3", "steps=2"),
             log: str = "", nproc: int | None = None, started: float | None = None, **fields):
    """A toy-recipe job's record written by hand into the registry ``root`` (FAKE: no process ran),
    its command as a launch builds it (``output_dir=<out>`` last among its overrides)."""
    import sys
    import time

    from jobhelpers import TOY_CONFIG, TOY_RECIPE
    from tune_magic.registry import store as jobstore
    from tune_magic.registry.store import JobRecord

    ovs = [*overrides, f"output_dir={out}"]
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)] if nproc \
        else [sys.executable]
    d = root / job_id
    d.mkdir(parents=True)
    (d / "output.log").write_text(log)
    started = started if started is not None else time.time() - 60
    fields.setdefault("name", f"toy {job_id}")
    rec = JobRecord(id=job_id, argv=[*head, str(TOY_RECIPE), "--config", str(TOY_CONFIG), *ovs],
                    env={}, cwd=str(root), log_path=str(d / "output.log"), started_at=started, status=status,
                    output_dir=str(out), metric_log_dir=str(out / "logs"), recipe=str(TOY_RECIPE),
                    config=str(TOY_CONFIG), distributed=bool(nproc), rendezvous="standalone" if nproc else None,
                    nproc_per_node=str(nproc) if nproc else None,
                    ended_at=None if status in ("running", "pending", "unknown") else started + 30,
                    returncode={"succeeded": 0, "failed": 1, "stopped": -15}.get(status), **fields)
    jobstore.write_record(d, rec)
    return rec


def metric_log(out: Path, steps, start: float = 10.0) -> str:
    """A DiskLogger file (torchtune 0.6.1's ``Step N | loss:X lr:Y``) under ``out/logs`` with
    ``start / step`` losses, and the combined log's line naming it."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    path = out / "logs" / f"log_{steps[0]}.txt"
    path.write_text("".join(f"Step {s} | loss:{start / s} lr:0.001 \n" for s in steps))
    return f"INFO:torchtune.utils._logging:Writing logs to {path}\n"
