"""The CLI's reading of a job's files and its words for OS errors: a job's log is read only when it
is a regular file (``O_NOFOLLOW`` + ``O_NONBLOCK`` + ``fstat``: a link is not followed, a FIFO does
not hang), in chunks of at most :data:`CHUNK_BYTES`; an ``OSError`` becomes one paragraph naming
the fix. Used by :mod:`tune_magic.ui.cli` and :mod:`tune_magic.ui.clitargets`.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time
from typing import Iterable, Iterator

from tune_magic.errors import UserError
from tune_magic.paths import file_kind


class CliError(UserError, ValueError):
    """A user mistake on the command line: printed as one paragraph, exit 2."""


#: The job (or sweep) a command is following right now, under ``"job"``: what Ctrl-C leaves running.
FOLLOWING: dict[str, str] = {}


#: errno values that are the machine's state, not a bug: reported as one paragraph, exit 2.
ENV_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def os_reason(exc: OSError) -> str:
    """``<strerror> (<ERRNO>)[ at <file>]`` for an OSError, e.g. ``Read-only file system (EROFS) at /x``."""
    name = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else type(exc).__name__
    where = f" at {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc} ({name}){where}"


def os_error_paragraph(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free some space on that disk, or point TUNE_MAGIC_HOME at another disk"
    elif exc.errno == errno.EROFS:
        fix = "point TUNE_MAGIC_HOME at a writable directory"
    else:
        fix = "check the file's permissions, or point TUNE_MAGIC_HOME at a directory you own"
    return f"{os_reason(exc)}; {fix}"


#: Most bytes of a log that ``tune-magic logs`` / ``run --wait`` hold in memory at once.
CHUNK_BYTES = 1 << 20


def _not_a_log(path: str, mode: int) -> CliError:
    return CliError(f"the job's log {path} is {file_kind(mode)}, not a regular file: tune_magic writes a regular "
                    "file there, so something else replaced it; refusing to read it (links are never followed "
                    "inside the job registry)")


def check_job_log(path: str) -> None:
    """Refuse a job log that is not a regular file (a link, a FIFO, a device, a directory).

    A missing log passes (the job has not written yet, or its log was removed).

    Raises:
        CliError: it exists and is not a regular file, or cannot be looked at.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CliError(f"cannot read the job's log: {os_reason(exc)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_a_log(path, st.st_mode)


def read_from(path: str, offset: int) -> Iterator[bytes]:
    """Yield ``path``'s bytes from ``offset`` to its current end, in chunks of at most :data:`CHUNK_BYTES`.

    A missing file yields nothing (the job has not written yet, or its log was removed). Only a
    regular file is read: a link at ``path`` is never followed (``O_NOFOLLOW``, see
    :func:`tune_magic.registry.store.open_nofollow`), and a FIFO or device is refused, not opened for
    reading (``O_NONBLOCK``, then ``fstat``), so nothing outside the registry is printed and
    nothing blocks.

    Raises:
        CliError: the path is not a regular file, or cannot be read.
    """
    from pathlib import Path

    from tune_magic.registry.store import open_nofollow

    check_job_log(path)
    try:
        fd = open_nofollow(Path(path), os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # became a link after check_job_log looked
            raise _not_a_log(path, stat.S_IFLNK) from None
        raise CliError(f"cannot read the job's log: {os_reason(exc)}") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_a_log(path, mode)
        f.seek(offset)
        while chunk := f.read(CHUNK_BYTES):
            yield chunk


def whole_log(job, follow: bool, poll_s: float = 0.2) -> Iterator[bytes]:
    """Yield the job's whole log from its start in chunks of at most :data:`CHUNK_BYTES`.

    With ``follow``, keep yielding what is appended (polling every ``poll_s`` seconds) until the
    job is no longer live; the last read comes after the job was seen ended, so nothing is missed.
    """
    from tune_magic.registry.status import parse

    offset = 0
    while True:
        live = follow and parse(job.status).is_live
        for chunk in read_from(job.log_path, offset):
            offset += len(chunk)
            yield chunk
        if not live:
            return
        time.sleep(poll_s)


def write_chunks(chunks: Iterable[bytes], out=None) -> None:
    out = out or sys.stdout.buffer
    for chunk in chunks:
        out.write(chunk)
        out.flush()
