"""The per-user job registry on disk: one directory per job with a validated JSON record.

Layout (``$TUNE_MAGIC_HOME/jobs``, directories mode 0700)::

    jobs/<job id>/record.json    the record (this module's JobRecord), replaced atomically
    jobs/<job id>/record.lock    flock()ed around every read-modify-write
    jobs/<job id>/output.log     the job's combined stdout+stderr (appended by the job itself)
    jobs/<job id>/supervisor.log the supervisor's own messages

Both the launching process and the job's supervisor update the record, so every update is a
read-modify-write under an exclusive ``flock``. Nothing here imports torch or IPython: the
supervisor imports this module and must start fast.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

from .errors import StateDirError
from .paths import home

RECORD = "record.json"
LOCK = "record.lock"
OUTPUT_LOG = "output.log"
SUPERVISOR_LOG = "supervisor.log"
SCHEMA = 1

#: Job states. ``running`` until the process tree exits; then one of the three final states.
RUNNING, SUCCEEDED, FAILED, STOPPED = "running", "succeeded", "failed", "stopped"
STATES = (RUNNING, SUCCEEDED, FAILED, STOPPED)


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
    """Everything known about one job; the JSON file's schema.

    Times are unix seconds. ``argv`` is the final command (with the per-job ``output_dir``);
    ``env`` holds only the job's additions to the launching process's environment.
    """

    id: str
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log_path: str
    started_at: float
    status: str = RUNNING
    output_dir: str | None = None
    metric_log_dir: str | None = None
    checkpoint_dir: str | None = None
    gpus: list[int] | None = None
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
    schema: int = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "JobRecord":
        """Validate and build a record: every field must have its type (times finite numbers).

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
            if isinstance(value, float) and not math.isfinite(value):
                raise CorruptRecord(f"field {name!r} is not a finite number")
        if not kwargs["argv"] or not all(isinstance(a, str) for a in kwargs["argv"]):
            raise CorruptRecord("argv must be a non-empty list of strings")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in kwargs["env"].items()):
            raise CorruptRecord("env must map strings to strings")
        if kwargs.get("status", RUNNING) not in STATES:
            raise CorruptRecord(f"unknown status {kwargs.get('status')!r}")
        for key in ("gpus", "warnings"):
            if kwargs.get(key) is not None and not all(isinstance(x, int if key == "gpus" else str)
                                                       for x in kwargs[key]):
                raise CorruptRecord(f"field {key!r} has items of the wrong type")
        for key in ("supervisor", "agent"):
            if kwargs.get(key) is not None:
                kwargs[key] = _process_ref(kwargs[key])
        kwargs["workers"] = [_process_ref(w) for w in kwargs.get("workers") or []]
        return cls(**kwargs)


def _process_ref(data: Any) -> ProcessRef:
    if not isinstance(data, dict):
        raise CorruptRecord("a process reference is not an object")
    pid, ctime, rank = data.get("pid"), data.get("create_time"), data.get("rank")
    if (not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0
            or not isinstance(ctime, (int, float)) or isinstance(ctime, bool) or not math.isfinite(ctime)
            or not (rank is None or (isinstance(rank, int) and not isinstance(rank, bool)))):
        raise CorruptRecord(f"bad process reference {data!r}")
    return ProcessRef(pid, float(ctime), rank)


_NUM = (int, float)
_OPT_STR = (str, type(None))
# field -> (allowed types, required)
_FIELD_TYPES: dict[str, tuple[tuple, bool]] = {
    "id": ((str,), True), "name": ((str,), True), "argv": ((list,), True), "env": ((dict,), True),
    "cwd": ((str,), True), "log_path": ((str,), True), "started_at": (_NUM, True),
    "status": ((str,), False), "output_dir": (_OPT_STR, False), "metric_log_dir": (_OPT_STR, False),
    "checkpoint_dir": (_OPT_STR, False), "gpus": ((list, type(None)), False), "distributed": ((bool,), False),
    "nproc_per_node": (_OPT_STR, False), "rendezvous": (_OPT_STR, False), "rendezvous_endpoint": (_OPT_STR, False),
    "supervisor": ((dict, type(None)), False), "agent": ((dict, type(None)), False), "workers": ((list,), False),
    "ended_at": ((int, float, type(None)), False), "returncode": ((int, type(None)), False),
    "error": (_OPT_STR, False), "stop_requested": ((bool,), False), "warnings": ((list,), False),
    "recipe": (_OPT_STR, False), "config": (_OPT_STR, False), "schema": ((int,), False),
}


