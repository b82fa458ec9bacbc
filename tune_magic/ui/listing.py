"""Narrowing a listing of jobs: ``--running``, ``--failed``, ``--name GLOB``, ``--last N``.

One filter for ``%tune_jobs``, the live jobs table and ``tune-magic jobs`` (the options are declared
once, :data:`ARGUMENTS`, and added to both parsers). Pure: it reads each job's last record.
"""

from __future__ import annotations

import argparse
import fnmatch
from dataclasses import dataclass
from typing import Iterable

from tune_magic.registry.status import Status


def positive_count(text: str) -> int:
    """argparse type of ``--last``: a whole number >= 1.

    Raises:
        argparse.ArgumentTypeError: anything else (the parser turns it into its usage error).
    """
    value = text.strip()
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of jobs >= 1, e.g. --last 5")
    return int(value)


#: The filter's options as ``(flags, argparse keyword arguments)``, for ``argparse`` and IPython's
#: ``magic_arguments`` alike.
ARGUMENTS: tuple[tuple[tuple[str, ...], dict], ...] = (
    (("--running",), {"action": "store_true", "help": "only live jobs (running, or pending in a queue)"}),
    (("--failed",), {"action": "store_true", "help": "only failed jobs (with --running: live or failed ones)"}),
    (("--name",), {"metavar": "GLOB", "help": "only jobs whose name matches GLOB (shell-style, e.g. 'lr-*')"}),
    (("--last",), {"metavar": "N", "type": positive_count, "help": "only the N most recently started jobs"}),
)


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a listing shows.

    Attributes:
        running: live jobs (``pending`` or ``running``).
        failed: failed jobs. With ``running``: either kind; with neither: every status.
        name: a shell-style pattern (:func:`fnmatch.fnmatchcase`) the job's name must match, or ``None``.
        last: keep only the ``last`` most recently started of the jobs that match, or ``None``.
    """

    running: bool = False
    failed: bool = False
    name: str | None = None
    last: int | None = None

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> "JobFilter":
        """The filter parsed by a parser that has :data:`ARGUMENTS`."""
        return cls(running=bool(ns.running), failed=bool(ns.failed), name=ns.name, last=ns.last)

    @property
    def narrows(self) -> bool:
        """Whether it leaves any job out (by status or name; ``last`` aside)."""
        return self.running or self.failed or self.name is not None

    def matches(self, job) -> bool:
        """Whether ``job`` (a :class:`tune_magic.Job`) passes the status and name tests, as its
        record now says (``last`` is applied to a whole listing, :meth:`select`)."""
        if self.running or self.failed:
            state = job.record.state
            if not ((self.running and state.is_live) or (self.failed and state is Status.FAILED)):
                return False
        return self.name is None or fnmatch.fnmatchcase(job.name, self.name)

    def may_match_later(self, job) -> bool:
        """Whether ``job``, which does not match now, may come to (a live job may still fail)."""
        return self.failed and job.record.state.is_live and (
            self.name is None or fnmatch.fnmatchcase(job.name, self.name))

    def select(self, jobs: Iterable) -> list:
        """The jobs that match, in the order given, the newest ``last`` of them when ``last`` is set
        (newest: latest ``started_at``, then greatest id)."""
        kept = [j for j in jobs if self.matches(j)]
        if self.last is not None and len(kept) > self.last:
            newest = set(map(id, newest_first(kept)[: self.last]))
            kept = [j for j in kept if id(j) in newest]
        return kept

    def describe(self) -> str:
        """The filter in words (``"failed jobs named 'lr-*'"``), for a listing that shows nothing."""
        kinds = " or ".join(k for k, on in (("live", self.running), ("failed", self.failed)) if on)
        text = f"{kinds} jobs" if kinds else "jobs"
        return text + (f" named {self.name!r}" if self.name is not None else "")


def newest_first(jobs: Iterable) -> list:
    """``jobs`` sorted with the most recently started first (then the greatest id)."""
    return sorted(jobs, key=lambda j: (j.started_at, j.id), reverse=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the filter's options (:data:`ARGUMENTS`) to ``parser``."""
    for flags, kwargs in ARGUMENTS:
        parser.add_argument(*flags, **kwargs)
