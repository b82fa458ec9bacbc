"""Whose registry it is: each job's secret token, and what the registry's modes allow. Stdlib only.

Anyone who can write into a registry (``jobs/`` writable by a group or by everybody) can plant a
record naming any process of yours (pid and start time copied from ``/proc``). So before a stop
signals a process, the scheduler checks that it is yours (same real uid) and that it is the job's:

- every job launched by this release gets a token, ``<job id>.<32 hex digits>``, in its
  environment (:data:`TOKEN_ENV`; the record keeps it in its ``env``, ``procs.json`` too), which
  its processes inherit and ``/proc/PID/environ`` shows to their owner only. A token that does not
  start with the job's own id (copied from another record) matches no process;
- a record of an earlier release has no token: its processes are signalled as before (pid and
  create time), but only when its job directory was made by you (a planted token-less record sits
  in a directory its planter made; the record file itself says nothing, since your own listings
  rewrite it).

Group project directories (setgid, umask 002), root-squashed NFS and containers keep working: only
the registry root and what is below it are looked at, never its parents, and a registry writable by
others gives a warning (:func:`open_to_others`), not a refusal.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

#: The environment variable that carries a job's token into its processes.
TOKEN_ENV = "TUNE_MAGIC_JOB_TOKEN"


def new_token(job_id: str) -> str:
    """A new token for job ``job_id``: ``<job id>.<128 random bits in hex>``."""
    return f"{job_id}.{secrets.token_hex(16)}"


def bound_token(job_id: str, token: object) -> str | None:
    """``token`` when it is a token of job ``job_id`` (as :func:`new_token` makes them), else ``None``."""
    if isinstance(token, str) and token.startswith(f"{job_id}.") and len(token) > len(job_id) + 16:
        return token
    return None


def written_by_me(path: Path) -> bool:
    """Whether the file or directory at ``path`` (not followed if a link) belongs to this process's user."""
    try:
        return os.lstat(path).st_uid == os.getuid()
    except OSError:
        return False


def open_to_others(root: Path) -> str | None:
    """A warning when the registry directory ``root`` can be written by users other than its owner
    (its group, or everybody) — anyone there can plant records; ``None`` otherwise (or when it
    cannot be read). Only ``root`` itself is looked at, never its parents."""
    try:
        st = os.stat(root)
    except OSError:
        return None
    writers = [who for who, bit in (("its group", stat.S_IWGRP), ("every user", stat.S_IWOTH)) if st.st_mode & bit]
    if not writers or (writers == ["its group"] and st.st_mode & stat.S_ISGID):
        return None  # a group project directory (setgid): its members are trusted by design
    return (f"{root} is writable by {' and '.join(writers)}: others can plant job records there. tune_magic signals "
            "only processes that carry the job's own token (or, for records of earlier releases, records you wrote), "
            f"but keep it private: chmod go-w {root}")


def permission_denied(path: Path) -> OSError | None:
    """The ``PermissionError`` that looking at ``path`` gives (another user's registry), else ``None``."""
    try:
        os.lstat(path)
    except PermissionError as exc:
        return exc
    except OSError as exc:
        return exc if exc.errno in (errno.EACCES, errno.EPERM) else None
    return None
