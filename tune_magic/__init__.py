"""tune_magic: launch, watch and stop torchtune/torchrun fine-tuning jobs from Jupyter.

``%load_ext tune_magic`` registers the magics. The Python API is importable from here; heavy parts
(torch, widgets) are imported only when first used, so loading the extension stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_API = {
    "build_plan": "job.launch",
    "LaunchPlan": "plan.model",
    "PlanError": "errors",
    "TuneMagicError": "errors",
    "UserError": "errors",
    "JobStartError": "errors",
    "StateDirError": "errors",
    "Status": "registry.status",
    "home": "paths",
    "make_assets": "assets",
    "launch": "job.launch",
    "jobs": "job",
    "get_job": "job",
    "stop_jobs": "job.stopping",
    "Job": "job",
    "JobNotFound": "errors",
    "AmbiguousJobName": "errors",
    "LaunchWarning": "errors",
    "Panel": "ui.panel",
    "resume": "job.resume",
    "ResumePlan": "job.resume",
    "NothingToResume": "errors",
    "sweep": "sweeping.create",
    "Sweep": "sweeping.sweep",
    "sweeps": "sweeping.sweep",
    "get_sweep": "sweeping.sweep",
    "revive_sweeps": "sweeping.sweep",
    "close_generators": "job.generators",
    "GenerationError": "job.generate",
    "CheckpointError": "checkpoints.catalog",
    "compare": "sweeping.compare",
}

__all__ = sorted(_API) + ["load_ipython_extension"]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'tune_magic' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython: Any) -> None:
    """Register the tune_magic magics with an IPython shell (``%load_ext tune_magic``)."""
    from tune_magic.ui.magics import register

    register(ipython)
