"""Jobs: a facade over each job's record and its scheduler; listings. Knows nothing of IPython.
One concept: every question about one job (status, metrics, evaluations, stop, wait) has its
answer on :class:`Job`.

The package: :class:`Job` and the listings here; :mod:`~tune_magic.job.launch` (words -> a checked
plan -> a registered job handed to its scheduler), :mod:`~tune_magic.job.resume` (a job continued
from its checkpoint as a new, linked job), :mod:`~tune_magic.job.clashes` (what a launch may not
share with a live job) and :mod:`~tune_magic.job.stopping` (several jobs stopped together).

A :class:`Job` reads its record under ``$TUNE_MAGIC_HOME/jobs/<id>/`` (:mod:`tune_magic.registry`)
and asks its scheduler (:mod:`tune_magic.schedulers`) what became of it, how to stop it and where it
runs; it never asks which scheduler it has. Any process (a new kernel, the CLI) lists, follows and
stops jobs that another one launched (:mod:`tune_magic.job.launch`).
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Mapping

from tune_magic import schedulers
from tune_magic.errors import JobNotFound, PlanError, StateDirError
from tune_magic.logs.notify import get_notifier
from tune_magic.config.launchwords import check_job_id
from tune_magic.registry import owner
from tune_magic.registry import store as jobstore
from tune_magic.registry.ids import resolve_job_id
from tune_magic.registry.status import Status
from tune_magic.registry.store import JobRecord

#: Seconds between asking the scheduler what became of a live job (see Job.refresh).
LIVENESS_CHECK_S = 1.0

RUNNING, SUCCEEDED, FAILED, STOPPED = Status.RUNNING, Status.SUCCEEDED, Status.FAILED, Status.STOPPED


class Job:
    """A background job, backed by its record on disk.

    Attributes are read from the record; call :meth:`refresh` (or a method that does) to see
    changes. Status (:class:`tune_magic.Status`, a ``str``): ``pending`` (queued by a scheduler),
    ``running``, ``unknown`` (nothing of it runs and no exit code is known: "outcome unknown"),
    ``succeeded`` (exit 0), ``failed`` (non-zero exit) or ``stopped`` (stopped by a user).

    ``damaged`` is True for a job whose ``record.json`` cannot be read: what is known comes from
    its small process file, so it can still be stopped (its supervisor rewrites the record).
    """

    def __init__(self, directory: Path, record: JobRecord | None = None):
        self.dir = Path(directory)
        self.damaged = False
        if record is None:
            try:
                record = _read(self.dir)
            except jobstore.CorruptRecord:
                record = _damaged_record(self.dir)
                self.damaged = True
        else:
            schedulers.get_or_missing(record.scheduler).migrate(record)
        self._record = record
        self._stamp: tuple | None = None  # identity of the record file last read
        self._checked = 0.0  # monotonic time of the last look at the scheduler

    # -- state --------------------------------------------------------------------------------
    @property
    def scheduler(self) -> str:
        """The name of the scheduler the job runs on (``"local"``, ``"slurm"``, ...)."""
        return self._record.scheduler

    def _sched(self):
        return schedulers.get_or_missing(self._record.scheduler)

    def refresh(self) -> "Job":
        """Re-read the record if it changed; ask the scheduler what became of a live job (at most
        every :data:`LIVENESS_CHECK_S` seconds) and record what it settles.

        Reading never needs a write: when the registry cannot be written (read-only, full), the
        settled status is shown anyway. Cheap when nothing changed (one ``stat``).
        """
        stamp = jobstore.stamp(self.dir)
        if stamp is None or stamp != self._stamp:
            try:
                self._record = _read(self.dir)
                self.damaged = False
            except jobstore.CorruptRecord:
                if not self.damaged:
                    self._record = _damaged_record(self.dir, self._record)
                    self.damaged = True
            self._stamp = stamp
        r = self._record
        now = time.monotonic()
        if (not r.state.is_terminal) and now - self._checked >= LIVENESS_CHECK_S:
            self._checked = now
            changes = self._sched().describe(self.dir, r) if not self.damaged else {}
            persist = changes.pop("_persist", True)
            if changes:
                if persist and not self.damaged:
                    try:
                        self._record = jobstore.update(self.dir, migrate=self._sched().migrate, **changes)
                        self._stamp = jobstore.stamp(self.dir)
                        return self
                    except (OSError, jobstore.CorruptRecord, StateDirError):
                        pass  # read-only or full: show it anyway
                shown = JobRecord.from_dict(r.to_dict())
                for key, value in changes.items():
                    shown.set_status(value) if key == "status" else setattr(shown, key, value)
                self._record = shown
        return self

    @property
    def record(self) -> JobRecord:
        """The last record read (see :meth:`refresh`)."""
        return self._record

    id = property(lambda self: self._record.id, doc="Unique job id (str).")
    name = property(lambda self: self._record.name, doc="Free-text name (str; need not be unique).")
    returncode = property(lambda self: self.refresh()._record.returncode,
                          doc="Exit code (int; negative: killed by that signal) once ended, else None.")
    error = property(lambda self: self.refresh()._record.error,
                     doc="For a failed job: the failing rank and its error line (str), else None.")
    output_dir = property(lambda self: self._record.output_dir, doc="Resolved output_dir (str) or None.")
    log_path = property(lambda self: self._record.log_path, doc="The job's combined stdout+stderr log (str).")
    argv = property(lambda self: list(self._record.argv), doc="The command that was launched (list[str]).")
    gpus = property(lambda self: self._record.gpus, doc="GPU ids given to the job (list[int]) or None.")
    started_at = property(lambda self: self._record.started_at, doc="Unix time (s) of the launch.")
    ended_at = property(lambda self: self.refresh()._record.ended_at, doc="Unix time (s) of the end, or None.")

    @property
    def status(self) -> Status:
        """The job's :class:`~tune_magic.Status` (re-read from disk; compares equal to its string)."""
        return self.refresh()._record.state

    @property
    def pid(self) -> int | None:
        """Pid of the torchrun agent (or of the one recipe process) on this machine; ``None`` where
        the job has no process here (e.g. a SLURM job) or before it started."""
        agent = self._record.agent
        return agent.pid if agent else None

    @property
    def nodes(self) -> list[str]:
        """Host names the job runs on: this host for a local job; a cluster job's allocation
        (``[]`` while it is pending)."""
        return self._sched().nodes(self._record)

    @property
    def num_nodes(self) -> int:
        """Nodes the job asked for (1 for a local job)."""
        return self._record.num_nodes

    @property
    def pending_reason(self) -> str | None:
        """Why a pending job waits (the engine's reason, e.g. SLURM's ``Resources``), else ``None``."""
        return self.refresh()._record.pending_reason

    @property
    def engine_note(self) -> str | None:
        """A note on how sure the status is (e.g. ``"SLURM not answering since 14:05"``: the status
        shown is the last known one), from the job's scheduler; ``None`` when there is none."""
        return self._sched().job_note(self._record)

    @property
    def engine_id(self) -> str | None:
        """The engine's own id of the job (e.g. SLURM's job id, once submitted), else ``None``."""
        return self._sched().engine_id(self._record)

    @property
    def engine_id_label(self) -> str | None:
        """What the engine's id is called (a column title, e.g. ``"SLURM ID"``), else ``None``."""
        return self._sched().engine_id_label

    @property
    def overrides(self) -> list[str]:
        """The override words the recipe got (``key=value`` / ``~key``, in order; the per-job
        ``output_dir`` tune_magic adds included), also for jobs launched before records kept them."""
        from tune_magic.registry.record import overrides_of

        return overrides_of(self._record)

    @property
    def tail_rules(self) -> tuple:
        """The engine's own lines a card's display tail collapses (its scheduler's rules)."""
        return self._sched().tail_rules

    @property
    def workers(self) -> list[dict]:
        """The rank processes: ``{"host", "rank", "pid"}`` for a job on this machine, ``{"host",
        "rank"}`` for a job on other nodes (as its nodes reported them)."""
        r = self._record
        if r.workers:  # processes recorded by pid run on this machine
            import socket

            host = next(iter(self.nodes), None) or socket.gethostname()
            return [{"host": host, "rank": w.rank, "pid": w.pid} for w in r.workers]
        return [dict(x) for x in r.rank_hosts]

    @property
    def rendezvous_endpoint(self) -> str | None:
        """The real ``host:port`` once the workers are up (from a worker's MASTER_ADDR/PORT), or the
        user's endpoint when they gave one; ``None`` for one-process jobs and before workers start."""
        return self.refresh()._record.rendezvous_endpoint

    @property
    def elapsed_s(self) -> float:
        """Seconds since launch, or the job's whole duration once it ended (without the time a
        requeued job waited in its engine's queue again)."""
        r = self._record
        return max(0.0, (r.ended_at or time.time()) - r.started_at - self._sched().queued_s(r))

    def __repr__(self) -> str:
        # no status: a notebook's Out[] keeps this text while the job moves on (the card is live)
        r = self._record
        return f"<Job {r.id} {r.name!r}>"

    # -- actions --------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None, poll_s: float = 0.1) -> Status:
        """Block while the job is pending or running; return the status it then has (terminal,
        or ``unknown`` when nothing of it runs and no exit code exists). The evaluations of its
        checkpoints may still run: :meth:`wait_evaluations` waits for them too.

        Raises:
            TimeoutError: still pending or running after ``timeout`` seconds.
        """
        deadline = wait_deadline(timeout)
        # the supervisor writes the record by renaming a new file into the job's directory: a watch
        # on the directory's names ends each wait the moment it does (polling every poll_s all the
        # same, for where notification never comes); the rest of the job's writes wake nobody
        woke = threading.Event()
        sub = get_notifier().subscribe(woke.set)
        try:
            sub.watch(dirs=[self.dir])
            while True:
                woke.clear()
                if not self.status.is_live:
                    break
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    raise TimeoutError(f"job {self.id} still {self._record.status} after {timeout} s")
                woke.wait(poll_s if deadline is None else min(poll_s, deadline - now + 0.001))
        finally:
            sub.close()
        self._settle_supervisor()
        if self._record.validation or self._record.keep_checkpoints:
            self.ensure_keeper()  # a keeper that died with checkpoints still to evaluate or prune goes on
        return self._record.state

    def wait_evaluations(self, timeout: float | None = None, poll_s: float = 0.2) -> list:
        """Block until the job has ended and every evaluation of its checkpoints has ended (a job
        that validates by checkpoints: :meth:`evaluations`); return :meth:`evaluations`. Returns
        once the job has ended for a job that validates in its loop (its values are in its logs)
        or not at all. Starts the job's keeper again should it have died (:meth:`ensure_keeper`).

        Args:
            timeout: seconds to wait in all (the job and its evaluations), or ``None``.
            poll_s: seconds between looks.

        Raises:
            TimeoutError: the job, or an evaluation, still to finish after ``timeout`` seconds.
            ValueError: ``timeout`` is not a number of seconds >= 0.
        """
        from tune_magic.job.keeper import wait_for

        deadline = wait_deadline(timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()), poll_s)
        return wait_for(self, deadline, poll_s)

    def _settle_supervisor(self) -> None:
        """Let the scheduler's own process for this ended job finish exiting (see
        :meth:`tune_magic.schedulers.base.Scheduler.settle_after_end`)."""
        self._sched().settle_after_end(self._record)

    def stop(self, grace_s: float = 10.0) -> Status:
        """Stop the job: every process of it still alive gets SIGTERM (through the torchrun agent,
        which forwards it to the workers), and after ``grace_s`` seconds SIGKILL; a queued job is
        cancelled. Works whatever the recorded status (a finished job's orphans are killed too),
        on a damaged record, and on a full disk.

        Only processes whose pid and create-time match what was recorded are signalled.

        Returns:
            The status afterwards (``stopped`` unless the job had already ended).

        Raises:
            ValueError: ``grace_s`` is not a number of seconds >= 0.
        """
        if isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or not 0 <= grace_s < math.inf:
            raise ValueError(f"grace_s={grace_s!r}: give the seconds between SIGTERM and SIGKILL, a number >= 0")
        self.refresh()
        sched = self._sched()
        if not self.damaged and self._record.state.is_live:
            # what the log shows now decides whether a run that exits 0 had finished (the outcome rule)
            from tune_magic.logs.progress import finished_and_saved

            jobstore.mark_stop_requested(self.dir, finished=finished_and_saved(self.tail(200), self._record.epochs))
        sched.cancel(self.dir, None if self.damaged else self._record, float(grace_s))
        self._checked = 0.0
        self._stamp = None
        self.refresh()
        if not self._record.state.is_terminal and not self.damaged:
            extra = sched.settle_after_cancel(self.dir, self._record)
            if extra:
                try:
                    self._record = jobstore.update(self.dir, **extra)
                except (OSError, jobstore.CorruptRecord, StateDirError):
                    for key, value in extra.items():
                        self._record.set_status(value) if key == "status" else setattr(self._record, key, value)
        if self.damaged and self._record.state.is_live and not sched.has_live_parts(self.dir, None):
            self._record.set_status(STOPPED)  # nothing of it runs any more; its record stays unreadable
        self._settle_supervisor()
        return self._record.state

    def failure(self):
        """Why the job failed, in full (:class:`tune_magic.logs.failure.FailureReason`: the one plain line,
        the failing rank and host, the exception, the whole traceback), or ``None`` when it did not
        fail or nothing more than :attr:`error` is known."""
        from tune_magic.logs.failure import FailureReason

        if self.refresh()._record.status != FAILED:
            return None
        try:
            data = jobstore.read_json(self.dir / jobstore.FAILURE, 4 << 20)
            texts = ("line", "kind", "host", "exc_type", "message", "traceback")
            numbers = ("rank", "local_rank", "exitcode", "pid")
            if not isinstance(data, dict) or not isinstance(data.get("line"), str) or not all(
                    data.get(k) is None or isinstance(data.get(k), str) for k in texts) or not all(
                    data.get(k) is None or (isinstance(data.get(k), int) and not isinstance(data.get(k), bool))
                    for k in numbers):
                raise ValueError("failure.json is damaged")
            return FailureReason(**{k: data.get(k) for k in FailureReason.__dataclass_fields__})
        except (OSError, ValueError, TypeError):
            r = self._record
            return FailureReason(line=r.error or f"exited with code {r.returncode}", kind="exit_code",
                                 exitcode=r.returncode) if r.error or r.returncode is not None else None

    def summary(self):
        """Return the job's :class:`tune_magic.logs.summary.Summary`: last step and loss, epoch,
        progress text, last metric values, whether it is saving a checkpoint, the failure reason.
        Reads the small summary file, never the whole log (at most the bytes it gained since)."""
        from tune_magic.logs.summary import Summary, current_summary

        r = self.refresh()._record
        if self.damaged:
            return Summary()
        kept = not r.state.is_terminal and self._sched().keeps_summary(self.dir, r)
        return current_summary(self.dir, r, kept=kept, final=not r.state.is_live)

    def metric_points(self) -> list:
        """Read the job's logs to their current end; return its merged metric points
        (:class:`tune_magic.logs.points.MetricPoint`, sorted by step then name).

        Sources: the DiskLogger file (found from the log's ``Writing logs to`` line, else the newest
        ``log_*`` in the job's metric-log dir created after its start) and the progress bar in the
        combined log; for a step both give, the metric file's value wins. A job whose checkpoints
        are evaluated by jobs of their own (:meth:`evaluations`) has their ``val_loss`` points too,
        each at the step its checkpoint was saved.
        """
        from tune_magic.logs.metricfollow import JobMetricsFollower

        r = self._record
        with JobMetricsFollower(r.log_path, log_dir=r.metric_log_dir, started_after=r.started_at - 1,
                                max_lines=1, cwd=r.cwd, rank_log_dir=r.rank_log_dir) as follower:
            follower.finish() if not self.status.is_live else follower.poll()
            points = follower.points()
        if r.validation:  # checkpoints evaluated by jobs of their own: their points are this job's
            from tune_magic.job.evaluate import evaluation_points

            extra = evaluation_points(self.evaluations())
            if extra:
                points = sorted(points + extra, key=lambda p: (p.step, p.name))
        return points

    def evaluations(self):
        """The evaluations of this job's checkpoints (a job that validates by checkpoints: each saved
        ``epoch_N/`` evaluated on ``dataset_val`` by a job of its own), by epoch:
        :class:`tune_magic.job.evaluate.Evaluation` (epoch, step, its job, status, ``val_loss``,
        error). Empty for a job that validates in its loop, or not at all."""
        from tune_magic.job.evaluate import evaluations_of

        return evaluations_of(self.dir)

    def validation_points(self) -> list:
        """The job's validation losses as metric points (``name`` ``"val_loss"``, sorted by step):
        those its recipe logged in its loop, or those of its checkpoints' evaluations (``source``
        ``"evaluation"``, ``epoch`` the checkpoint's 1-based epoch)."""
        from tune_magic.checkpoints.validation import VAL_LOSS

        return [p for p in self.metric_points() if p.name == VAL_LOSS]

    def checkpoints(self) -> list:
        """The job's checkpoints, by epoch: one :class:`tune_magic.checkpoints.catalog.Checkpoint`
        per ``epoch_N/`` of its ``output_dir`` (epoch, path, files, bytes on disk, kind: ``full`` /
        ``lora_merged`` / ``adapter_only``, complete or not, the step it was saved at, its
        ``val_loss`` when evaluated, ``needed_by_resume``), and one per checkpoint retention removed
        (``pruned``: when, and the bytes freed). Reads files only, never with torch."""
        from tune_magic.job.checkpoints import checkpoints_of

        return checkpoints_of(self)

    def export(self, dest: "str | os.PathLike[str]", checkpoint: "str | int" = "best"):
        """Copy one checkpoint (``"best"``: the lowest validation loss, ``"last"``, ``"epoch_N"`` or
        N) with the job's tokenizer and configs into the new folder ``dest``, in the Hugging Face
        layout where the checkpointer wrote one, with a README saying how to load it; return the
        :class:`tune_magic.checkpoints.export.ExportResult`.

        Raises:
            CheckpointError: an unknown, pruned or incomplete checkpoint, none evaluated for
                ``"best"``, a ``dest`` that exists and is not empty, or the job's tokenizer or
                config file gone.
            OSError: ``dest``'s parent cannot be written (nothing is left behind).
        """
        from tune_magic.job.checkpoints import export_of

        return export_of(self, dest, checkpoint)

    def keeper_state(self) -> str:
        """Where this job's keeper (:mod:`tune_magic.job.keeper`) is: ``"done"`` (nothing left to do),
        ``"running"`` (a process holds its lock) or ``"none"`` (never started, or died)."""
        from tune_magic.job.keeper import KEEPER_DONE, keeper_alive

        if (self.dir / KEEPER_DONE).exists():
            return "done"
        return "running" if keeper_alive(self.dir) else "none"

    def ensure_keeper(self, env=None) -> bool:
        """Start this job's keeper (:mod:`tune_magic.job.keeper`: it evaluates the job's checkpoints
        and applies its retention) when the job needs one, none runs and it is not done; return
        whether one was started. The launch calls it; a card and ``wait`` call it again, so a keeper
        that died (a reboot) goes on. Never raises for a keeper that cannot start."""
        from tune_magic.job.keeper import ensure

        try:
            return ensure(self, env=env)
        except OSError:
            return False

    def val_summary(self):
        """What listings show of the job's validation losses (latest, best, evaluations pending or
        failed): :class:`tune_magic.checkpoints.validation.ValSummary`, or ``None`` when the job does
        not validate. Reads the small summary file (in-loop validation) or the evaluations' result
        files, never a whole log. Pending evaluations count, once the job has ended, the checkpoints
        its keeper has not launched an evaluation of yet."""
        from tune_magic.job.evaluate import val_summary_of
        from tune_magic.job.keeper import KEEPER_DONE

        return val_summary_of(self, keeper_done=(self.dir / KEEPER_DONE).exists())

    def metrics(self) -> list[dict]:
        """Return the job's metric points as dicts: ``step`` (int), ``name`` (str), ``value``
        (float; ``nan``/``inf`` kept), ``epoch`` (int or None), ``source`` (``disklogger``,
        ``jsonl``, ``progress``, or ``evaluation`` for a checkpoint evaluation's ``val_loss``). See
        :meth:`metric_points`."""
        return [p._asdict() for p in self.metric_points()]

    def metrics_frame(self):
        """Return the metrics as a long-form pandas DataFrame (one row per step and metric name;
        columns step, name, value, epoch, source).

        Raises:
            ImportError: pandas is not installed (``pip install pandas``).
        """
        from tune_magic.logs.export import points_to_frame

        return points_to_frame(self.metric_points())

    def resume(self, overrides=(), **options) -> "Job":
        """Resume this stopped, failed or ``unknown`` job from its last checkpoint, as a new job in
        the same ``output_dir`` linked to it; return the new job (a ``ResumePlan`` for a dry run).
        The same as ``tune_magic.resume(self, overrides, **options)``: see there
        (:func:`tune_magic.job.resume.resume`) for the options, the pre-flight and the refusals."""
        # a call-time import within the job package: the resume launches through job.launch,
        # which builds Job objects, so importing it at the top would make the package's own cycle
        from tune_magic.job.resume import resume

        return resume(self, overrides, **options)

    def generate(self, prompt: str, *, checkpoint="last", max_new_tokens: int = 64, temperature: float = 0.0,
                 top_k: int | None = None, seed: int = 0, on_text=None) -> str:
        """Answer ``prompt`` with this job's model loaded from one of its checkpoints, with its own
        config, tokenizer and prompt template (``recipes/generate_text.py``; docs/generation.md).

        The first call for a checkpoint starts a process where the job ran (this machine, or a
        one-task job of its cluster scheduler) that keeps the model loaded; later calls of this
        Python process reuse it. It ends after 300 s without a prompt, at exit, or on
        :meth:`close_generation`; one that ended is started again. Nothing is written outside the
        job's registry directory (``<job dir>/generate/``); this process never imports torch.

        Args:
            prompt: the user message (``str``), formatted as in training.
            checkpoint: ``"last"`` (the newest complete), ``"best"`` (lowest validation loss),
                ``"epoch_N"``, ``"base"`` (the untrained input model), or the path of an
                ``epoch_N/`` folder.
            max_new_tokens: at most this many new tokens (>= 1).
            temperature: 0.0 is greedy (exactly the most likely token every step); > 0 samples.
            top_k: sample among the k most likely tokens (>= 1), or ``None``.
            seed: seeds the sampling (>= 0): the same request gives the same text.
            on_text: ``Callable[[str], None]`` called with each new piece of text as it arrives, in
                this thread (the pieces are for display: the returned text is the answer).

        Returns:
            The generated text (``str``), without the end-of-sequence token.

        Raises:
            PlanError: a bad prompt or option (nothing started).
            CheckpointError: an unknown, pruned or incomplete checkpoint, none yet, or no validation
                loss for ``"best"`` (nothing started).
            GenerationError: the recipe refused it (e.g. a prompt longer than the tokenizer's
                ``max_seq_len``: its own paragraph), or its process ended without answering.
        """
        from tune_magic.job.generators import generate

        return generate(self, prompt, checkpoint=checkpoint, max_new_tokens=max_new_tokens, temperature=temperature,
                        top_k=top_k, seed=seed, on_text=on_text)

    def close_generation(self) -> int:
        """End this job's kept-alive generation processes (see :meth:`generate`); return how many ran."""
        from tune_magic.job.generators import close_generators

        return close_generators(self.id)

    def lineage(self) -> list["Job"]:
        """This job and the jobs it resumed, oldest first: the chain of ``resumed_from`` back to the
        first run (a job removed with ``rm`` ends it; see :mod:`tune_magic.checkpoints.lineage`)."""
        from tune_magic.checkpoints.lineage import ancestors

        return [Job(jobstore.job_dir(r.id, self.dir.parent), r) for r in ancestors(self.refresh()._record,
                                                                                   self.dir.parent)] + [self]

    def lineage_metrics(self) -> list[dict]:
        """The metrics of :meth:`lineage` as one run: dicts as :meth:`metrics` returns, plus ``job``
        (the id of the job that logged the point). Each job's points stop at the global step where
        the next job resumed (the steps it redid replace them); a resumed run that numbered its
        steps from 1 again has them shifted to continue (:func:`tune_magic.checkpoints.lineage.lineage_points`)."""
        from tune_magic.checkpoints.lineage import lineage_points

        chain = self.lineage()
        points = [j.metric_points() for j in chain]
        return [{**p._asdict(), "job": job_id} for job_id, p in lineage_points([j.record for j in chain], points)]

    def tail(self, n: int = 20) -> list[str]:
        """Return the last ``n`` lines of the job's log (a progress bar's redraws collapsed to the
        latest one, as a terminal would show it)."""
        from tune_magic.logs.endevidence import read_tail

        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"n={n!r}: give a number of lines")
        text = read_tail(self.log_path, min(max(64 * 1024, 512 * n), 64 << 20))
        lines = [line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r")
                 for line in text.split("\n")]
        if lines and lines[-1] == "":
            lines.pop()
        return lines[-n:] if n > 0 else []


