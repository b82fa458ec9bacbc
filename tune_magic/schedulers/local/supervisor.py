"""The small process that owns one local job: ``python -m tune_magic.schedulers.local.supervisor JOB_DIR``.

It starts the job's command through :mod:`.exitwrap` (which records the exit code even if this
process is killed), records the agent's and the workers' pids and create-times and the real
rendezvous endpoint (from a worker's environment: torchrun itself only logs ``localhost:0``), and,
once the command ended, kills whatever of the job outlived it (orphaned workers of a killed agent, a
rank's leftover children) and writes the exit code, end time, final status and failure reason.

It also keeps the registry true while the job runs: if ``record.json`` is damaged it is rewritten
from what this process knows; if the job's whole directory is deleted (a /tmp cleaner, ``rm -rf
~/.cache``) it is recreated within :data:`REGISTRY_CHECK_S` seconds with the record, the pids and a
log that continues from that moment. The final write is retried until it succeeds (a full disk).

It holds an ``flock`` on ``supervisor.lock`` for its whole life (inherited from the launcher, so
there is no moment where a registered job has neither): readers tell "supervisor alive" from it.
Because it runs in its own session, the job survives the notebook kernel being interrupted,
restarted or killed. Keep imports light: this starts on every launch.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

# everything this process may need later is imported now: it outlives upgrades, and a module first
# imported after one would come from another release (0.1.0's supervisors needed shims for that)
from tune_magic.logs import endevidence, lineformat, logfiles, metricfollow, parse, points, readers, splitter  # noqa: F401
from tune_magic.logs.oom import OomWatch
from tune_magic.logs.summary import SummaryTracker, write_summary
from tune_magic.registry import store as jobstore
from tune_magic.registry.owner import TOKEN_ENV
from tune_magic.registry.outcome import Evidence, Outcome, decide
from tune_magic.registry.store import FAILED, CorruptRecord, JobRecord, ProcessRef
from tune_magic.schedulers.local import procs

if TYPE_CHECKING:
    from tune_magic.logs.oom import OomWatch

#: Seconds between polls of the job.
POLL_S = 0.2
#: Seconds between looks for worker processes once they have all been found.
DISCOVERY_SLOW_S = 5.0
#: Seconds between checks that the job's directory and record are intact.
REGISTRY_CHECK_S = 1.0
#: Seconds between updates of the job's summary (summary.json: last step and loss, progress).
SUMMARY_S = 1.0
#: Seconds orphans of an ended agent get between SIGTERM and SIGKILL.
ORPHAN_GRACE_S = 3.0
#: Longest pause between retries of the final record write, in seconds.
MAX_RETRY_S = 5.0
#: Most bytes copied per poll from a deleted log into its recreated file.
COPY_BYTES = 4 << 20

EXITWRAP = Path(__file__).with_name("exitwrap.py")


def discover_workers(agent: psutil.Process) -> tuple[list[ProcessRef], str | None]:
    """Return the agent's rank processes and the rendezvous endpoint they were given.

    Workers are the agent's direct children with torchrun's ``RANK`` and ``TORCHELASTIC_RUN_ID``
    in their environment (a rank's own children inherit both, so descendants are not ranks); the
    endpoint is a worker's ``MASTER_ADDR:MASTER_PORT``.
    """
    workers, endpoint = [], None
    try:
        children = agent.children(recursive=False)
    except psutil.Error:
        return [], None
    for child in children:
        try:
            environ = child.environ()
            if "RANK" not in environ or "TORCHELASTIC_RUN_ID" not in environ:
                continue
            workers.append(ProcessRef(child.pid, child.create_time(), int(environ["RANK"])))
            if endpoint is None and environ.get("MASTER_PORT"):
                endpoint = f"{environ.get('MASTER_ADDR', 'localhost')}:{environ['MASTER_PORT']}"
        except (psutil.Error, ValueError):
            continue
    return sorted(workers, key=lambda w: (w.rank, w.pid)), endpoint


class Supervisor:
    """One job's supervisor (see the module docstring). ``run()`` returns the job's exit code."""

    def __init__(self, job_dir: Path, lock_fd: int | None = None, ready_fd: int | None = None):
        self.dir = job_dir
        self.lock_fd = lock_fd
        self.ready_fd = ready_fd  # the launcher waits on it: written once the agent is recorded
        self.record: JobRecord = jobstore.read(job_dir)  # the last good record: rewritten from if damaged
        self.me = procs.ref_of(psutil.Process())
        self.agent: ProcessRef | None = None
        self.workers: list[ProcessRef] = []
        self.endpoint: str | None = None
        self._log_fd: int | None = None  # a read handle on the log: the job writes through its own
        self._copy_from: int | None = None  # offset in the old log to copy from after a deletion
        self._copy_to: int | None = None  # write handle of the recreated log
        self._next_check = 0.0
        self._next_summary = 0.0
        self._next_look = 0.0  # next look for workers (monotonic seconds)
        self._known_workers: tuple = ()  # (pids and ranks, endpoint) last recorded
        self.stop_requested = False  #: a stop asked for by SIGUSR1 (works on a read-only or full disk)
        self.tracker = SummaryTracker(self.record)
        self.autoresume = None  # .autoresume when the job has --max-resumes (imported now: see the imports)
        if self.record.max_resumes:
            from tune_magic.schedulers.local import autoresume

            self.autoresume = autoresume

    # -- the record ----------------------------------------------------------------------------
    def _update(self, **changes) -> None:
        """Set fields in the record (and in memory); on failure keep them for the next write."""
        for key, value in changes.items():
            if key == "status":
                self.record.set_status(value)
            else:
                setattr(self.record, key, value)
        try:
            with jobstore.locked(self.dir) as rec:
                for key, value in changes.items():
                    if key == "status":
                        rec.set_status(value)
                    else:
                        setattr(rec, key, value)
                self._mine(rec)
                self.record = rec
        except (OSError, CorruptRecord, jobstore.StateDirError):
            pass  # the next registry check repairs it; the final write retries

    def _mine(self, rec: JobRecord) -> None:
        """Put what this process knows into ``rec`` (it may have been rewritten by a reader)."""
        rec.supervisor = self.me
        if self.agent is not None:
            rec.agent = self.agent
        if self.workers:
            seen = {w.pid for w in rec.workers}
            rec.workers = rec.workers + [w for w in self.workers if w.pid not in seen]
        if self.endpoint and (rec.rendezvous != "user" or _port_unknown(rec.rendezvous_endpoint)):
            rec.rendezvous_endpoint = self.endpoint  # what the workers really used

    def _write_procs(self) -> None:
        try:
            jobstore.write_procs(self.dir, supervisor=self.me, agent=self.agent, workers=self.workers,
                                 scheduler=self.record.scheduler)
        except OSError:
            pass

    def check_registry(self) -> None:
        """Recreate a deleted job directory, rewrite a damaged record. Cheap when all is well."""
        try:
            st = os.lstat(self.dir)
            gone = not stat.S_ISDIR(st.st_mode)
        except FileNotFoundError:
            gone = True
        except OSError:
            return
        if gone:
            self._recreate()
            return
        try:
            self.record = jobstore.read(self.dir)
        except CorruptRecord:
            self._rewrite_record()
        side = jobstore.read_procs(self.dir)
        if side.get("agent") != self.agent or side.get("supervisor") != self.me or "scheduler" not in side:
            self._write_procs()  # damaged or replaced: what a stop needs to find the job's processes

    def _rewrite_record(self) -> None:
        """Rewrite a damaged record from what this process knows; something that is not a file
        where the record goes (a directory, a socket) is moved aside first, never deleted."""
        path = self.dir / jobstore.RECORD
        try:
            st = os.lstat(path)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                os.rename(path, self.dir / f"{jobstore.RECORD}.damaged-{int(time.time())}")
        except OSError:
            pass
        self._mine(self.record)
        try:
            jobstore.write_record(self.dir, self.record)
        except OSError:
            pass

    def _recreate(self) -> None:
        now = time.time()
        try:
            levels = [self.dir, *list(self.dir.parents)[:2]]  # the job's dir, jobs/ and the home: private
            levels[-1].parent.mkdir(parents=True, exist_ok=True)
            for d in reversed(levels):
                try:
                    d.mkdir(mode=0o700)
                except FileExistsError:
                    pass
            self._mine(self.record)
            self.record.log_lost_at = now
            jobstore.write_record(self.dir, self.record)
        except OSError:
            return  # try again at the next check
        self._write_procs()
        try:  # a fresh lock file: readers must see this supervisor alive again
            fd = jobstore.open_nofollow(self.dir / jobstore.SUPERVISOR_LOCK, os.O_RDWR | os.O_CREAT)
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self.lock_fd is not None:
                os.close(self.lock_fd)
            self.lock_fd = fd
        except OSError:
            pass
        try:
            out = jobstore.open_nofollow(Path(self.record.log_path), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            stamp = time.strftime("%H:%M:%S", time.localtime(now))
            os.write(out, (f"[tune_magic] the job's directory was deleted and recreated at {stamp}; "
                           "the log before this moment is gone\n").encode())
            if self._copy_to is not None:
                os.close(self._copy_to)
            self._copy_to = out
            if self._log_fd is not None:
                self._copy_from = os.fstat(self._log_fd).st_size
        except OSError:
            pass

    def _copy_log(self) -> None:
        """After a recreation: append what the job wrote to its (deleted) log to the new one."""
        if self._copy_to is None or self._log_fd is None or self._copy_from is None:
            return
        try:
            data = os.pread(self._log_fd, COPY_BYTES, self._copy_from)
            if data:
                os.write(self._copy_to, data)
                self._copy_from += len(data)
        except OSError:
            pass

    # -- running ------------------------------------------------------------------------------
    def run(self) -> int:
        """Run the job to its end and record it; return its exit code (127: it could not start)."""
        rec = self.record
        if rec.state.is_terminal:  # settled by a reader before we got here: never run it twice
            return rec.returncode or 0
        self._update(supervisor=self.me)
        self._write_procs()
        while True:  # one attempt; again only with --max-resumes, from the last checkpoint
            wrapper = self._start()
            if wrapper is None:
                return 127
            try:
                wrapper_ref = procs.ref_of(psutil.Process(wrapper.pid))
            except psutil.Error:
                wrapper_ref = ProcessRef(wrapper.pid, time.time())
            oom_watch = OomWatch.start(wrapper.pid)
            self._find_agent(wrapper, wrapper_ref)
            self._tell_launcher()
            self._watch(wrapper)
            code = self._exit_code(wrapper, wrapper_ref)
            # whatever outlived the command (a killed agent's workers, a rank's children) goes now
            procs.kill_job(self.agent, self.workers, ORPHAN_GRACE_S, procs.Owner(rec.env.get(TOKEN_ENV)))
            self.check_registry()
            self._copy_log()
            if not self._again(code):
                break
        self._end(code, oom_watch)
        return code

    def _again(self, code: int | None) -> bool:
        """With ``--max-resumes``: start the failed attempt again from the job's last checkpoint
        (:mod:`.autoresume` decides); return whether a new attempt is to start."""
        if self.autoresume is None:
            return False
        while self.tracker.advance():
            pass
        step = self.tracker.summary.step
        stop = self.stop_requested or jobstore.stop_was_requested(self.dir, self.record)
        nxt = self.autoresume.next_attempt(self.dir, self.record, code, stop=stop, step=step, now=time.time())
        if nxt.message:
            self.autoresume.say(self.record.log_path, nxt.message)
        if not nxt.changes or self.stop_requested:
            return False
        self.autoresume.set_exit_file_aside(self.dir, len(nxt.changes["attempts"]) - 1)
        # the next attempt's processes replace this one's; until its agent is recorded, a stop waits for it
        self.agent, self.workers, self.endpoint, self._known_workers, self._next_look = None, [], None, (), 0.0
        try:
            jobstore.write_procs(self.dir, supervisor=self.me, merge=False, scheduler=self.record.scheduler)
        except OSError:
            pass
        fresh = {} if self.record.rendezvous == "user" else {"rendezvous_endpoint": None}  # a new OS-chosen port
        self._update(agent=None, workers=[], **fresh, **nxt.changes)
        return True

    def _start(self) -> subprocess.Popen | None:
        """Start the command under the exit wrapper, its output appended to the job's log; on
        failure record the end (exit code 127) and return ``None``."""
        rec = self.record
        log = Path(rec.log_path)
        out = jobstore.open_nofollow(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._log_fd = jobstore.open_nofollow(log, os.O_RDONLY)
        try:
            return subprocess.Popen(
                [sys.executable, "-I", "-S", str(EXITWRAP), str(self.dir / jobstore.EXIT_CODE), "--", *rec.argv],
                cwd=rec.cwd, env={**os.environ, **rec.env}, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, close_fds=True,
            )
        except OSError as exc:
            self._final(Evidence(returncode=127, failure_line=f"could not start {rec.argv[0]}: {exc}",
                                 nothing_runs=True))
            return None
        finally:
            os.close(out)

    def _watch(self, wrapper: subprocess.Popen) -> None:
        """Until the wrapper exits: find the workers and the endpoint, keep the registry true."""
        exited = _exit_fd(wrapper.pid)
        while wrapper.poll() is None:
            now = time.monotonic()
            if self.record.distributed and now >= self._next_look and self.agent is not None:
                self._look_for_workers(now)
            self._housekeep(now)
            _wait_exit(wrapper, exited, POLL_S)
        if exited is not None:
            os.close(exited)

    def _look_for_workers(self, now: float) -> None:
        """Record the agent's workers and the endpoint when they change; set when to look next."""
        agent = procs.alive(self.agent)
        if agent is None:
            return
        rec = self.record
        expected = int(rec.nproc_per_node) if (rec.nproc_per_node or "").isdigit() else 1
        workers, endpoint = discover_workers(agent)
        complete = len(workers) >= expected and endpoint is not None
        key = (tuple((w.pid, w.rank) for w in workers), endpoint)
        if workers and key != self._known_workers:
            self._known_workers = key
            seen = {w.pid for w in self.workers}
            self.workers += [w for w in workers if w.pid not in seen]
            self.endpoint = endpoint or self.endpoint
            self._write_procs()
            self._update()
        # look often until all are known, then rarely (an elastic restart): every look
        # reads /proc of each child, which steals CPU from the job on a small machine
        self._next_look = now + (DISCOVERY_SLOW_S if complete else 0.0)

    def _exit_code(self, wrapper: subprocess.Popen, wrapper_ref: ProcessRef) -> int | None:
        """The command's exit code: the exit wrapper's record, else the orphaned agent's, else the
        wrapper's own (negative: killed by that signal)."""
        code = wrapper.returncode
        exit_info = jobstore.read_exit_code(self.dir)
        if exit_info is not None:
            return exit_info.returncode
        if procs.alive(self.agent) is not None and self.agent != wrapper_ref:
            # the wrapper was killed, not the job: the agent, reparented to this subreaper, runs on
            return self._wait_orphaned_agent()
        if code is not None and code > 128:  # the wrapper re-raised a signal it could not
            return 128 - code
        return code

    def _end(self, code: int | None, oom_watch: OomWatch) -> None:
        """Decide and record the job's end: failure reason, final summary, then the record."""
        stop = self.stop_requested or jobstore.stop_was_requested(self.dir, self.record)
        oom = None
        if code not in (0, None) and not stop:
            pids = [w.pid for w in self.workers] + ([self.agent.pid] if self.agent else [])
            try:
                oom = oom_watch.killed(pids)
            except Exception:  # evidence is a bonus: never lose the end for it
                oom = None
        evidence, reason = endevidence.evidence(self.dir, self.record, code, stop_requested=stop, oom=oom,
                                           pid=self.agent.pid if self.agent else None, nothing_runs=True)
        endevidence.keep_failure(self.dir, reason)
        # the summary first: a reader that sees the end in the record finds the final summary too
        self.tracker.record.error = self.record.error or (decide(evidence) or Outcome(FAILED)).reason
        while self.tracker.advance(final=True):
            pass
        write_summary(self.dir, self.tracker.summary, forward_only=False)
        self._final(evidence)

    def _wait_orphaned_agent(self) -> int | None:
        """Supervise the agent after its wrapper died (it is this process's child now: a child
        subreaper adopts its orphaned descendants); return its exit code and write it as the wrapper
        would have."""
        pid = self.agent.pid
        while True:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not adopted after all (no subreaper): its code is lost
                while procs.alive(self.agent) is not None:
                    time.sleep(POLL_S)
                return None
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            now = time.monotonic()
            self._housekeep(now)
            time.sleep(POLL_S)
        try:
            jobstore.write_atomic(self.dir / jobstore.EXIT_CODE,
                                  json.dumps({"returncode": code, "ended_at": time.time()}).encode())
        except OSError:
            pass
        return code

    def _housekeep(self, now: float) -> None:
        """One poll's upkeep while the job runs (``now``: monotonic seconds): the registry check every
        :data:`REGISTRY_CHECK_S`, the log copy, and the summary every :data:`SUMMARY_S`."""
        if now >= self._next_check:
            self._next_check = now + REGISTRY_CHECK_S
            self.check_registry()
        self._copy_log()
        if now >= self._next_summary:
            self._next_summary = now + SUMMARY_S
            if self.tracker.advance():
                write_summary(self.dir, self.tracker.summary)

    def _find_agent(self, wrapper: subprocess.Popen, wrapper_ref: ProcessRef) -> None:
        """Record the wrapper's child (the agent) as soon as it exists."""
        deadline = time.monotonic() + 10.0
        try:
            parent = psutil.Process(wrapper.pid)
        except psutil.Error:
            parent = None
        while time.monotonic() < deadline:
            try:
                kids = parent.children() if parent is not None else []
            except psutil.Error:
                kids = []
            if kids:
                try:
                    self.agent = procs.ref_of(kids[0])
                except psutil.Error:
                    self.agent = None
                if self.agent is not None:
                    break
            if wrapper.poll() is not None:
                break
            time.sleep(0.002)
        if self.agent is None:  # it ended before we saw it: the wrapper stands in (launch() waits on it)
            self.agent = wrapper_ref
        self._write_procs()
        self._update()

    def _tell_launcher(self) -> None:
        """Wake the launcher waiting for the agent's record (best effort: it also looks by itself)."""
        if self.ready_fd is not None:
            try:
                os.write(self.ready_fd, b"1")
            except OSError:
                pass
            finally:
                os.close(self.ready_fd)
                self.ready_fd = None

    def _final(self, evidence: Evidence) -> None:
        """Write the end into the record, retrying until it succeeds (a full disk frees up)."""
        delay = 0.1
        ended = time.time()
        while True:
            try:
                try:
                    with jobstore.locked(self.dir) as rec:
                        self._apply_end(rec, evidence, ended)
                        self.record = rec
                except CorruptRecord:
                    self._apply_end(self.record, evidence, ended)
                    self._rewrite_record()
                    jobstore.read(self.dir)  # raises (and so retries) until the rewrite took
                return
            except FileNotFoundError:
                self._recreate()
            except (OSError, jobstore.StateDirError, CorruptRecord):
                pass
            time.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_S)

    def _apply_end(self, rec: JobRecord, evidence: Evidence, ended: float) -> None:
        """Decide the end (:func:`tune_magic.registry.outcome.decide`) with the stop as the record
        has it now (a stop may have been recorded since the evidence was gathered) and record it."""
        self._mine(rec)
        if rec.state.is_terminal:
            return
        from dataclasses import replace

        stop = evidence.stop_requested or jobstore.stop_was_requested(self.dir, rec)
        # a stop asked since the evidence was gathered: did training end before it reached the job?
        late = stop and not evidence.stop_requested and endevidence.trained_to_the_end(rec)
        evidence = replace(evidence, stop_requested=stop,
                           finished_at_stop=evidence.finished_at_stop or rec.finished_at_stop or late)
        end = decide(evidence)
        if end is None:
            return
        for key, value in endevidence.changes(end, rec, ended, step=self.tracker.summary.step).items():
            rec.set_status(value) if key == "status" else setattr(rec, key, value)
        if evidence.returncode is not None:
            rec.returncode = evidence.returncode


