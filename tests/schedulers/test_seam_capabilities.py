"""The scheduler seam's capabilities (issue 27): sweeps are an optional capability a scheduler may
leave out, and a sweep's default parallelism is the scheduler's to say, never read off its name."""

from __future__ import annotations

import pytest

from tune_magic import schedulers
from tune_magic.errors import PlanError
from tune_magic.schedulers.base import Scheduler, SweepEngine
from tune_magic.sweeping.create import preview


def test_without_a_sweep_engine_a_scheduler_leaves_sweeps_to_the_sweep_process():
    local, slurm = schedulers.get("local"), schedulers.get("slurm")
    assert Scheduler.sweep_engine is None and local.sweep_engine is None
    assert isinstance(slurm.sweep_engine, SweepEngine)
    # the capability's dry run and cancel have defaults, its submit does not
    assert SweepEngine.__abstractmethods__ == frozenset({"submit_sweep"})


def test_a_sweeps_default_parallelism_is_asked_of_its_scheduler():
    assert schedulers.get("local").default_max_parallel(6) is None  # the slot rule: one at a time, no GPUs
    assert schedulers.get("slurm").default_max_parallel(6) == 6  # SLURM's queue decides


@pytest.mark.parametrize(("scheduler", "expected"), [("local", 1), ("slurm", 3)])
def test_a_dry_run_takes_the_default_parallelism_from_the_scheduler(tiny_assets, scheduler, expected, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no sbatch needed: a dry run submits nothing
    try:
        dry = preview("lora_finetune --config tiny/lora seed=1,2,3 max_steps_per_epoch=2", scheduler=scheduler)
    except PlanError as exc:  # the SLURM clients are missing here: the default never got asked
        pytest.skip(f"{scheduler}: {exc}")
    assert dry.slots.max_parallel == expected
