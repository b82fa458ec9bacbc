"""Sweeps on disk: one directory per sweep next to the jobs. Stdlib only (the sweep process imports it).

Layout (``$TUNE_MAGIC_HOME/sweeps``, directories mode 0700)::

    sweeps/.staging-<id>/          a sweep being registered (renamed to sweeps/<id> in one step)
    sweeps/<id>/sweep.json         the record (:class:`~tune_magic.sweeping.record.SweepRecord`),
                                   replaced atomically
    sweeps/<id>/sweep.backup.json  the same record, written right after it: a damaged sweep.json is
                                   read from here, its trials' states from their own job records
                                   (:func:`rebuild`), and written back whole at the next write
    sweeps/<id>/sweep.lock         flock()ed around every read-modify-write of the record; the sweep
                                   process also holds it while it starts a trial, so a stop and a
                                   start never cross (a stopped sweep starts nothing more)
    sweeps/<id>/supervisor.lock    flock()ed by the sweep process for its whole life (liveness; the
                                   creator holds it until the process inherits it, as for jobs)
    sweeps/<id>/env.json           the creator's environment (mode 0600): every trial, whoever
                                   starts the sweep process again, gets the same one
    sweeps/<id>/runner.log         the sweep process's own messages
    sweeps/<id>/done               present once nothing is queued and nothing runs (listings skip it)

The trials' jobs live in ``jobs/`` like any job; each record names its sweep (``JobRecord.sweep``).
Files are opened without following links, as in :mod:`tune_magic.registry.files`. Reading never
writes: a read-only registry lists.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from tune_magic.errors import StateDirError
from tune_magic.paths import home
from tune_magic.registry.files import check_job_dir, flocked, lock_is_held, open_nofollow, read_json, write_atomic
from tune_magic.registry.ids import new_job_id
from tune_magic.registry import store as jobstore
from tune_magic.registry.record import CorruptRecord
from tune_magic.sweeping.record import QUEUED, STARTED, SweepRecord

SWEEP_FILE = "sweep.json"
BACKUP_FILE = "sweep.backup.json"
SWEEP_LOCK = "sweep.lock"
#: Held by the sweep process for its life (the same name as a job's supervisor lock).
RUNNER_LOCK = "supervisor.lock"
RUNNER_LOG = "runner.log"
ENV_FILE = "env.json"
DONE = "done"
#: Every sweep id starts with this (``sweep-20261201-101500-3fa2c1``); job ids never do.
PREFIX = "sweep-"
#: Largest sweep record read, in bytes (1,000 trials take about 250 KiB).
MAX_SWEEP_BYTES = 16 << 20


#: The sweeps' folder in ``$TUNE_MAGIC_HOME`` (beside ``jobs``).
SWEEPS = "sweeps"


def sweeps_root(env=None, *, create: bool = False) -> Path:
    """``$TUNE_MAGIC_HOME/sweeps`` (created, mode 0700, with ``create``).

    Raises:
        StateDirError: ``create`` and it cannot be created or written.
    """
    root = home(env) / SWEEPS
    if create:
        try:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StateDirError(f"cannot use {root} for sweep records ({exc.strerror or exc}); point "
                                "TUNE_MAGIC_HOME at a writable directory") from None
        if not os.access(root, os.W_OK | os.X_OK):
            raise StateDirError(f"{root} is not writable; point TUNE_MAGIC_HOME at a writable directory")
    return root


def new_sweep_id() -> str:
    """A fresh sweep id: :data:`PREFIX` and a job-id-shaped stamp (sortable by creation)."""
    return PREFIX + new_job_id()


def is_sweep_id(text: str) -> bool:
    """Whether ``text`` has a sweep id's form (job ids never start with :data:`PREFIX`)."""
    return isinstance(text, str) and text.startswith(PREFIX) and "/" not in text and ".." not in text


def sweep_dir(sweep_id: str, root: Path | None = None) -> Path:
    """The directory of ``sweep_id`` (not checked to exist)."""
    return (root or sweeps_root()) / sweep_id


