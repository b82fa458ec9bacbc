"""Evaluating a job's checkpoints on its ``dataset_val``: the evaluator process that gives each
saved checkpoint a job of its own, and the evaluations a job has.

A job whose validation mode is :data:`~tune_magic.checkpoints.validation.CHECKPOINTS` (any recipe
that does not validate in its loop, torchtune 0.6.1's built-ins included) gets an evaluator:
``python -m tune_magic.job.evaluate JOB_DIR``, started by the launch beside the job, in a session
of its own (the kernel's interrupts and restarts never reach it), holding ``evaluator.lock`` for
its life so two never run. It reads the job's log for the step each ``epoch_N/`` was saved at
(:class:`~tune_magic.checkpoints.validation.SaveSteps`), and for each complete ``epoch_N/`` this
job wrote (:func:`tune_magic.checkpoints.catalog.list_checkpoints`) launches
``recipes/validate_checkpoint.py`` with the job's config and overrides as a job of its own, on the
job's scheduler: listed, followed, stopped and triaged like any job, its record's ``evaluates``
naming the job, the epoch and the step. On this machine it runs on a free GPU, never one another
live job holds (the training job's included), and waits while none is free. Each launch is one line
of ``evaluations.jsonl`` in the job's directory. The evaluator ends once the job has ended and every
complete checkpoint has its evaluation; an evaluation's failure never fails the job. Should it
die, :func:`revive` (the card, ``Job.wait``) starts it again; it picks up where the file says.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tune_magic.checkpoints import validation
from tune_magic.errors import UserError
from tune_magic.job.validation import EVALUATOR_DONE, EVALUATOR_LOCK, evaluation_recipe, start_evaluator
from tune_magic.registry import store as jobstore
from tune_magic.registry.files import open_nofollow
from tune_magic.registry.record import JobRecord, overrides_of

#: One line per checkpoint given an evaluation: ``{"epoch", "step", "job"}`` or ``{"epoch", "step", "error"}``.
EVALUATIONS = "evaluations.jsonl"
#: Seconds between the evaluator's looks at the job's output_dir.
POLL_S = 1.0


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
    whose epoch is not in ``done``: those its evaluator has still to launch."""
    from tune_magic.checkpoints.catalog import list_checkpoints

    if not record.output_dir:
        return []
    started = record.started_at - 1  # folders an earlier job of this output_dir wrote are not this job's
    return [c for c in list_checkpoints(record.output_dir, settings)
            if c.complete and c.epoch not in done and c.mtime >= started]


def val_summary_of(job) -> "validation.ValSummary | None":
    """``Job.val_summary``: from the job's summary file (in-loop validation, or ``val_loss`` lines
    a recipe logged unasked) or its evaluations (checkpoint evaluation). Pending evaluations count
    the queued and running ones and, once the job has ended, the checkpoints its evaluator has not
    launched an evaluation of yet."""
    plan = validation.ValidationPlan.from_record(job.record.validation)
    if plan is not None and plan.mode == validation.CHECKPOINTS:
        evals = job.evaluations()
        live = sum(1 for e in evals if e.status in ("pending", "running"))
        failed = sum(1 for e in evals if e.val_loss is None and e.status not in ("pending", "running"))
        if not job.record.state.is_live and not (job.dir / EVALUATOR_DONE).exists():
            live += len(unevaluated(job.record, {e.epoch for e in evals}))
        return validation.ValSummary.of_points([(e.step, e.val_loss) for e in evals if e.val_loss is not None],
                                               pending=live, failed=failed)
    s = job.summary()
    if s.val_step is None and plan is None:
        return None
    return validation.ValSummary(s.val_loss, s.val_step, s.min_val_loss, s.min_val_step)


def _append(job_dir: Path, entry: Mapping[str, Any]) -> None:
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


