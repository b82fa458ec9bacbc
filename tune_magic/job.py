"""Background jobs: launch a plan, list, follow and stop jobs. Knows nothing of IPython.

A launch registers a record under ``$TUNE_MAGIC_HOME/jobs/<id>/`` and hands it to a scheduler
(:mod:`tune_magic.schedulers`: ``local`` runs it on this machine under a supervisor process). So a
job outlives the process that launched it, and any later process (a new kernel, the CLI) lists,
follows and stops it through the same records. :class:`Job` never asks which scheduler it has.

Registration is atomic: the job's directory is prepared under a hidden staging name and renamed
into place with its record in one step, under the launch lock, after the clash checks. A launcher
killed at any moment leaves either nothing, a staging directory that the next listing removes, or
a registered job whose status becomes true at the next look (``failed``: "the launch was
interrupted") — never a directory without a record or a running record without a process.
"""

from __future__ import annotations

import errno
import math
import re
from dataclasses import replace
import os
import shutil
import signal
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import psutil

from tune_magic.plan import catalog
from tune_magic.schedulers.local import gpus as gpu_mod
from tune_magic.registry import store as jobstore
from tune_magic import schedulers
from tune_magic.plan.build import LaunchPlan, build_plan, check_job_id, resolve_config, split_args, with_config
from tune_magic.plan.configview import resolve_dirs, write_overlaid_config
from tune_magic.errors import JobNotFound, JobStartError, PlanError, StateDirError, UserError
from tune_magic.registry.ids import new_job_id
from tune_magic.logs.notify import get_notifier
from tune_magic.registry.store import JobRecord, ProcessRef
from tune_magic.schedulers.base import SchedulerOptions, check_scheduler_name, default_scheduler
from tune_magic.schedulers.local.procs import alive as _alive
from tune_magic.registry.status import Status

#: Environment variable: when "1", every launch is a dry run that returns the LaunchPlan.
DRY_RUN_ENV = "TUNE_MAGIC_DRY_RUN"
#: Seconds between asking the scheduler what became of a live job (see Job.refresh).
LIVENESS_CHECK_S = 1.0
#: Seconds a staging directory without a live launcher is kept before a listing removes it.
STAGING_GRACE_S = 2.0
#: Longest job name accepted, in characters (listings cut names to 40 anyway).
MAX_NAME_CHARS = 1000
#: Test hook: the launch step at which the launching process SIGKILLs itself (fault tests).
TEST_KILL_ENV = "TUNE_MAGIC_TEST_KILL_LAUNCHER_AT"
#: The launch steps, in order, that TEST_KILL_ENV can name.
LAUNCH_STEPS = ("staging", "planned", "staged", "registered", "submitted")

RUNNING, SUCCEEDED, FAILED, STOPPED = Status.RUNNING, Status.SUCCEEDED, Status.FAILED, Status.STOPPED


