"""Count GPUs without initialising CUDA in the calling process.

A ``torch.cuda.*`` call in a notebook kernel creates a CUDA context that holds GPU memory and breaks
later forked launches, so the kernel asks ``nvidia-smi`` (a separate process) instead. On a machine
without ``nvidia-smi`` the answer is 0 GPUs.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Iterable, Mapping

from .command import PlanError

NVIDIA_SMI_TIMEOUT_S = 10.0


class GpuError(PlanError):
    """GPU ids that do not exist on this machine, or are busy. The message names the fix."""


def gpu_ids(env: Mapping[str, str] | None = None) -> list[int]:
    """Return the indices of this machine's GPUs, as ``nvidia-smi`` lists them (``[]`` if none).

    Args:
        env: environment whose ``PATH`` is searched for ``nvidia-smi``; default ``os.environ``.
    """
    exe = shutil.which("nvidia-smi", path=None if env is None else env.get("PATH"))
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(line) for line in (l.strip() for l in out.splitlines()) if line.isdigit()]


def count_gpus(env: Mapping[str, str] | None = None) -> int:
    """Return the number of GPUs on this machine (0 without ``nvidia-smi``)."""
    return len(gpu_ids(env))


def check_gpus(wanted: Iterable[int], busy: Mapping[int, str], *, force: bool = False,
               env: Mapping[str, str] | None = None) -> None:
    """Check that every wanted GPU exists and, unless ``force``, is not used by a running job.

    Args:
        wanted: GPU indices the job asks for.
        busy: GPU index -> id of the running job using it.
        force: allow sharing a GPU with a running job.

    Raises:
        GpuError: an id that does not exist, or a busy one without ``force``.
    """
    present = gpu_ids(env)
    for gpu in wanted:
        if gpu not in present:
            found = f"{len(present)} GPU(s): {', '.join(map(str, present))}" if present else "0 GPUs"
            raise GpuError(f"GPU {gpu} does not exist on this machine ({found} found by nvidia-smi); "
                           "pick existing ids or leave --gpus out")
        if gpu in busy and not force:
            raise GpuError(f"GPU {gpu} is used by running job {busy[gpu]}; pick another GPU, stop that job, "
                           "or pass --force / force=True to share it")


def pick_free(n: int, busy: Mapping[int, str], env: Mapping[str, str] | None = None) -> list[int]:
    """Return the ``n`` lowest-numbered GPUs not used by a running job (``gpus="auto"``).

    Raises:
        GpuError: fewer than ``n`` free GPUs.
    """
    present = gpu_ids(env)
    free = [g for g in present if g not in busy]
    if len(free) < n:
        raise GpuError(f"gpus='auto' needs {n} free GPU(s) but {len(free)} of {len(present)} are free; "
                       "stop a job or give --gpus explicitly (with --force to share)")
    return free[:n]
