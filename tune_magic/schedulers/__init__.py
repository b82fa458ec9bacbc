"""Where jobs run: one :class:`~tune_magic.schedulers.base.Scheduler` per engine.

``local`` (a supervisor process per job on this machine) and ``slurm`` (one batch job, any number
of nodes). Everything above this package (``Job``, listings, magics, views, the CLI) goes through
the interface and never asks which scheduler a job has. Implementations are imported on first use.
"""

from __future__ import annotations

import importlib

from tune_magic.schedulers.base import Scheduler, SchedulerOptions

#: scheduler name -> "module:class"
_IMPLEMENTATIONS = {
    "local": "tune_magic.schedulers.local:LocalScheduler",
    "slurm": "tune_magic.schedulers.slurm:SlurmScheduler",
}
_cache: dict[str, Scheduler] = {}


def names() -> tuple[str, ...]:
    """The scheduler names, ``local`` first."""
    return tuple(_IMPLEMENTATIONS)


def get(name: str) -> Scheduler:
    """Return the scheduler called ``name`` (one instance per process).

    Raises:
        KeyError: no such scheduler (callers validate user input first; see
            :func:`tune_magic.schedulers.base.check_scheduler_name`).
    """
    sched = _cache.get(name)
    if sched is None:
        module, _, cls = _IMPLEMENTATIONS[name].partition(":")
        sched = _cache[name] = getattr(importlib.import_module(module), cls)()
    return sched


__all__ = ["Scheduler", "SchedulerOptions", "get", "names"]