def dry_run_requested(env: Mapping[str, str] | None = None) -> bool:
    """Return True when ``TUNE_MAGIC_DRY_RUN`` asks for dry runs (``1``/``true``/``yes``/``on``);
    ``0``/``false``/``no``/``off`` or unset/empty mean a real launch.

    Raises:
        PlanError: any other value (it fails closed: a typo never starts a real job).
    """
    value = (os.environ if env is None else env).get(DRY_RUN_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise PlanError(f"{DRY_RUN_ENV}={value!r} is neither on (1, true, yes, on) nor off (0, false, no, off); "
                    f"set one of them or unset it")


def _launch_step(step: str) -> None:
    if os.environ.get(TEST_KILL_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


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
                record = jobstore.read(self.dir)
            except jobstore.CorruptRecord:
                record = _damaged_record(self.dir)
                self.damaged = True
        self._record = record
        self._stamp: tuple | None = None  # identity of the record file last read
        self._checked = 0.0  # monotonic time of the last look at the scheduler

    # -- state --------------------------------------------------------------------------------
    @property
    def scheduler(self) -> str:
        """Where the job runs: ``"local"`` or ``"slurm"``."""
        return self._record.scheduler

    def _sched(self):
        return schedulers.get(self._record.scheduler)

    def refresh(self) -> "Job":
        """Re-read the record if it changed; ask the scheduler what became of a live job (at most
        every :data:`LIVENESS_CHECK_S` seconds) and record what it settles.

        Reading never needs a write: when the registry cannot be written (read-only, full), the
        settled status is shown anyway. Cheap when nothing changed (one ``stat``).
        """
        stamp = jobstore.stamp(self.dir)
        if stamp is None or stamp != self._stamp:
            try:
                self._record = jobstore.read(self.dir)
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
                        self._record = jobstore.update(self.dir, **changes)
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
        """Pid of the torchrun agent (or of the one recipe process); ``None`` where the job has no
        local process (a SLURM job) or before it started."""
        agent = self._record.agent
        return agent.pid if agent and self._record.scheduler == "local" else None

    @property
    def nodes(self) -> list[str]:
        """Host names the job runs on: this host for a local job; a SLURM job's allocation
        (``[]`` while it is pending)."""
        r = self._record
        if r.scheduler == "local":
            import socket

            return [socket.gethostname()]
        return list(r.nodes)

    @property
    def num_nodes(self) -> int:
        """Nodes the job asked for (1 for a local job)."""
        return self._record.num_nodes

    @property
    def pending_reason(self) -> str | None:
        """Why a pending job waits (SLURM's reason: ``Resources``, ``Priority``...), else ``None``."""
        return self.refresh()._record.pending_reason

    @property
    def slurm_job_id(self) -> str | None:
        """SLURM's id of a SLURM job once submitted, else ``None``."""
        return self._record.slurm_job_id

    @property
    def workers(self) -> list[dict]:
        """The rank processes: ``{"host", "rank", "pid"}`` for a local job, ``{"host", "rank"}``
        for a SLURM job (as its nodes reported them)."""
        r = self._record
        if r.scheduler == "local":
            host = self.nodes[0]
            return [{"host": host, "rank": w.rank, "pid": w.pid} for w in r.workers]
        return [dict(x) for x in r.rank_hosts]

    @property
    def rendezvous_endpoint(self) -> str | None:
        """The real ``host:port`` once the workers are up (from a worker's MASTER_ADDR/PORT), or the
        user's endpoint when they gave one; ``None`` for one-process jobs and before workers start."""
        return self.refresh()._record.rendezvous_endpoint

    @property
    def elapsed_s(self) -> float:
        """Seconds since launch, or the job's whole duration once it ended."""
        r = self._record
        return max(0.0, (r.ended_at or time.time()) - r.started_at)

    def __repr__(self) -> str:
        # no status: a notebook's Out[] keeps this text while the job moves on (the card is live)
        r = self._record
        return f"<Job {r.id} {r.name!r}>"

    # -- actions --------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None, poll_s: float = 0.1) -> Status:
        """Block while the job is pending or running; return the status it then has (terminal,
        or ``unknown`` when nothing of it runs and no exit code exists).

        Raises:
            TimeoutError: still pending or running after ``timeout`` seconds.
        """
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 0 <= timeout < math.inf):
            raise ValueError(f"timeout={timeout!r}: give seconds (a number >= 0) or None to wait for ever")
        deadline = None if timeout is None else time.monotonic() + timeout
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
        return self._record.state

    def _settle_supervisor(self, timeout: float = 5.0) -> None:
        """Let an ended job's supervisor finish exiting (it writes the final record, then exits),
        and reap it if this process started it, so neither it nor a zombie is left behind."""
        ref = self._record.supervisor
        supervisor = _alive(ref)
        if supervisor is not None:
            try:
                supervisor.wait(timeout)  # psutil reaps it when it is our child
            except (psutil.Error, psutil.TimeoutExpired):
                pass
        elif ref is not None:  # exited already: if it is our zombie child, reap it
            try:
                proc = psutil.Process(ref.pid)
                if proc.ppid() == os.getpid() and abs(proc.create_time() - ref.create_time) <= 0.05:
                    os.waitpid(ref.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError):
                pass

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
        (:class:`tune_magic.logs.parse.MetricPoint`, sorted by step then name).

        Sources: the DiskLogger file (found from the log's ``Writing logs to`` line, else the newest
        ``log_*`` in the job's metric-log dir created after its start) and the progress bar in the
        combined log; for a step both give, the metric file's value wins.
        """
        from tune_magic.logs.follow import JobMetricsFollower

        r = self._record
        with JobMetricsFollower(r.log_path, log_dir=r.metric_log_dir, started_after=r.started_at - 1,
                                max_lines=1, cwd=r.cwd, rank_log_dir=r.rank_log_dir) as follower:
            follower.finish() if not self.status.is_live else follower.poll()
            return follower.points()

    def metrics(self) -> list[dict]:
        """Return the job's metric points as dicts: ``step`` (int), ``name`` (str), ``value``
        (float; ``nan``/``inf`` kept), ``epoch`` (int or None), ``source`` (``disklogger``,
        ``jsonl`` or ``progress``). See :meth:`metric_points`."""
        return [p._asdict() for p in self.metric_points()]

    def metrics_frame(self):
        """Return the metrics as a long-form pandas DataFrame (one row per step and metric name;
        columns step, name, value, epoch, source).

        Raises:
            ImportError: pandas is not installed (``pip install pandas``).
        """
        from tune_magic.logs.follow import points_to_frame

        return points_to_frame(self.metric_points())

    def tail(self, n: int = 20) -> list[str]:
        """Return the last ``n`` lines of the job's log (a progress bar's redraws collapsed to the
        latest one, as a terminal would show it)."""
        from tune_magic.schedulers.local.supervisor import read_tail

        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"n={n!r}: give a number of lines")
        text = read_tail(self.log_path, min(max(64 * 1024, 512 * n), 64 << 20))
        lines = [line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r")
                 for line in text.split("\n")]
        if lines and lines[-1] == "":
            lines.pop()
        return lines[-n:] if n > 0 else []


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


def _live_jobs(records: Iterable[JobRecord]) -> list[Job]:
    out = []
    for r in records:
        if r.state.is_live:
            job = Job(jobstore.job_dir(r.id), r)
            if job.refresh().record.state.is_live:
                out.append(job)
    return out


def _busy_gpus(running: list[Job]) -> dict[int | str, str]:
    """Physical GPU -> id of the live job using it (records made before ``physical_gpus`` existed
    hold physical ids in ``gpus``)."""
    busy: dict[int | str, str] = {}
    for j in running:
        r = j.record
        for g in (r.physical_gpus if r.physical_gpus is not None else r.gpus) or []:
            busy[g] = j.id
    return busy


def scheduler_options(*, scheduler: str | None = None, nodes: Any = None, gpus_per_node: Any = None,
                      cpus_per_node: Any = None, partition: str | None = None, time_limit: str | None = None,
                      account: str | None = None, sbatch: Sequence[str] | None = None,
                      env: Mapping[str, str] | None = None) -> SchedulerOptions:
    """Validate a launch's own scheduler options; return them as :class:`SchedulerOptions`.

    Raises:
        PlanError: an unknown scheduler, a count that is not a positive integer, a value of the
            wrong type.
    """
    env = os.environ if env is None else env
    name = check_scheduler_name(scheduler if scheduler is not None else default_scheduler(env),
                                "--scheduler" if scheduler is not None else "TUNE_MAGIC_SCHEDULER")

    def count(value: Any, flag: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):  # ASCII digits only
            value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{flag} {value!r} must be a positive integer, e.g. {flag} 2")
        return value

    examples = {"--partition": "gpu", "--time": "2:00:00", "--account": "myproject"}

    def text(value: Any, flag: str) -> str | None:
        if value is None:
            return None
        if flag == "--time" and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # minutes, as sbatch reads a bare number
        if not isinstance(value, str) or not value.strip() or any(c.isspace() or ord(c) < 32 for c in value):
            raise PlanError(f"{flag} {value!r} must be one word, e.g. {flag} {examples[flag]}")
        return value

    if sbatch is not None and (isinstance(sbatch, str) or not all(isinstance(s, str) for s in sbatch)):
        raise PlanError("sbatch options are a list of strings, each one option as sbatch takes it, e.g. "
                        "['--qos=high']")
    return SchedulerOptions(
        scheduler=name, nodes=count(nodes, "--nodes"), gpus_per_node=count(gpus_per_node, "--gpus-per-node"),
        cpus_per_node=count(cpus_per_node, "--cpus-per-node"), partition=text(partition, "--partition"),
        time_limit=text(time_limit, "--time"), account=text(account, "--account"), sbatch=tuple(sbatch or ()),
    )


def launch(
    args: str | Sequence[str],
    *,
    name: str | None = None,
    gpus: str | Iterable[int] | None = None,
    cwd: str | os.PathLike | None = None,
    force: bool = False,
    env: Mapping[str, str] | None = None,
    dry_run: bool | None = None,
    config_overlay: str | None = None,
    scheduler: str | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    cpus_per_node: int | None = None,
    partition: str | None = None,
    time_limit: str | None = None,
    account: str | None = None,
    sbatch: Sequence[str] | None = None,
    job_id: str | None = None,
) -> "Job | LaunchPlan":
    """Launch a ``tune run``-style job in the background and return at once.

    Args:
        args: ``[TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value ...]`` (see
            :func:`tune_magic.build_plan`).
        name: free-text name shown in listings (default: the recipe name).
        gpus: GPU ids (``"0,1"``, ``[2, 3]``), or ``"auto"`` for as many free GPUs as the job has
            processes per node. Sets ``CUDA_VISIBLE_DEVICES`` in the job's environment only.
        cwd: working directory of the job and of relative paths (default: the current one).
        force: allow sharing a GPU or an ``output_dir`` with a running job.
        env: the caller's environment (default ``os.environ``); the job gets it plus the plan's
            additions.
        dry_run: return the :class:`LaunchPlan` without starting or registering anything.
            Default: ``TUNE_MAGIC_DRY_RUN=1`` in the environment.
        config_overlay: YAML text of a config mapping (a ``%%tune_run`` cell body). Merged over
            ``--config`` when one is given, else used as the config; the result is saved as
            ``config.yaml`` in the job's directory and launched with ``--config`` pointing at it.
        scheduler: where the job runs: ``"local"`` (default, or ``$TUNE_MAGIC_SCHEDULER``) or
            ``"slurm"``.
        nodes, gpus_per_node, cpus_per_node, partition, time_limit, account, sbatch: the SLURM
            scheduler's options (``--nodes``, ``--gpus-per-node``, ``--cpus-per-node``,
            ``--partition``, ``--time``, ``--account``, extra sbatch options); refused by ``local``.
        job_id: the id a dry run's plan is built for (default: a new one, as a launch would pick);
            a real launch always picks its own.

    Returns:
        The :class:`Job` (or the plan, for a dry run).

    Raises:
        PlanError: bad arguments, unknown or busy GPUs, an ``output_dir`` used by a running job.
            Nothing has been started.
        StateDirError: ``$TUNE_MAGIC_HOME`` cannot take the job (read-only, full disk).
        JobStartError: the scheduler could not start the job (its record says why).
    """
    caller_env = dict(os.environ if env is None else env)
    cwd = os.path.abspath(os.getcwd() if cwd is None else os.fspath(cwd))
    if name is not None and not isinstance(name, str):
        raise PlanError(f"name={name!r}: the job name must be a string")
    if name is not None and len(name) > MAX_NAME_CHARS:
        raise PlanError(f"the job name is {len(name)} characters long; give at most {MAX_NAME_CHARS}")
    if not isinstance(args, (str, list, tuple)):
        raise PlanError(f"args={args!r}: give the tune run-style words as a string or a list of strings")
    for flag, value in (("force", force), ("dry_run", dry_run)):
        if value is not None and not isinstance(value, bool):
            raise PlanError(f"{flag}={value!r}: give True or False")
    options = scheduler_options(scheduler=scheduler, nodes=nodes, gpus_per_node=gpus_per_node,
                                cpus_per_node=cpus_per_node, partition=partition, time_limit=time_limit,
                                account=account, sbatch=sbatch, env=caller_env)
    sched = schedulers.get(options.scheduler)
    if dry_run is None:
        dry_run = dry_run_requested(caller_env)
    tokens = split_args(args)
    if job_id is not None and not dry_run:
        raise PlanError("job_id is for dry runs only; a launch picks its own id")
    job_id = check_job_id(job_id) if job_id is not None else new_job_id()
    if dry_run:
        # nothing is registered; one file per distinct cell body holds its config for the preview
        if config_overlay is not None:
            import hashlib

            d = Path(tempfile.gettempdir()) / "tune_magic_dry_run"
            d.mkdir(mode=0o700, exist_ok=True)
            digest = hashlib.sha256(f"{tokens}\0{config_overlay}\0{cwd}".encode()).hexdigest()[:16]
            tokens = _apply_overlay(tokens, config_overlay, cwd, d / f"config-{digest}.yaml")
        plan, _ = _plan(tokens, job_id, gpus=gpus, cwd=cwd, env=caller_env, busy={}, options=options)
        # the job's directory as it would be (the same id-dependent paths a launch gets)
        would_be = jobstore.jobs_root(caller_env, create=False) / job_id
        plan = replace(plan, **sched.prepare(plan, options, caller_env, would_be))
        problems = resolve_dirs(plan, cwd=cwd).errors  # here, a launch would refuse these
        return replace(plan, warnings=plan.warnings + [f"a launch here would refuse this: {e}" for e in problems])
    root = jobs_root_for_launch(caller_env)
    _collect_staging(root)
    stage = jobstore.staging_dir(job_id, root)
    final = root / job_id
    lock_fd: int | None = None
    try:
        try:
            stage.mkdir(mode=0o700)
            _launch_step("staging")
            # held from now until the supervisor inherits it: a registered job always has a live
            # holder (launcher or supervisor) until its supervisor exits
            lock_fd = jobstore.open_nofollow(stage / jobstore.SUPERVISOR_LOCK, os.O_RDWR | os.O_CREAT)
            import fcntl

            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            if config_overlay is not None:  # the job reads it at its final place, once registered
                tokens = _apply_overlay(tokens, config_overlay, cwd, stage / "config.yaml")
            plan, dirs, resolved = _checked_plan(tokens, job_id, gpus=gpus, cwd=cwd, env=caller_env, root=root,
                                                 force=force, job_dir=final, options=options)
            if config_overlay is not None:
                plan = _replace_config(plan, str(final / "config.yaml"))
            plan = replace(plan, **sched.prepare(plan, options, caller_env, final))
            _launch_step("planned")
            record = JobRecord(
                id=job_id, name=name or plan.recipe_name or Path(plan.recipe).stem, argv=plan.argv, env=plan.env,
                cwd=cwd, log_path=str(final / jobstore.OUTPUT_LOG), started_at=time.time(),
                output_dir=dirs.output_dir, metric_log_dir=dirs.metric_log_dir, checkpoint_dir=dirs.checkpoint_dir,
                gpus=plan.gpus, physical_gpus=resolved.physical if resolved else None, distributed=plan.distributed, nproc_per_node=plan.nproc_per_node,
                rendezvous=plan.rendezvous, rendezvous_endpoint=plan.endpoint,
                warnings=list(dict.fromkeys(dirs.warnings + plan.warnings)),
                recipe=plan.recipe, config=plan.config, rank_log_dir=plan.rank_log_dir, scheduler=sched.name,
                status=getattr(sched, "initial_status", Status.RUNNING).value,
                num_nodes=int(plan.nnodes) if (plan.nnodes or "").isdigit() else 1, time_limit=options.time_limit,
                epochs=dirs.epochs, max_steps_per_epoch=dirs.max_steps_per_epoch,
            )
            jobstore.write_record(stage, record)
            jobstore.write_procs(stage, scheduler=sched.name)  # a damaged record still says where it runs
            os.close(jobstore.open_nofollow(stage / jobstore.LOCK, os.O_WRONLY | os.O_CREAT))
            _launch_step("staged")
            # one launch at a time checks for clashes and registers, so two cannot both take a directory or GPU
            with jobstore.flocked(root / jobstore.LAUNCH_LOCK):
                _check_clashes(resolved, dirs, _live_jobs(jobstore.list_records(root)), force=force, plan=plan)
                os.rename(stage, final)
            _launch_step("registered")
            if plan.output_dir and dirs.output_dir:
                _make_private_dir(Path(dirs.output_dir))
        except OSError as exc:
            raise _state_error(exc, root) from None
        try:
            sched.submit(final, record, plan, options, caller_env, lock_fd)
        except UserError:
            jobstore.remove_tree(final)  # the engine refused it as described: nothing runs, nothing listed
            raise
        _launch_step("submitted")
        return Job(final)
    except BaseException:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)  # nothing registered, nothing left behind
        raise
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


def jobs_root_for_launch(env: Mapping[str, str]) -> Path:
    """The registry, created and writable, for a launch (see :func:`jobstore.jobs_root`)."""
    return jobstore.jobs_root(env)


def _state_error(exc: OSError, root: Path) -> StateDirError:
    """Turn a registry write failure at launch into one paragraph naming the fix."""
    where = root.parent
    if jobstore.disk_full(exc):
        return StateDirError(f"the disk holding TUNE_MAGIC_HOME ({where}) is full ({exc.strerror}); nothing was "
                             "started. Free some space there, or point TUNE_MAGIC_HOME at a disk with room")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return StateDirError(f"TUNE_MAGIC_HOME ({where}) is not writable ({exc.strerror}); nothing was started. "
                             "Point TUNE_MAGIC_HOME at a writable directory to launch jobs (listing works read-only)")
    if exc.errno == errno.ELOOP:
        return StateDirError(f"a symbolic link was planted inside the job registry {root} ({exc.filename}); "
                             "tune_magic never follows links there. Remove it and launch again")
    return StateDirError(f"cannot register the job under {root} ({exc.strerror or exc}); nothing was started")


def _make_private_dir(path: Path) -> None:
    """Create the per-job output_dir the plan added, mode 0700 (it will hold the resolved config
    with every override, and the checkpoints)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    os.chmod(path, 0o700)


