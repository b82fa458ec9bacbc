"""Background jobs: launch a plan, list, follow and stop jobs. Knows nothing of IPython.

A launch writes a record under ``$TUNE_MAGIC_HOME/jobs/<id>/`` and starts a supervisor
(:mod:`tune_magic.supervisor`) in a new session; the supervisor starts the job and records its
exit. So a job outlives the process that launched it, and any later process (a new kernel, the CLI)
lists, follows and stops it through the same records.
"""

from __future__ import annotations

import fcntl
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import psutil

from . import catalog
from . import gpus as gpu_mod
from . import jobstore
from .command import LaunchPlan, PlanError, build_plan, check_job_id, resolve_config, split_args, with_config
from .errors import JobNotFound, JobStartError
from .configview import resolve_dirs, write_overlaid_config
from .ids import new_job_id
from .jobstore import FAILED, RUNNING, STOPPED, SUCCEEDED, JobRecord, ProcessRef

#: Environment variable: when "1", every launch is a dry run that returns the LaunchPlan.
DRY_RUN_ENV = "TUNE_MAGIC_DRY_RUN"
#: Seconds launch() waits for the supervisor to record the job's pid.
START_TIMEOUT_S = 30.0
_CREATE_TIME_TOLERANCE_S = 0.05
#: Seconds between checks that a running job's supervisor is still alive (see Job.refresh).
LIVENESS_CHECK_S = 1.0


