"""A job's record: the validated JSON object in ``record.json``, and the process references in it.

Schema history (:data:`SCHEMA`): 1, before the status model (no ``scheduler``, four statuses);
2, engine-specific fields at the top level; 3, the scheduler's own fields under ``backend`` and its
launch options under ``scheduler_options``, and every field this release does not know kept as it
was (:attr:`JobRecord.extra`). Every schema loads; a record is always written as the current one.
Stdlib only: the supervisor imports this and must start fast.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from tune_magic.errors import TuneMagicError
from tune_magic.registry import attempts as attempt_entries
from tune_magic.registry.status import Status, transition

#: Record schema written now (see the module docstring).
SCHEMA = 3

RUNNING = Status.RUNNING
#: The status names a record may hold.
STATES = tuple(s.value for s in Status)


class CorruptRecord(TuneMagicError, ValueError):
    """A job record that is missing, unreadable or fails validation."""


@dataclass
class ProcessRef:
    """A process identified so that a recycled pid is never mistaken for it.

    Attributes:
        pid: the process id.
        create_time: its start time as psutil reports it (seconds since the epoch).
        rank: the worker's global rank (``RANK``), or ``None`` for non-workers.
    """

    pid: int
    create_time: float
    rank: int | None = None


@dataclass
class JobRecord:
    """Everything known about one job; the JSON file's schema (version :data:`SCHEMA`).

    Times are unix seconds. ``argv`` is the final command (with the per-job ``output_dir``);
    ``env`` holds only the job's additions to the launching process's environment. ``status`` is
    a :class:`tune_magic.registry.status.Status` value; change it only through :meth:`set_status`.
    ``log_lost_at`` is set when the job's directory was deleted while it ran and the supervisor
    recreated it: the log before that moment is gone. ``num_nodes``, ``nodes``, ``rank_hosts``
    (``{host, rank}`` as the job's nodes reported them) and ``pending_reason`` (why a queued job
    waits) are filled by schedulers that place jobs on other nodes (a local job has one node, this
    host). ``scheduler_options`` holds the scheduler's own launch options as given (name -> value,
    from the scheduler's option table); ``backend`` is the scheduler's own part of the record (e.g.
    the engine's id of the job), which nothing outside that scheduler reads. ``extra`` holds the
    fields this release does not know (a later release's, or an earlier one's that moved): they are
    written back unchanged, so no writer drops what another wrote.
    ``epochs`` and ``max_steps_per_epoch`` are the config's keys of those names as resolved at
    launch (positive integers, or ``None`` when unset or not a number): how long the run is.
    ``stop_requested_at`` is when a user first asked to stop the job (unix seconds), and
    ``finished_at_stop`` whether its log then showed the last planned step and the checkpoint save
    after it (the outcome rule, :mod:`tune_magic.registry.outcome`, reads both).
    ``overrides`` are the recipe's override words as it got them (``key=value`` / ``~key``, the
    per-job ``output_dir`` included), or ``None`` in records written before the field existed
    (:func:`overrides_of` then reads them from ``argv``).
    ``sweep`` is set for a trial of a sweep: ``{"id": sweep id, "trial": its index, "name": the
    sweep's name}`` (:mod:`tune_magic.sweeping.record`), else ``None``.
    ``validation`` says how a job with a ``dataset_val`` validates: ``{"mode": "in_loop" |
    "checkpoints", "every_n_steps": int | None}`` (:mod:`tune_magic.checkpoints.validation`), else
    ``None``. ``evaluates`` is set on a job that evaluates another's checkpoint: ``{"job": its id,
    "epoch": N of epoch_N, "step": the global step it was saved at}`` (:mod:`tune_magic.job.evaluate`).
    ``keep_checkpoints`` is the job's retention policy (``--keep-checkpoints``): an int N (the newest
    N), ``"best"``, or ``None`` (every checkpoint kept; :mod:`tune_magic.job.keeper`).
    """

    id: str
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log_path: str
    started_at: float
    status: str = RUNNING.value
    output_dir: str | None = None
    metric_log_dir: str | None = None
    checkpoint_dir: str | None = None
    gpus: list[int] | None = None
    physical_gpus: list[int | str] | None = None
    distributed: bool = False
    nproc_per_node: str | None = None
    rendezvous: str | None = None
    rendezvous_endpoint: str | None = None
    supervisor: ProcessRef | None = None
    agent: ProcessRef | None = None
    workers: list[ProcessRef] = field(default_factory=list)
    ended_at: float | None = None
    returncode: int | None = None
    error: str | None = None
    stop_requested: bool = False
    stop_requested_at: float | None = None
    finished_at_stop: bool = False
    warnings: list[str] = field(default_factory=list)
    recipe: str | None = None
    config: str | None = None
    rank_log_dir: str | None = None
    scheduler: str = "local"
    scheduler_options: dict[str, Any] = field(default_factory=dict)
    backend: dict[str, Any] = field(default_factory=dict)
    num_nodes: int = 1
    nodes: list[str] = field(default_factory=list)
    rank_hosts: list[dict] = field(default_factory=list)
    pending_reason: str | None = None
    log_lost_at: float | None = None
    epochs: int | None = None
    max_steps_per_epoch: int | None = None
    recipe_name: str | None = None
    torchrun_options: list[str] | None = None
    overrides: list[str] | None = None
    resumed_from: str | None = None
    resumed_by: str | None = None
    resume_point: dict[str, Any] | None = None
    attempts: list[dict] = field(default_factory=list)
    max_resumes: int | None = None
    sweep: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    evaluates: dict[str, Any] | None = None
    keep_checkpoints: int | str | None = None
    schema: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready dict (always written as the current :data:`SCHEMA`), with the
        unknown fields of :attr:`extra` at the top level as they were read."""
        data = asdict(self)
        data.pop("extra")
        data["status"] = str(self.status)
        data["schema"] = SCHEMA
        return {**self.extra, **data}

    @property
    def state(self) -> Status:
        """``status`` as a :class:`Status`."""
        return Status(self.status)

    def set_status(self, new: str | Status) -> bool:
        """Move to ``new`` through :func:`tune_magic.registry.status.transition`; return whether it moved.

        A terminal status is never left: recording an end twice keeps the first.
        """
        moved = transition(self.status, new)
        changed = moved.value != self.status
        self.status = moved.value
        return changed

    @classmethod
    def from_dict(cls, data: Any) -> "JobRecord":
        """Validate and build a record: every field must have its type (numbers finite and
        representable as floats). Records of every earlier schema load: fields this release does
        not know go to :attr:`extra` (and are written back as they were); a scheduler moves its own
        old fields into :attr:`backend` when it reads the record (``Scheduler.migrate``).

        Raises:
            CorruptRecord: not a mapping, a required field missing, a field of the wrong type,
                or an unknown status.
        """
        if not isinstance(data, dict):
            raise CorruptRecord("record is not a JSON object")
        kwargs = {k: v for k, v in data.items() if k in _FIELD_TYPES}
        extra = {k: v for k, v in data.items() if k not in _FIELD_TYPES and isinstance(k, str)}
        for name, (kinds, required) in _FIELD_TYPES.items():
            if name not in kwargs:
                if required:
                    raise CorruptRecord(f"field {name!r} is missing")
                continue
            value = kwargs[name]
            if value is None and type(None) in kinds:
                continue
            if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
                raise CorruptRecord(f"field {name!r} has the wrong type ({type(value).__name__})")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not finite_number(value):
                raise CorruptRecord(f"field {name!r} is not a finite number")
        if not kwargs["argv"] or not all(isinstance(a, str) for a in kwargs["argv"]):
            raise CorruptRecord("argv must be a non-empty list of strings")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in kwargs["env"].items()):
            raise CorruptRecord("env must map strings to strings")
        if kwargs.get("status", RUNNING.value) not in STATES:
            raise CorruptRecord(f"unknown status {kwargs.get('status')!r}")
        if kwargs.get("physical_gpus") is not None and not all(
                isinstance(x, (int, str)) and not isinstance(x, bool) for x in kwargs["physical_gpus"]):
            raise CorruptRecord("field 'physical_gpus' has items of the wrong type")
        if not all(isinstance(x, str) for x in kwargs.get("nodes") or []):
            raise CorruptRecord("field 'nodes' has items of the wrong type")
        if not all(isinstance(x, dict) and isinstance(x.get("host"), str) and isinstance(x.get("rank"), int)
                   for x in kwargs.get("rank_hosts") or []):
            raise CorruptRecord("field 'rank_hosts' must hold {host, rank} objects")
        for key in ("gpus", "warnings", "overrides"):
            if kwargs.get(key) is not None and not all(
                isinstance(x, int if key == "gpus" else str) and not isinstance(x, bool) for x in kwargs[key]
            ):
                raise CorruptRecord(f"field {key!r} has items of the wrong type")
        for key in ("epochs", "max_steps_per_epoch", "max_resumes"):
            if kwargs.get(key) is not None and kwargs[key] < 1:
                raise CorruptRecord(f"field {key!r} must be a positive integer")
        _check_relaunch_fields(kwargs)
        _check_sweep(kwargs.get("sweep"))
        _check_evaluates(kwargs.get("evaluates"))
        for key in ("supervisor", "agent"):
            if kwargs.get(key) is not None:
                kwargs[key] = parse_process_ref(kwargs[key])
        kwargs["workers"] = [parse_process_ref(w) for w in kwargs.get("workers") or []]
        for key in ("scheduler_options", "backend"):
            if not all(isinstance(k, str) for k in kwargs.get(key) or {}):
                raise CorruptRecord(f"field {key!r} must map names to values")
        kwargs["schema"] = SCHEMA
        return cls(**kwargs, extra=extra)


