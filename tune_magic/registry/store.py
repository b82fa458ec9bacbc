"""The per-user job registry on disk: one directory per job with a validated JSON record.

Layout (``$TUNE_MAGIC_HOME/jobs``, directories mode 0700)::

    jobs/.launch.lock              flock()ed while a launch checks for clashes and registers
    jobs/.staging-<id>/            a launch being registered (renamed to jobs/<id> in one step)
    jobs/<id>/record.json          the record (this module's JobRecord), replaced atomically
    jobs/<id>/record.lock          flock()ed around every read-modify-write of the record
    jobs/<id>/procs.json           the job's processes (supervisor, agent, workers): enough to stop
                                   the job even when record.json is damaged
    jobs/<id>/supervisor.lock      flock()ed by the job's supervisor for its whole life (liveness)
    jobs/<id>/exit_code            the job's exit code, written by a wrapper that outlives the
                                   supervisor
    jobs/<id>/stop_requested       present once a user asked to stop the job
    jobs/<id>/output.log           the job's combined stdout+stderr (appended by the job itself)
    jobs/<id>/supervisor.log       the supervisor's own messages
    jobs/<id>/failure.json         why a failed job failed, with the whole traceback (failure.py)

Both the launching process and the job's supervisor update the record, so every update is a
read-modify-write under an exclusive ``flock``. Files inside a job directory, the directory itself
and ``.launch.lock`` are opened without following symbolic links (``O_NOFOLLOW``): a link planted
in the registry never makes tune_magic create or write a file elsewhere. ``$TUNE_MAGIC_HOME``,
``jobs/`` and their parents may be links (``~/.cache -> /scratch/...``).

Reading never writes: listing a read-only registry works. Nothing here imports torch or IPython:
the supervisor imports this module and must start fast.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import shutil
import stat as _stat
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from tune_magic.errors import StateDirError
from tune_magic.paths import home
from tune_magic.registry.status import Status

RECORD = "record.json"
LOCK = "record.lock"
PROCS = "procs.json"
SUPERVISOR_LOCK = "supervisor.lock"
EXIT_CODE = "exit_code"
STOP_REQUESTED = "stop_requested"
OUTPUT_LOG = "output.log"
SUPERVISOR_LOG = "supervisor.log"
FAILURE = "failure.json"
LAUNCH_LOCK = ".launch.lock"
STAGING_PREFIX = ".staging-"
#: Record schema written now. 1: before the status model (no ``scheduler``, four statuses).
SCHEMA = 2
#: Largest record file read, in bytes (a record is a few KiB; anything larger is damage).
MAX_RECORD_BYTES = 4 << 20

#: Job states (``Status`` members; equal to their string values).
PENDING, RUNNING, UNKNOWN = Status.PENDING, Status.RUNNING, Status.UNKNOWN
SUCCEEDED, FAILED, STOPPED = Status.SUCCEEDED, Status.FAILED, Status.STOPPED
STATES = tuple(s.value for s in Status)

_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class CorruptRecord(ValueError):
    """A job record that is missing, unreadable or fails validation."""


@dataclass
class ProcessRef:
    """A process identified so that a recycled pid is never mistaken for it.

    Attributes:
        pid: the process id.
        create_time: its start time as psutil reports it (seconds since the epoch).
        rank: the worker's global rank (``RANK``), or ``None`` for non-workers.
    """

    pid: int
    create_time: float
    rank: int | None = None


@dataclass
class JobRecord:
    """Everything known about one job; the JSON file's schema (version :data:`SCHEMA`).

    Times are unix seconds. ``argv`` is the final command (with the per-job ``output_dir``);
    ``env`` holds only the job's additions to the launching process's environment. ``status`` is
    a :class:`tune_magic.registry.status.Status` value; change it only through :meth:`set_status`.
    ``log_lost_at`` is set when the job's directory was deleted while it ran and the supervisor
    recreated it: the log before that moment is gone. The ``slurm_*``, ``num_nodes``, ``nodes``,
    ``rank_hosts`` (``{host, rank}`` the batch script reported), ``pending_reason`` and
    ``time_limit`` fields belong to SLURM jobs (a local job has one node, this host).
    ``epochs`` and ``max_steps_per_epoch`` are the config's keys of those names as resolved at
    launch (positive integers, or ``None`` when unset or not a number): how long the run is.
    """

    id: str
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log_path: str
    started_at: float
    status: str = RUNNING.value
    output_dir: str | None = None
    metric_log_dir: str | None = None
    checkpoint_dir: str | None = None
    gpus: list[int] | None = None
    physical_gpus: list[int | str] | None = None
    distributed: bool = False
    nproc_per_node: str | None = None
    rendezvous: str | None = None
    rendezvous_endpoint: str | None = None
    supervisor: ProcessRef | None = None
    agent: ProcessRef | None = None
    workers: list[ProcessRef] = field(default_factory=list)
    ended_at: float | None = None
    returncode: int | None = None
    error: str | None = None
    stop_requested: bool = False
    warnings: list[str] = field(default_factory=list)
    recipe: str | None = None
    config: str | None = None
    rank_log_dir: str | None = None
    scheduler: str = "local"
    slurm_job_id: str | None = None
    slurm_conf: str | None = None
    num_nodes: int = 1
    nodes: list[str] = field(default_factory=list)
    rank_hosts: list[dict] = field(default_factory=list)
    pending_reason: str | None = None
    time_limit: str | None = None
    log_lost_at: float | None = None
    epochs: int | None = None
    max_steps_per_epoch: int | None = None
    schema: int = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready dict (always written as the current :data:`SCHEMA`)."""
        data = asdict(self)
        data["status"] = str(self.status)
        data["schema"] = SCHEMA
        return data

    @property
    def state(self) -> Status:
        """``status`` as a :class:`Status`."""
        return Status(self.status)

    def set_status(self, new: str | Status) -> bool:
        """Move to ``new`` through :func:`tune_magic.registry.status.transition`; return whether it moved.

        A terminal status is never left: recording an end twice keeps the first.
        """
        from tune_magic.registry.status import transition

        moved = transition(self.status, new)
        changed = moved.value != self.status
        self.status = moved.value
        return changed

    @classmethod
    def from_dict(cls, data: Any) -> "JobRecord":
        """Validate and build a record: every field must have its type (numbers finite and
        representable as floats). Records of schema 1 (before the status model) load too.

        Raises:
            CorruptRecord: not a mapping, a required field missing, a field of the wrong type,
                or an unknown status.
        """
        if not isinstance(data, dict):
            raise CorruptRecord("record is not a JSON object")
        kwargs = {k: v for k, v in data.items() if k in _FIELD_TYPES}
        for name, (kinds, required) in _FIELD_TYPES.items():
            if name not in kwargs:
                if required:
                    raise CorruptRecord(f"field {name!r} is missing")
                continue
            value = kwargs[name]
            if value is None and type(None) in kinds:
                continue
            if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
                raise CorruptRecord(f"field {name!r} has the wrong type ({type(value).__name__})")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not _finite(value):
                raise CorruptRecord(f"field {name!r} is not a finite number")
        if not kwargs["argv"] or not all(isinstance(a, str) for a in kwargs["argv"]):
            raise CorruptRecord("argv must be a non-empty list of strings")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in kwargs["env"].items()):
            raise CorruptRecord("env must map strings to strings")
        if kwargs.get("status", RUNNING.value) not in STATES:
            raise CorruptRecord(f"unknown status {kwargs.get('status')!r}")
        if kwargs.get("physical_gpus") is not None and not all(
                isinstance(x, (int, str)) and not isinstance(x, bool) for x in kwargs["physical_gpus"]):
            raise CorruptRecord("field 'physical_gpus' has items of the wrong type")
        if not all(isinstance(x, str) for x in kwargs.get("nodes") or []):
            raise CorruptRecord("field 'nodes' has items of the wrong type")
        if not all(isinstance(x, dict) and isinstance(x.get("host"), str) and isinstance(x.get("rank"), int)
                   for x in kwargs.get("rank_hosts") or []):
            raise CorruptRecord("field 'rank_hosts' must hold {host, rank} objects")
        for key in ("gpus", "warnings"):
            if kwargs.get(key) is not None and not all(
                isinstance(x, int if key == "gpus" else str) and not isinstance(x, bool) for x in kwargs[key]
            ):
                raise CorruptRecord(f"field {key!r} has items of the wrong type")
        for key in ("epochs", "max_steps_per_epoch"):
            if kwargs.get(key) is not None and kwargs[key] < 1:
                raise CorruptRecord(f"field {key!r} must be a positive integer")
        for key in ("supervisor", "agent"):
            if kwargs.get(key) is not None:
                kwargs[key] = _process_ref(kwargs[key])
        kwargs["workers"] = [_process_ref(w) for w in kwargs.get("workers") or []]
        kwargs["schema"] = SCHEMA
        return cls(**kwargs)


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int such as 10**400 passes isinstance, then breaks every table
        return False


