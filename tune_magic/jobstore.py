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
import os
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

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
        """Validate and build a record.

        Raises:
            CorruptRecord: not a mapping, a required field missing, a field of the wrong type,
                or an unknown status.
        """
        if not isinstance(data, dict):
            raise CorruptRecord("record is not a JSON object")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        for required, kind in (("id", str), ("name", str), ("cwd", str), ("log_path", str), ("argv", list),
                               ("env", dict), ("started_at", (int, float))):
            if not isinstance(kwargs.get(required), kind) or isinstance(kwargs.get(required), bool):
                raise CorruptRecord(f"field {required!r} missing or not {getattr(kind, '__name__', 'a number')}")
        if not all(isinstance(a, str) for a in kwargs["argv"]) or not kwargs["argv"]:
            raise CorruptRecord("argv must be a non-empty list of strings")
        if kwargs.get("status", RUNNING) not in STATES:
            raise CorruptRecord(f"unknown status {kwargs.get('status')!r}")
        try:
            for key in ("supervisor", "agent"):
                if kwargs.get(key) is not None:
                    kwargs[key] = ProcessRef(**kwargs[key])
            kwargs["workers"] = [ProcessRef(**w) for w in kwargs.get("workers") or []]
        except TypeError as exc:
            raise CorruptRecord(f"bad process reference: {exc}") from None
        return cls(**kwargs)


def jobs_root(env=None) -> Path:
    """Return ``$TUNE_MAGIC_HOME/jobs``, created with mode 0700."""
    root = home(env) / "jobs"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
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


def read(d: Path) -> JobRecord:
    """Read and validate the record in job directory ``d``.

    Raises:
        CorruptRecord: missing, not JSON, or invalid.
    """
    try:
        data = json.loads((d / RECORD).read_text())
    except FileNotFoundError:
        raise CorruptRecord(f"no record in {d}") from None
    except (OSError, ValueError) as exc:
        raise CorruptRecord(f"unreadable record in {d}: {exc}") from None
    return JobRecord.from_dict(data)


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


def list_records(root: Path | None = None) -> list[JobRecord]:
    """Return every valid record, oldest first; corrupt or half-created ones are skipped."""
    root = root or jobs_root()
    out = []
    for d in root.iterdir():
        if d.is_dir():
            try:
                out.append(read(d))
            except CorruptRecord:
                continue
    return sorted(out, key=lambda r: (r.started_at, r.id))
