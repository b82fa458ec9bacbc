"""Evaluating a job's checkpoints on its ``dataset_val``: one checkpoint's evaluation launched as a
job of its own, and the evaluations a job has.

A job whose validation mode is :data:`~tune_magic.checkpoints.validation.CHECKPOINTS` (any recipe
that does not validate in its loop, torchtune 0.6.1's built-ins included) has each complete
``epoch_N/`` evaluated: its keeper (:mod:`tune_magic.job.keeper`) launches
``recipes/validate_checkpoint.py`` with the job's config and overrides as a job of its own
(:func:`launch_evaluation`), on the job's scheduler: listed, followed, stopped and triaged like any
job, its record's ``evaluates`` naming the job, the epoch and the step it was saved at. On this
machine it runs on a free GPU, never one another live job holds (the training job's included).
Each launch is one line of ``evaluations.jsonl`` in the job's directory; an evaluation's failure
never fails the job.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tune_magic.checkpoints import validation
from tune_magic.job.validation import evaluation_recipe
from tune_magic.registry import store as jobstore
from tune_magic.registry.files import append_json_line, read_epoch_lines
from tune_magic.registry.record import JobRecord, overrides_of

#: One line per checkpoint given an evaluation: ``{"epoch", "step", "job"}`` or ``{"epoch", "step", "error"}``.
EVALUATIONS = "evaluations.jsonl"
#: An evaluation's statuses while it is queued or running.
LIVE = ("pending", "running")


# -- the evaluations of a job ----------------------------------------------------------------------

def read_evaluations(job_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The lines of a job's ``evaluations.jsonl``, oldest first (a torn last line is skipped)."""
    return read_epoch_lines(Path(job_dir) / EVALUATIONS)


@dataclass(frozen=True)
class Evaluation:
    """One checkpoint's evaluation, as a job's card and listings show it.

    Attributes:
        epoch: N of ``epoch_N/``.
        step: the global step it was saved at (steps).
        job_id: the evaluation's own job, or ``None`` when it could not be launched.
        status: that job's status (``pending``, ``running``, ``succeeded``, ``failed``, ...), or
            ``"not started"``.
        val_loss: the validation loss (:data:`~tune_magic.checkpoints.validation.RESULT_FILE`), once written.
        error: why it failed or could not start, else ``None``.
    """

    epoch: int
    step: int
    job_id: str | None
    status: str
    val_loss: float | None = None
    error: str | None = None


def evaluations_of(job_dir: Path) -> list[Evaluation]:
    """A job's evaluations (``evaluations.jsonl``, each with its job's status and result), by epoch."""
    from tune_magic.job import Job

    out: dict[int, Evaluation] = {}
    for entry in read_evaluations(job_dir):
        epoch, step = entry["epoch"], int(entry.get("step") or 0)
        job_id = entry.get("job")
        if not isinstance(job_id, str):
            out[epoch] = Evaluation(epoch, step, None, "not started", error=str(entry.get("error") or "not started"))
            continue
        try:
            job = Job(jobstore.job_dir(job_id, job_dir.parent))
            record = job.refresh().record
        except Exception:  # noqa: BLE001 - damaged: what the line says is all there is
            job = None
        if job is None or _removed(job):
            out[epoch] = Evaluation(epoch, step, job_id, "removed")
            continue
        out[epoch] = evaluation(epoch, step, job_id, record, validation.read_result(record.output_dir))
    return [out[k] for k in sorted(out)]


def _removed(job) -> bool:
    """Whether an evaluation's job is gone (``tune-magic rm``): a Job of a missing directory reads
    as a damaged record whose processes may live, so its directory is asked."""
    return job.damaged and not job.dir.is_dir()


def evaluation(epoch: int, step: int, job_id: str, record: JobRecord,
               result: Mapping[str, Any] | None) -> Evaluation:
    """One checkpoint's :class:`Evaluation` from its job's record and its result file's content
    (:func:`~tune_magic.checkpoints.validation.read_result`, ``None`` while not written)."""
    value = float(result["val_loss"]) if result is not None else None
    error = record.error if record.state.value in ("failed", "stopped", "unknown") else None
    return Evaluation(epoch, step, job_id, record.state.value, value, error)


