"""Release 0.1.0's path of :mod:`tune_magic.logs.oom`, kept for 0.1.0 supervisors still running after
an upgrade. New code imports ``tune_magic.logs``."""

from tune_magic.logs.oom import OomWatch  # noqa: F401
