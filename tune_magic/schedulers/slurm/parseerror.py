"""The one error of reading the SLURM clients' answers (its own module: both the squeue and the
job array readers raise it)."""

from __future__ import annotations

from tune_magic.errors import TuneMagicError


class SqueueParseError(TuneMagicError, ValueError):
    """squeue's output is not what this module reads (the message quotes the start of it).

    Not a :class:`~tune_magic.errors.UserError`: the engine answered oddly; the scheduler treats
    it as "no answer", which never ends a job."""