def evaluation_points(evaluations: list[Evaluation]) -> list:
    """The ``val_loss`` metric points of evaluations with a result (``source`` ``"evaluation"``,
    ``epoch`` the checkpoint's 1-based epoch, at the step it was saved)."""
    from tune_magic.logs.points import SOURCE_EVALUATION, MetricPoint

    return [MetricPoint(e.step, validation.VAL_LOSS, e.val_loss, e.epoch + 1, SOURCE_EVALUATION)
            for e in evaluations if e.val_loss is not None]


def is_evaluated(record: JobRecord) -> bool:
    """Whether the job's checkpoints are evaluated by jobs of their own (its record's ``validation``
    mode is :data:`~tune_magic.checkpoints.validation.CHECKPOINTS`)."""
    plan = validation.ValidationPlan.from_record(record.validation)
    return plan is not None and plan.mode == validation.CHECKPOINTS


def unevaluated(record: JobRecord, done: set[int], settings=None) -> list:
    """The complete ``epoch_N/`` checkpoints this job wrote (:func:`tune_magic.checkpoints.catalog.list_checkpoints`)
    whose epoch is not in ``done``: those its keeper has still to launch an evaluation of."""
    from tune_magic.checkpoints.catalog import list_checkpoints

    if not record.output_dir:
        return []
    started = record.started_at - 1  # folders an earlier job of this output_dir wrote are not this job's
    return [c for c in list_checkpoints(record.output_dir, settings)
            if c.complete and c.epoch not in done and c.mtime >= started]


def val_summary_of(job, summary=None, *, keeper_done: bool = True) -> "validation.ValSummary | None":
    """``Job.val_summary``: from the job's summary file (in-loop validation, or ``val_loss`` lines
    a recipe logged unasked) or its evaluations (checkpoint evaluation). ``summary``: the job's
    :class:`~tune_magic.logs.summary.Summary` when the caller read it already (a listing). Pending
    evaluations are the queued and running ones and, once the job has ended while its keeper is not
    done (``keeper_done`` False), the checkpoints it has not launched an evaluation of yet."""
    if is_evaluated(job.record):
        evals = job.evaluations()
        out = summary_of_evaluations(evals)
        if not keeper_done and not job.record.state.is_live:
            from dataclasses import replace

            out = replace(out, pending=out.pending + len(unevaluated(job.record, {e.epoch for e in evals})))
        return out
    s = job.summary() if summary is None else summary
    if s.val_step is None and validation.ValidationPlan.from_record(job.record.validation) is None:
        return None
    return validation.ValSummary(s.val_loss, s.val_step, s.min_val_loss, s.min_val_step)


def summary_of_evaluations(evals: "list[Evaluation] | tuple[Evaluation, ...]") -> "validation.ValSummary":
    """The :class:`~tune_magic.checkpoints.validation.ValSummary` of a job's evaluations: their
    values by step, how many are queued or running (one whose value is written is done, however
    long its process takes to exit), how many ended without a value."""
    live = sum(1 for e in evals if e.status in LIVE and e.val_loss is None)
    failed = sum(1 for e in evals if e.val_loss is None and e.status not in LIVE)
    return validation.ValSummary.of_points([(e.step, e.val_loss) for e in evals if e.val_loss is not None],
                                           pending=live, failed=failed)


