"""A job's attempts: each start of its command within the one job. Pure; stdlib only.

A job is tried again, as the same job (one id, one record, one log), when its engine or its
options ask for it: a local job launched with ``--max-resumes N`` that failed after saving a
checkpoint is relaunched from that checkpoint by its supervisor; a batch job an engine requeues
(preemption, a node failure) starts again under the same engine id. The record keeps one entry per
start in ``attempts`` (oldest first). A job that was never tried again has none: its one attempt
is the job itself (``started_at``, ``ended_at`` of the record).

Each entry is a JSON object (this module's format, read by :func:`parse`):

``number``
    1-based.
``started_at``, ``ended_at``
    unix seconds; ``ended_at`` is ``null`` while the attempt runs.
``reason``
    why it ended, in words (``"rank 1: RuntimeError: ..."``, ``"requeued (preempted)"``), or
    ``null`` (it runs, or it ended the job and the record's ``error`` says why).
``step``
    the last global step it logged (steps), or ``null``.
``returncode``
    its exit code (negative: killed by that signal), or ``null``.
``resumed_from``
    the checkpoint it started from: ``{"checkpoint": "epoch_0/", "epoch": 0, "step": 2}`` (the
    folder relative to ``output_dir``, its 0-based epoch K, the global step there or ``null``),
    or ``null`` when it started from the beginning (no checkpoint yet).
``log_offset``
    bytes of the job's combined log written before it started: its own lines follow.

Writers append with :func:`begin` and settle with :func:`finish`; :func:`notes` says them in words
(a card's "attempt 2: resumed from epoch_0/ at step 2 after rank 1: RuntimeError: ...").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class Attempt:
    """One start of a job's command (see the module docstring for each field's meaning and units)."""

    number: int
    started_at: float
    ended_at: float | None = None
    reason: str | None = None
    step: int | None = None
    returncode: int | None = None
    resumed_from: dict[str, Any] | None = None
    log_offset: int = 0

    @property
    def elapsed_s(self) -> float | None:
        """Seconds the attempt ran, or ``None`` while it runs."""
        return None if self.ended_at is None else max(0.0, self.ended_at - self.started_at)

    def to_dict(self) -> dict[str, Any]:
        """The record's JSON object for this attempt."""
        return asdict(self)


def _number(value: Any, kinds: tuple = (int, float)) -> bool:
    return isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(float(value))


def parse(data: Any) -> list[Attempt]:
    """Validate the record's ``attempts`` list; return its entries.

    Unknown keys in an entry are ignored (a later release's).

    Raises:
        ValueError: not a list of objects of this module's format (the message says which entry
            and field).
    """
    if not isinstance(data, list):
        raise ValueError("attempts must be a list")
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValueError(f"attempt {i + 1} is not an object")
        number, started = item.get("number"), item.get("started_at")
        if not _number(number, (int,)) or number < 1 or not _number(started):
            raise ValueError(f"attempt {i + 1} lacks a positive number or a started_at time")
        for key, kinds in (("ended_at", (int, float)), ("step", (int,)), ("returncode", (int,)),
                           ("log_offset", (int,))):
            if item.get(key) is not None and not _number(item[key], kinds):
                raise ValueError(f"attempt {i + 1}: {key} has the wrong type")
        if item.get("reason") is not None and not isinstance(item["reason"], str):
            raise ValueError(f"attempt {i + 1}: reason must be text")
        source = item.get("resumed_from")
        if source is not None and not (isinstance(source, dict) and isinstance(source.get("checkpoint"), str)):
            raise ValueError(f"attempt {i + 1}: resumed_from must name a checkpoint")
        out.append(Attempt(number, float(started), None if item.get("ended_at") is None else float(item["ended_at"]),
                           item.get("reason"), item.get("step"), item.get("returncode"), source,
                           item.get("log_offset") or 0))
    return out


def begin(attempts: Sequence[dict], *, started_at: float, first_started_at: float,
          resumed_from: dict[str, Any] | None, log_offset: int) -> list[dict]:
    """Return ``attempts`` with a new attempt started.

    When the list is empty, the job's first attempt is written first (started at
    ``first_started_at``, the record's ``started_at``); the caller settles it with :func:`finish`
    before beginning the next one.

    Args:
        attempts: the record's list (not modified).
        started_at: unix seconds the new attempt starts.
        first_started_at: unix seconds the job started.
        resumed_from: the checkpoint the new attempt starts from (see the module docstring), or
            ``None`` (from the beginning).
        log_offset: the combined log's size in bytes when it starts.
    """
    out = [dict(a) for a in attempts]
    if not out:
        out.append(Attempt(1, first_started_at).to_dict())
    out.append(Attempt(len(out) + 1, started_at, resumed_from=resumed_from, log_offset=log_offset).to_dict())
    return out


def finish(attempts: Sequence[dict], *, ended_at: float, reason: str | None, step: int | None,
           returncode: int | None, first_started_at: float | None = None) -> list[dict]:
    """Return ``attempts`` with the last one ended (a job with none gets its first attempt,
    started at ``first_started_at``, ended). An attempt already ended keeps its end.

    Args:
        ended_at: unix seconds of the end.
        reason: why it ended, in words, or ``None``.
        step: the last global step it logged, or ``None``.
        returncode: its exit code, or ``None``.
    """
    out = [dict(a) for a in attempts]
    if not out:
        out.append(Attempt(1, ended_at if first_started_at is None else first_started_at).to_dict())
    last = out[-1]
    if last.get("ended_at") is None:
        last.update(ended_at=ended_at, reason=reason, step=step, returncode=returncode)
    return out


def where(source: dict[str, Any] | None) -> str:
    """``"epoch_0/ at step 2"`` (or without the step when unknown) for an attempt's ``resumed_from``."""
    if not source:
        return "the beginning"
    step = source.get("step")
    return source["checkpoint"] + (f" at step {step}" if isinstance(step, int) else "")


def notes(attempts: Sequence[Attempt]) -> list[str]:
    """One line per attempt after the first: where it resumed from and why the one before ended,
    e.g. ``"attempt 2: resumed from epoch_0/ at step 2 after rank 1: RuntimeError: boom (attempt 1
    reached step 3)"``."""
    out = []
    for before, a in zip(attempts, attempts[1:]):
        how = f"resumed from {where(a.resumed_from)}" if a.resumed_from else "started over from the beginning"
        why = f" after {before.reason}" if before.reason else ""
        reached = f" (attempt {before.number} reached step {before.step})" if before.step is not None else ""
        out.append(f"attempt {a.number}: {how}{why}{reached}")
    return out
