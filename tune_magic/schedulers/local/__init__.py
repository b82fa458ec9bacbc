"""The local scheduler: each job is a process tree on this machine, owned by a supervisor.

``submit`` starts :mod:`.supervisor` in a new session (so Jupyter's interrupt and restart never
reach the job); the supervisor starts the command through :mod:`.exitwrap` and records its end.
``describe`` settles a job whose supervisor is gone from the exit file the wrapper left, or calls
it ``unknown`` when nothing of it remains and no exit code exists. ``cancel`` signals every
process of the job, found by session (:mod:`.procs`).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import psutil

from tune_magic.errors import JobStartError
from tune_magic.logs import endevidence
from tune_magic.registry import outcome
from tune_magic.registry import owner as owners
from tune_magic.registry import store as jobstore
from tune_magic.registry.outcome import Evidence, decide
from tune_magic.registry.store import FAILED, RUNNING, JobRecord
from tune_magic.registry.status import Status
from tune_magic.schedulers.base import Scheduler, SchedulerOptions
from tune_magic.schedulers.local import procs

#: Seconds launch() waits for the supervisor to record the job's first process.
START_TIMEOUT_S = 30.0
#: Seconds stop() waits for the supervisor to record the end after the processes are gone.
RECORD_TIMEOUT_S = 10.0


class LocalScheduler(Scheduler):
    """Jobs as local process trees (see the module docstring)."""

    name = "local"
    initial_status = Status.RUNNING
    relaunches_from_checkpoint = True  # the supervisor does it (autoresume.py)
    runs_on_this_machine = True
    foreign_option_hint = ("for several nodes without a cluster scheduler run torchrun's --nnodes N "
                           "--rdzv-endpoint HOST:PORT on every node")

    # -- launching ----------------------------------------------------------------------------
    def prepare(self, plan, options: SchedulerOptions, env: Mapping[str, str], job_dir: Path) -> dict[str, Any]:
        return {}

    def nodes(self, record: JobRecord) -> list[str]:
        """This machine."""
        import socket

        return [socket.gethostname()]

    def submit(self, job_dir: Path, record: JobRecord, plan, options: SchedulerOptions, env: Mapping[str, str],
               lock_fd: int | None) -> None:
        argv = [sys.executable, "-m", "tune_magic.schedulers.local.supervisor", str(job_dir)]
        token = record.env.get(owners.TOKEN_ENV)
        if token is not None:  # the supervisor carries it too: a stop's signal to it is checked the same way
            env = {**env, owners.TOKEN_ENV: token}
        if lock_fd is not None:
            argv += ["--lock-fd", str(lock_fd)]
        # the supervisor writes to this pipe once the job's first process is in the record (and exiting
        # closes it), so the wait below sleeps until then instead of re-reading the record every few
        # milliseconds (half of what ten launches from threads at once cost their process went to it)
        ready, ready_w = os.pipe()
        argv += ["--ready-fd", str(ready_w)]
        try:
            try:
                fd = jobstore.open_nofollow(job_dir / jobstore.SUPERVISOR_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                try:
                    # start_new_session: Jupyter's interrupt/restart signal the kernel's process group, not this one
                    sup = subprocess.Popen(argv, cwd=record.cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=fd,
                                           stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                           pass_fds=(ready_w,) if lock_fd is None else (lock_fd, ready_w))
                finally:
                    os.close(fd)
            finally:
                os.close(ready_w)  # the supervisor holds the only write end now: its exit means EOF
            self._wait_started(job_dir, record, sup, ready)
        finally:
            os.close(ready)

    @staticmethod
    def _wait_started(job_dir: Path, record: JobRecord, sup: subprocess.Popen, ready: int) -> None:
        """Return once the record names the job's first process (or its end); raise JobStartError
        if the supervisor exits first or takes longer than :data:`START_TIMEOUT_S`."""
        deadline = time.monotonic() + START_TIMEOUT_S
        log = job_dir / jobstore.SUPERVISOR_LOG
        signalled = False
        while True:
            try:
                rec = jobstore.read(job_dir)
            except jobstore.CorruptRecord:
                rec = None
            if rec is not None and (rec.agent is not None or rec.state.is_terminal):
                if rec.agent is None and rec.status == FAILED:
                    raise JobStartError(f"job {record.id} did not start: {rec.error}; see {log}")
                return
            code = sup.poll()
            if code is not None:
                why = (rec.error if rec is not None and rec.error else None) or f"the supervisor exited with {code}"
                raise JobStartError(f"job {record.id} did not start: {why}; see {log}")
            if time.monotonic() > deadline:
                raise JobStartError(f"job {record.id} did not start within {START_TIMEOUT_S:.0f} s; see {log}")
            if signalled:  # written or closed: the record or the exit shows within moments
                time.sleep(0.005)
            else:  # a look every 0.1 s all the same, should a wake-up never come
                signalled = bool(select.select([ready], [], [], 0.1)[0])

    # -- following ----------------------------------------------------------------------------
    @staticmethod
    def _refs(job_dir: Path, record: JobRecord | None):
        """(supervisor, agent, workers) from the record and procs.json together; when both are
        damaged, from the job's supervisor process itself (found by its command line)."""
        if record is None:
            try:
                record = jobstore.read(job_dir)  # the supervisor may have repaired it meanwhile
            except jobstore.CorruptRecord:
                record = None
        side = jobstore.read_procs(job_dir)
        sup = side.get("supervisor") or (record.supervisor if record else None)
        agent = side.get("agent") or (record.agent if record else None)
        workers = {w.pid: w for w in side.get("workers", [])}
        for w in (record.workers if record else []):
            workers.setdefault(w.pid, w)
        if agent is None:
            sup, agent = procs.from_supervisor(job_dir) or (sup, agent)
        return sup, agent, list(workers.values())

    @staticmethod
    def _owner(job_dir: Path, record: JobRecord | None) -> procs.Owner:
        """Which processes are the job's (:mod:`tune_magic.registry.owner`): those carrying its token
        (from the record, else procs.json); a token of another job's matches nothing; a record
        without one (an earlier release) counts only when this user made the job's directory."""
        if record is None:
            try:
                record = jobstore.read(job_dir)
            except jobstore.CorruptRecord:
                record = None
        token = (record.env.get(owners.TOKEN_ENV) if record is not None else None) \
            or jobstore.read_procs(job_dir).get("token")
        if token is not None:
            return procs.Owner(token=owners.bound_token(job_dir.name, token) or "\0")  # "\0": in no environment
        # the job's directory, made by whoever registered the job (a record in it may since have been
        # rewritten by this user's own listings, so the record file's owner says nothing)
        return procs.Owner(token=None, legacy_ok=owners.written_by_me(job_dir))

    def keeps_summary(self, job_dir: Path, record: JobRecord) -> bool:
        """A live supervisor keeps the job's summary current (readers read it as is)."""
        return self.supervisor_alive(job_dir, record)

    def supervisor_alive(self, job_dir: Path, record: JobRecord | None) -> bool:
        """Whether the job's supervisor (or a launcher about to start it) is alive."""
        held = jobstore.lock_is_held(job_dir / jobstore.SUPERVISOR_LOCK)
        if held is not None:
            return held
        sup, _, _ = self._refs(job_dir, record)  # records written before the lock existed
        return procs.alive(sup, self._owner(job_dir, record)) is not None

    def describe(self, job_dir: Path, record: JobRecord) -> dict[str, Any]:
        """Settle from the exit file or a vanished supervisor, through the outcome rule
        (:func:`tune_magic.registry.outcome.decide`). The returned dict has the fields to change,
        and ``"_persist": False`` when the supervisor is alive and will write them itself (a reader
        then only shows them, e.g. while a full disk delays the supervisor's write)."""
        state = record.state
        if state.is_terminal or state is Status.PENDING:
            return {}
        supervised = self.supervisor_alive(job_dir, record)
        exit_info = jobstore.read_exit_code(job_dir)
        if exit_info is not None and supervised and procs.alive(self._refs(job_dir, record)[1]) is not None:
            exit_info = None  # the agent still runs: whatever that file says, the job has not ended
        if exit_info is not None and supervised and record.max_resumes:
            exit_info = None  # the supervisor may start it again from its checkpoint: it records the end itself
        if exit_info is not None:
            evidence, reason = endevidence.evidence(job_dir, record, exit_info.returncode, nothing_runs=True)
            changes = endevidence.changes(decide(evidence), record, exit_info.ended_at)
            if supervised:
                changes["_persist"] = False
            else:
                endevidence.keep_failure(job_dir, reason)
            return changes
        if supervised:
            return {}
        _, agent, workers = self._refs(job_dir, record)
        if procs.job_processes(agent, workers, self._owner(job_dir, record)):
            return {"status": RUNNING} if state is Status.UNKNOWN else {}  # runs on without its supervisor
        if agent is None and not jobstore.stop_was_requested(job_dir, record):
            evidence = Evidence(verdict=outcome.FAILED, nothing_runs=True, failure_line=outcome.LAUNCH_INTERRUPTED)
        else:  # nothing runs, no exit code: stopped if asked, else outcome unknown (an exit file may still come)
            evidence, _ = endevidence.evidence(job_dir, record, None, nothing_runs=True)
        end = decide(evidence)
        if end is None or end.status is state:
            return {}
        return endevidence.changes(end, record, time.time())

    # -- stopping -----------------------------------------------------------------------------
    def cancel(self, job_dir: Path, record: JobRecord | None, grace_s: float) -> None:
        from tune_magic.schedulers.local.supervisor import STOP_SIGNAL

        live = record is None or record.state.is_live
        sup, agent, workers = self._refs(job_dir, record)
        own = self._owner(job_dir, record)  # a planted record names nothing a stop may signal
        if live:
            # tell the supervisor first (a signal: it works on a read-only or full disk), then the registry
            supervisor = procs.alive(sup, own)
            if supervisor is not None:
                procs.signal_all([supervisor], STOP_SIGNAL)
            jobstore.mark_stop_requested(job_dir)  # never raises: the signals matter more
        if agent is None and live and self.supervisor_alive(job_dir, record):
            deadline = time.monotonic() + START_TIMEOUT_S  # launched a moment ago: wait for its first pid
            while agent is None and time.monotonic() < deadline and self.supervisor_alive(job_dir, record):
                time.sleep(0.02)
                _, agent, workers = self._refs(job_dir, None)
        procs.kill_job(agent, workers, grace_s, own)
        # the supervisor records the end and exits; give it the time to
        deadline = time.monotonic() + RECORD_TIMEOUT_S
        while self.supervisor_alive(job_dir, record) and time.monotonic() < deadline:
            try:
                if jobstore.read(job_dir).state.is_terminal:
                    break
            except jobstore.CorruptRecord:
                pass
            time.sleep(0.05)
        # workers that started while we killed (a launch racing the stop)
        _, agent, workers = self._refs(job_dir, None)
        procs.kill_job(agent, workers, 0.0, own)

    def settle_after_end(self, record: JobRecord, timeout_s: float = 5.0) -> None:
        """The supervisor writes the final record, then exits: wait for that (``timeout_s``
        seconds at most) and reap it if it is this process's child."""
        ref = record.supervisor
        deadline = time.monotonic() + timeout_s
        # not psutil's wait(): for another process's child it waits until the pid is gone, and a
        # zombie its parent has not reaped keeps it for the whole timeout although it has exited
        while procs.alive(ref) is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        if ref is not None:  # exited: if it is our zombie child, reap it
            try:
                proc = psutil.Process(ref.pid)
                if proc.ppid() == os.getpid() and abs(proc.create_time() - ref.create_time) <= procs.CREATE_TIME_TOLERANCE_S:
                    os.waitpid(ref.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError):
                pass

    def has_live_parts(self, job_dir: Path, record: JobRecord | None) -> bool:
        if self.supervisor_alive(job_dir, record):
            return True
        _, agent, workers = self._refs(job_dir, record)
        return bool(procs.job_processes(agent, workers, self._owner(job_dir, record)))
