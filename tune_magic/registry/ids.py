"""Job ids: unique, sortable by start time, safe as a directory name."""

from __future__ import annotations

import secrets
import time


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
