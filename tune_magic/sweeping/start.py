"""Starting the sweep process, and starting it again for a sweep whose process died.

The sweep process (:mod:`tune_magic.sweeping.runner`) holds the sweep's process lock
(``supervisor.lock``) for its whole life. A sweep with queued trials, not stopped, whose lock
nobody holds lost its process (SIGKILL, a reboot): :func:`revive` takes the lock without waiting
(another listing that took it first wins) and starts a new process that inherits it, so two never
run and there is no moment where the sweep seems to have none. Listings never call it: it is a
step of its own (:func:`tune_magic.sweeping.sweep.revive_sweeps`, ``Sweep.revive``), taken by
``Sweep.wait``, ``tune-magic jobs`` and ``sweeps``, the jobs table and a sweep card.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from tune_magic.sweeping import store as sweepstore
from tune_magic.registry.files import open_nofollow
from tune_magic.registry.record import CorruptRecord
from tune_magic.sweeping.record import QUEUED, SweepRecord

#: Bytes the registry's disk must have free for a sweep process to be started: it writes its log,
#: the sweep's record and each trial's job directory (a few KiB each).
MIN_FREE_BYTES = 1 << 20

#: The sweep processes this process started (reaped when they exit, so none is left a zombie).
_started: list[subprocess.Popen] = []


def start_runner(sweep_dir: Path, *, python: str | None = None, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, lock_fd: int | None = None) -> int:
    """Start the sweep process of ``sweep_dir`` in a session of its own (so the kernel's
    interrupts and restarts never reach it), its output appended to ``runner.log``.

    Args:
        sweep_dir: the sweep's directory.
        python: the interpreter to run it on (default this one).
        env: its environment (default this process's).
        cwd: its working directory (the sweep's; default the current one).
        lock_fd: the sweep's process lock, held by the caller: the process inherits it.

    Returns:
        The process id.

    Raises:
        OSError: it could not be started.
    """
    _reap()
    argv = [python or sys.executable, "-m", "tune_magic.sweeping.runner", str(sweep_dir)]
    if lock_fd is not None:
        argv += ["--lock-fd", str(lock_fd)]
    log = open_nofollow(sweep_dir / sweepstore.RUNNER_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        proc = subprocess.Popen(argv, cwd=cwd or os.getcwd(), env=dict(os.environ if env is None else env),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True,
                                pass_fds=(lock_fd,) if lock_fd is not None else ())
    finally:
        os.close(log)
    _started.append(proc)
    return proc.pid


def _reap() -> None:
    """Reap the sweep processes this process started that have exited."""
    for proc in list(_started):
        if proc.poll() is not None:
            _started.remove(proc)


def no_room(sweep_dir: Path) -> str | None:
    """Why the registry's disk cannot take a sweep's next trial (fewer than
    :data:`MIN_FREE_BYTES` free where ``sweep_dir`` is), in words; ``None`` when it can or the
    disk cannot be asked. Reads only (``statvfs``): a listing on a full disk can say it."""
    try:
        free = shutil.disk_usage(sweep_dir).free
    except OSError:
        return None
    if free >= MIN_FREE_BYTES:
        return None
    return (f"waiting for disk space: the disk holding {sweep_dir.parent.parent} is full ({free:,} bytes "
            "free); queued trials start once space is freed")


def needs_runner(record: SweepRecord) -> bool:
    """Whether ``record`` describes a sweep whose queue still has work: trials queued, not stopped,
    not run by an engine of its own (``record.engine``)."""
    return (record.stop_requested_at is None and record.done_at is None and not record.engine
            and any(t.status == QUEUED for t in record.trials))


def revive(sweep_dir: Path, record: SweepRecord | None = None) -> bool:
    """Start the sweep process again when the sweep needs one and none holds its lock.

    Returns:
        Whether a process was started (it may still find another one took the lock first, and exit).
    """
    _reap()
    if sweepstore.runner_alive(sweep_dir) or sweepstore.is_done(sweep_dir):
        return False
    try:
        record = record or sweepstore.read(sweep_dir)
    except CorruptRecord:
        return False
    if not needs_runner(record) or not os.access(sweep_dir, os.W_OK):  # a read-only registry only lists
        return False
    if no_room(sweep_dir):  # it could not write a line: a listing later starts it, once there is room
        return False
    # take the lock here and hand it to the new process, as the creator does: from this moment the
    # sweep has a live holder, so no other listing starts a second process meanwhile
    try:
        lock_fd = open_nofollow(sweep_dir / sweepstore.RUNNER_LOCK, os.O_RDWR | os.O_CREAT)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another listing took it a moment ago
            return False
        env = sweepstore.read_env(sweep_dir)
        try:
            start_runner(sweep_dir, python=record.python or None, env=env,
                         cwd=record.cwd if os.path.isdir(record.cwd) else None, lock_fd=lock_fd)
        except OSError:
            return False
        return True
    finally:
        os.close(lock_fd)


def revive_all(root: Path | None = None) -> list[str]:
    """:func:`revive` every sweep under ``root`` (default ``$TUNE_MAGIC_HOME/sweeps``) that needs
    it; return the ids of those whose process was started again. Never raises for one bad sweep;
    costs one lock test per sweep not marked done."""
    started = []
    try:
        dirs = sweepstore.list_dirs(root)
    except Exception:  # noqa: BLE001 - a listing never fails because of the sweeps
        return started
    for d in dirs:
        try:
            if revive(d):
                started.append(d.name)
        except Exception:  # noqa: BLE001 - one bad sweep must not stop the others (or the listing)
            continue
    return started
