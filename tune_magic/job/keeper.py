"""A job's keeper: the process beside a job that evaluates its checkpoints and keeps what matters.

A job gets a keeper when its checkpoints need looking after: it validates by checkpoints
(:data:`~tune_magic.checkpoints.validation.CHECKPOINTS`: each complete ``epoch_N/`` evaluated by a
job of its own, :mod:`tune_magic.job.evaluate`), or it keeps only some of them
(``--keep-checkpoints N | best``: the record's ``keep_checkpoints``). The launch starts it
(``Job.ensure_keeper``), in a session of its own (the kernel's interrupts and restarts never reach
it), holding ``keeper.lock`` for its life, so two never run; its output goes to ``keeper.log``.
Every :data:`POLL_S` it

1. reads what the job's log gained, for the step each ``epoch_N/`` was saved at
   (:class:`~tune_magic.checkpoints.validation.SaveSteps`);
2. launches the evaluation of each complete ``epoch_N/`` the job wrote and none evaluates yet
   (waiting while no GPU is free on this machine), one line of ``evaluations.jsonl`` each;
3. removes what retention allows (:func:`tune_magic.checkpoints.retention.plan_retention`: never
   the newest complete checkpoint, one not complete, the one a resume needs, one being read — an
   evaluation still running on it, or a generation holding it, :mod:`tune_magic.checkpoints.inuse`
   — nor, for ``best``, one not evaluated yet), one line of ``pruned.jsonl`` each with the bytes
   freed. The training loop never waits for any of this: it is another process.

It ends once the job has ended, every complete checkpoint has its evaluation and, for ``best``,
those evaluations ended, and retention was applied a last time; ``keeper.done`` then says so.
Should it die, ``Job.ensure_keeper`` (the card, ``Job.wait``) starts it again; it picks up from the
files.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

from tune_magic.checkpoints import validation
from tune_magic.errors import UserError
from tune_magic.registry import store as jobstore
from tune_magic.registry.files import append_json_line, open_nofollow
from tune_magic.job.checkpoints import PRUNED, read_pruned, val_losses
from tune_magic.registry.record import overrides_of

#: Held by the keeper for its whole life.
KEEPER_LOCK = "keeper.lock"
#: The keeper's output.
KEEPER_LOG = "keeper.log"
#: Written when the keeper has nothing left to do (no start after it).
KEEPER_DONE = "keeper.done"
#: Seconds between the keeper's looks.
POLL_S = 1.0

_started: list[subprocess.Popen] = []


def keep_policy(record) -> "int | str | None":
    """The job's retention policy (``keep_checkpoints``: an int N, ``"best"``), or ``None``."""
    keep = record.keep_checkpoints
    return keep if keep == "best" or (isinstance(keep, int) and not isinstance(keep, bool) and keep >= 1) else None


def needs_keeper(record) -> bool:
    """Whether a job's checkpoints need a keeper (validation by checkpoints, or retention)."""
    plan = validation.ValidationPlan.from_record(record.validation)
    return (plan is not None and plan.mode == validation.CHECKPOINTS) or keep_policy(record) is not None


