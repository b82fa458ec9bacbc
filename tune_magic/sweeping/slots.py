"""How a sweep's trials share a pool of GPUs. Pure.

``--gpus`` takes ids and inclusive ranges (``0-7``, ``0-3,6,7``), read by
:func:`tune_magic.gpus.parse_gpu_spec` (as a launch's ``--gpus`` is).

A sweep runs up to K trials at once (:func:`plan_slots`). With a GPU pool, the pool is cut into
consecutive groups of G GPUs (``--gpus-per-trial``, default the launch's processes per node) and
each running trial holds one group: ``--gpus 0-7 --gpus-per-trial 2`` gives the slots
``(0,1), (2,3), (4,5), (6,7)``; ``--max-parallel K`` keeps the first K. Without GPUs (a CPU
machine, no ``--gpus``), K is the number of trials at once, 1 unless ``--max-parallel`` says more.
A pool that does not divide into groups of G is refused rather than leaving GPUs idle unasked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from tune_magic.errors import PlanError



def parse_count(value: "int | str", flag: str, example: str) -> int:
    """Read a whole number >= 1 given to ``flag`` (``--max-parallel``, ``--gpus-per-trial``).

    Raises:
        PlanError: not a whole number, or 0 or negative; the message shows ``example``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise PlanError(f"{flag} {value!r} must be a whole number >= 1, e.g. {example}")
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([+-]?[0-9]+)\s*", value)
        if m is None:
            raise PlanError(f"{flag} {value!r} must be a whole number >= 1, e.g. {example}")
        value = int(m[1])
    if value < 1:
        raise PlanError(f"{flag} {value} must be at least 1, e.g. {example}")
    return value


@dataclass(frozen=True)
class Slots:
    """Where a sweep's running trials go.

    Attributes:
        gpus: one entry per slot (``len(gpus)`` trials run at once): the GPU ids a trial in that
            slot gets (``(0, 1)``), or ``None`` for a slot without GPUs (CPU).
        gpus_per_trial: G, or ``None`` without GPUs.
        unused: GPUs of the pool that no slot uses because ``--max-parallel`` kept fewer slots.
    """

    gpus: tuple["tuple[int, ...] | None", ...]
    gpus_per_trial: int | None
    unused: tuple[int, ...] = ()

    @property
    def max_parallel(self) -> int:
        """How many trials run at once."""
        return len(self.gpus)


def plan_slots(*, n_trials: int, pool: "Sequence[int] | None" = None, gpus_per_trial: "int | str | None" = None,
               max_parallel: "int | str | None" = None, nproc_per_node: "str | int | None" = None) -> Slots:
    """Decide how many trials run at once and which GPUs each slot holds.

    Args:
        n_trials: the number of trials (>= 1); never more slots than trials.
        pool: the GPU ids the sweep may use (:func:`tune_magic.gpus.parse_gpu_spec`), ``None``/empty for none.
        gpus_per_trial: G (``--gpus-per-trial``); default ``nproc_per_node`` when it is a number,
            else 1.
        max_parallel: K (``--max-parallel``); default: every group of the pool, or 1 without GPUs.
            A K larger than the number of groups is capped at it (K is a cap, not a demand).
        nproc_per_node: the launch's processes per node (``--nproc_per_node``), when given.

    Returns:
        :class:`Slots`: the first K consecutive groups of G GPUs, or K slots without GPUs.

    Raises:
        PlanError: ``--max-parallel`` or ``--gpus-per-trial`` not a whole number >= 1; G with no
            pool; G larger than the pool; a pool that is not a multiple of G (the message names
            the GPUs that would idle and both fixes); G disagreeing with a numeric
            ``--nproc_per_node``, or a word such as ``gpu`` with no G.
    """
    k = None if max_parallel is None else parse_count(max_parallel, "--max-parallel", "--max-parallel 2")
    g = None if gpus_per_trial is None else parse_count(gpus_per_trial, "--gpus-per-trial", "--gpus-per-trial 2")
    ids = list(pool or [])
    nproc = None if nproc_per_node is None else str(nproc_per_node).strip()
    if not ids:
        if g is not None:
            raise PlanError(f"--gpus-per-trial {g} needs a pool of GPUs to divide: give --gpus too, e.g. "
                            f"--gpus 0-{2 * g - 1} --gpus-per-trial {g}")
        n = min(k or 1, n_trials)
        return Slots(gpus=(None,) * n, gpus_per_trial=None)
    if nproc is not None and nproc.isdigit():
        if g is not None and g != int(nproc):
            raise PlanError(f"--nproc_per_node {nproc} and --gpus-per-trial {g} disagree: a trial runs one process "
                            f"per GPU; drop --nproc_per_node (the GPUs set it) or give --gpus-per-trial {nproc}")
        g = g or int(nproc)
    elif nproc is not None and g is None:
        raise PlanError(f"--nproc_per_node {nproc} does not say how many GPUs of the pool each trial gets: give "
                        "--gpus-per-trial G (or --nproc_per_node G)")
    g = g or 1
    shown = _shown(ids)
    if g > len(ids):
        raise PlanError(f"--gpus-per-trial {g} is larger than the pool --gpus {shown} ({len(ids)} GPU"
                        f"{'s' if len(ids) != 1 else ''}); give more GPUs or fewer per trial")
    if len(ids) % g:
        idle = ids[len(ids) - len(ids) % g:]
        raise PlanError(f"--gpus {shown} ({len(ids)} GPUs) does not divide into groups of {g}: GPU "
                        f"{','.join(map(str, idle))} would stay idle; give a multiple of {g} GPUs (e.g. --gpus "
                        f"{_shown(ids[:len(ids) - len(idle)])}) or another --gpus-per-trial")
    groups = [tuple(ids[i:i + g]) for i in range(0, len(ids), g)]
    n = min(k or len(groups), len(groups), n_trials)
    used = {i for grp in groups[:n] for i in grp}
    return Slots(gpus=tuple(groups[:n]), gpus_per_trial=g, unused=tuple(i for i in ids if i not in used))


def _shown(ids: Sequence[int]) -> str:
    """``ids`` as a ``--gpus`` value, runs of consecutive ids as ranges (``0-3,6``)."""
    parts, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            run = ids[start:i]
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)))
            start = i
    return ",".join(parts)
