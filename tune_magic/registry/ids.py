"""Job ids: unique, sortable by start time, safe as a directory name; and the job a user names."""

from __future__ import annotations

import os
import secrets
import time

from tune_magic.errors import AmbiguousJobName, PlanError


def new_job_id(now: float | None = None) -> str:
    """Return a fresh job id such as ``20261129-203015-3fa2c1``.

    The time part (UTC, to the second) makes ids sort by start; 24 random bits keep two jobs
    started in the same second apart. The result always passes
    :func:`tune_magic.plan.words.check_job_id`.

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
    from tune_magic.plan.words import check_job_id
    from tune_magic.registry import store as jobstore

    try:
        check_job_id(spec)
        malformed = None
    except PlanError as exc:
        malformed = exc
    if malformed is None and os.path.lexists(jobstore.job_dir(spec)):
        return spec
    named = [r.id for r in jobstore.list_records(jobstore.jobs_root(create=False)) if r.name == spec]
    if len(named) == 1:
        return named[0]
    if named:
        shown = ", ".join(named[-_IDS_SHOWN:]) + (f" (and {len(named) - _IDS_SHOWN} older)" if len(named) > _IDS_SHOWN else "")
        raise AmbiguousJobName(f"{len(named)} jobs are named {spec!r}: {shown}; give the id of the one you mean")
    if malformed is not None:
        raise PlanError(f"no job is named {spec!r}, and it is not valid as a job id (letters, digits, '_', '-', "
                          "'.'; no '/', no '..'); tune-magic jobs lists the jobs") from None
    return spec
