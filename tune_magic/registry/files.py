"""Safe file access inside the registry: no symbolic link is ever followed, writes are atomic.

Every file inside a job directory, the directory itself and the registry's lock files are opened
with ``O_NOFOLLOW``: a link planted in the registry never makes tune_magic create or write a file
elsewhere. ``$TUNE_MAGIC_HOME``, ``jobs/`` and their parents may be links (``~/.cache ->
/scratch/...``). Stdlib only: the supervisor imports this and must start fast.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat as _stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from tune_magic.errors import StateDirError

#: Largest record file read, in bytes (a record is a few KiB; anything larger is damage).
MAX_RECORD_BYTES = 4 << 20

_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


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


def append_json_line(path: Path, entry: Mapping[str, Any]) -> None:
    """Append ``entry`` as one JSON line to ``path`` (created, mode 0600, no link followed) in one
    ``O_APPEND`` write, so that lines of several writers never mix.

    Raises:
        OSError: the file cannot be opened or written (a link in the way: ``ELOOP``).
    """
    data = (json.dumps(dict(entry)) + "\n").encode()
    fd = open_nofollow(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            # a writer killed mid-line (or a full disk) left a torn line: end it, or this entry
            # would join it and be skipped with it; at worst a race adds a blank line, skipped too
            data = b"\n" + data
        os.write(fd, data)
    finally:
        os.close(fd)


def read_epoch_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` that are objects with an integer ``"epoch"``, oldest first: a torn
    last line (a writer killed mid-write) and foreign lines are skipped; a missing or unreadable
    file reads as none. The format of a job's ``evaluations.jsonl`` and ``pruned.jsonl``."""
    out = []
    try:
        with os.fdopen(open_nofollow(path, os.O_RDONLY), "r", encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and isinstance(entry.get("epoch"), int) \
                        and not isinstance(entry["epoch"], bool):
                    out.append(entry)
    except (OSError, UnicodeDecodeError):
        pass
    return out


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