class Keeper:
    """The keeper's loop for one job (module docstring).

    Args:
        job_dir: the job's registry directory.
        env: the environment evaluations are launched with.
    """

    def __init__(self, job_dir: Path, env: Mapping[str, str]):
        from tune_magic.checkpoints.catalog import SaveSettings
        from tune_magic.config.tuneparse import recipe_config
        from tune_magic.job import Job
        from tune_magic.job.evaluate import read_evaluations

        self.job = Job(job_dir)
        self.env = dict(env)
        self.record = self.job.record
        self.plan = validation.ValidationPlan.from_record(self.record.validation)
        self.keep = keep_policy(self.record)
        try:
            self.settings = SaveSettings.from_config(recipe_config(self.record.config, overrides_of(self.record)))
        except Exception:  # noqa: BLE001 - the catalog then reads each folder's kind from its files alone
            self.settings = None
        self.steps = validation.SaveSteps()
        self.offset = 0
        self.evaluated = {e["epoch"] for e in read_evaluations(job_dir)}
        self.pruned = {e["epoch"] for e in read_pruned(job_dir)}
        self.waiting: str | None = None
        self._in_loop: tuple[int, dict[int, float]] | None = None  # (log offset, in-loop val losses then)

    @property
    def evaluates(self) -> bool:
        return self.plan is not None and self.plan.mode == validation.CHECKPOINTS

    def _read_log(self) -> None:
        try:
            with open(self.record.log_path, "rb") as f:
                f.seek(self.offset)
                data = f.read(8 << 20)
        except OSError:
            return
        self.offset += len(data)
        self.steps.feed(data.decode("utf-8", errors="replace"))

    def _checkpoints(self) -> list:
        from tune_magic.checkpoints.catalog import list_checkpoints

        return list_checkpoints(self.record.output_dir, self.settings) if self.record.output_dir else []

    def _evaluate(self, checkpoints: list, live: bool) -> bool:
        """Launch the evaluations that can start now; return whether one waits for a GPU."""
        from tune_magic.gpus import GpuError
        from tune_magic.job.evaluate import existing_evaluation, launch_evaluation, record_evaluation

        started = self.record.started_at - 1  # folders an earlier job of this output_dir wrote are not this job's
        for cp in sorted(checkpoints, key=lambda c: c.epoch):
            if not cp.complete or cp.epoch in self.evaluated or cp.mtime < started:
                continue
            step = self.steps.step_of(cp.epoch)
            if step is None:
                if live:
                    continue  # its epoch's steps are not in the log yet
                step = self.job.summary().step or 0
            root = self.job.dir.parent
            try:
                job_id = existing_evaluation(self.record, cp.epoch, root)
                if job_id is None:
                    job_id = launch_evaluation(self.record, str(cp.path), cp.epoch, step, env=self.env, root=root).id
            except GpuError as exc:
                if self.waiting != str(exc):
                    self.waiting = str(exc)
                    print(f"epoch_{cp.epoch}: waiting for a free GPU: {exc}", flush=True)
                return True
            except UserError as exc:
                record_evaluation(self.job.dir, {"epoch": cp.epoch, "step": step, "error": str(exc)})
                print(f"epoch_{cp.epoch}: not evaluated: {exc}", flush=True)
            else:
                record_evaluation(self.job.dir, {"epoch": cp.epoch, "step": step, "job": job_id})
                print(f"epoch_{cp.epoch} (step {step}): evaluation job {job_id}", flush=True)
            self.evaluated.add(cp.epoch)
        return False

    def _val_losses(self) -> tuple[dict[int, float], set[int]]:
        """(``{epoch: val_loss}`` of the checkpoints evaluated so far, the epochs whose evaluation
        is still pending or running)."""
        if self.evaluates:
            evals = self.job.evaluations()
            return ({e.epoch: e.val_loss for e in evals if e.val_loss is not None},
                    {e.epoch for e in evals if e.status in ("pending", "running")})
        if self.plan is None:
            return {}, set()
        # in the recipe's loop: read again only once the log grew (a look every second otherwise
        # re-reads the whole metric file of a long run)
        if self._in_loop is None or self._in_loop[0] != self.offset:
            self._in_loop = (self.offset, val_losses(self.job, self.steps))
        return self._in_loop[1], set()

    def _retain(self, checkpoints: list) -> None:
        """Remove what retention allows now (module docstring, step 3)."""
        from dataclasses import replace

        from tune_magic.checkpoints import inuse
        from tune_magic.checkpoints.catalog import resume_epoch
        from tune_magic.checkpoints.retention import plan_retention

        losses, running = self._val_losses()
        present = [replace(c, val_loss=losses.get(c.epoch)) for c in checkpoints if c.epoch not in self.pruned]
        busy = inuse.busy(self.job.dir, [c.epoch for c in present]) | running
        resume = resume_epoch(self.record.output_dir)
        plan = plan_retention(present, self.keep, val_losses=losses, in_use=busy,
                              resume_needs=() if resume is None else (resume,))
        for cp in plan.prune:
            self._remove(cp)

    def _remove(self, cp) -> None:
        from tune_magic.checkpoints import inuse

        out = Path(self.record.output_dir).resolve()
        path = Path(cp.path).resolve()
        if path.parent != out or path.name != f"epoch_{cp.epoch}":
            return  # never anything but an epoch_N/ directly in the job's output_dir
        with inuse.removing(self.job.dir, cp.epoch) as free:
            if not free:
                return  # a reader started on it a moment ago
            shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            return
        append_json_line(self.job.dir / PRUNED, {"epoch": cp.epoch, "at": time.time(), "bytes_freed": cp.bytes_on_disk,
                                        "path": str(path)})
        self.pruned.add(cp.epoch)
        print(f"epoch_{cp.epoch}: removed ({cp.bytes_on_disk} bytes freed)", flush=True)

    def look(self, live: bool) -> bool:
        """One look (module docstring); return whether anything is still to do."""
        self._read_log()
        checkpoints = self._checkpoints()
        waiting = self._evaluate(checkpoints, live) if self.evaluates else False
        if self.keep is not None:
            self._retain(self._checkpoints())
        if live or waiting:
            return True
        started = self.record.started_at - 1
        unevaluated = self.evaluates and any(c.complete and c.epoch not in self.evaluated and c.mtime >= started
                                             for c in self._checkpoints())
        pending = self.keep == "best" and bool(self._val_losses()[1])
        return unevaluated or pending

    def run(self) -> int:
        """Look every :data:`POLL_S` until the job ended and nothing is left to do."""
        while True:
            live = self.job.refresh().status.is_live
            if not self.look(live) and not live:
                (self.job.dir / KEEPER_DONE).touch()
                return 0
            time.sleep(POLL_S)