def _collect_staging(root: Path) -> None:
    """Remove staging directories of launches that died before registering (best effort)."""
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(jobstore.STAGING_PREFIX)]
    except OSError:
        return
    now = time.time()
    for e in entries:
        d = Path(e.path)
        try:
            if jobstore.lock_is_held(d / jobstore.SUPERVISOR_LOCK):
                continue
            if now - os.lstat(d).st_mtime < STAGING_GRACE_S:
                continue  # a launcher between mkdir and taking its lock
            if not e.is_dir(follow_symlinks=False):
                continue
            shutil.rmtree(d, ignore_errors=True)
        except OSError:
            continue


def _apply_overlay(tokens: list[str], overlay: str, cwd: str, dest: Path) -> list[str]:
    """Write the overlaid config to ``dest`` and point ``--config`` at it."""
    tokens, base = with_config(tokens, str(dest))
    base_path = resolve_config(base, Path(cwd))[0] if base is not None else None
    try:
        write_overlaid_config(base_path, overlay, dest)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    return tokens


def _plan(tokens: list[str], job_id: str, *, gpus, cwd: str, env, busy, force: bool = False,
          launching: bool = False, job_dir: Path | None = None,
          options: SchedulerOptions | None = None) -> "tuple[LaunchPlan, gpu_mod.ResolvedGpus | None]":
    """The plan and, when launching with GPUs, the GPUs resolved through the kernel's
    ``CUDA_VISIBLE_DEVICES`` (the plan's env then carries the job's real ``CUDA_VISIBLE_DEVICES``).
    Explicit ids are checked at launch only: dry runs for GPU nodes stay buildable here."""
    resolved = None
    if isinstance(gpus, str) and gpus.strip() == "auto":
        probe = build_plan(tokens, env=env, cwd=cwd)
        nproc = probe.nproc_per_node or "1"
        n = int(nproc) if nproc.isdigit() else 1
        resolved = gpu_mod.resolve_gpus("auto", n, busy, env, force=force)
        gpus = resolved.typed
    options = options or SchedulerOptions()
    plan = build_plan(tokens, env=env, cwd=cwd, gpus=gpus, job_id=job_id, job_dir=job_dir,
                      scheduler=options.scheduler, nodes=options.nodes, gpus_per_node=options.gpus_per_node)
    if launching and plan.scheduler == "local" and plan.nproc_per_node == "gpu" and not plan.gpus:
        # torchrun would count CUDA devices in its agent and stop with "Cuda is not available."
        vis = gpu_mod.visibility(env)
        if not vis.gpus:
            raise PlanError(f"--nproc_per_node gpu starts one process per visible GPU, and {vis.describe()}; "
                            f"give a number of processes instead (--nproc_per_node 2) or run where a GPU is")
    if plan.gpus and launching:
        if resolved is None:
            resolved = gpu_mod.resolve_gpus(plan.gpus, len(plan.gpus), busy, env, force=force)
        plan = replace(plan, env={**plan.env, "CUDA_VISIBLE_DEVICES": resolved.cuda_visible_devices})
    elif plan.gpus and "CUDA_VISIBLE_DEVICES" in plan.env:
        # a dry run shows the CUDA_VISIBLE_DEVICES a launch from this kernel would give the job
        # (ids are relative to the kernel's own); it checks nothing against this machine's GPUs
        preview = gpu_mod.preview_cuda_visible_devices(plan.gpus, env)
        if preview is not None:
            plan = replace(plan, env={**plan.env, "CUDA_VISIBLE_DEVICES": preview})
        else:
            visible = env.get("CUDA_VISIBLE_DEVICES", "")
            plan = replace(plan, warnings=plan.warnings + [
                f"GPU ids {','.join(map(str, plan.gpus))} are not all among the {len([v for v in visible.split(',') if v.strip()])} "
                f"GPUs this kernel may use (CUDA_VISIBLE_DEVICES={visible!r}): a launch from here would refuse them"])
    return plan, resolved