def wait_deadline(timeout: float | None) -> float | None:
    """The monotonic deadline of a wait of ``timeout`` seconds (``None``: no deadline).

    Raises:
        ValueError: ``timeout`` is not a number of seconds >= 0 (nor ``None``).
    """
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 <= timeout < math.inf):
        raise ValueError(f"timeout={timeout!r}: give seconds (a number >= 0) or None to wait for ever")
    return None if timeout is None else time.monotonic() + timeout


def _read(d: Path) -> JobRecord:
    """The record in ``d``, with its scheduler's fields of earlier releases moved into place.

    Raises:
        CorruptRecord: see :func:`tune_magic.registry.store.read`.
    """
    record = jobstore.read(d)
    schedulers.get_or_missing(record.scheduler).migrate(record)
    return record


def _damaged_record(d: Path, last: JobRecord | None = None) -> JobRecord:
    """A stand-in record for a job whose record.json cannot be read: what procs.json knows."""
    if last is not None:
        return last
    side = jobstore.read_procs(d)
    try:
        started = os.lstat(d).st_mtime
    except OSError:
        started = time.time()
    return JobRecord(id=d.name, name="(damaged record)", argv=["?"], env={}, cwd="/",
                     log_path=str(d / jobstore.OUTPUT_LOG), started_at=started,
                     supervisor=side.get("supervisor"), agent=side.get("agent"), workers=side.get("workers", []),
                     status=Status.RUNNING.value, scheduler=side.get("scheduler", "local"))