# -- starting it ---------------------------------------------------------------------------------

def keeper_alive(job_dir: Path) -> bool:
    """Whether a process holds the job's keeper lock."""
    return bool(jobstore.lock_is_held(job_dir / KEEPER_LOCK))


def start_keeper(job_dir: Path, *, env: Mapping[str, str] | None = None, cwd: str | None = None) -> bool:
    """Start the job's keeper in a session of its own, unless one holds its lock or it is done;
    return whether one was started. Its output is appended to ``keeper.log``."""
    if (job_dir / KEEPER_DONE).exists() or not os.access(job_dir, os.W_OK):
        return False
    try:
        lock_fd = open_nofollow(job_dir / KEEPER_LOCK, os.O_RDWR | os.O_CREAT)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # alive
            return False
        log = open_nofollow(job_dir / KEEPER_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            proc = subprocess.Popen([sys.executable, "-m", "tune_magic.job.keeper", str(job_dir), "--lock-fd",
                                     str(lock_fd)], cwd=cwd if cwd and os.path.isdir(cwd) else None,
                                    env=dict(os.environ if env is None else env), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                    pass_fds=(lock_fd,))
        finally:
            os.close(log)
        _started.append(proc)
        for p in list(_started):  # reaped once exited: none is left a zombie
            if p.poll() is not None:
                _started.remove(p)
        return True
    except OSError:
        return False
    finally:
        os.close(lock_fd)


def ensure(job, *, env: Mapping[str, str] | None = None) -> bool:
    """``Job.ensure_keeper``: start the keeper of ``job`` when it needs one, none runs and it is
    not done; return whether one was started."""
    if not needs_keeper(job.record) or (job.dir / KEEPER_DONE).exists():
        return False
    return start_keeper(job.dir, env=env, cwd=job.record.cwd)


# -- waiting for it -------------------------------------------------------------------------------

def keep_evaluating(job) -> bool:
    """Start the keeper of an ended ``job`` again if it died (:func:`ensure`); return whether the
    evaluations of its checkpoints can still finish: its keeper runs, or is done (the evaluations it
    launched end on their own). ``False`` for a keeper that cannot be started (a registry it cannot
    write)."""
    job.ensure_keeper()
    return (job.dir / KEEPER_DONE).exists() or keeper_alive(job.dir)


def wait_for(job, deadline: float | None, poll_s: float = 0.2) -> list:
    """``Job.wait_evaluations`` once ``job`` has ended: block until its keeper has launched the
    evaluation of every checkpoint (started again should it have died: :func:`keep_evaluating`) and
    each of those jobs has ended; return :meth:`~tune_magic.job.Job.evaluations`.

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
        if not going or ((job.dir / KEEPER_DONE).exists() and not any(e.status in ("pending", "running")
                                                                       for e in evals)):
            return evals
        if deadline is not None and time.monotonic() > deadline:
            left = job.val_summary().pending or 1
            raise TimeoutError(f"job {job.id}: {left} evaluation{'s' if left > 1 else ''} of its checkpoints still "
                               "to finish")
        time.sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic())))


def main(argv: list[str] | None = None) -> int:
    """``python -m tune_magic.job.keeper JOB_DIR [--lock-fd N]``: the keeper (module docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m tune_magic.job.keeper JOB_DIR [--lock-fd N]", file=sys.stderr)
        return 2
    job_dir = Path(args[0])
    if "--lock-fd" not in args:  # started by hand: take the lock, or another keeper runs
        fd = open_nofollow(job_dir / KEEPER_LOCK, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            print(f"a keeper of {job_dir.name} runs already", file=sys.stderr)
            return 0
    return Keeper(job_dir, os.environ).run()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
