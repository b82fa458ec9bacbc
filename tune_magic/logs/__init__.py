"""What happened: reading what jobs write. Pure parsing plus incremental file followers.

Log and metric-file parsing, the incremental follower, per-job summaries, progress, failure
reasons, OOM evidence, the display tail, and file-change notification. The modules:

* parsing: ``lineformat`` (torchtune's and torch's line formats, one line at a time), ``points``
  (``MetricPoint``, ``MetricBatch``), ``records`` (text -> records and display lines),
  ``parse`` (the incremental ``LogParser``), ``columns`` (its fast path for uniform DiskLogger
  blocks), ``readers`` (a whole line, text or file at once);
* following: ``linefollow`` (one growing file), ``logfiles`` (where a job's metric and per-rank
  files are), ``metricstore`` (merged series), ``follow`` (``JobMetricsFollower``: one job),
  ``export`` (JSON, CSV, DataFrame), ``notify`` (file-change notification);
* what a job's log says: ``summary``, ``progress``, ``reports`` (torchrun's failure report),
  ``tracebacks`` (by process, survived or not), ``failure`` (the failure reason), ``oom``,
  ``ending`` (the evidence of a job's end), ``tailview`` (the card's display tail).
"""
