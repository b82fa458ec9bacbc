"""A sweep as the user holds it: :class:`Sweep` (its trials, jobs, wait, stop, best trial, frame),
and the listings :func:`sweeps` and :func:`get_sweep`. Knows nothing of IPython.

A :class:`Sweep` reads its record (``$TUNE_MAGIC_HOME/sweeps/<id>/sweep.json``) and its trials'
jobs (normal :class:`~tune_magic.job.Job` objects). Reading a sweep or listing sweeps has no side
effects; starting the sweep process again when the sweep has queued trials and none runs is a step
of its own (:meth:`Sweep.revive`, :func:`revive_sweeps`), taken by what waits for a sweep to go on:
:meth:`Sweep.wait`, a sweep card, the jobs table and the CLI's ``jobs`` and ``sweeps``.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tune_magic import schedulers
from tune_magic.errors import JobNotFound, PlanError
from tune_magic.job import Job, wait_deadline
from tune_magic.logs.notify import get_notifier
from tune_magic.registry import store as jobstore
from tune_magic.sweeping import store as sweepstore
from tune_magic.registry.files import check_job_dir
from tune_magic.job.stopping import stop_jobs
from tune_magic.sweeping.record import NOT_STARTED, QUEUED, STARTED, SweepRecord
from tune_magic.sweeping import start

#: Seconds between two looks for a dead sweep process by the same :class:`Sweep`.
REVIVE_CHECK_S = 1.0
#: How a trial reads in tables when it is queued, when it could not be started, and when its
#: sweep was stopped before it started.
QUEUED_LABEL, NOT_STARTED_LABEL, CANCELLED_LABEL = "queued", "not started", "cancelled"


@dataclass(frozen=True)
class Trial:
    """One trial as it stands.

    Attributes:
        index: 0-based, in trial order.
        name: its label (``lr=3e-4,lora_rank=8``), also its job's name.
        values: ``{axis key: value}`` as the recipe reads each item (``1e-4`` -> ``0.0001``).
        texts: ``{axis key: item as typed}``.
        status: its job's status once started (``running``, ``succeeded``, ...); before that
            ``queued``, or ``cancelled`` when the sweep was stopped first; ``not started`` when it
            could not be started.
        job: its :class:`~tune_magic.job.Job` once started, else ``None``.
        error: why it could not be started, or its job's failure reason, else ``None``.
        waiting: why a queued trial waits (a GPU of its slot another job holds), else ``None``.
    """

    index: int
    name: str
    values: dict[str, Any]
    texts: dict[str, str]
    status: str
    job: Job | None
    error: str | None = None
    waiting: str | None = None

    @property
    def is_live(self) -> bool:
        """Queued (and not cancelled), pending or running."""
        return self.status in (QUEUED_LABEL, "pending", "running")


class Sweep:
    """A sweep: a grid of trials, each a normal job, at most ``max_parallel`` at a time.

    ``trials`` (:class:`Trial` rows), ``jobs`` (the started trials' jobs), :meth:`wait`,
    :meth:`stop`, :meth:`best` (the trial with the lowest validation loss when the trials validate,
    else the lowest final loss: :meth:`ranking`), :meth:`frame` (a pandas DataFrame, one row per
    trial). Attributes are read from the record; every call re-reads what changed.
    """

    def __init__(self, directory: Path, record: SweepRecord | None = None):
        self.dir = Path(directory)
        self._record = record if record is not None else sweepstore.read(self.dir)
        self._stamp: tuple | None = None
        self._jobs: dict[str, Job] = {}
        self._values: dict[tuple[str, str], Any] = {}
        self._revived_at = 0.0

    id = property(lambda self: self._record.id, doc="The sweep id (``sweep-...``).")
    name = property(lambda self: self._record.name, doc="The sweep's name.")

    def refresh(self) -> "Sweep":
        """Re-read the record if it changed (no side effects: see :meth:`revive`)."""
        stamp = _stamp(self.dir)
        if stamp is None or stamp != self._stamp:
            try:
                self._record = sweepstore.read(self.dir)
            except jobstore.CorruptRecord:
                pass  # replaced at this moment or damaged: keep the last good one
            self._stamp = stamp
        return self

    def revive(self) -> bool:
        """Start the sweep process again if it died (SIGKILL, a reboot) with trials queued; never a
        second one (:func:`tune_magic.sweeping.start.revive`). Looks at most every
        :data:`REVIVE_CHECK_S` seconds per :class:`Sweep` object.

        Returns:
            Whether a process was started.
        """
        now = time.monotonic()
        if now - self._revived_at < REVIVE_CHECK_S or not start.needs_runner(self.refresh()._record):
            return False
        self._revived_at = now
        return start.revive(self.dir, self._record)

    @property
    def record(self) -> SweepRecord:
        """The record as last read (see :meth:`refresh`)."""
        return self._record

    @property
    def keys(self) -> list[str]:
        """The axis keys, in trial order."""
        return self._record.keys

    @property
    def max_parallel(self) -> int:
        """How many trials run at once."""
        return self._record.max_parallel

    def job_of(self, job_id: str) -> Job | None:
        """The (refreshed) job ``job_id`` of a trial, or ``None`` when its directory is gone."""
        job = self._jobs.get(job_id)
        if job is None:
            d = jobstore.job_dir(job_id)
            if not d.is_dir():
                return None
            job = self._jobs[job_id] = Job(d)
        return job.refresh()

    def _value(self, key: str, text: str) -> Any:
        from tune_magic.config.overrides import recipe_value

        if (key, text) not in self._values:
            try:
                self._values[(key, text)] = recipe_value(key, text)
            except Exception:  # noqa: BLE001 - a hand-edited record: show the text
                self._values[(key, text)] = text
        return self._values[(key, text)]

    @property
    def note(self) -> str | None:
        """What the sweep's status does not say, read without writing: why its queued trials cannot
        start now (the registry's disk is full: :func:`tune_magic.sweeping.start.no_room`), or
        that a stop asked of it did not take (its engine did not answer, and its trials ran to
        their own ends); ``None`` otherwise."""
        rec = self.refresh()._record
        if rec.stop_requested_at is not None:
            statuses = [t.status for t in self.trials]
            if sweep_status(statuses, rec.stop_requested_at) == "finished" and _stopped_before_end(self, rec):
                return (f"the stop asked at {time.strftime('%H:%M', time.localtime(rec.stop_requested_at))} did "
                        "not take: the trials ran to their own ends")
            return None
        if not start.needs_runner(rec):
            return None
        return start.no_room(self.dir)

    @property
    def trials(self) -> list[Trial]:
        """Every trial, in order, with its current status."""
        rec = self.refresh()._record
        room = start.no_room(self.dir) if start.needs_runner(rec) else None
        out = []
        for t in rec.trials:
            texts = dict(w.split("=", 1) for w in t.words)
            values = {k: self._value(k, v) for k, v in texts.items()}
            job = self.job_of(t.job_id) if t.status == STARTED and t.job_id else None
            error, waiting = t.error, t.waiting
            if t.status == QUEUED:
                status = CANCELLED_LABEL if rec.stop_requested_at is not None else QUEUED_LABEL
                waiting = waiting or room
            elif t.status == NOT_STARTED:
                status = NOT_STARTED_LABEL
            elif job is None:
                status, error = "unknown", f"its job {t.job_id} was removed"
            else:
                status = job.record.state.label
                error = job.record.error if job.record.status == "failed" else None
                waiting = None
            out.append(Trial(index=t.index, name=t.name, values=values, texts=texts, status=status, job=job,
                             error=error, waiting=waiting))
        return out

    @property
    def jobs(self) -> list[Job]:
        """The jobs of the trials started so far, in trial order."""
        return [t.job for t in self.trials if t.job is not None]

    def counts(self) -> dict[str, int]:
        """``{status: trials}`` over every trial (statuses as :attr:`Trial.status`)."""
        out: dict[str, int] = {}
        for t in self.trials:
            out[t.status] = out.get(t.status, 0) + 1
        return out

    @property
    def status(self) -> str:
        """``running`` while a trial is queued, pending or running; then ``stopped`` if a stop of
        the sweep took (see :func:`sweep_status`), else ``finished``."""
        return sweep_status([t.status for t in self.trials], self._record.stop_requested_at)

    def wait(self, timeout: float | None = None, poll_s: float = 0.5,
             evaluations: bool | None = None) -> dict[str, int]:
        """Block until no trial is queued, pending or running, and (``evaluations``) every
        evaluation of the trials' checkpoints has ended, so :meth:`best` gives the final ranking;
        return :meth:`counts`.

        Args:
            timeout: seconds to wait in all, or ``None``.
            poll_s: seconds between looks.
            evaluations: wait for the evaluations of the trials' checkpoints too
                (:meth:`tune_magic.job.Job.wait_evaluations`; trials that validate in their loop
                have nothing to wait for). Default (``None``): yes, when the trials validate.

        Raises:
            TimeoutError: a trial, or an evaluation, still to finish after ``timeout`` seconds.
            ValueError: ``timeout`` is not a number of seconds >= 0.
        """
        deadline = wait_deadline(timeout)
        counts = self._wait_trials(deadline, timeout, poll_s)
        if evaluations is not False:
            for job in self.jobs:
                if job.record.validation:
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    try:
                        job.wait_evaluations(left, poll_s=min(poll_s, 0.2))
                    except TimeoutError as exc:
                        raise TimeoutError(f"sweep {self.id} after {timeout} s: {exc}") from None
        return counts

    def _wait_trials(self, deadline: float | None, timeout: float | None, poll_s: float) -> dict[str, int]:
        """:meth:`wait`'s wait for the trials' jobs."""
        woke = threading.Event()
        sub = get_notifier().subscribe(woke.set)
        try:
            while True:
                woke.clear()
                self.revive()  # waiting for a sweep whose process died would otherwise never end
                trials = self.trials
                if not any(t.is_live for t in trials):
                    return self.counts()
                # a trial's record replaced (its end), the sweep's (a new start) wake this at once
                sub.watch(files=[self.dir / sweepstore.SWEEP_FILE]
                          + [t.job.dir / jobstore.RECORD for t in trials if t.job is not None and t.is_live])
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    raise TimeoutError(f"sweep {self.id} still running after {timeout} s: {self.counts()}")
                woke.wait(poll_s if deadline is None else min(poll_s, deadline - now + 0.001))
        finally:
            sub.close()

    def stop(self, grace_s: float = 10.0) -> dict[str, int]:
        """Stop the sweep: queued trials never start, and every trial's job still pending or
        running is stopped (SIGTERM, then SIGKILL after ``grace_s`` seconds), side by side.

        Returns:
            :meth:`counts` afterwards.

        Raises:
            ValueError: ``grace_s`` is not a number of seconds >= 0.
        """
        if isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or not 0 <= grace_s < math.inf:
            raise ValueError(f"grace_s={grace_s!r}: give the seconds between SIGTERM and SIGKILL, a number >= 0")
        # under the sweep's lock: the sweep process starts a trial only holding it, after looking at
        # this flag, so once it is set no trial starts and every started one is in the registry
        with sweepstore.locked(self.dir) as record:
            record.stop_requested_at = record.stop_requested_at or time.time()
        self._record, self._stamp = record, None
        engine = schedulers.get_or_missing(record.scheduler).sweep_engine
        if engine is not None:
            engine.cancel_sweep(self.dir, record, float(grace_s))
        ids = {t.job_id for t in record.trials if t.job_id}
        for r in jobstore.list_records():  # a job registered by a sweep process killed before it wrote it down
            hit = sweepstore.trial_of(r.sweep)
            if hit is not None and hit[0] == self.id:
                ids.add(r.id)
        live = [job for job in (self.job_of(i) for i in sorted(ids)) if job is not None and job.status.is_live]
        # together, as stop --all does (a stop that fails leaves that trial to the engine's own end)
        stop_jobs(live, float(grace_s), errors=[])
        sweepstore.mark_done(self.dir)
        return self.counts()

    def best(self):
        """The best trial so far (:class:`tune_magic.sweeping.results.TrialResult`: the trial, its
        steps, final and minimum loss, best validation loss, and ``ranked_by``: the measure it won
        by, ``val_loss`` or ``final_loss``), or ``None`` before any trial has a finite value.

        The measure (:meth:`ranking`): among the trials that succeeded while any has, else among
        all, the lowest best validation loss when every one has a validation loss and none of
        their evaluations is still to finish, else the lowest final loss (ties broken by the lowest
        minimum loss).
        """
        return self.ranking().best

    def ranking(self):
        """The ranking of the trials (:class:`tune_magic.sweeping.results.Ranking`: ``best``,
        ``measure``, ``label`` such as ``"best by val_loss"``, and ``note``, e.g. ``"ranking by
        final loss until 2 evaluations finish"``), the one every view shows
        (:func:`tune_magic.sweeping.results.rank`)."""
        from tune_magic.sweeping.results import rank

        return rank(self.results())

    def results(self) -> list:
        """Every trial with its steps, final and minimum loss read from its logs, and its best
        validation loss (:class:`tune_magic.sweeping.results.TrialResult`, in trial order)."""
        from tune_magic.sweeping.results import results

        return results(self.trials)

    def frame(self):
        """A pandas DataFrame, one row per trial (index ``trial``): ``name``, a column per axis
        (its key; values as the recipe reads them), ``status``, ``job_id``, ``steps`` (the last
        step with a loss), ``final_loss``, ``min_loss``, ``best_val_loss`` (the trial's lowest
        validation loss, NaN without one). Its ``attrs`` say how the best trial was chosen:
        ``best`` (its index), ``ranked_by`` (``val_loss`` or ``final_loss``), ``ranking``
        (``"best by val_loss"``), ``note`` (:meth:`ranking`).

        Raises:
            ImportError: pandas is not installed.
        """
        from tune_magic.sweeping.results import frame

        return frame(self.results(), self.keys)

    def metric_groups(self) -> list[tuple[dict, list]]:
        """Every started trial's metric points with its labels (``trial``, ``job_id``, each axis key
        with the item as typed): what ``tune-magic metrics SWEEP --csv`` prints, one row per point
        (:func:`tune_magic.sweeping.results.metric_groups`)."""
        from tune_magic.sweeping.results import metric_groups

        return metric_groups(self.trials, self.keys)

    def __repr__(self) -> str:
        r = self._record
        return f"<Sweep {r.id} {r.name!r}: {len(r.trials)} trials, {r.max_parallel} at a time>"


def _stamp(d: Path) -> tuple | None:
    import os

    try:
        st = os.stat(d / sweepstore.SWEEP_FILE, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def sweep_status(statuses: Sequence[str], stop_requested_at: float | None) -> str:
    """A sweep's status from its trials' (:attr:`Trial.status`): ``running`` while one is queued,
    pending or running; then ``stopped`` when a stop was asked and took (a trial ``stopped``, or
    queued trials ``cancelled``), else ``finished``: a stop its engine never took (the controller
    did not answer) leaves trials that ran to their own ends, and the sweep says that, not a stop."""
    if any(s in (QUEUED_LABEL, "pending", "running") for s in statuses):
        return "running"
    took = any(s in ("stopped", CANCELLED_LABEL) for s in statuses)
    return "stopped" if stop_requested_at is not None and took else "finished"


def _stopped_before_end(sweep: Sweep, record: SweepRecord) -> bool:
    """Whether the stop was asked while a trial still ran (not after the sweep had ended)."""
    ends = [t.job.ended_at for t in sweep.trials if t.job is not None and t.job.ended_at]
    return bool(ends) and max(ends) > (record.stop_requested_at or 0)


def sweeps(skipped: list | None = None) -> list[Sweep]:
    """Every sweep in the registry, oldest first; no side effects (:func:`revive_sweeps` is the
    step that starts dead sweep processes again). Damaged records are skipped (their paths
    appended to ``skipped`` when given)."""
    return [Sweep(sweepstore.sweep_dir(r.id), r) for r in sweepstore.list_records(skipped=skipped)]


def revive_sweeps() -> list[str]:
    """Start the sweep process again of every sweep whose process died with trials queued (never
    two for one sweep); return their ids. The step the CLI's ``jobs`` and ``sweeps``, the jobs
    table and sweep cards take before they show sweeps; listings themselves start nothing.
    Never raises for one bad sweep."""
    return start.revive_all()


def get_sweep(sweep: str) -> Sweep:
    """The sweep with this id, or the only one with this name.

    Raises:
        JobNotFound: no such sweep.
        PlanError: several sweeps have that name (the message lists their ids).
    """
    if not isinstance(sweep, str) or not sweep:
        raise PlanError(f"sweep={sweep!r}: give a sweep id or name (tune-magic sweeps lists them)")
    if sweepstore.is_sweep_id(sweep):
        d = sweepstore.sweep_dir(sweep)
        try:
            check_job_dir(d)
        except FileNotFoundError:
            raise JobNotFound(f"no sweep {sweep!r}; tune-magic sweeps lists the sweeps") from None
        try:
            return Sweep(d).refresh()
        except jobstore.CorruptRecord as exc:
            raise DamagedSweep(sweep, str(exc)) from None
    named = [r for r in sweepstore.list_records() if r.name == sweep]
    if not named:
        raise JobNotFound(f"no sweep with the id or name {sweep!r}; tune-magic sweeps lists the sweeps")
    if len(named) > 1:
        raise PlanError(f"{len(named)} sweeps are named {sweep!r} ({', '.join(r.id for r in named)}); give the id")
    return Sweep(sweepstore.sweep_dir(named[0].id), named[0]).refresh()


class DamagedSweep(JobNotFound):
    """A sweep whose record and its backup cannot be read (see
    :func:`tune_magic.sweeping.store.rebuild`): its queued trials are unknown, its started
    trials are jobs like any (:func:`trial_jobs_of`), and :func:`stop_damaged` stops them."""

    def __init__(self, sweep_id: str, why: str) -> None:
        super().__init__(f"sweep {sweep_id!r} has a damaged record ({why}); its queued trials are unknown. "
                         f"tune-magic stop {sweep_id} stops the trials it started, tune-magic jobs lists them")
        self.sweep_id = sweep_id


def trial_jobs_of(sweep_id: str) -> list[Job]:
    """Every job of the registry that names ``sweep_id`` as its sweep (``JobRecord.sweep``), oldest first."""
    return [Job(jobstore.job_dir(r.id), r) for r in jobstore.list_records()
            if (hit := sweepstore.trial_of(r.sweep)) is not None and hit[0] == sweep_id]


def stop_damaged(sweep_id: str, grace_s: float = 10.0) -> dict[str, int]:
    """Stop a sweep whose record cannot be read (:class:`DamagedSweep`): mark it done, so no
    listing starts its process again, and stop every live job of its trials, side by side.

    Returns:
        ``{status: jobs}`` of its trials' jobs afterwards.
    """
    sweepstore.mark_done(sweepstore.sweep_dir(sweep_id))
    jobs = trial_jobs_of(sweep_id)
    stop_jobs([j for j in jobs if j.status.is_live], float(grace_s), errors=[])
    counts: dict[str, int] = {}
    for job in jobs:
        status = str(job.refresh().status)
        counts[status] = counts.get(status, 0) + 1
    return counts


def stop_running_sweeps(grace_s: float = 10.0) -> list[tuple[str, dict[str, int]]]:
    """Stop every sweep that still has trials queued or running (``stop --all``: otherwise a sweep
    process would start the next trials as soon as the running ones are stopped).

    Returns:
        ``[(sweep id, counts afterwards)]``.
    """
    return [(s.id, s.stop(grace_s=grace_s)) for s in sweeps() if s.status == "running"]
