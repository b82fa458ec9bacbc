"""Helpers of the resume end-to-end tests (not tests themselves): real jobs through
``tune_magic.launch``, their per-step losses, and "stopped after epoch K's checkpoint" made by
copying an uninterrupted run's ``epoch_K/`` and recipe state into a fresh ``output_dir``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import tune_magic.job as J
import tune_magic.launcher as L
from tune_magic.plan.resume import RECIPE_STATE, ResumePreflight, preflight

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
