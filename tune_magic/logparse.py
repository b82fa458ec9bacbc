"""Release 0.1.0's path of :mod:`tune_magic.logs.parse`, kept for 0.1.0 supervisors still running
after an upgrade (their summary imports it on first use). New code imports ``tune_magic.logs``."""

from tune_magic.logs.lineformat import strip_ansi  # noqa: F401
from tune_magic.logs.parse import LogParser  # noqa: F401
from tune_magic.logs.points import SOURCE_PROGRESS  # noqa: F401