def _process_ref(data: Any) -> ProcessRef:
    if not isinstance(data, dict):
        raise CorruptRecord("a process reference is not an object")
    pid, ctime, rank = data.get("pid"), data.get("create_time"), data.get("rank")
    if (not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 1 << 31
            or not isinstance(ctime, (int, float)) or isinstance(ctime, bool) or not _finite(ctime)
            or not (rank is None or (isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 1 << 31))):
        raise CorruptRecord(f"bad process reference {str(data)[:200]}")
    return ProcessRef(pid, float(ctime), rank)


_NUM = (int, float)
_OPT_STR = (str, type(None))
# field -> (allowed types, required)
_FIELD_TYPES: dict[str, tuple[tuple, bool]] = {
    "id": ((str,), True), "name": ((str,), True), "argv": ((list,), True), "env": ((dict,), True),
    "cwd": ((str,), True), "log_path": ((str,), True), "started_at": (_NUM, True),
    "status": ((str,), False), "output_dir": (_OPT_STR, False), "metric_log_dir": (_OPT_STR, False),
    "checkpoint_dir": (_OPT_STR, False), "gpus": ((list, type(None)), False),
    "physical_gpus": ((list, type(None)), False), "distributed": ((bool,), False),
    "nproc_per_node": (_OPT_STR, False), "rendezvous": (_OPT_STR, False), "rendezvous_endpoint": (_OPT_STR, False),
    "supervisor": ((dict, type(None)), False), "agent": ((dict, type(None)), False), "workers": ((list,), False),
    "ended_at": ((int, float, type(None)), False), "returncode": ((int, type(None)), False),
    "error": (_OPT_STR, False), "stop_requested": ((bool,), False), "warnings": ((list,), False),
    "recipe": (_OPT_STR, False), "config": (_OPT_STR, False), "rank_log_dir": (_OPT_STR, False),
    "scheduler": ((str,), False), "slurm_job_id": (_OPT_STR, False), "slurm_conf": (_OPT_STR, False),
    "num_nodes": ((int,), False), "nodes": ((list,), False), "rank_hosts": ((list,), False),
    "pending_reason": (_OPT_STR, False), "time_limit": (_OPT_STR, False),
    "log_lost_at": ((int, float, type(None)), False), "epochs": ((int, type(None)), False),
    "max_steps_per_epoch": ((int, type(None)), False), "schema": ((int,), False),
}


