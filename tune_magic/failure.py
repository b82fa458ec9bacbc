"""Release 0.1.0's path of :mod:`tune_magic.logs.failure`, kept for 0.1.0 supervisors still running
after an upgrade (they import it only when their job ends). New code imports ``tune_magic.logs``."""

from tune_magic.logs.failure import Evidence, FailureReason, describe_failure  # noqa: F401