def _port_unknown(endpoint: str | None) -> bool:
    """True for no endpoint, or one whose port is 0 or missing (the OS or torchrun picks it)."""
    if not endpoint:
        return True
    host, sep, port = endpoint.rpartition(":")
    if not sep or "]" in port:  # "host" or "[::1]" without a port
        return True
    return port.strip() in ("", "0")


def _exit_fd(pid: int) -> int | None:
    """A pidfd of ``pid`` (readable once it exits; Linux 5.3+), or ``None`` where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _wait_exit(proc: subprocess.Popen, exited: int | None, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``proc`` to exit. With a pidfd the wait ends the moment
    it does (``Popen.wait(timeout)`` sleeps in steps of up to 50 ms, which the job's end would wait
    out); then ``proc.poll()`` reaps it."""
    if exited is not None:
        try:
            select.select([exited], [], [], timeout)
        except (OSError, ValueError):
            time.sleep(timeout)
        proc.poll()
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass


#: The signal a stop sends the supervisor first: "a user asked to stop this job" (no file needed).
STOP_SIGNAL = signal.SIGUSR1


def _become_subreaper() -> None:
    """Adopt this process's orphaned descendants (Linux PR_SET_CHILD_SUBREAPER): if the exit
    wrapper is killed, the job's agent becomes this process's child and its exit code is not lost."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m tune_magic.schedulers.local.supervisor JOB_DIR [--lock-fd N] [--ready-fd N]``
    (``--ready-fd``: a pipe written and closed once the job's first process is recorded)."""
    argv = sys.argv[1:] if argv is None else argv
    job_dir = Path(argv[0])
    lock_fd = int(argv[argv.index("--lock-fd") + 1]) if "--lock-fd" in argv else None
    ready_fd = int(argv[argv.index("--ready-fd") + 1]) if "--ready-fd" in argv else None
    # interrupts of a terminal or kernel never reach this session; a SIGTERM meant for it (e.g. a
    # shutdown) reaches the job through the wrapper, which ends normally and gets recorded
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    _become_subreaper()
    try:
        supervisor = Supervisor(job_dir, lock_fd, ready_fd)

        def stop_asked(_signum, _frame):  # tune_magic's stop, before it signals the job
            supervisor.stop_requested = True

        signal.signal(STOP_SIGNAL, stop_asked)
        return supervisor.run()
    except Exception as exc:  # never leave a record saying "running" for a job nobody watches
        try:
            jobstore.update(job_dir, status=FAILED, ended_at=time.time(), error=f"supervisor error: {exc!r}")
        finally:
            raise


if __name__ == "__main__":
    sys.exit(main())