def _checked_plan(tokens: list[str], job_id: str, *, gpus, cwd: str, env, root: Path, force: bool, job_dir: Path,
                  options: SchedulerOptions):
    """Build the plan and check it against this machine (GPUs visible and free, inputs exist, dirs
    resolve). Busy GPUs are checked again under the launch lock."""
    running = _live_jobs(jobstore.list_records(root))
    plan, resolved = _plan(tokens, job_id, gpus=gpus, cwd=cwd, env=env, busy=_busy_gpus(running), force=force,
                           launching=True, job_dir=job_dir, options=options)
    dirs = resolve_dirs(plan, cwd=cwd)
    if dirs.errors:
        raise PlanError(dirs.errors[0] + "; nothing was started")
    if dirs.missing_inputs:
        key, path = dirs.missing_inputs[0]
        shipped = Path(plan.config).is_relative_to(catalog.shipped_root())
        assets = " (the shipped configs use the tiny assets: run tune-magic assets, or tune_magic.make_assets())" if shipped else ""
        raise PlanError(f"{key} {path} does not exist, so every rank would fail at start-up; create it{assets} "
                        f"or override {key}=...")
    for message in dirs.warnings:
        warnings.warn(message, stacklevel=4)
    return plan, dirs, resolved


def _replace_config(plan: LaunchPlan, config_at: str) -> LaunchPlan:
    """The plan with its config file moved to ``config_at`` (same content, final place)."""
    staged = plan.config
    return replace(plan, config=config_at, argv=[config_at if a == staged else a for a in plan.argv])


