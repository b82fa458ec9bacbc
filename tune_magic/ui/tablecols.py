"""The columns a listing of jobs adds to id, name, status, step, loss and elapsed time. Pure.

Shared by ``tune-magic jobs`` and the live jobs table (``%tune_jobs``, the panel's):

* ``started``: when the job was launched (:func:`started_text`), always;
* ``scheduler``: only when the jobs listed run on more than one scheduler;
* the engine's own id of each job, titled by its scheduler's ``engine_id_label`` (``SLURM ID``),
  and the ``nodes`` it runs on: only when some job listed has an engine id (the live table shows
  the nodes under the engine's id, in one column: :data:`TABLE_KINDS`, so that it fits a narrow
  notebook).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable

#: The optional columns, in the order they are shown.
KINDS = ("started", "scheduler", "engine", "nodes")
#: The live table's optional columns (the nodes are in the engine's column).
TABLE_KINDS = ("started", "scheduler", "engine")
#: The engine-id column's title when jobs of several engines (or one without a label) have ids.
ENGINE_TITLE = "ENGINE ID"


def started_text(ts: float, now: float | None = None) -> str:
    """When a job started, in local time, as short as it can be: ``14:03`` today, ``12-01 14:03``
    another day this year, ``2025-12-01`` in another year."""
    at, today = time.localtime(ts), time.localtime(time.time() if now is None else now)
    if at[:3] == today[:3]:
        return time.strftime("%H:%M", at)
    return time.strftime("%m-%d %H:%M" if at.tm_year == today.tm_year else "%Y-%m-%d", at)


def values(job, now: float | None = None) -> dict[str, str]:
    """The optional columns' text for ``job`` (a :class:`tune_magic.Job`): ``""`` where it has none.
    Reads the last record and its scheduler only (no log, no engine query)."""
    return {"started": started_text(job.started_at, now), "scheduler": job.scheduler,
            "engine": job.engine_id or "", "nodes": ",".join(job.nodes) if job.engine_id else ""}


@dataclass(frozen=True)
class Columns:
    """Which optional columns a listing shows.

    Attributes:
        scheduler: the jobs run on more than one scheduler.
        engine: the engine-id column's title (also showing ``nodes``), or ``None``: no job listed
            has an engine id.
    """

    scheduler: bool = False
    engine: str | None = None

    def kinds(self) -> list[str]:
        """The optional columns shown, in order (a subset of :data:`KINDS`)."""
        return ["started"] + (["scheduler"] if self.scheduler else []) + (["engine", "nodes"] if self.engine else [])

    def table_kinds(self) -> list[str]:
        """The live table's optional columns shown (a subset of :data:`TABLE_KINDS`)."""
        return [k for k in self.kinds() if k in TABLE_KINDS]

    def title(self, kind: str) -> str:
        """A column's title, upper case (``STARTED``, ``SLURM ID``...)."""
        return self.engine if kind == "engine" and self.engine else kind.upper()

    def heading(self, kind: str) -> str:
        """A column's heading in the live table (lower case as its others, the engine's label as the
        scheduler spells it: ``started``, ``SLURM ID``)."""
        return self.engine if kind == "engine" and self.engine else kind

    def widened(self, other: "Columns") -> "Columns":
        """The columns either listing shows (a live table only ever adds columns)."""
        engine = self.engine if other.engine in (None, self.engine) else (other.engine if not self.engine
                                                                          else ENGINE_TITLE)
        return Columns(scheduler=self.scheduler or other.scheduler, engine=engine)


def columns_for(jobs: Iterable) -> Columns:
    """The optional columns a listing of ``jobs`` shows (see the module docstring)."""
    schedulers, labels = set(), set()
    for job in jobs:
        schedulers.add(job.scheduler)
        if job.engine_id:
            labels.add(job.engine_id_label or ENGINE_TITLE)
    engine = None if not labels else labels.pop() if len(labels) == 1 else ENGINE_TITLE
    return Columns(scheduler=len(schedulers) > 1, engine=engine)