# ---------------------------------------------------------------------------------------------


def jobs(skipped: list | None = None) -> list[Job]:
    """Return every job in the registry (live and finished), oldest first. Never writes except to
    record what it learns (best effort); works on a read-only registry. Starts no process (a dead
    sweep's process is started again by :func:`tune_magic.sweeping.sweep.revive_sweeps`).

    Args:
        skipped: when given, damaged records are appended to it (:class:`tune_magic.registry.store.Skipped`:
            path and a one-line reason) instead of being reported with :func:`warnings.warn`.
    """
    root = jobstore.jobs_root(create=False)
    jobstore.collect_staging(root)
    _warn_if_open(root)
    stamps: dict[str, tuple] = {}
    records, bad = jobstore.list_records_checked(root, stamps)
    from tune_magic.checkpoints.lineage import link_resumes

    link_resumes(records, root)  # a resume killed before it linked the job it resumed
    if skipped is not None:
        skipped.extend(bad)
    else:
        for s in bad:
            warnings.warn(f"skipped job directory {s.path}: {s.reason}", RuntimeWarning, stacklevel=2)
    return [_listed_job(root, r, stamps) for r in records]


_WARNED: set[str] = set()


def _warn_if_open(root: Path) -> None:
    """Warn once per process and registry when others may write into it (records could be planted)."""
    message = owner.open_to_others(root)
    if message and str(root) not in _WARNED:
        _WARNED.add(str(root))
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _listed_job(root: Path, record: JobRecord, stamps: Mapping[str, tuple]) -> Job:
    """A refreshed Job for a record a listing just read: the record is not read a second time
    unless it changed since (the listing's stamp was taken before its read)."""
    job = Job(jobstore.job_dir(record.id, root), record)
    job._stamp = stamps.get(record.id)
    return job.refresh()