def dry_run_requested(env: Mapping[str, str] | None = None) -> bool:
    """Return True when ``TUNE_MAGIC_DRY_RUN`` asks for dry runs (``1``/``true``/``yes``)."""
    value = (os.environ if env is None else env).get(DRY_RUN_ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def _alive(ref: ProcessRef | None) -> psutil.Process | None:
    """Return the process if ``ref``'s pid is alive and is the same process (create-time match)."""
    if ref is None:
        return None
    try:
        proc = psutil.Process(ref.pid)
        if abs(proc.create_time() - ref.create_time) > _CREATE_TIME_TOLERANCE_S:
            return None  # the pid was recycled: never signal a stranger
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


class Job:
    """A background job, backed by its record on disk.

    Attributes are read from the record; call :meth:`refresh` (or a method that does) to see
    changes made by the supervisor. Status is ``running``, ``succeeded`` (exit 0), ``failed``
    (non-zero exit) or ``stopped`` (stopped by the user).
    """

    def __init__(self, directory: Path, record: JobRecord | None = None):
        self.dir = Path(directory)
        self._record = record or jobstore.read(self.dir)
        self._stamp: tuple | None = None  # identity of the record file last read
        self._checked = 0.0  # monotonic time of the last liveness check

    # -- state --------------------------------------------------------------------------------
    def refresh(self) -> "Job":
        """Re-read the record if it changed; settle a job whose supervisor vanished without
        recording an exit (checked at most every :data:`LIVENESS_CHECK_S` seconds).

        Cheap when nothing changed (one ``stat``), so views can call it several times a second.
        """
        stamp = jobstore.stamp(self.dir)
        if stamp is None or stamp != self._stamp:
            self._record = jobstore.read(self.dir)
            self._stamp = stamp
        r = self._record
        now = time.monotonic()
        if r.status == RUNNING and r.supervisor is not None and now - self._checked >= LIVENESS_CHECK_S:
            self._checked = now
            if _alive(r.supervisor) is None:
                time.sleep(0.05)  # the supervisor may be writing its final record right now
                self._record = r = jobstore.read(self.dir)
                if r.status == RUNNING and _alive(r.agent) is None:
                    with jobstore.locked(self.dir) as rec:
                        if rec.status == RUNNING:
                            rec.status = STOPPED if rec.stop_requested else FAILED
                            rec.ended_at = rec.ended_at or time.time()
                            if rec.status == FAILED:
                                rec.error = rec.error or "the job's supervisor exited without recording an exit code"
                    self._record = jobstore.read(self.dir)
                self._stamp = None
        return self

    @property
    def record(self) -> JobRecord:
        """The last record read (see :meth:`refresh`)."""
        return self._record

    id = property(lambda self: self._record.id, doc="Unique job id (str).")
    name = property(lambda self: self._record.name, doc="Free-text name (str; need not be unique).")
    returncode = property(lambda self: self.refresh()._record.returncode, doc="Exit code (int) once ended, else None.")
    error = property(lambda self: self.refresh()._record.error,
                     doc="For a failed job: the failing rank and its error line (str), else None.")
    output_dir = property(lambda self: self._record.output_dir, doc="Resolved output_dir (str) or None.")
    log_path = property(lambda self: self._record.log_path, doc="The job's combined stdout+stderr log (str).")
    argv = property(lambda self: list(self._record.argv), doc="The command that was launched (list[str]).")
    gpus = property(lambda self: self._record.gpus, doc="GPU ids given to the job (list[int]) or None.")
    started_at = property(lambda self: self._record.started_at, doc="Unix time (s) of the launch.")
    ended_at = property(lambda self: self.refresh()._record.ended_at, doc="Unix time (s) of the end, or None.")

    @property
    def status(self) -> str:
        """``running``, ``succeeded``, ``failed`` or ``stopped`` (re-read from disk)."""
        return self.refresh()._record.status

    @property
    def pid(self) -> int | None:
        """Pid of the torchrun agent (or of the one recipe process)."""
        agent = self._record.agent
        return agent.pid if agent else None

    @property
    def rendezvous_endpoint(self) -> str | None:
        """The real ``host:port`` once the workers are up (from a worker's MASTER_ADDR/PORT), or the
        user's endpoint when they gave one; ``None`` for one-process jobs and before workers start."""
        return self.refresh()._record.rendezvous_endpoint

    @property
    def elapsed_s(self) -> float:
        """Seconds since launch, or the job's whole duration once it ended."""
        r = self._record
        return (r.ended_at or time.time()) - r.started_at

    def __repr__(self) -> str:
        # no status: a notebook's Out[] keeps this text while the job moves on (the card is live)
        r = self._record
        return f"<Job {r.id} {r.name!r}>"

    # -- actions --------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None, poll_s: float = 0.1) -> str:
        """Block until the job ends; return its final status.

        Raises:
            TimeoutError: still running after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.status == RUNNING:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still running after {timeout} s")
            time.sleep(poll_s)
        self._settle_supervisor()
        return self._record.status

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
                if proc.ppid() == os.getpid() and abs(proc.create_time() - ref.create_time) <= _CREATE_TIME_TOLERANCE_S:
                    os.waitpid(ref.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError):
                pass

    def _processes(self) -> list[psutil.Process]:
        r = self._record
        procs = [p for p in (_alive(r.agent), *(_alive(w) for w in r.workers)) if p is not None]
        agent = _alive(r.agent)
        if agent is not None:
            try:
                procs += agent.children(recursive=True)  # workers not yet recorded
            except psutil.Error:
                pass
        seen, out = set(), []
        for p in procs:
            if p.pid not in seen:
                seen.add(p.pid)
                out.append(p)
        return out

    def stop(self, grace_s: float = 10.0) -> str:
        """Stop the job: SIGTERM to the torchrun agent (it forwards to the workers), wait up to
        ``grace_s`` seconds, then SIGKILL the agent and every worker still alive.

        Only processes whose pid and create-time match the record are signalled. Stopping a job
        that already ended changes nothing.

        Returns:
            The final status (``stopped`` unless the job had already ended).
        """
        if isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or not 0 <= grace_s < math.inf:
            raise ValueError(f"grace_s={grace_s!r}: give the seconds between SIGTERM and SIGKILL, a number >= 0")
        self.refresh()
        if self._record.status != RUNNING:
            return self._record.status
        jobstore.update(self.dir, stop_requested=True)
        if self._record.agent is None:  # launched a moment ago: wait for the supervisor's record
            deadline = time.monotonic() + START_TIMEOUT_S
            while self.refresh()._record.agent is None and self._record.status == RUNNING:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
        procs = self._processes()
        agent = _alive(self._record.agent)
        if agent is not None:
            try:
                agent.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive + self._processes():  # workers live in their own sessions: kill each one
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(self._processes(), timeout=5)
        # the supervisor records the exit; if it is gone, record it here
        deadline = time.monotonic() + 10
        while self.status == RUNNING and time.monotonic() < deadline:
            if _alive(self._record.supervisor) is None:
                jobstore.update(self.dir, status=STOPPED, ended_at=time.time())
            time.sleep(0.05)
        self._settle_supervisor()  # it has recorded the exit; let it finish so nothing is left
        return self.status

    def metric_points(self) -> list:
        """Read the job's logs to their current end; return its merged metric points
        (:class:`tune_magic.logparse.MetricPoint`, sorted by step then name).

        Sources: the DiskLogger file (found from the log's ``Writing logs to`` line, else the newest
        ``log_*`` in the job's metric-log dir created after its start) and the progress bar in the
        combined log; for a step both give, the metric file's value wins.
        """
        from .follow import JobMetricsFollower

        r = self._record
        with JobMetricsFollower(r.log_path, log_dir=r.metric_log_dir, started_after=r.started_at - 1,
                                max_lines=1, cwd=r.cwd) as follower:
            follower.finish() if self.status != RUNNING else follower.poll()
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
        from .follow import points_to_frame

        return points_to_frame(self.metric_points())

    def tail(self, n: int = 20) -> list[str]:
        """Return the last ``n`` lines of the job's log (a progress bar's redraws collapsed to the
        latest one, as a terminal would show it)."""
        from .supervisor import read_tail

        text = read_tail(self.log_path, max(64 * 1024, 512 * n))
        lines = [line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r")
                 for line in text.split("\n")]
        if lines and lines[-1] == "":
            lines.pop()
        return lines[-n:] if n > 0 else []


# ---------------------------------------------------------------------------------------------


def _running(records: Iterable[JobRecord]) -> list[Job]:
    out = []
    for r in records:
        job = Job(jobstore.job_dir(r.id), r)
        if r.status == RUNNING and job.refresh().record.status == RUNNING:
            out.append(job)
    return out


def _busy_gpus(running: list[Job]) -> dict[int, str]:
    return {g: j.id for j in running for g in (j.gpus or [])}


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

    Returns:
        The running :class:`Job` (or the plan, for a dry run).

    Raises:
        PlanError: bad arguments, unknown or busy GPUs, an ``output_dir`` used by a running job.
            Nothing has been started.
        JobStartError: the supervisor could not start the job.
    """
    caller_env = dict(os.environ if env is None else env)
    cwd = os.path.abspath(os.getcwd() if cwd is None else os.fspath(cwd))
    if name is not None and not isinstance(name, str):
        raise PlanError(f"name={name!r}: the job name must be a string")
    if dry_run is None:
        dry_run = dry_run_requested(caller_env)
    tokens = split_args(args)
    job_id = new_job_id()
    if dry_run:
        # nothing is registered; a temporary folder only holds a cell body's config for the preview
        d = Path(tempfile.mkdtemp(prefix="tune_magic_dry_run_")) if config_overlay is not None else None
        if d is not None:
            tokens = _apply_overlay(tokens, config_overlay, cwd, d / "config.yaml")
        return _plan(tokens, job_id, gpus=gpus, cwd=cwd, env=caller_env, busy={})
    root = jobstore.jobs_root(caller_env)
    # one launch at a time checks for clashes and registers, so two cannot both take a directory or GPU
    with open(root / ".launch.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        d = jobstore.reserve(job_id, root)
        try:
            if config_overlay is not None:
                tokens = _apply_overlay(tokens, config_overlay, cwd, d / "config.yaml")
            return _start(tokens, job_id, d, name=name, gpus=gpus, cwd=cwd, force=force, env=caller_env)
        except BaseException:
            shutil.rmtree(d, ignore_errors=True)  # nothing registered, nothing left behind
            raise


def _apply_overlay(tokens: list[str], overlay: str, cwd: str, dest: Path) -> list[str]:
    """Write the overlaid config to ``dest`` and point ``--config`` at it."""
    tokens, base = with_config(tokens, str(dest))
    base_path = resolve_config(base, Path(cwd))[0] if base is not None else None
    try:
        write_overlaid_config(base_path, overlay, dest)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    return tokens


def _plan(tokens: list[str], job_id: str, *, gpus, cwd: str, env, busy: dict[int, str]) -> LaunchPlan:
    if isinstance(gpus, str) and gpus.strip() == "auto":
        probe = build_plan(tokens, env=env, cwd=cwd)
        nproc = probe.nproc_per_node or "1"
        n = int(nproc) if nproc.isdigit() else 1
        gpus = gpu_mod.pick_free(n, busy, env)
    return build_plan(tokens, env=env, cwd=cwd, gpus=gpus, job_id=job_id)


def _same_or_nested(a: str, b: str) -> bool:
    a, b = Path(os.path.realpath(a)), Path(os.path.realpath(b))
    return a == b or a in b.parents or b in a.parents


def _start(tokens: list[str], job_id: str, d: Path, *, name, gpus, cwd, force, env) -> "Job":
    running = _running(jobstore.list_records(d.parent))
    busy = _busy_gpus(running)
    plan = _plan(tokens, job_id, gpus=gpus, cwd=cwd, env=env, busy=busy)
    if plan.gpus:
        gpu_mod.check_gpus(plan.gpus, busy, force=force, env=env)
    dirs = resolve_dirs(plan, cwd=cwd)
    if dirs.errors:
        raise PlanError(dirs.errors[0] + "; nothing was started")
    if dirs.missing_inputs:
        key, path = dirs.missing_inputs[0]
        shipped = Path(plan.config).is_relative_to(catalog.shipped_root())
        assets = " (the shipped configs use the tiny assets: run tune-magic assets, or tune_magic.make_assets())" if shipped else ""
        raise PlanError(f"{key} {path} does not exist, so every rank would fail at start-up; create it{assets} "
                        f"or override {key}=...")
    if not force:
        mine = [x for x in (dirs.output_dir, dirs.metric_log_dir, dirs.checkpoint_dir) if x]
        for job in running:
            theirs = [x for x in (job.output_dir, job.record.metric_log_dir, job.record.checkpoint_dir) if x]
            clash = next(((m, t) for m in mine for t in theirs if _same_or_nested(m, t)), None)
            if clash:
                raise PlanError(
                    f"{clash[0]} would share {clash[1]} with running job {job.id}; choose another output_dir=..., "
                    "stop that job, or pass --force / force=True"
                )
    for message in dirs.warnings:
        warnings.warn(message, stacklevel=3)

    record = JobRecord(
        id=job_id, name=name or plan.recipe_name or Path(plan.recipe).stem, argv=plan.argv, env=plan.env,
        cwd=cwd, log_path=str(d / jobstore.OUTPUT_LOG), started_at=time.time(), output_dir=dirs.output_dir,
        metric_log_dir=dirs.metric_log_dir, checkpoint_dir=dirs.checkpoint_dir, gpus=plan.gpus,
        distributed=plan.distributed, nproc_per_node=plan.nproc_per_node, rendezvous=plan.rendezvous,
        rendezvous_endpoint=plan.endpoint, warnings=dirs.warnings, recipe=plan.recipe, config=plan.config,
    )
    jobstore.create(record, d.parent)
    with open(d / jobstore.SUPERVISOR_LOG, "ab") as slog:
        # start_new_session: Jupyter's interrupt/restart signal the kernel's process group, not this one.
        sup = subprocess.Popen(
            [sys.executable, "-m", "tune_magic.supervisor", str(d)], cwd=cwd, env=env,
            stdin=subprocess.DEVNULL, stdout=slog, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
        )
    try:
        ctime = psutil.Process(sup.pid).create_time()
    except psutil.Error:
        ctime = time.time()
    jobstore.update(d, supervisor=ProcessRef(sup.pid, ctime))
    job = Job(d)
    deadline = time.monotonic() + START_TIMEOUT_S
    while job.refresh().record.agent is None:
        if job.record.status != RUNNING or sup.poll() is not None:
            why = job.record.error or f"the supervisor exited with {sup.poll()}"
            raise JobStartError(f"job {job_id} did not start: {why}; see {d / jobstore.SUPERVISOR_LOG}")
        if time.monotonic() > deadline:
            raise JobStartError(f"job {job_id} did not start within {START_TIMEOUT_S} s; see {d / jobstore.SUPERVISOR_LOG}")
        time.sleep(0.005)
    return job


def jobs() -> list[Job]:
    """Return every job in the registry (running and finished), oldest first; corrupt records skipped."""
    return [Job(jobstore.job_dir(r.id), r).refresh() for r in jobstore.list_records()]


def get_job(job_id: str) -> Job:
    """Return the job with this id.

    Raises:
        PlanError: the id is malformed (``/``, ``..``).
        JobNotFound: no such job.
    """
    check_job_id(job_id)
    d = jobstore.job_dir(job_id)
    try:
        return Job(d).refresh()
    except jobstore.CorruptRecord:
        raise JobNotFound(f"no job {job_id!r}; tune-magic jobs lists the jobs") from None


def remove(job_id: str) -> None:
    """Delete a finished job's record and log (its output_dir is kept).

    Raises:
        PlanError: the job is still running (stop it first).
        JobNotFound: no such job.
    """
    check_job_id(job_id)
    d = jobstore.job_dir(job_id)
    try:
        job = Job(d).refresh()
    except jobstore.CorruptRecord:
        if not d.is_dir():
            raise JobNotFound(f"no job {job_id!r}; tune-magic jobs lists the jobs") from None
        shutil.rmtree(d)  # an unreadable record: nothing can be signalled or followed through it
        return
    if job.status == RUNNING:
        raise PlanError(f"job {job_id} is running; stop it first (tune-magic stop {job_id})")
    shutil.rmtree(job.dir)