def _check_relaunch_fields(kwargs: dict[str, Any]) -> None:
    """Validate the fields a resume and a relaunch read: word lists, and the attempts' format.

    Raises:
        CorruptRecord: one of them malformed.
    """
    for key in ("torchrun_options", "overrides"):
        if kwargs.get(key) is not None and not all(isinstance(x, str) for x in kwargs[key]):
            raise CorruptRecord(f"field {key!r} must be a list of strings")
    try:
        attempt_entries.parse(kwargs.get("attempts") or [])
    except ValueError as exc:
        raise CorruptRecord(f"field 'attempts': {exc}") from None
def _check_sweep(sweep: dict | None) -> None:
    """Refuse a ``sweep`` field that is not ``{id: str, trial: int, name: str}`` (more keys are kept)."""
    trial = None if sweep is None else sweep.get("trial")
    if sweep is not None and not (isinstance(sweep.get("id"), str) and isinstance(trial, int)
                                  and not isinstance(trial, bool) and isinstance(sweep.get("name", ""), str)):
        raise CorruptRecord("field 'sweep' must be {id, trial, name}")


def _check_evaluates(evaluates: dict | None) -> None:
    """Refuse an ``evaluates`` field that is not ``{job: str, epoch: int, step: int}`` (more keys are kept)."""
    if evaluates is None:
        return
    ints = [evaluates.get(k) for k in ("epoch", "step")]
    if not (isinstance(evaluates.get("job"), str)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints)):
        raise CorruptRecord("field 'evaluates' must be {job, epoch, step}")