def damaged_live_jobs() -> list[Job]:
    """Jobs whose record cannot be read but whose processes still run (``stop --all`` stops them)."""
    root = jobstore.jobs_root(create=False)
    _, bad = jobstore.list_records_checked(root)
    out = []
    for s in bad:
        try:
            jobstore.check_job_dir(s.path)
        except (OSError, StateDirError):
            continue
        job = Job(s.path)
        if job.damaged and job._sched().has_live_parts(job.dir, None):
            out.append(job)
    return out


def _not_found(d: Path, job_id: str) -> None:
    """Why there is no job directory ``d``: another user's registry we may not read, or no such job.

    Raises:
        StateDirError: permission denied (said plainly, with whose registry it is).
        JobNotFound: no such job.
    """
    denied = owner.permission_denied(d)
    if denied is not None:
        raise StateDirError(f"permission denied: {d.parent} belongs to another user, and you may not read it, so "
                            f"job {job_id!r} cannot be looked at from here ({denied.strerror}); point TUNE_MAGIC_HOME "
                            "at your own registry, or ask its owner")
    raise JobNotFound(f"no job {job_id!r}; tune-magic jobs lists the jobs")


def _job_at(job_id: str) -> Job:
    """The job in ``job_id``'s directory (``job_id``: an id, or a name only one job has; see
    :func:`resolve_job_id`), as it reads (damaged or not).

    Raises:
        PlanError: the id is malformed. JobNotFound: no such directory (AmbiguousJobName: a name
        several jobs have). StateDirError: a link.
    """
    if not isinstance(job_id, str):
        check_job_id(job_id)  # raises: only text names a job
    job_id = resolve_job_id(job_id)
    check_job_id(job_id)
    d = jobstore.job_dir(job_id)
    if not os.path.lexists(d):
        _not_found(d, job_id)
    jobstore.check_job_dir(d)
    return Job(d)