def _read_file(d: Path, name: str) -> SweepRecord:
    try:
        check_job_dir(d)
        data = read_json(d / name, MAX_SWEEP_BYTES)
    except FileNotFoundError:
        raise CorruptRecord(f"no sweep record in {d}") from None
    except StateDirError as exc:
        raise CorruptRecord(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise CorruptRecord(f"unreadable sweep record {d / name}: {exc}") from None
    record = SweepRecord.from_dict(data)
    if record.id != d.name:
        raise CorruptRecord(f"sweep record in {d} names another sweep id ({record.id!r})")
    return record


def read(d: Path) -> SweepRecord:
    """Read and validate the record in sweep directory ``d``; its id must be the directory's name.
    A damaged or missing ``sweep.json`` is rebuilt (:func:`rebuild`) when its backup can be read.
    Never writes: the rebuilt record is written back by the next write (the sweep process's).

    Raises:
        CorruptRecord: neither the record nor its backup can be read, or ``d`` is a link.
    """
    try:
        return _read_file(d, SWEEP_FILE)
    except CorruptRecord as damaged:
        try:
            return rebuild(d, str(damaged))
        except CorruptRecord:
            raise damaged from None


def rebuild(d: Path, why: str) -> SweepRecord:
    """The sweep record of ``d`` rebuilt from what survives a damaged ``sweep.json``: its backup
    (the axes, trials and options, as last written), each trial's state from the newest job
    record of the registry that names this sweep and trial (``JobRecord.sweep``), and the
    ``done`` marker (a stop leaves it too). The record says so in its ``warnings``.

    Raises:
        CorruptRecord: the backup cannot be read either.
    """
    record = _read_file(d, BACKUP_FILE)
    newest: dict[int, Any] = {}
    for job in jobstore.list_records():
        hit = trial_of(job.sweep)
        if (hit is not None and hit[0] == record.id and 0 <= hit[1] < len(record.trials)
                and job.id != record.trials[hit[1]].interrupted_job):
            if hit[1] not in newest or job.started_at >= newest[hit[1]].started_at:
                newest[hit[1]] = job
    for index, job in newest.items():
        trial = record.trials[index]
        if trial.status == QUEUED or trial.job_id != job.id:
            slot = (job.sweep or {}).get("slot")
            trial.status, trial.job_id, trial.started_at, trial.waiting = STARTED, job.id, job.started_at, None
            trial.slot = slot if isinstance(slot, int) else trial.slot
    if is_done(d) and record.done_at is None:
        try:
            record.done_at = os.lstat(d / DONE).st_mtime
        except OSError:
            record.done_at = time.time()
    note = f"{SWEEP_FILE} was damaged ({why}); rebuilt from {BACKUP_FILE} and the trials' job records"
    record.warnings = [*record.warnings, note]
    return record


def read_repaired(d: Path) -> SweepRecord:
    """:func:`read`, and a record rebuilt from its backup written back at once (under the sweep's
    lock), so the sweep process rebuilds a damaged record once, not at every look.

    Raises:
        CorruptRecord: as :func:`read`.
    """
    try:
        return _read_file(d, SWEEP_FILE)
    except CorruptRecord:
        with locked(d) as record:  # read() rebuilds it; the block's end writes it back
            return record


def write(d: Path, record: SweepRecord) -> None:
    """Replace ``d``'s record in one step, then its backup (no lock taken; see :func:`locked`)."""
    data = json.dumps(record.to_dict(), indent=1, allow_nan=False).encode()
    write_atomic(d / SWEEP_FILE, data)
    write_atomic(d / BACKUP_FILE, data)


@contextmanager
def locked(d: Path) -> Iterator[SweepRecord]:
    """Hold the sweep's lock; yield its record; write it back when the block ends without error."""
    check_job_dir(d)
    with flocked(d / SWEEP_LOCK):
        record = read(d)
        yield record
        write(d, record)


@contextmanager
def holding(d: Path) -> Iterator[None]:
    """Hold the sweep's lock without reading the record (the sweep process starting a trial)."""
    check_job_dir(d)
    with flocked(d / SWEEP_LOCK):
        yield


def runner_alive(d: Path) -> bool:
    """Whether a sweep process (or the creator about to start one) holds the sweep's process lock."""
    return bool(lock_is_held(d / RUNNER_LOCK))


def is_done(d: Path) -> bool:
    """Whether the sweep was marked done (nothing queued, nothing runs)."""
    return os.path.lexists(d / DONE)


def mark_done(d: Path) -> None:
    """Mark the sweep done (an empty file; best effort)."""
    try:
        os.close(open_nofollow(d / DONE, os.O_WRONLY | os.O_CREAT))
    except OSError:
        pass


def write_env(d: Path, env: dict[str, str]) -> None:
    """Keep the creator's environment for the trials (mode 0600, like every registry file)."""
    write_atomic(d / ENV_FILE, json.dumps(dict(env)).encode())


def read_env(d: Path) -> dict[str, str] | None:
    """The environment kept by :func:`write_env`, or ``None`` when missing or damaged."""
    try:
        data = read_json(d / ENV_FILE)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        return None
    return data


def list_dirs(root: Path | None = None) -> list[Path]:
    """Every sweep directory (not staging ones), by name (so by creation time). Never writes."""
    root = root or sweeps_root()
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise StateDirError(f"cannot read the sweep registry {root} ({exc.strerror or exc})") from None
    return [Path(e.path) for e in entries if e.name.startswith(PREFIX) and e.is_dir(follow_symlinks=False)]


def list_records(root: Path | None = None, skipped: list | None = None) -> list[SweepRecord]:
    """Every valid sweep record, oldest first; damaged ones are skipped (their paths appended to
    ``skipped`` when given)."""
    out = []
    for d in list_dirs(root):
        try:
            out.append(read(d))
        except CorruptRecord:
            if skipped is not None:
                skipped.append(d)
    return sorted(out, key=lambda r: (r.created_at, r.id))


def trial_of(sweep: Any) -> tuple[str, int] | None:
    """``(sweep id, trial index)`` of a job record's ``sweep`` field, or ``None``."""
    if isinstance(sweep, dict) and isinstance(sweep.get("id"), str) and isinstance(sweep.get("trial"), int):
        return sweep["id"], sweep["trial"]
    return None
