"""A sweep's record: the validated JSON object in ``sweeps/<id>/sweep.json``. Stdlib only.

A sweep is a grid of trials (:mod:`tune_magic.sweeping.grid`), each a normal job once it starts. The
record keeps what is needed to start every trial the same way from any process (the launch words
with each axis in place, the cell body, the scheduler and its options, the GPU slots) and, per
trial, its state in the queue:

- ``queued``: not started yet (:attr:`TrialState.waiting` may say why, e.g. a GPU another job holds);
- ``started``: a job was registered for it (:attr:`TrialState.job_id`); from then on the job's own
  record says how it goes (``running``, ``succeeded``, ...);
- ``not_started``: it could not be started (:attr:`TrialState.error` says why); the others go on.

A stopped sweep (``stop_requested_at`` set) starts nothing more: its queued trials never start.
``done_at`` is set once no trial is queued and none runs (so listings need not look again).

Schema history (:data:`SWEEP_SCHEMA`): 1, the first. Fields this release does not know are kept
(:attr:`SweepRecord.extra`, :attr:`TrialState.extra`) and written back, as job records do.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from tune_magic.registry.record import CorruptRecord

#: Sweep record schema written now.
SWEEP_SCHEMA = 1
#: Trial states in the queue (see the module docstring).
QUEUED, STARTED, NOT_STARTED = "queued", "started", "not_started"
TRIAL_STATES = (QUEUED, STARTED, NOT_STARTED)


@dataclass
class TrialState:
    """One trial of a sweep and its place in the queue.

    Attributes:
        index: 0-based, in the sweep's trial order (first axis slowest).
        name: its label, saying its values (``lr=3e-4,lora_rank=8``); the name of its job.
        words: its override words, one per axis (``optimizer.lr=3e-4``), in axis order.
        status: ``queued``, ``started`` or ``not_started``.
        job_id: the id of its job once started, else ``None``.
        slot: the slot (index into :attr:`SweepRecord.slots`) it runs in, once started.
        started_at: unix seconds when its job was registered.
        error: why it could not be started (``not_started``), else ``None``.
        waiting: why a queued trial waits (a GPU of its slot that another live job holds), else ``None``.
        interrupted_job: the id of an earlier job of this trial whose launch was interrupted before
            it ran (:data:`~tune_magic.registry.outcome.LAUNCH_INTERRUPTED`): the trial was queued
            again, once; else ``None``.
    """

    index: int
    name: str
    words: list[str]
    status: str = QUEUED
    job_id: str | None = None
    slot: int | None = None
    started_at: float | None = None
    error: str | None = None
    waiting: str | None = None
    interrupted_job: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("extra")
        return {**self.extra, **data}


@dataclass
class SweepRecord:
    """Everything known about one sweep (``sweep.json``, schema :data:`SWEEP_SCHEMA`).

    Attributes:
        id: the sweep id (``sweep-<job id form>``), also its directory's name.
        name: the sweep's name (``--name``; default the recipe's name).
        created_at: unix seconds.
        cwd: the working directory every trial runs in.
        python: the interpreter of the process that made the sweep (the sweep process runs on it).
        args: the launch words (``[TORCHRUN-OPTIONS] RECIPE --config CONFIG [overrides]``), each
            axis word as written (``optimizer.lr=1e-4,3e-4``) in its place.
        axes: ``{"key", "texts", "position"}`` per axis, in trial order: ``position`` is the index
            of its word in ``args`` (``None`` for a YAML body's ``sweep:`` axis, appended).
        trials: every trial, in order.
        extra_overrides: overrides every trial gets after its own (e.g. the Weights & Biases
            ``metric_logger.group=<sweep>``).
        config_overlay: a YAML cell body merged over ``--config`` (its ``sweep:`` section taken out).
        scheduler, scheduler_options: where the trials run and that scheduler's options as given.
        slots: one entry per trial that runs at once: the GPU ids (as typed, relative to the
            caller's ``CUDA_VISIBLE_DEVICES``) a trial in that slot gets, or ``None`` (no GPUs).
        gpus_per_trial: G, or ``None`` without GPUs.
        max_trials: the cap the sweep was checked against.
        force: trials may share a GPU or an output_dir with a live job (``--force``).
        keep_checkpoints: each trial's retention policy (``--keep-checkpoints``: N, ``"best"``), or ``None``.
        stop_requested_at: unix seconds when a user stopped the sweep, else ``None``.
        done_at: unix seconds when the last trial ended (nothing queued, nothing live), else ``None``.
        warnings: what the checks said (keys the config lacks, ...).
        engine: a scheduler's own part of the record when it runs the whole sweep as one engine
            job (e.g. an array job's id); nothing outside that scheduler reads it.
        schema: :data:`SWEEP_SCHEMA`.
        extra: fields this release does not know, written back unchanged.
    """

    id: str
    name: str
    created_at: float
    cwd: str
    args: list[str]
    axes: list[dict[str, Any]]
    trials: list[TrialState]
    python: str = ""
    extra_overrides: list[str] = field(default_factory=list)
    config_overlay: str | None = None
    scheduler: str = "local"
    scheduler_options: dict[str, Any] = field(default_factory=dict)
    slots: list[list[int] | None] = field(default_factory=lambda: [None])
    gpus_per_trial: int | None = None
    max_trials: int | None = None
    force: bool = False
    keep_checkpoints: int | str | None = None
    stop_requested_at: float | None = None
    done_at: float | None = None
    warnings: list[str] = field(default_factory=list)
    engine: dict[str, Any] = field(default_factory=dict)
    schema: int = SWEEP_SCHEMA
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def max_parallel(self) -> int:
        """How many trials run at once (one per slot)."""
        return len(self.slots)

    @property
    def keys(self) -> list[str]:
        """The axis keys, in trial order."""
        return [a["key"] for a in self.axes]

    def trial_args(self, index: int) -> list[str]:
        """The launch words of trial ``index``: each axis word replaced in place by the trial's
        override word, the body's ``sweep:`` axes and :attr:`extra_overrides` appended (the same
        words :meth:`tune_magic.sweeping.grid.SweepPlan.args` gives, plus the extra overrides)."""
        trial = self.trials[index]
        out = list(self.args)
        appended = []
        for axis, word in zip(self.axes, trial.words):
            if axis.get("position") is None:
                appended.append(word)
            else:
                out[axis["position"]] = word
        return out + appended + list(self.extra_overrides)

    def counts(self) -> dict[str, int]:
        """``{queue state: number of trials}`` (``queued``, ``started``, ``not_started``)."""
        out = {s: 0 for s in TRIAL_STATES}
        for t in self.trials:
            out[t.status] = out.get(t.status, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict (always the current schema), unknown fields kept as read."""
        data = {k: v for k, v in asdict(self).items() if k not in ("extra", "trials")}
        data["trials"] = [t.to_dict() for t in self.trials]
        data["schema"] = SWEEP_SCHEMA
        return {**self.extra, **data}

    @classmethod
    def from_dict(cls, data: Any) -> "SweepRecord":
        """Validate and build a record.

        Raises:
            CorruptRecord: not a mapping, a required field missing, a field of the wrong type,
                an axis or trial of the wrong shape, a trial state not in :data:`TRIAL_STATES`.
        """
        if not isinstance(data, dict):
            raise CorruptRecord("sweep record is not a JSON object")
        kwargs = _checked(data, _FIELDS, "sweep record")
        extra = {k: v for k, v in data.items() if k not in _FIELDS and isinstance(k, str)}
        if not all(isinstance(a, str) for a in kwargs["args"]) or not kwargs["args"]:
            raise CorruptRecord("sweep field 'args' must be a non-empty list of strings")
        for axis in kwargs["axes"]:
            if (not isinstance(axis, dict) or not isinstance(axis.get("key"), str)
                    or not isinstance(axis.get("texts"), list) or not all(isinstance(t, str) for t in axis["texts"])
                    or not (axis.get("position") is None or _is_int(axis["position"]))):
                raise CorruptRecord("sweep field 'axes' must hold {key, texts, position} objects")
            if axis.get("position") is not None and not 0 <= axis["position"] < len(kwargs["args"]):
                raise CorruptRecord(f"sweep axis {axis['key']!r} points outside 'args'")
        kwargs["trials"] = [_trial(t, len(kwargs["axes"])) for t in kwargs["trials"]]
        if [t.index for t in kwargs["trials"]] != list(range(len(kwargs["trials"]))):
            raise CorruptRecord("sweep trials must be numbered 0, 1, 2, ... in order")
        slots = kwargs.get("slots", [None])
        if not slots or not all(s is None or (isinstance(s, list) and all(_is_int(g) for g in s)) for s in slots):
            raise CorruptRecord("sweep field 'slots' must hold GPU id lists or nulls")
        for key in ("extra_overrides", "warnings"):
            if not all(isinstance(x, str) for x in kwargs.get(key) or []):
                raise CorruptRecord(f"sweep field {key!r} has items of the wrong type")
        kwargs["schema"] = SWEEP_SCHEMA
        return cls(**kwargs, extra=extra)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked(data: dict, fields: dict[str, tuple[tuple, bool]], what: str) -> dict[str, Any]:
    """The known fields of ``data``, each checked for its type (numbers finite)."""
    kwargs = {k: v for k, v in data.items() if k in fields}
    for name, (kinds, required) in fields.items():
        if name not in kwargs:
            if required:
                raise CorruptRecord(f"{what}: field {name!r} is missing")
            continue
        value = kwargs[name]
        if value is None and type(None) in kinds:
            continue
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            raise CorruptRecord(f"{what}: field {name!r} has the wrong type ({type(value).__name__})")
        if isinstance(value, float) and not math.isfinite(value):
            raise CorruptRecord(f"{what}: field {name!r} is not a finite number")
    return kwargs


def _trial(data: Any, n_axes: int) -> TrialState:
    if not isinstance(data, dict):
        raise CorruptRecord("a sweep trial is not an object")
    kwargs = _checked(data, _TRIAL_FIELDS, "sweep trial")
    if kwargs.get("status", QUEUED) not in TRIAL_STATES:
        raise CorruptRecord(f"sweep trial {kwargs.get('index')}: unknown state {kwargs.get('status')!r}")
    words = kwargs["words"]
    if len(words) != n_axes or not all(isinstance(w, str) and "=" in w for w in words):
        raise CorruptRecord(f"sweep trial {kwargs.get('index')}: one key=value word per axis expected")
    if kwargs.get("status") == STARTED and not kwargs.get("job_id"):
        raise CorruptRecord(f"sweep trial {kwargs.get('index')}: started without a job id")
    extra = {k: v for k, v in data.items() if k not in _TRIAL_FIELDS and isinstance(k, str)}
    return TrialState(**kwargs, extra=extra)


_NUM = (int, float)
_OPT_STR = (str, type(None))
_OPT_NUM = (int, float, type(None))
# field -> (allowed types, required)
_FIELDS: dict[str, tuple[tuple, bool]] = {
    "id": ((str,), True), "name": ((str,), True), "created_at": (_NUM, True), "cwd": ((str,), True),
    "args": ((list,), True), "axes": ((list,), True), "trials": ((list,), True), "python": ((str,), False),
    "extra_overrides": ((list,), False), "config_overlay": (_OPT_STR, False), "scheduler": ((str,), False),
    "scheduler_options": ((dict,), False), "slots": ((list,), False), "gpus_per_trial": ((int, type(None)), False),
    "max_trials": ((int, type(None)), False), "force": ((bool,), False), "stop_requested_at": (_OPT_NUM, False),
    "keep_checkpoints": ((int, str, type(None)), False),
    "done_at": (_OPT_NUM, False), "warnings": ((list,), False), "engine": ((dict,), False), "schema": ((int,), False),
}
_TRIAL_FIELDS: dict[str, tuple[tuple, bool]] = {
    "index": ((int,), True), "name": ((str,), True), "words": ((list,), True), "status": ((str,), False),
    "job_id": (_OPT_STR, False), "slot": ((int, type(None)), False), "started_at": (_OPT_NUM, False),
    "error": (_OPT_STR, False), "waiting": (_OPT_STR, False), "interrupted_job": (_OPT_STR, False),
}