# -- safe file access -------------------------------------------------------------------------


def check_job_dir(d: Path) -> Path:
    """Return ``d`` if it is a real directory (not a symbolic link).

    Raises:
        StateDirError: ``d`` is a symbolic link (tune_magic never follows links inside the
            registry) or not a directory.
        FileNotFoundError: ``d`` does not exist.
    """
    st = os.lstat(d)
    if _stat.S_ISLNK(st.st_mode):
        raise StateDirError(
            f"job directory {d} is a symbolic link; tune_magic never follows links inside its registry. "
            f"Remove the link itself (rm {d}) or move the real directory there"
        )
    if not _stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"{d} in the job registry is not a directory; remove it (rm {d})")
    return d


def open_nofollow(path: Path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` that refuses a symbolic link at ``path`` (``ELOOP``) and is close-on-exec."""
    return os.open(path, flags | _NOFOLLOW, mode)


def read_bytes(path: Path, limit: int = MAX_RECORD_BYTES) -> bytes:
    """Read at most ``limit`` bytes of ``path`` without following a link at it.

    Raises:
        OSError: missing, a link (``ELOOP``), unreadable.
    """
    fd = open_nofollow(path, os.O_RDONLY)
    try:
        want = limit + 1
        # a read of n bytes allocates n bytes first: size the first one by the file (a 4 MiB buffer
        # per record cost more than the read itself, and listings read a record per job)
        step = min(want, os.fstat(fd).st_size + 1)
        chunks, got = [], 0
        while got < want:
            chunk = os.read(fd, min(step, want - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
            step = 64 << 10  # small: at the end of the file this read only meets EOF
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` in one step: readers see the old or the new file.

    The temporary file is created with ``O_EXCL`` next to ``path``; ``os.replace`` replaces a link
    at ``path`` itself, never its target.

    Raises:
        OSError: e.g. ``ENOSPC`` (the old file is then left as it was).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: Path, limit: int = MAX_RECORD_BYTES) -> Any:
    """Parse the JSON file at ``path`` (no link followed).

    Raises:
        OSError: missing or unreadable.
        ValueError: not JSON, too large, or too deeply nested.
    """
    data = read_bytes(path, limit)
    if len(data) > limit:
        raise ValueError(f"{path.name} is larger than {limit} bytes")
    try:
        return json.loads(data)
    except RecursionError:  # "[[[[...]]]]" nested deeper than the parser's stack
        raise ValueError(f"{path.name} is nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path.name} is not UTF-8 ({exc.reason})") from None


