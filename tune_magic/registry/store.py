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

import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from tune_magic.errors import StateDirError
from tune_magic.paths import home
from tune_magic.registry.files import (  # noqa: F401  (the registry's file access, used through this module)
    MAX_RECORD_BYTES, check_job_dir, disk_full, flocked, lock_is_held, open_nofollow, read_bytes, read_json,
    write_atomic,
)
from tune_magic.registry.record import (  # noqa: F401
    SCHEMA, STATES, CorruptRecord, JobRecord, ProcessRef, finite_number, parse_process_ref,
)
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
#: Seconds a staging directory without a live launcher is kept before a listing removes it.
STAGING_GRACE_S = 2.0

#: Job states (``Status`` members; equal to their string values).
PENDING, RUNNING, UNKNOWN = Status.PENDING, Status.RUNNING, Status.UNKNOWN
SUCCEEDED, FAILED, STOPPED = Status.SUCCEEDED, Status.FAILED, Status.STOPPED


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


def collect_staging(root: Path) -> None:
    """Remove staging directories of launches that died before registering (best effort): those
    whose ``supervisor.lock`` nobody holds and that are older than :data:`STAGING_GRACE_S`."""
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(STAGING_PREFIX)]
    except OSError:
        return
    now = time.time()
    for e in entries:
        d = Path(e.path)
        try:
            if lock_is_held(d / SUPERVISOR_LOCK):
                continue
            if now - os.lstat(d).st_mtime < STAGING_GRACE_S:
                continue  # a launcher between mkdir and taking its lock
            if not e.is_dir(follow_symlinks=False):
                continue
            shutil.rmtree(d, ignore_errors=True)
        except OSError:
            continue


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
def locked(d: Path, migrate: Callable[[JobRecord], None] | None = None) -> Iterator[JobRecord]:
    """Hold the job's lock; yield its record (passed through ``migrate`` first, which moves an
    earlier release's fields into place: ``Scheduler.migrate``); write it back when the block ends
    without error."""
    check_job_dir(d)
    with flocked(d / LOCK):
        record = read(d)
        if migrate is not None:
            migrate(record)
        yield record
        write_record(d, record)


def update(d: Path, *, migrate: Callable[[JobRecord], None] | None = None, **changes: Any) -> JobRecord:
    """Set fields of the record in ``d`` atomically under the lock; return the new record.

    A ``status`` change goes through the transition rule (a terminal status is never left).
    ``migrate``: see :func:`locked`.
    """
    with locked(d, migrate) as record:
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
                workers: list[ProcessRef] | None = None, *, merge: bool = True, scheduler: str | None = None,
                token: str | None = None) -> None:
    """Record the job's processes in ``procs.json`` (kept apart from the record so that a damaged
    record never hides what must be stopped), and the job's token (:mod:`tune_magic.registry.owner`:
    which processes a stop may signal). With ``merge``, fields not given keep their value.

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
    if token is not None:
        data["token"] = token
    out = {k: (asdict(v) if isinstance(v, ProcessRef) else v if isinstance(v, str) else [asdict(w) for w in v])
           for k, v in data.items()}
    write_atomic(d / PROCS, json.dumps(out).encode(), fsync=False)


def read_procs(d: Path) -> dict[str, Any]:
    """Return ``{"supervisor": ProcessRef, "agent": ProcessRef, "workers": [ProcessRef],
    "scheduler": str, "token": str}`` (keys present only when known) from ``procs.json``; ``{}``
    when missing or damaged. The scheduler and the token are written at registration, so a damaged
    record still says where the job runs and which processes are its own."""
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
                out[key] = parse_process_ref(data[key])
        if isinstance(data.get("workers"), list):
            out["workers"] = [parse_process_ref(w) for w in data["workers"]]
    except CorruptRecord:
        return {}
    name = data.get("scheduler")
    if isinstance(name, str) and 0 < len(name) <= 64 and name.isprintable():
        out["scheduler"] = name
    token = data.get("token")
    if isinstance(token, str) and 0 < len(token) <= 200 and token.isprintable():
        out["token"] = token
    return out


@dataclass(frozen=True)
class ExitInfo:
    """What the job's exit wrapper wrote: the exit code (negative: killed by that signal) and
    when (unix seconds)."""

    returncode: int
    ended_at: float


def read_exit_code(d: Path, name: str = EXIT_CODE) -> ExitInfo | None:
    """Return the job's recorded exit, or ``None`` while none is written (or it is damaged).

    Format (this module's, written by ``tune_magic/schedulers/local/exitwrap.py``): a JSON object
    ``{"returncode": int, "ended_at": float}`` padded with spaces; all spaces means "not yet".
    ``name``: the file in ``d`` (an engine that runs a job several times keeps one per attempt).
    """
    try:
        data = read_json(d / name, 4096)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    code, ended = data.get("returncode"), data.get("ended_at")
    if not isinstance(code, int) or isinstance(code, bool) or not -256 < code < 1 << 16:
        return None
    if not isinstance(ended, (int, float)) or isinstance(ended, bool) or not finite_number(ended):
        ended = os.stat(d / name).st_mtime if os.path.exists(d / name) else time.time()
    return ExitInfo(code, float(ended))


def stop_was_requested(d: Path, record: JobRecord | None = None) -> bool:
    """Whether a user asked to stop the job (the record's flag, or the marker file a stop writes
    when the record cannot be written)."""
    return bool(record is not None and record.stop_requested) or os.path.lexists(d / STOP_REQUESTED)


def mark_stop_requested(d: Path, finished: bool | None = None) -> bool:
    """Record a stop request as cheaply as possible; return whether it was recorded.

    Tries the record (under its lock: ``stop_requested``, the first ``stop_requested_at``, and
    ``finished_at_stop`` when ``finished`` is given), then an empty marker file (needs no data
    blocks, so it usually works on a full disk). Never raises for a write that fails: a stop must
    go on to signal the job whatever the disk says.
    """
    ok = False
    try:
        with locked(d) as record:
            record.stop_requested = True
            record.stop_requested_at = record.stop_requested_at or time.time()
            if finished is not None and not record.state.is_terminal:
                record.finished_at_stop = bool(finished)
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
