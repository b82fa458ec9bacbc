"""The registry: what is known about every job, on disk.

``store`` (one directory per job under ``$TUNE_MAGIC_HOME/jobs``: the validated record, small
side files, locks), ``status`` (the status model and its one transition rule) and ``ids``.
Nothing here starts, signals or follows a process.
"""