def _same_or_nested(a: str, b: str) -> bool:
    a, b = Path(os.path.realpath(a)), Path(os.path.realpath(b))
    return a == b or a in b.parents or b in a.parents


def _local_port(endpoint: str | None) -> int | None:
    """The port of ``host:port`` when the host is this machine, else ``None``."""
    import socket

    if not endpoint:
        return None
    host, sep, port = endpoint.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit():
        return None
    mine = {"", "localhost", "0.0.0.0", "::", "::1", socket.gethostname(), socket.getfqdn()}
    return int(port) if host in mine or host.startswith("127.") else None


def _check_clashes(resolved, dirs, running: list[Job], *, force: bool, plan: LaunchPlan | None = None) -> None:
    """Refuse a GPU, a directory or a rendezvous port on this machine that a live job uses (unless
    ``force``). Called under the launch lock, so two launches racing for the same GPU or
    ``output_dir``: exactly one is refused."""
    if force:
        return
    port = _local_port(plan.endpoint) if plan is not None and plan.rendezvous == "user" else None
    if port:
        for job in running:
            if job.scheduler == "local" and _local_port(job.record.rendezvous_endpoint) == port:
                raise PlanError(f"port {port} of your rendezvous endpoint is the rendezvous of {job.record.status} job "
                                f"{job.id}: the second job would fail (EADDRINUSE) or join the first one's rendezvous; "
                                "leave the endpoint out (a free port is picked), choose another port, or pass --force")
    if resolved is not None:
        busy = {str(k): v for k, v in _busy_gpus(running).items()}
        for typed, physical in zip(resolved.typed, resolved.physical):
            if str(physical) in busy:
                shown = f"GPU {typed}" + (f" (physical {physical})" if str(typed) != str(physical) else "")
                raise gpu_mod.GpuError(f"{shown} is used by running job {busy[str(physical)]}; pick another GPU, stop "
                                       "that job, or pass --force / force=True to share it")
    mine = [x for x in (dirs.output_dir, dirs.metric_log_dir, dirs.checkpoint_dir) if x]
    for job in running:
        theirs = [x for x in (job.output_dir, job.record.metric_log_dir, job.record.checkpoint_dir) if x]
        clash = next(((m, t) for m in mine for t in theirs if _same_or_nested(m, t)), None)
        if clash:
            raise PlanError(
                f"{clash[0]} would share {clash[1]} with {job.record.status} job {job.id}; choose another "
                "output_dir=..., stop that job, or pass --force / force=True"
            )


