"""What happened: reading what jobs write. Pure parsing plus incremental file followers.

Log and metric-file parsing, the incremental follower, per-job summaries, progress, failure
reasons, OOM evidence, the display tail, and file-change notification.
"""
