"""Release 0.1.0's path of :mod:`tune_magic.logs.parse`, kept for 0.1.0 supervisors still running
after an upgrade (their summary imports it on first use). New code imports ``tune_magic.logs``."""

from tune_magic.logs.parse import SOURCE_PROGRESS, LogParser, strip_ansi  # noqa: F401