def finite_number(value: int | float) -> bool:
    """Whether ``value`` is a finite number representable as a float."""
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int such as 10**400 passes isinstance, then breaks every table
        return False


def parse_process_ref(data: Any) -> ProcessRef:
    """Validate a ``{pid, create_time, rank}`` object.

    Raises:
        CorruptRecord: not an object of that shape.
    """
    if not isinstance(data, dict):
        raise CorruptRecord("a process reference is not an object")
    pid, ctime, rank = data.get("pid"), data.get("create_time"), data.get("rank")
    if (not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 1 << 31
            or not isinstance(ctime, (int, float)) or isinstance(ctime, bool) or not finite_number(ctime)
            or not (rank is None or (isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 1 << 31))):
        raise CorruptRecord(f"bad process reference {str(data)[:200]}")
    return ProcessRef(pid, float(ctime), rank)


_NUM = (int, float)
_OPT_STR = (str, type(None))
# field -> (allowed types, required)
_FIELD_TYPES: dict[str, tuple[tuple, bool]] = {
    "id": ((str,), True), "name": ((str,), True), "argv": ((list,), True), "env": ((dict,), True),
    "cwd": ((str,), True), "log_path": ((str,), True), "started_at": (_NUM, True),
    "status": ((str,), False), "output_dir": (_OPT_STR, False), "metric_log_dir": (_OPT_STR, False),
    "checkpoint_dir": (_OPT_STR, False), "gpus": ((list, type(None)), False),
    "physical_gpus": ((list, type(None)), False), "distributed": ((bool,), False),
    "nproc_per_node": (_OPT_STR, False), "rendezvous": (_OPT_STR, False), "rendezvous_endpoint": (_OPT_STR, False),
    "supervisor": ((dict, type(None)), False), "agent": ((dict, type(None)), False), "workers": ((list,), False),
    "ended_at": ((int, float, type(None)), False), "returncode": ((int, type(None)), False),
    "error": (_OPT_STR, False), "stop_requested": ((bool,), False),
    "stop_requested_at": ((int, float, type(None)), False), "finished_at_stop": ((bool,), False), "warnings": ((list,), False),
    "recipe": (_OPT_STR, False), "config": (_OPT_STR, False), "rank_log_dir": (_OPT_STR, False),
    "scheduler": ((str,), False), "scheduler_options": ((dict,), False), "backend": ((dict,), False),
    "num_nodes": ((int,), False), "nodes": ((list,), False), "rank_hosts": ((list,), False),
    "pending_reason": (_OPT_STR, False),
    "log_lost_at": ((int, float, type(None)), False), "epochs": ((int, type(None)), False),
    "max_steps_per_epoch": ((int, type(None)), False), "schema": ((int,), False),
    "recipe_name": (_OPT_STR, False), "torchrun_options": ((list, type(None)), False),
    "overrides": ((list, type(None)), False), "resumed_from": (_OPT_STR, False), "resumed_by": (_OPT_STR, False),
    "resume_point": ((dict, type(None)), False), "attempts": ((list,), False),
    "max_resumes": ((int, type(None)), False), "sweep": ((dict, type(None)), False),
    "validation": ((dict, type(None)), False), "evaluates": ((dict, type(None)), False),
    "keep_checkpoints": ((int, str, type(None)), False),
}


def overrides_of(record: JobRecord) -> list[str]:
    """The override words ``record``'s recipe got: its ``overrides`` field, or for a record written
    before that field, the words after ``--config CONFIG`` in ``argv`` (every plan ends with the
    recipe's ``--config CONFIG [overrides...]``; the last pair naming the record's config); ``[]``
    when ``argv`` has no such pair."""
    return original_overrides(record.argv, record.config, record.overrides)


def original_overrides(argv, config: str | None, recorded) -> list[str]:
    """:func:`overrides_of` from its parts: ``recorded`` when the record has them, else the words
    after the last ``--config <config>`` in ``argv``."""
    if recorded is not None:
        return list(recorded)
    for i in range(len(argv) - 2, -1, -1):
        if argv[i] == "--config" and (config is None or argv[i + 1] == config):
            return list(argv[i + 2:])
    return []
