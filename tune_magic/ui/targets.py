"""What a command names: a job or a sweep, found by one rule for the magics and the CLI.

A word names a sweep when it is a sweep id (``sweep-...``) or the name of a sweep; otherwise a job
(its id, or the name of exactly one job: :func:`tune_magic.job.get_job`). Every command that takes
an existing job takes a sweep the same way (``%tune_logs``, ``%tune_stop``, ``tune-magic logs``,
``stop``, ``metrics``, ``jobs --sweep``), and shows it with the same parts: its card
(:mod:`tune_magic.ui.cards`), its plain-text stream (:func:`tune_magic.ui.watch.stream_text`).
"""

from __future__ import annotations

from typing import Mapping, Union

from tune_magic.job import Job
from tune_magic.sweeping import store as sweepstore
from tune_magic.sweeping.sweep import Sweep

#: A job or a sweep.
Target = Union[Job, Sweep]


def is_sweep(spec: str | None) -> bool:
    """Whether ``spec`` names a sweep (its id, or the name of one) rather than a job."""
    if not spec:
        return False
    if sweepstore.is_sweep_id(spec):
        return True
    try:
        return any(r.name == spec for r in sweepstore.list_records())
    except Exception:  # noqa: BLE001 - an unreadable sweep registry: it is not a sweep then
        return False


def find(spec: str) -> Target:
    """The sweep or the job ``spec`` names (see the module docstring).

    Raises:
        JobNotFound: no such job or sweep (:class:`~tune_magic.sweeping.sweep.DamagedSweep` for a
            sweep whose record cannot be read).
        PlanError: several sweeps have that name.
    """
    from tune_magic.job import get_job  # looked up at each call: tests replace it on its module
    from tune_magic.sweeping.sweep import get_sweep

    return get_sweep(spec) if is_sweep(spec) else get_job(spec)


def card(target: Target):
    """A live card of the job or sweep (:class:`~tune_magic.ui.cards.JobCard`,
    :class:`~tune_magic.ui.cards.SweepCard`), its watcher started."""
    from tune_magic.ui.cards import JobCard, SweepCard

    return SweepCard(target) if isinstance(target, Sweep) else JobCard(target)


def counts_text(counts: Mapping[str, int]) -> str:
    """``"2 stopped, 1 cancelled"``: a sweep's trials per status, as every stop prints them."""
    return ", ".join(f"{n} {status}" for status, n in counts.items())
