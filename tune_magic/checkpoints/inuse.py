"""Which of a job's checkpoints a process is reading now, so retention never removes one under it.

A reader (a generation process, an evaluation) holds a shared ``flock`` on
``<job dir>/inuse/epoch_<N>.lock`` for as long as it reads ``epoch_N/`` (:func:`reading`); the
job's keeper asks :func:`busy` before it removes a folder, which tries each lock exclusively
without waiting. A reader that dies lets its lock go with its process, so a lock never outlives
what held it. Nothing is written into the checkpoint folder itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterable, Iterator

from tune_magic.registry.files import open_nofollow

#: The folder of the locks, in the job's registry directory.
INUSE_DIR = "inuse"


def lock_path(job_dir: str | os.PathLike[str], epoch: int) -> Path:
    """``<job_dir>/inuse/epoch_<epoch>.lock``."""
    return Path(job_dir) / INUSE_DIR / f"epoch_{int(epoch)}.lock"


def hold(job_dir: str | os.PathLike[str], epoch: int) -> int:
    """Take the shared lock of ``epoch_<epoch>`` for the caller; return its file descriptor (the
    lock goes when it is closed, or with the process). Never waits long: only a removal in
    progress holds it exclusively, for as long as it decides.

    Raises:
        OSError: the lock file cannot be made (a read-only registry).
    """
    path = lock_path(job_dir, epoch)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def reading(job_dir: str | os.PathLike[str], epoch: int) -> Iterator[None]:
    """Hold ``epoch_<epoch>`` in use for the ``with`` block (see :func:`hold`)."""
    fd = hold(job_dir, epoch)
    try:
        yield
    finally:
        os.close(fd)


def busy(job_dir: str | os.PathLike[str], epochs: Iterable[int]) -> set[int]:
    """The epochs among ``epochs`` that some process holds in use now (a try of each lock,
    exclusive and without waiting; a missing lock file is a free epoch)."""
    out = set()
    for epoch in epochs:
        try:
            fd = open_nofollow(lock_path(job_dir, epoch), os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            out.add(int(epoch))
        finally:
            os.close(fd)
    return out


@contextlib.contextmanager
def removing(job_dir: str | os.PathLike[str], epoch: int) -> Iterator[bool]:
    """Hold ``epoch_<epoch>`` exclusively while it is removed, so no reader starts on it meanwhile;
    yields whether the lock was had (``False``: a reader holds it: leave the folder be)."""
    path = lock_path(job_dir, epoch)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
