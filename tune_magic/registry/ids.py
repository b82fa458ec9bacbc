"""Job ids: unique, sortable by start time, safe as a directory name; and the job a user names."""

from __future__ import annotations

import os
import re
import secrets
import time

from tune_magic.errors import AmbiguousJobName, PlanError, StateDirError


_JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def check_job_id(job_id: str) -> str:
    """Validate a job id (one of :func:`new_job_id` or a user's ``--job-id``): letters, digits,
    ``_ . -``, no leading dot, no ``/`` or ``..``; return it.

    Raises:
        PlanError: any other text (a job id names a directory of the registry).
    """
    if not isinstance(job_id, str) or not _JOB_ID_RE.fullmatch(job_id) or ".." in job_id:
        raise PlanError(
            f"job id {job_id!r} is not valid: use letters, digits, '_', '-', '.' (no '/', no '..'), as shown by tune-magic jobs"
        )
    return job_id


def new_job_id(now: float | None = None) -> str:
    """Return a fresh job id such as ``20261129-203015-3fa2c1``.

    The time part (UTC, to the second) makes ids sort by start; 24 random bits keep two jobs
    started in the same second apart. The result always passes
    :func:`check_job_id`.

    Args:
        now: unix time in seconds; default the current time.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(3)}"


#: Most ids an ambiguous name's message lists.
_IDS_SHOWN = 10


def resolve_job_id(spec: str) -> str:
    """The id of the job ``spec`` names: ``spec`` itself when a job has that id (an id always
    wins), else the id of the one job whose name is ``spec``; else ``spec`` (a well-formed id then
    reads as "no such job").

    Raises:
        AmbiguousJobName: several jobs have that name (the message lists their ids).
        PlanError: no job has that name, and ``spec`` is no well-formed id (``/``, ``..``).
    """
    from tune_magic.registry import store as jobstore

    try:
        check_job_id(spec)
        malformed = None
    except PlanError as exc:
        malformed = exc
    if malformed is None and os.path.lexists(jobstore.job_dir(spec)):
        return spec
    try:
        records = jobstore.list_records(jobstore.jobs_root(create=False))
    except StateDirError:
        if malformed is None:
            return spec  # the caller says why this id cannot be looked at (another user's registry...)
        raise
    named = [r.id for r in records if r.name == spec]
    if len(named) == 1:
        return named[0]
    if named:
        shown = ", ".join(named[-_IDS_SHOWN:]) + (f" (and {len(named) - _IDS_SHOWN} older)" if len(named) > _IDS_SHOWN else "")
        raise AmbiguousJobName(f"{len(named)} jobs are named {spec!r}: {shown}; give the id of the one you mean")
    if malformed is not None:
        raise PlanError(f"no job is named {spec!r}, and it is not valid as a job id (letters, digits, '_', '-', "
                          "'.'; no '/', no '..'); tune-magic jobs lists the jobs") from None
    return spec
