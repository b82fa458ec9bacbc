"""The sweep process: ``python -m tune_magic.sweeping.runner SWEEP_DIR [--lock-fd N]``.

The queue of a sweep lives here, outside the kernel: this small process starts each queued trial
through :func:`tune_magic.launch` (its own job: output_dir, log, record, rendezvous port, card) as
soon as a slot frees up, and exits once nothing is queued and no trial runs. It runs in a session
of its own, so the kernel's interrupts, restarts and death never reach it, and it holds the
sweep's process lock (``supervisor.lock``) for its whole life: inherited from the creator, or taken
without waiting when a listing starts it again (:mod:`tune_magic.sweeping.start`); a second one
finds the lock taken and exits.

No trial is lost or run twice: a trial's job is registered under the sweep's record lock
(``sweep.lock``), after checking that the trial is still queued and that the sweep was not stopped,
and handed to its scheduler outside the lock, in a thread of its own (trials whose slots free at
once start side by side); its job's record names the sweep and the trial (``JobRecord.sweep``)
from the moment it is registered, so a process killed between registering the job and writing the
sweep record is caught up by the next one (:meth:`Runner.adopt`), which never starts that trial again.

A trial whose slot's GPUs another live job holds (the launch's clash check, whoever launched that
job) stays queued, saying why, and is tried again; one that cannot be started (its plan is
refused) is ``not_started`` with the reason; a trial that fails does not stop the others.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from tune_magic.errors import JobStartError, StateDirError, UserError
from tune_magic.job import Job
from tune_magic.job.launch import register_trial
from tune_magic.logs.notify import get_notifier
from tune_magic.registry import store as jobstore
from tune_magic.sweeping import store as sweepstore
from tune_magic.registry.files import open_nofollow
from tune_magic.registry.outcome import LAUNCH_INTERRUPTED
from tune_magic.sweeping.record import NOT_STARTED, QUEUED, STARTED, SweepRecord
from tune_magic.gpus import GpuError
from tune_magic.sweeping.start import no_room

#: Longest wait between two looks at the trials, in seconds (a job's end normally wakes it at once).
POLL_S = 1.0
#: Seconds before a trial whose GPUs another job holds is tried again.
BUSY_RETRY_S = 2.0


def _log(message: str) -> None:
    try:
        print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)
    except OSError:  # runner.log on a full disk: the queue goes on without its line
        pass


class Runner:
    """The queue of one sweep (see the module docstring). ``run()`` returns once the sweep is done
    or stopped."""

    def __init__(self, sweep_dir: Path):
        self.dir = sweep_dir
        self.env = sweepstore.read_env(sweep_dir) or dict(os.environ)
        self.wake = threading.Event()
        self.jobs: dict[int, Job] = {}  # trial index -> its job
        self.ended: set[int] = set()  # trials whose jobs were seen ended (never live again)
        self.submitting: list[threading.Thread] = []  # trials being handed to their scheduler
        self.said: dict[int, str] = {}  # trial index -> why it waits, as last logged

    def run(self) -> int:
        """Start trials as slots free up until none is queued and none runs, or the sweep is stopped."""
        self.adopt()
        sub = get_notifier().subscribe(self.wake.set)
        try:
            while True:
                self.wake.clear()
                record = sweepstore.read_repaired(self.dir)
                if record.stop_requested_at is not None:
                    _log("the sweep was stopped: no queued trial will start")
                    return 0
                # a job's record replaced (its end) or the sweep's (a stop) wakes this at once;
                # watched before the look, so an end between the look and the wait still wakes it
                sub.watch(files=[self.dir / sweepstore.SWEEP_FILE]
                          + [job.dir / jobstore.RECORD for i, job in self.jobs.items() if i not in self.ended])
                live = self.live_slots(record)
                queued = [t.index for t in record.trials if t.status == QUEUED]
                if not queued and not live:
                    self.finish()
                    return 0
                started, blocked = self.fill(record, live, queued) if queued else (False, False)
                if started:
                    continue  # look again at once: count the new trials' slots, watch their records
                self.wake.wait(BUSY_RETRY_S if blocked else POLL_S)
        finally:
            sub.close()
            for thread in self.submitting:  # a registered trial is handed on before this process exits
                thread.join()

    # -- the trials' jobs -------------------------------------------------------------------------
    def trial_jobs(self) -> dict[int, Job]:
        """Every job the registry holds for this sweep, by trial index (the newest one per trial)."""
        sweep_id = self.dir.name
        found: dict[int, Job] = {}
        for record in jobstore.list_records():
            hit = sweepstore.trial_of(record.sweep)
            if hit is not None and hit[0] == sweep_id:
                found[hit[1]] = Job(jobstore.job_dir(record.id), record)
        return found

    def adopt(self) -> None:
        """Catch the sweep record up with the registry: a trial whose job was registered by a
        sweep process that died before writing it down is started, never started again."""
        registered = self.trial_jobs()
        with sweepstore.locked(self.dir) as record:
            for trial in record.trials:
                job = registered.get(trial.index)
                if trial.status == QUEUED and job is not None and job.id != trial.interrupted_job:
                    trial.status, trial.job_id, trial.started_at = STARTED, job.id, job.started_at
                    slot = (job.record.sweep or {}).get("slot")
                    trial.slot = slot if isinstance(slot, int) else None
                    _log(f"trial {trial.index} ({trial.name}): found its job {job.id}, registered before this "
                         "process started")
        for trial in record.trials:
            if trial.status == STARTED and trial.index in registered:
                self.jobs[trial.index] = registered[trial.index]

    def job(self, index: int, job_id: str) -> Job | None:
        """The job of trial ``index`` (``None`` when its directory is gone: ``tune-magic rm``)."""
        job = self.jobs.get(index)
        if job is None or job.id != job_id:
            d = jobstore.job_dir(job_id)
            if not d.is_dir():
                return None
            job = self.jobs[index] = Job(d)
        return job

    def live_slots(self, record: SweepRecord) -> dict[int, int]:
        """``{slot: trial index}`` of the started trials whose jobs are pending or running."""
        live: dict[int, int] = {}
        for trial in record.trials:
            if trial.status != STARTED or trial.job_id is None:
                continue
            if trial.index in self.ended:
                continue
            job = self.job(trial.index, trial.job_id)
            if job is None or job.damaged or not job.refresh().record.state.is_live:
                if job is not None and job.record.error == LAUNCH_INTERRUPTED and trial.interrupted_job is None:
                    self.queue_again(trial.index, job.id)
                elif job is None or job.record.state.is_terminal:
                    self.ended.add(trial.index)
                continue
            slot = trial.slot if trial.slot is not None and trial.slot not in live else next(
                (s for s in range(len(record.slots)) if s not in live), len(record.slots) + trial.index)
            live[slot] = trial.index
        return live

    def queue_again(self, index: int, job_id: str) -> None:
        """Queue trial ``index`` again, once, after its job ``job_id`` never ran: the process that
        launched it died between its registration and its start (no trial is lost to that)."""
        with sweepstore.locked(self.dir) as record:
            trial = record.trials[index]
            if trial.status != STARTED or trial.job_id != job_id or trial.interrupted_job is not None:
                return
            trial.status, trial.job_id, trial.slot, trial.started_at = QUEUED, None, None, None
            trial.interrupted_job = job_id
        self.jobs.pop(index, None)
        self.wake.set()
        _log(f"trial {index} ({trial.name}): its job {job_id} never ran (its launch was interrupted); queued again")

    # -- starting ---------------------------------------------------------------------------------
    def fill(self, record: SweepRecord, live: dict[int, int], queued: list[int]) -> tuple[bool, bool]:
        """Start queued trials on the free slots, in trial order; return (whether one started,
        whether a trial waits because another job holds a GPU of its slot)."""
        started = blocked = False
        for slot in range(len(record.slots)):
            if not queued:
                break
            if slot in live:
                continue
            outcome = self.start(queued[0], slot)
            if outcome == "stopped":
                return started, False
            if outcome == "busy":
                blocked = True
                continue  # the same trial tries the next free slot
            started = started or outcome == "started"
            queued.pop(0)
        return started, blocked

    def start(self, index: int, slot: int) -> str:
        """Register trial ``index`` in ``slot`` under the sweep's lock, then submit it in a thread of
        its own (outside the lock: trials freed at once start side by side). Returns ``"started"``,
        ``"busy"`` (a GPU of the slot is held by another live job), ``"failed"`` (it could not be
        started: marked ``not_started``), ``"stopped"`` (the sweep was stopped) or ``"skipped"``
        (not queued any more)."""
        with sweepstore.holding(self.dir):
            record = sweepstore.read(self.dir)
            if record.stop_requested_at is not None:
                return "stopped"
            trial = record.trials[index]
            if trial.status != QUEUED:
                return "skipped"
            gpus = record.slots[slot]
            try:
                registered = register_trial(
                    record.trial_args(index), name=trial.name, gpus=list(gpus) if gpus else None, cwd=record.cwd,
                    force=record.force, env=self.env, config_overlay=record.config_overlay,
                    scheduler=record.scheduler, sweep_trial={"id": record.id, "trial": index, "name": record.name,
                                                             "slot": slot},
                    keep_checkpoints=record.keep_checkpoints, **record.scheduler_options)
            except (GpuError, StateDirError) as exc:  # a GPU another job holds; a full registry disk
                self._wait(record, index, str(exc) if isinstance(exc, GpuError) else
                           (no_room(self.dir) or " ".join(str(exc).split())))
                return "busy"
            except UserError as exc:
                return self._not_started(record, index, str(exc))
            except Exception as exc:  # noqa: BLE001 - a bug must not stop the other trials
                traceback.print_exc()
                return self._not_started(record, index, f"{type(exc).__name__}: {exc}")
            trial.status, trial.job_id, trial.slot = STARTED, registered.record.id, slot
            trial.started_at, trial.waiting = registered.record.started_at, None
            sweepstore.write(self.dir, record)
        # from here the job is listed (running, its lock held by this process until its supervisor
        # takes it), so a stop of the sweep finds it and waits for its processes to stop them
        self.jobs[index] = Job(registered.dir)
        thread = threading.Thread(target=self._submit, args=(index, trial.name, registered),
                                  name=f"tune_magic-sweep-submit-{index}", daemon=True)
        self.submitting = [t for t in self.submitting if t.is_alive()] + [thread]
        thread.start()
        _log(f"trial {index} ({trial.name}) started as job {registered.record.id} in slot {slot}"
             + (f" on GPUs {','.join(map(str, gpus))}" if gpus else ""))
        return "started"

    def _submit(self, index: int, name: str, registered) -> None:
        """Hand a registered trial to its scheduler (its own thread). A start failure is the job's
        (its record says why; its slot frees); an engine's refusal removes the job: not started."""
        try:
            registered.submit()
        except JobStartError as exc:
            _log(f"trial {index} ({name}): {exc}")
        except UserError as exc:
            with sweepstore.holding(self.dir):
                self._not_started(sweepstore.read(self.dir), index, str(exc))
        except Exception:  # noqa: BLE001 - a bug must not stop the other trials
            traceback.print_exc()
        self.wake.set()

    def _wait(self, record: SweepRecord, index: int, why: str) -> None:
        """Trial ``index`` waits (queued) for ``why``; said once, in its record when there is room."""
        trial = record.trials[index]
        if trial.waiting != why:
            trial.waiting = why
            try:
                sweepstore.write(self.dir, record)
            except OSError:  # the disk it waits for: the listing says it from statvfs meanwhile
                pass
        if self.said.get(index) != why:  # once, even when the record could not keep it
            self.said[index] = why
            _log(f"trial {index} ({trial.name}) waits: {why}")

    def _not_started(self, record: SweepRecord, index: int, why: str) -> str:
        trial = record.trials[index]
        trial.status, trial.error, trial.waiting = NOT_STARTED, why, None
        sweepstore.write(self.dir, record)
        _log(f"trial {index} ({trial.name}) could not be started: {why}")
        return "failed"

    def finish(self) -> None:
        """Record that nothing is queued and nothing runs."""
        with sweepstore.locked(self.dir) as record:
            record.done_at = record.done_at or time.time()
        sweepstore.mark_done(self.dir)
        _log("every trial has ended")


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring). ``--lock-fd N``: the sweep's process lock, held and
    handed on by the creator; without it the lock is taken here, and if another process holds it
    this one exits at once (status 0)."""
    argv = sys.argv[1:] if argv is None else argv
    sweep_dir = Path(argv[0])
    lock_fd = int(argv[argv.index("--lock-fd") + 1]) if "--lock-fd" in argv else None
    for sig in (signal.SIGINT, signal.SIGHUP):  # a terminal's or a kernel's interrupt is not for this process
        signal.signal(sig, signal.SIG_IGN)
    if lock_fd is None:
        lock_fd = open_nofollow(sweep_dir / sweepstore.RUNNER_LOCK, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log("another sweep process runs this sweep; exiting")
            return 0
    _log(f"sweep process {os.getpid()} for {sweep_dir.name}")
    runner = Runner(sweep_dir)
    signal.signal(signal.SIGUSR1, lambda *_: runner.wake.set())  # a stop: look at the record now
    try:
        return runner.run()
    except jobstore.CorruptRecord as exc:  # neither the record nor its backup: no queue is known
        _log(f"the sweep record cannot be read or rebuilt ({exc}); no further trial starts. The trials' jobs "
             "are listed and stopped as any job (tune-magic jobs, tune-magic stop JOB)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
