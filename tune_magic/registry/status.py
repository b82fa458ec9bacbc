"""A job's status: one enum and the one transition function every writer uses. Pure.

::

    pending ──> running ──> succeeded | failed | stopped      (terminal: never left)
       │ ^         │
       │ └─────────┴──> unknown ──> succeeded | failed | stopped
       └──────────────> (any terminal state; e.g. a pending SLURM job cancelled)

``running`` (or ``unknown``) goes back to ``pending`` only when the engine confirms that it queued
the job again (a SLURM requeue: preemption, ``scontrol requeue``, a node failure with requeue).

``unknown`` means: the supervisor and the job's processes are gone and no exit code is known
yet. It is not terminal: an exit code that turns up later (the job's exit file) settles it.
Listings show it as "outcome unknown", never as a false ``failed``.

Values are plain strings (``Status.RUNNING == "running"``), so records stay JSON.
"""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    """Job status. ``str`` subclass: compares equal to, and serialises as, its value."""

    PENDING = "pending"  #: submitted, not started yet (a scheduler queue)
    RUNNING = "running"  #: the job's processes run (or are being started)
    UNKNOWN = "unknown"  #: supervisor and processes gone, no exit code known yet
    SUCCEEDED = "succeeded"  #: exit code 0
    FAILED = "failed"  #: non-zero exit, or it could not be started
    STOPPED = "stopped"  #: stopped or cancelled by a user

    def __str__(self) -> str:
        return self.value

    @property
    def is_terminal(self) -> bool:
        """True for ``succeeded``, ``failed`` and ``stopped``: the status never changes again."""
        return self in _TERMINAL

    @property
    def is_live(self) -> bool:
        """True for ``pending`` and ``running``: something may still run; stop() acts on it."""
        return self in (Status.PENDING, Status.RUNNING)

    @property
    def label(self) -> str:
        """What listings show: the value, except ``unknown`` -> ``"outcome unknown"``."""
        return "outcome unknown" if self is Status.UNKNOWN else self.value


_TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.STOPPED})

#: Every status, in lifecycle order.
STATUSES = tuple(Status)

# allowed moves (a move to the same status is always allowed and changes nothing)
_ALLOWED: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset({Status.RUNNING, Status.UNKNOWN} | _TERMINAL),
    Status.RUNNING: frozenset({Status.UNKNOWN, Status.PENDING} | _TERMINAL),  # pending: a confirmed requeue
    Status.UNKNOWN: frozenset({Status.RUNNING, Status.PENDING} | _TERMINAL),
    Status.SUCCEEDED: frozenset(),
    Status.FAILED: frozenset(),
    Status.STOPPED: frozenset(),
}


def parse(value: "str | Status") -> Status:
    """Return the :class:`Status` named by ``value``.

    Raises:
        ValueError: not a status name.
    """
    try:
        return Status(value)
    except ValueError:
        raise ValueError(f"unknown status {value!r}; one of {', '.join(s.value for s in Status)}") from None


def can_move(old: "str | Status", new: "str | Status") -> bool:
    """Return whether a job may go from ``old`` to ``new`` (same status: True)."""
    old, new = parse(old), parse(new)
    return old is new or new in _ALLOWED[old]


def transition(old: "str | Status", new: "str | Status") -> Status:
    """Return the status after trying to move from ``old`` to ``new``.

    The one rule every writer applies: a terminal status is never left, and ``unknown`` is only
    entered from a live status. A move that is not allowed keeps ``old`` (it is not an error: two
    writers may race to record an end, and the first one wins).

    Raises:
        ValueError: ``old`` or ``new`` is not a status name.
    """
    old, new = parse(old), parse(new)
    return new if can_move(old, new) else old
