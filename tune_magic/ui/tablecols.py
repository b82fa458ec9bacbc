"""The columns a listing of jobs adds to id, name, status, step, loss and elapsed time. Pure.

Shared by ``tune-magic jobs`` and the live jobs table (``%tune_jobs``, the panel's):

* ``started``: when the job was launched (:func:`started_text`), always;
* ``scheduler``: only when the jobs listed run on more than one scheduler;
* the engine's own id of each job, titled by its scheduler's ``engine_id_label`` (``SLURM ID``),
  and the ``nodes`` it runs on: only when some job listed has an engine id (the live table shows
  the nodes under the engine's id, in one column: :data:`TABLE_KINDS`, so that it fits a narrow
  notebook);
* ``val loss`` (``VAL LOSS``), right after the loss: only when some job listed validates or logged
  a validation loss (:func:`val_text`, from ``Job.val_summary``: the summary file or the
  evaluations' result files, never a log).
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


def val_text(val, digits: int = 5) -> str:
    """The validation-loss column's text of a job's
    :class:`~tune_magic.checkpoints.validation.ValSummary` (``None``: ``""``): the best, with the
    latest where it is another step's (``3.1025 (latest 3.1625)``), and ``evaluating…`` while an
    evaluation of a checkpoint is queued or running; ``digits`` significant digits."""
    if val is None:
        return ""
    bits = []
    if val.best is not None:
        latest = f" (latest {val.latest:.{digits}g})" if val.latest_step != val.best_step else ""
        bits.append(f"{val.best:.{digits}g}{latest}")
    elif val.latest is not None:  # none is finite
        bits.append(f"{val.latest:.{digits}g}")
    if val.pending:
        bits.append("evaluating…")
    return " · ".join(bits)


def evaluates_text(record) -> str:
    """What an evaluation job evaluates (its record's ``evaluates``), for its row's note line:
    ``validates epoch_2 (step 12) of job ID``; ``""`` for any other job."""
    e = record.evaluates
    if not e:
        return ""
    return f"validates epoch_{e['epoch']} (step {e['step']}) of job {e['job']}"


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
        val: some job listed has a validation loss (or validates): the ``VAL LOSS`` column, shown
            after the loss (not one of :meth:`kinds`: its place is among the fixed columns).
    """

    scheduler: bool = False
    engine: str | None = None
    val: bool = False

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
        return Columns(scheduler=self.scheduler or other.scheduler, engine=engine, val=self.val or other.val)


def columns_for(jobs: Iterable, val: bool = False) -> Columns:
    """The optional columns a listing of ``jobs`` shows (see the module docstring); ``val``: some
    job has a validation loss (the caller knows: it read their summaries)."""
    schedulers, labels = set(), set()
    for job in jobs:
        schedulers.add(job.scheduler)
        if job.engine_id:
            labels.add(job.engine_id_label or ENGINE_TITLE)
    engine = None if not labels else labels.pop() if len(labels) == 1 else ENGINE_TITLE
    return Columns(scheduler=len(schedulers) > 1, engine=engine, val=val)