def get_job(job_id: str) -> Job:
    """Return the job with this id, or with this name when only one job has it (an id always
    wins); also one whose record is damaged but whose processes live.

    Raises:
        PlanError: the id is malformed (``/``, ``..``).
        JobNotFound: no such job; :class:`~tune_magic.errors.AmbiguousJobName` (a subclass) when
            several jobs have that name: its message lists their ids.
        StateDirError: its directory is a symbolic link.
    """
    job = _job_at(job_id)
    d = job.dir
    job_id = d.name
    if job.damaged and not job._sched().has_live_parts(d, None):
        raise JobNotFound(f"job {job_id!r} has a damaged record and nothing of it runs; tune-magic rm {job_id} "
                          "removes it")
    return job.refresh()


def remove(job_id: str) -> None:
    """Delete a finished job's record and log (its output_dir is kept); ``job_id`` may be a name
    only one job has (see :func:`get_job`).

    Raises:
        PlanError: the job is pending or running, or a process of it still lives (stop it first).
        JobNotFound: no such job.
        StateDirError: its directory is a symbolic link (the link is never followed).
    """
    job = _job_at(job_id)
    d = job.dir
    job_id = d.name
    if not job.damaged:
        job.refresh()
    if (not job.damaged and job.record.state.is_live) or job._sched().has_live_parts(d, None if job.damaged else job.record):
        raise PlanError(f"job {job_id} is {'running' if job.damaged else job.record.status} (a process of it still "
                        f"lives); stop it first (tune-magic stop {job_id})")
    jobstore.remove_tree(d)