def _existing(record: JobRecord, epoch: int, root: Path) -> str | None:
    """The id of a job already evaluating ``epoch`` of ``record`` (an evaluator that died between
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


class Evaluator:
    """The loop of the evaluator process of one job (module docstring).

    Args:
        job_dir: the training job's directory.
        env: the environment evaluations are launched with.
    """

    def __init__(self, job_dir: Path, env: Mapping[str, str]):
        from tune_magic.checkpoints.catalog import SaveSettings
        from tune_magic.config.tuneparse import recipe_config
        from tune_magic.job import Job

        self.job = Job(job_dir)
        self.env = dict(env)
        self.record = self.job.record
        try:
            self.settings = SaveSettings.from_config(recipe_config(self.record.config, overrides_of(self.record)))
        except Exception:  # noqa: BLE001 - the catalog then reads each folder's kind from its files alone
            self.settings = None
        self.steps = validation.SaveSteps()
        self.offset = 0
        self.done = {e["epoch"] for e in read_evaluations(job_dir)}
        self.waiting: str | None = None

    def _read_log(self) -> None:
        try:
            with open(self.record.log_path, "rb") as f:
                f.seek(self.offset)
                data = f.read(8 << 20)
        except OSError:
            return
        self.offset += len(data)
        self.steps.feed(data.decode("utf-8", errors="replace"))

    def _pending(self) -> list:
        return unevaluated(self.record, self.done, self.settings)

    def look(self, live: bool) -> bool:
        """One look: launch what can be launched; return whether something is still to do."""
        from tune_magic.gpus import GpuError

        self._read_log()
        pending = self._pending()
        for cp in sorted(pending, key=lambda c: c.epoch):
            step = self.steps.step_of(cp.epoch)
            if step is None:
                if live:
                    continue  # its epoch's steps are not in the log yet
                step = self.job.summary().step or 0
            root = self.job.dir.parent
            try:
                job_id = _existing(self.record, cp.epoch, root)
                if job_id is None:
                    job_id = launch_evaluation(self.record, str(cp.path), cp.epoch, step, env=self.env, root=root).id
            except GpuError as exc:
                if self.waiting != str(exc):
                    self.waiting = str(exc)
                    print(f"epoch_{cp.epoch}: waiting for a free GPU: {exc}", flush=True)
                return True
            except UserError as exc:
                _append(self.job.dir, {"epoch": cp.epoch, "step": step, "error": str(exc)})
                print(f"epoch_{cp.epoch}: not evaluated: {exc}", flush=True)
            else:
                _append(self.job.dir, {"epoch": cp.epoch, "step": step, "job": job_id})
                print(f"epoch_{cp.epoch} (step {step}): evaluation job {job_id}", flush=True)
            self.done.add(cp.epoch)
        return live or bool(self._pending())

    def run(self) -> int:
        """Look every :data:`POLL_S` until the job ended and every checkpoint has its evaluation."""
        while True:
            live = self.job.refresh().status.is_live
            if not self.look(live) and not live:
                (self.job.dir / EVALUATOR_DONE).touch()
                return 0
            time.sleep(POLL_S)


def revive(job) -> bool:
    """Start the evaluator of ``job`` (a :class:`~tune_magic.job.Job`) again when it validates by
    checkpoints, its evaluator is not done and none runs; return whether one was started. A step of
    its own, taken by the card and ``Job.wait``: listings never start anything."""
    plan = validation.ValidationPlan.from_record(job.record.validation)
    if plan is None or plan.mode != validation.CHECKPOINTS or (job.dir / EVALUATOR_DONE).exists():
        return False
    return start_evaluator(job.dir, cwd=job.record.cwd)


def keep_evaluating(job) -> bool:
    """Start the evaluator of an ended ``job`` again if it died (:func:`revive`); return whether its
    evaluations can still finish: its evaluator runs, or has launched every one (whose jobs end on
    their own). ``False`` for an evaluator that cannot be started (a registry it cannot write)."""
    from tune_magic.job.validation import evaluator_alive

    revive(job)
    return (job.dir / EVALUATOR_DONE).exists() or evaluator_alive(job.dir)


def wait_for(job, deadline: float | None, poll_s: float = 0.2) -> list[Evaluation]:
    """``Job.wait_evaluations`` once ``job`` has ended: block until its evaluator has launched the
    evaluation of every checkpoint (starting the evaluator again should it have died: :func:`revive`)
    and each of those jobs has ended; return :meth:`~tune_magic.job.Job.evaluations`.

    Args:
        job: the ended :class:`~tune_magic.job.Job`.
        deadline: :func:`time.monotonic` seconds to give up at, or ``None``.
        poll_s: seconds between looks.

    Raises:
        TimeoutError: evaluations still to finish at ``deadline`` (the message counts them).
    """
    plan = validation.ValidationPlan.from_record(job.record.validation)
    if plan is None or plan.mode != validation.CHECKPOINTS:
        return job.evaluations()
    while True:
        going = keep_evaluating(job)
        evals = job.evaluations()
        if not going or ((job.dir / EVALUATOR_DONE).exists() and not any(e.status in ("pending", "running")
                                                                          for e in evals)):
            return evals
        if deadline is not None and time.monotonic() > deadline:
            left = job.val_summary().pending or 1
            raise TimeoutError(f"job {job.id}: {left} evaluation{'s' if left > 1 else ''} of its checkpoints still "
                               "to finish")
        time.sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic())))


def main(argv: list[str] | None = None) -> int:
    """``python -m tune_magic.job.evaluate JOB_DIR [--lock-fd N]``: the evaluator (module docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m tune_magic.job.evaluate JOB_DIR [--lock-fd N]", file=sys.stderr)
        return 2
    job_dir = Path(args[0])
    if "--lock-fd" not in args:  # started by hand: take the lock, or another evaluator runs
        fd = open_nofollow(job_dir / EVALUATOR_LOCK, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            print(f"an evaluator of {job_dir.name} runs already", file=sys.stderr)
            return 0
    return Evaluator(job_dir, os.environ).run()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