def jobs_root(env=None) -> Path:
    """Return ``$TUNE_MAGIC_HOME/jobs``, created with mode 0700.

    Raises:
        StateDirError: it cannot be created or is not a writable directory.
    """
    root = home(env) / "jobs"
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise StateDirError(f"cannot use {root} for job records ({exc.strerror or exc}); point TUNE_MAGIC_HOME "
                            "at a writable directory") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise StateDirError(f"{root} is not writable; point TUNE_MAGIC_HOME at a writable directory")
    return root


def job_dir(job_id: str, root: Path | None = None) -> Path:
    """Return the directory of ``job_id`` (not checked to exist)."""
    return (root or jobs_root()) / job_id


def reserve(job_id: str, root: Path | None = None) -> Path:
    """Create an empty job directory (mode 0700). Until :func:`create` writes its record, listings
    skip it; remove it with ``shutil.rmtree`` if the launch is abandoned.

    Raises:
        FileExistsError: a job with this id exists already.
    """
    d = job_dir(job_id, root)
    d.mkdir(mode=0o700)
    return d


def create(record: JobRecord, root: Path | None = None) -> Path:
    """Write a job's first record, creating its directory (mode 0700) unless :func:`reserve` did.

    Raises:
        FileExistsError: a job with this id has a record already.
    """
    d = job_dir(record.id, root)
    if not d.is_dir():
        d.mkdir(mode=0o700)
    if (d / RECORD).exists():
        raise FileExistsError(f"job {record.id} exists already")
    _write(d, record)
    return d


def _write(d: Path, record: JobRecord) -> None:
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".record.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record.to_dict(), f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, d / RECORD)  # readers see the old or the new record, never half of one
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stamp(d: Path) -> tuple | None:
    """Return an identity of ``d``'s record file that changes with every write (inode, mtime,
    size), or ``None`` if it cannot be read. Lets readers skip re-parsing an unchanged record."""
    try:
        st = os.stat(d / RECORD)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def read(d: Path) -> JobRecord:
    """Read and validate the record in job directory ``d``; its id must be the directory's name.

    Raises:
        CorruptRecord: missing, not JSON, or invalid.
    """
    try:
        data = json.loads((d / RECORD).read_text())
    except FileNotFoundError:
        raise CorruptRecord(f"no record in {d}") from None
    except (OSError, ValueError) as exc:
        raise CorruptRecord(f"unreadable record in {d}: {exc}") from None
    record = JobRecord.from_dict(data)
    if record.id != d.name:
        raise CorruptRecord(f"record in {d} names another job id ({record.id!r})")
    return record


@contextmanager
def locked(d: Path) -> Iterator[JobRecord]:
    """Hold the job's lock; yield its record; write it back when the block ends without error."""
    with open(d / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            record = read(d)
            yield record
            _write(d, record)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def update(d: Path, **changes: Any) -> JobRecord:
    """Set fields of the record in ``d`` atomically under the lock; return the new record."""
    with locked(d) as record:
        for key, value in changes.items():
            setattr(record, key, value)
    return record


def list_records(root: Path | None = None, skipped: list[Path] | None = None) -> list[JobRecord]:
    """Return every valid record, oldest first.

    Corrupt or half-created job directories are skipped (appended to ``skipped`` when given);
    ``tune-magic rm ID`` removes them.
    """
    root = root or jobs_root()
    out = []
    for d in root.iterdir():
        if d.is_dir() and not d.name.startswith("."):
            try:
                out.append(read(d))
            except CorruptRecord:
                if skipped is not None:
                    skipped.append(d)
    return sorted(out, key=lambda r: (r.started_at, r.id))
