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

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tune_magic.checkpoints import validation
from tune_magic.job.validation import evaluation_recipe
from tune_magic.registry import store as jobstore
from tune_magic.registry.files import open_nofollow
from tune_magic.registry.record import JobRecord, overrides_of

#: One line per checkpoint given an evaluation: ``{"epoch", "step", "job"}`` or ``{"epoch", "step", "error"}``.
EVALUATIONS = "evaluations.jsonl"


# -- the evaluations of a job ----------------------------------------------------------------------

def read_evaluations(job_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The lines of a job's ``evaluations.jsonl``, oldest first (a torn last line is skipped)."""
    out = []
    try:
        with open(Path(job_dir) / EVALUATIONS, "r", encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and isinstance(entry.get("epoch"), int):
                    out.append(entry)
    except OSError:
        pass
    return out


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
        except Exception:  # noqa: BLE001 - removed or damaged: what the line says is all there is
            out[epoch] = Evaluation(epoch, step, job_id, "removed")
            continue
        result = validation.read_result(record.output_dir)
        value = float(result["val_loss"]) if result is not None else None
        error = record.error if record.state.value in ("failed", "stopped", "unknown") else None
        out[epoch] = Evaluation(epoch, step, job_id, record.state.value, value, error)
    return [out[k] for k in sorted(out)]


def evaluation_points(evaluations: list[Evaluation]) -> list:
    """The ``val_loss`` metric points of evaluations with a result (``source`` ``"evaluation"``,
    ``epoch`` the checkpoint's 1-based epoch, at the step it was saved)."""
    from tune_magic.logs.points import MetricPoint

    return [MetricPoint(e.step, validation.VAL_LOSS, e.val_loss, e.epoch + 1, "evaluation")
            for e in evaluations if e.val_loss is not None]


def unevaluated(record: JobRecord, done: set[int], settings=None) -> list:
    """The complete ``epoch_N/`` checkpoints this job wrote (:func:`tune_magic.checkpoints.catalog.list_checkpoints`)
    whose epoch is not in ``done``: those its keeper has still to launch an evaluation of."""
    from tune_magic.checkpoints.catalog import list_checkpoints

    if not record.output_dir:
        return []
    started = record.started_at - 1  # folders an earlier job of this output_dir wrote are not this job's
    return [c for c in list_checkpoints(record.output_dir, settings)
            if c.complete and c.epoch not in done and c.mtime >= started]


def val_summary_of(job, *, keeper_done: bool = True) -> "validation.ValSummary | None":
    """``Job.val_summary``: from the job's summary file (in-loop validation, or ``val_loss`` lines
    a recipe logged unasked) or its evaluations (checkpoint evaluation). Pending evaluations are the
    queued and running ones and, once the job has ended while its keeper is not done
    (``keeper_done`` False), the checkpoints it has not launched an evaluation of yet."""
    plan = validation.ValidationPlan.from_record(job.record.validation)
    if plan is not None and plan.mode == validation.CHECKPOINTS:
        evals = job.evaluations()
        live = sum(1 for e in evals if e.status in ("pending", "running"))
        failed = sum(1 for e in evals if e.val_loss is None and e.status not in ("pending", "running"))
        if not keeper_done and not job.record.state.is_live:
            live += len(unevaluated(job.record, {e.epoch for e in evals}))
        return validation.ValSummary.of_points([(e.step, e.val_loss) for e in evals if e.val_loss is not None],
                                               pending=live, failed=failed)
    s = job.summary()
    if s.val_step is None and plan is None:
        return None
    return validation.ValSummary(s.val_loss, s.val_step, s.min_val_loss, s.min_val_step)


def record_evaluation(job_dir: Path, entry: Mapping[str, Any]) -> None:
    """Append one line to the job's ``evaluations.jsonl`` (one ``O_APPEND`` write: lines never mix)."""
    fd = open_nofollow(job_dir / EVALUATIONS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (json.dumps(dict(entry)) + "\n").encode())
    finally:
        os.close(fd)


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