class EvaluationFollower:
    """A job's evaluations as a live view follows them (a card, a jobs-table row): each
    :meth:`poll` costs a ``stat`` of ``evaluations.jsonl`` (read again only when it changed) and,
    of each evaluation not yet final, a look at its record (a ``stat`` while it is unchanged; its
    scheduler asked at most every ``Job.LIVENESS_CHECK_S``) and a ``stat`` of its result file (read
    once it appears or changes). An evaluation that ended and was read is never looked at again.

    Args:
        job: the training :class:`~tune_magic.job.Job` (validating by checkpoints).
        revive: start the job's keeper again when it died (``Job.ensure_keeper``; a card does, a
            listing never), looked at most every ``evaluator_every_s`` seconds.
        evaluator_every_s: seconds between looks at whether the keeper lives.

    Attributes:
        evaluations: the :class:`Evaluation` of each checkpoint given one so far, by epoch.
    """

    def __init__(self, job, *, revive: bool = False, evaluator_every_s: float = 5.0):
        self.job = job
        self.revive = revive
        self.evaluator_every_s = evaluator_every_s
        self.evaluations: tuple[Evaluation, ...] = ()
        self._listing: tuple | None = None  # (inode, size, mtime ns) of evaluations.jsonl when read
        self._followed: dict[int, tuple] = {}  # epoch -> (its Job, its result file's stat) while not final
        self._evaluator = True  # the job's keeper may still launch evaluations
        self._evaluator_done = False  # it said it has nothing left to do (never looked at again)
        self._evaluator_at = -math.inf  # monotonic time of the last look at it

    @property
    def pending(self) -> bool:
        """Whether an evaluation is queued or running."""
        return any(e.status in LIVE for e in self.evaluations)

    @property
    def open(self) -> bool:
        """Whether more is to come: an evaluation queued or running, or a keeper that lives (or was
        just started again) and has not said it is done."""
        return self.pending or self._evaluator

    def poll(self) -> bool:
        """Look again; return whether :attr:`evaluations` changed."""
        self._look_at_evaluator()
        by_epoch = {e.epoch: e for e in self.evaluations}
        listing = _stat(self.job.dir / EVALUATIONS)
        if listing != self._listing:
            self._listing = listing
            for entry in read_evaluations(self.job.dir):
                epoch = entry["epoch"]
                if epoch not in by_epoch or by_epoch[epoch].job_id != entry.get("job"):
                    by_epoch[epoch] = self._start(entry)
        for epoch in list(self._followed):
            by_epoch[epoch] = self._read(epoch, by_epoch[epoch])
        evaluations = tuple(by_epoch[k] for k in sorted(by_epoch))
        changed = evaluations != self.evaluations
        self.evaluations = evaluations
        return changed

    def _start(self, entry: Mapping[str, Any]) -> Evaluation:
        """A line of evaluations.jsonl seen for the first time: its evaluation, followed until final."""
        from tune_magic.job import Job

        epoch, step, job_id = entry["epoch"], int(entry.get("step") or 0), entry.get("job")
        if not isinstance(job_id, str):
            return Evaluation(epoch, step, None, "not started", error=str(entry.get("error") or "not started"))
        try:
            job = Job(jobstore.job_dir(job_id, self.job.dir.parent))
        except Exception:  # noqa: BLE001 - damaged: what the line says is all there is
            job = None
        if job is None or _removed(job):
            return Evaluation(epoch, step, job_id, "removed")
        self._followed[epoch] = (job, None)
        return Evaluation(epoch, step, job_id, job.record.state.value)

    def _read(self, epoch: int, last: Evaluation) -> Evaluation:
        """A followed evaluation as it is now; it is dropped once ended and its result read."""
        job, seen = self._followed[epoch]
        try:
            record = job.refresh().record
        except Exception:  # noqa: BLE001 - unreadable: looked at again next time
            return last
        if _removed(job):
            del self._followed[epoch]
            return Evaluation(last.epoch, last.step, last.job_id, "removed")
        path = Path(record.output_dir or "") / validation.RESULT_FILE
        now = _stat(path) if record.output_dir else None
        value = last.val_loss
        if now != seen:
            result = validation.read_result(record.output_dir)
            value = float(result["val_loss"]) if result is not None else None
            self._followed[epoch] = (job, now)
        out = evaluation(epoch, last.step, last.job_id, record, {"val_loss": value} if value is not None else None)
        if record.state.is_terminal:  # its result is written before it exits: read above, or none comes
            del self._followed[epoch]
        return out

    def _look_at_evaluator(self) -> None:
        """Whether the job's keeper may launch more evaluations, looked at every
        ``evaluator_every_s`` seconds; started again when it died (``revive``: ``Job.ensure_keeper``)."""
        now = time.monotonic()
        if self._evaluator_done or now - self._evaluator_at < self.evaluator_every_s:
            return
        self._evaluator_at = now
        state = self.job.keeper_state()
        self._evaluator_done = state == "done"
        self._evaluator = not self._evaluator_done and (state == "running"
                                                        or bool(self.revive and self.job.ensure_keeper()))


