"""Release 0.1.0's path of the log followers, kept for 0.1.0 supervisors still running after an
upgrade (they import it when they first read a job's files). New code imports ``tune_magic.logs``."""

from tune_magic.logs.logfiles import find_metric_file, rank_log_files, read_rank_logs  # noqa: F401