@contextmanager
def flocked(path: Path, exclusive: bool = True) -> Iterator[int]:
    """Hold an ``flock`` on ``path`` (created 0600 if missing, never through a link: a link planted
    there is removed — the link itself, never its target — and a real lock file made instead)."""
    try:
        fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        if exc.errno != errno.ELOOP or not os.path.islink(path):
            raise
        os.unlink(path)
        fd = open_nofollow(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


def lock_is_held(path: Path) -> bool | None:
    """Return whether some process holds an ``flock`` on ``path``: ``None`` if the file is
    missing or cannot be opened. Opens read-only, so it works in a read-only registry."""
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return False


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` means the filesystem has no room (``ENOSPC``, ``EDQUOT``)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


# -- the registry -----------------------------------------------------------------------------


def jobs_root(env=None, *, create: bool = True) -> Path:
    """Return ``$TUNE_MAGIC_HOME/jobs``.

    Args:
        env: environment to read ``TUNE_MAGIC_HOME`` from (default ``os.environ``).
        create: create it (mode 0700) and require write access, as launching needs. Readers pass
            ``False``: a missing or read-only registry is then fine.

    Raises:
        StateDirError: ``create`` and it cannot be created or is not a writable directory.
    """
    root = home(env) / "jobs"
    if not create:
        return root
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise StateDirError(f"cannot use {root} for job records ({exc.strerror or exc}); point TUNE_MAGIC_HOME "
                            "at a writable directory") from None
    if not root.is_dir() or not os.access(root, os.W_OK | os.X_OK):
        raise StateDirError(f"{root} is not writable; point TUNE_MAGIC_HOME at a writable directory")
    return root


def job_dir(job_id: str, root: Path | None = None) -> Path:
    """Return the directory of ``job_id`` (not checked to exist)."""
    return (root or jobs_root(create=False)) / job_id


def staging_dir(job_id: str, root: Path) -> Path:
    """Return the hidden directory where a launch prepares ``job_id`` before it is registered."""
    return root / f"{STAGING_PREFIX}{job_id}"


def create(record: JobRecord, root: Path | None = None) -> Path:
    """Write a job's first record, creating its directory (mode 0700).

    Raises:
        FileExistsError: a job with this id has a record already.
    """
    d = job_dir(record.id, root)
    try:
        d.mkdir(mode=0o700)
    except FileExistsError:
        check_job_dir(d)
        if os.path.lexists(d / RECORD):
            raise FileExistsError(f"job {record.id} exists already") from None
    write_record(d, record)
    return d


def write_record(d: Path, record: JobRecord, *, fsync: bool = True) -> None:
    """Replace ``d``'s record with ``record`` in one step (no lock taken; see :func:`locked`)."""
    write_atomic(d / RECORD, json.dumps(record.to_dict(), indent=1).encode(), fsync=fsync)


def stamp(d: Path) -> tuple | None:
    """Return an identity of ``d``'s record file that changes with every write (inode, mtime,
    size), or ``None`` if it cannot be read. Lets readers skip re-parsing an unchanged record."""
    try:
        st = os.stat(d / RECORD, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def read(d: Path) -> JobRecord:
    """Read and validate the record in job directory ``d``; its id must be the directory's name.

    Never writes. Pathological files (deep nesting, huge numbers, binary) are :class:`CorruptRecord`.

    Raises:
        CorruptRecord: missing, not JSON, invalid, or ``d`` is a symbolic link.
    """
    try:
        check_job_dir(d)
        data = read_json(d / RECORD)
    except FileNotFoundError:
        raise CorruptRecord(f"no record in {d}") from None
    except StateDirError as exc:
        raise CorruptRecord(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise CorruptRecord(f"unreadable record in {d}: {exc}") from None
    record = JobRecord.from_dict(data)
    if record.id != d.name:
        raise CorruptRecord(f"record in {d} names another job id ({record.id!r})")
    return record


@contextmanager
def locked(d: Path) -> Iterator[JobRecord]:
    """Hold the job's lock; yield its record; write it back when the block ends without error."""
    check_job_dir(d)
    with flocked(d / LOCK):
        record = read(d)
        yield record
        write_record(d, record)


def update(d: Path, **changes: Any) -> JobRecord:
    """Set fields of the record in ``d`` atomically under the lock; return the new record.

    A ``status`` change goes through the transition rule (a terminal status is never left).
    """
    with locked(d) as record:
        for key, value in changes.items():
            if key == "status":
                record.set_status(value)
            else:
                setattr(record, key, value)
    return record


@dataclass
class Skipped:
    """A job directory a listing could not use: its path and why (one line)."""

    path: Path
    reason: str


def list_records(root: Path | None = None, skipped: list | None = None) -> list[JobRecord]:
    """Return every valid record, oldest first. Never writes; a missing registry is empty.

    Damaged records (any error while reading one, including ``RecursionError`` or
    ``OverflowError`` from pathological JSON) are skipped: each is appended to ``skipped`` as its
    path (or, when ``skipped`` is a list of :class:`Skipped`, see :func:`list_records_checked`).
    Hidden entries (``.launch.lock``, ``.staging-*``) are not jobs.
    """
    records, bad = list_records_checked(root)
    if skipped is not None:
        skipped.extend(s.path for s in bad)
    return records


def list_records_checked(root: Path | None = None, stamps: dict[str, tuple] | None = None,
                         ) -> tuple[list[JobRecord], list[Skipped]]:
    """As :func:`list_records`, also returning the skipped directories with one-line reasons.

    Args:
        stamps: when given, filled with job id -> :func:`stamp` of its record file, taken just
            before the record was read (so a record replaced meanwhile has another stamp and is
            read again by whoever compares them: never an old record under a new stamp).
    """
    root = root or jobs_root(create=False)
    out, bad = [], []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return [], []
    except NotADirectoryError:
        raise StateDirError(f"{root} (or a folder above it) is not a directory, so it holds no jobs; point "
                            "TUNE_MAGIC_HOME at a directory") from None
    except OSError as exc:
        raise StateDirError(f"cannot read the job registry {root} ({exc.strerror or exc}); "
                            "point TUNE_MAGIC_HOME at a readable directory") from None
    for entry in entries:
        if entry.name.startswith("."):
            continue
        d = Path(entry.path)
        try:
            if not entry.is_dir(follow_symlinks=False):
                if entry.is_symlink():
                    bad.append(Skipped(d, "a symbolic link, not a job directory (tune_magic never follows it)"))
                continue
            before = stamp(d) if stamps is not None else None
            record = read(d)
            out.append(record)
            if stamps is not None:
                stamps[record.id] = before
        except CorruptRecord as exc:
            bad.append(Skipped(d, str(exc).splitlines()[0][:300]))
        except Exception as exc:  # a listing never fails because one record is bad
            bad.append(Skipped(d, f"unreadable record ({type(exc).__name__})"))
    return sorted(out, key=lambda r: (r.started_at, r.id)), bad


# -- small per-job files ------------------------------------------------------------------------


def write_procs(d: Path, supervisor: ProcessRef | None = None, agent: ProcessRef | None = None,
                workers: list[ProcessRef] | None = None, *, merge: bool = True, scheduler: str | None = None) -> None:
    """Record the job's processes in ``procs.json`` (kept apart from the record so that a damaged
    record never hides what must be stopped). With ``merge``, fields not given keep their value.

    Raises:
        OSError: the file cannot be written (e.g. ``ENOSPC``).
    """
    data = read_procs(d) if merge else {}
    if supervisor is not None:
        data["supervisor"] = supervisor
    if agent is not None:
        data["agent"] = agent
    if workers is not None:
        data["workers"] = workers
    if scheduler is not None:
        data["scheduler"] = scheduler
    out = {k: (asdict(v) if isinstance(v, ProcessRef) else v if isinstance(v, str) else [asdict(w) for w in v])
           for k, v in data.items()}
    write_atomic(d / PROCS, json.dumps(out).encode(), fsync=False)


def read_procs(d: Path) -> dict[str, Any]:
    """Return ``{"supervisor": ProcessRef, "agent": ProcessRef, "workers": [ProcessRef],
    "scheduler": str}`` (keys present only when known) from ``procs.json``; ``{}`` when missing or
    damaged. The scheduler is written at registration, so a damaged record still says where the
    job runs."""
    try:
        data = read_json(d / PROCS, 1 << 20)
    except (OSError, ValueError):
        return {}
    out: dict[str, Any] = {}
    if not isinstance(data, dict):
        return out
    try:
        for key in ("supervisor", "agent"):
            if isinstance(data.get(key), dict):
                out[key] = _process_ref(data[key])
        if isinstance(data.get("workers"), list):
            out["workers"] = [_process_ref(w) for w in data["workers"]]
    except CorruptRecord:
        return {}
    if data.get("scheduler") in ("local", "slurm"):
        out["scheduler"] = data["scheduler"]
    return out


@dataclass(frozen=True)
class ExitInfo:
    """What the job's exit wrapper wrote: the exit code (negative: killed by that signal) and
    when (unix seconds)."""

    returncode: int
    ended_at: float


def read_exit_code(d: Path) -> ExitInfo | None:
    """Return the job's recorded exit, or ``None`` while none is written (or it is damaged).

    Format (this module's, written by ``tune_magic/schedulers/local/exitwrap.py``): a JSON object
    ``{"returncode": int, "ended_at": float}`` padded with spaces; all spaces means "not yet".
    """
    try:
        data = read_json(d / EXIT_CODE, 4096)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    code, ended = data.get("returncode"), data.get("ended_at")
    if not isinstance(code, int) or isinstance(code, bool) or not -256 < code < 1 << 16:
        return None
    if not isinstance(ended, (int, float)) or isinstance(ended, bool) or not _finite(ended):
        ended = os.stat(d / EXIT_CODE).st_mtime if os.path.exists(d / EXIT_CODE) else time.time()
    return ExitInfo(code, float(ended))


def stop_was_requested(d: Path, record: JobRecord | None = None) -> bool:
    """Whether a user asked to stop the job (the record's flag, or the marker file a stop writes
    when the record cannot be written)."""
    return bool(record is not None and record.stop_requested) or os.path.lexists(d / STOP_REQUESTED)


def mark_stop_requested(d: Path) -> bool:
    """Record a stop request as cheaply as possible; return whether it was recorded.

    Tries the record (under its lock), then an empty marker file (needs no data blocks, so it
    usually works on a full disk). Never raises for a write that fails: a stop must go on to
    signal the job whatever the disk says.
    """
    ok = False
    try:
        update(d, stop_requested=True)
        ok = True
    except (OSError, CorruptRecord, StateDirError):
        pass
    try:
        os.close(open_nofollow(d / STOP_REQUESTED, os.O_WRONLY | os.O_CREAT))
        ok = True
    except OSError:
        pass
    return ok


def remove_tree(d: Path) -> None:
    """Delete a job directory (refusing a symbolic link: its target is never touched).

    Raises:
        StateDirError: ``d`` is a link.
    """
    check_job_dir(d)
    shutil.rmtree(d)