def _stat(path: Path) -> tuple | None:
    """``(inode, size, mtime ns)`` of ``path``, or ``None`` when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def record_evaluation(job_dir: Path, entry: Mapping[str, Any]) -> None:
    """Append one line to the job's ``evaluations.jsonl`` (one ``O_APPEND`` write: lines never mix)."""
    append_json_line(job_dir / EVALUATIONS, entry)


def evaluation_args(record: JobRecord, checkpoint_dir: str, epoch: int, step: int) -> list[str]:
    """The launch words of the evaluation of ``epoch_<epoch>``: the evaluation recipe with the job's
    config and overrides (its per-job ``output_dir`` replaced by the evaluation's own, beside it)."""
    words = [w for w in overrides_of(record) if not w.startswith("output_dir=")]
    out = f"{record.output_dir.rstrip('/')}-val-epoch_{epoch}" if record.output_dir else None
    return [evaluation_recipe(), "--config", record.config or "", *words,
            f"+validate.checkpoint_dir={checkpoint_dir}", f"+validate.step={step}", f"+validate.epoch={epoch}",
            *([f"output_dir={out}"] if out else [])]


def existing_evaluation(record: JobRecord, epoch: int, root: Path) -> str | None:
    """The id of a job already evaluating ``epoch`` of ``record`` (a keeper that died between
    the launch and its line in evaluations.jsonl), or ``None``."""
    for r in jobstore.list_records(root):
        e = r.evaluates or {}
        if e.get("job") == record.id and e.get("epoch") == epoch:
            return r.id
    return None


def launch_evaluation(record: JobRecord, checkpoint_dir: str, epoch: int, step: int, *,
                      env: Mapping[str, str], root: Path):
    """Launch the evaluation of one checkpoint as a job of its own (see the module docstring).

    Raises:
        GpuError: no free GPU on this machine for it now (try again later).
        UserError: the launch refused it (the message says why).
    """
    from tune_magic import gpus as gpu_mod
    from tune_magic import schedulers
    from tune_magic.job.launch import launch

    sched = schedulers.get(record.scheduler)
    gpus = None
    if sched.runs_on_this_machine and (record.gpus or _uses_gpus(record)):
        gpus = "auto" if gpu_mod.visibility(env).gpus else None
    options = {k: v for k, v in record.scheduler_options.items() if k != "nodes"}
    return launch(evaluation_args(record, checkpoint_dir, epoch, step), name=f"validate {record.name} epoch_{epoch}",
                  gpus=gpus, cwd=record.cwd, env=env, scheduler=record.scheduler, dry_run=False,
                  record_fields={"evaluates": {"job": record.id, "epoch": epoch, "step": step}}, **options)


def _uses_gpus(record: JobRecord) -> bool:
    """Whether the job's config runs on a GPU (``device`` not ``cpu``)."""
    try:
        from omegaconf import OmegaConf

        from tune_magic.config.tuneparse import recipe_config

        device = OmegaConf.select(recipe_config(record.config, overrides_of(record)), "device", default=None)
    except Exception:  # noqa: BLE001 - an unreadable config: the launch itself says why
        return False
    return str(device or "cuda").split(":", 1)[0] != "cpu"