def jobs(skipped: list | None = None) -> list[Job]:
    """Return every job in the registry (live and finished), oldest first. Never writes except to
    record what it learns (best effort); works on a read-only registry.

    Args:
        skipped: when given, damaged records are appended to it (:class:`tune_magic.registry.store.Skipped`:
            path and a one-line reason) instead of being reported with :func:`warnings.warn`.
    """
    root = jobstore.jobs_root(create=False)
    _collect_staging(root)
    stamps: dict[str, tuple] = {}
    records, bad = jobstore.list_records_checked(root, stamps)
    if skipped is not None:
        skipped.extend(bad)
    else:
        for s in bad:
            warnings.warn(f"skipped job directory {s.path}: {s.reason}", RuntimeWarning, stacklevel=2)
    return [_listed_job(root, r, stamps) for r in records]


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


def get_job(job_id: str) -> Job:
    """Return the job with this id (also one whose record is damaged but whose processes live).

    Raises:
        PlanError: the id is malformed (``/``, ``..``).
        JobNotFound: no such job.
        StateDirError: its directory is a symbolic link.
    """
    check_job_id(job_id)
    d = jobstore.job_dir(job_id)
    if not os.path.lexists(d):
        raise JobNotFound(f"no job {job_id!r}; tune-magic jobs lists the jobs")
    jobstore.check_job_dir(d)
    job = Job(d)
    if job.damaged and not job._sched().has_live_parts(d, None):
        raise JobNotFound(f"job {job_id!r} has a damaged record and nothing of it runs; tune-magic rm {job_id} "
                          "removes it")
    return job.refresh()


def remove(job_id: str) -> None:
    """Delete a finished job's record and log (its output_dir is kept).

    Raises:
        PlanError: the job is pending or running, or a process of it still lives (stop it first).
        JobNotFound: no such job.
        StateDirError: its directory is a symbolic link (the link is never followed).
    """
    check_job_id(job_id)
    d = jobstore.job_dir(job_id)
    if not os.path.lexists(d):
        raise JobNotFound(f"no job {job_id!r}; tune-magic jobs lists the jobs")
    jobstore.check_job_dir(d)
    job = Job(d)
    if not job.damaged:
        job.refresh()
    if (not job.damaged and job.record.state.is_live) or job._sched().has_live_parts(d, None if job.damaged else job.record):
        raise PlanError(f"job {job_id} is {'running' if job.damaged else job.record.status} (a process of it still "
                        f"lives); stop it first (tune-magic stop {job_id})")
    jobstore.remove_tree(d)
