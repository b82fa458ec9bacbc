"""The small process that owns one job: ``python -m tune_magic.supervisor JOB_DIR``.

It starts the job's command (the torchrun agent, or the one recipe process) as its child, records
the child's pid and create-time, discovers the worker processes and the real rendezvous endpoint
from a worker's environment (torchrun itself only logs ``localhost:0``), waits, and writes the exit
code, end time, final status and failure reason into the job record. Because it runs in its own
session, the job and its exit code survive the notebook kernel being interrupted, restarted or
killed.

Keep imports light: this starts on every launch, and the notebook waits for it to record the pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from . import jobstore
from .failure import describe_failure
from .jobstore import FAILED, STOPPED, SUCCEEDED, ProcessRef

POLL_S = 0.2
#: Seconds between looks for worker processes once they have been found.
DISCOVERY_SLOW_S = 5.0
#: Bytes from the end of the log read to explain a failure.
FAILURE_TAIL_BYTES = 256 * 1024


def discover_workers(agent: psutil.Process) -> tuple[list[ProcessRef], str | None]:
    """Return the agent's worker processes and the rendezvous endpoint they were given.

    Workers are the agent's descendants with torchrun's ``RANK`` in their environment; the endpoint
    is a worker's ``MASTER_ADDR:MASTER_PORT``.
    """
    workers, endpoint = [], None
    try:
        children = agent.children(recursive=True)
    except psutil.Error:
        return [], None
    for child in children:
        try:
            environ = child.environ()
            if "RANK" not in environ or "TORCHELASTIC_RUN_ID" not in environ:
                continue
            workers.append(ProcessRef(child.pid, child.create_time(), int(environ["RANK"])))
            if endpoint is None and environ.get("MASTER_PORT"):
                endpoint = f"{environ.get('MASTER_ADDR', 'localhost')}:{environ['MASTER_PORT']}"
        except (psutil.Error, ValueError):
            continue
    return sorted(workers, key=lambda w: (w.rank, w.pid)), endpoint


def read_tail(path: str | os.PathLike, nbytes: int) -> str:
    """Return the last ``nbytes`` of a file as text (invalid UTF-8 replaced; '' if missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - nbytes))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def supervise(job_dir: Path) -> int:
    """Run the job recorded in ``job_dir`` to completion; return its exit code."""
    record = jobstore.read(job_dir)
    with open(record.log_path, "ab", buffering=0) as log:
        try:
            child = subprocess.Popen(
                record.argv, cwd=record.cwd, env={**os.environ, **record.env},
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, close_fds=True,
            )
        except OSError as exc:
            jobstore.update(job_dir, status=FAILED, returncode=127, ended_at=time.time(),
                            error=f"could not start {record.argv[0]}: {exc}")
            return 127

    # A SIGTERM meant for the supervisor (e.g. a system shutdown) goes to the job, which then ends
    # normally and gets recorded; interrupts of a terminal or kernel never reach this session.
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    agent = psutil.Process(child.pid)
    jobstore.update(job_dir, agent=ProcessRef(child.pid, agent.create_time()))
    known: tuple = ()
    next_look = 0.0
    expected = int(record.nproc_per_node) if (record.nproc_per_node or "").isdigit() else 1
    while child.poll() is None:
        # look for workers often until all are known, then rarely (restarts): every look reads
        # /proc of each child, which steals CPU from the job on a small machine
        if record.distributed and time.monotonic() >= next_look:
            workers, endpoint = discover_workers(agent)
            complete = len(workers) >= expected and endpoint is not None
            next_look = time.monotonic() + (DISCOVERY_SLOW_S if complete else 0.0)
            key = (tuple((w.pid, w.rank) for w in workers), endpoint)
            if workers and key != known:
                known = key
                with jobstore.locked(job_dir) as rec:
                    seen = {w.pid for w in rec.workers}
                    rec.workers = rec.workers + [w for w in workers if w.pid not in seen]
                    if rec.rendezvous != "user" or not rec.rendezvous_endpoint:
                        rec.rendezvous_endpoint = endpoint
        try:
            child.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass

    code = child.returncode
    error = None if code == 0 else describe_failure(read_tail(record.log_path, FAILURE_TAIL_BYTES))
    with jobstore.locked(job_dir) as rec:
        rec.returncode = code
        rec.ended_at = time.time()
        if rec.stop_requested:
            rec.status = STOPPED
        elif code == 0:
            rec.status = SUCCEEDED
        else:
            rec.status = FAILED
            rec.error = error or f"exited with code {code}"
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m tune_magic.supervisor JOB_DIR``."""
    argv = sys.argv[1:] if argv is None else argv
    job_dir = Path(argv[0])
    try:
        return supervise(job_dir)
    except Exception as exc:  # never leave a record saying "running" for a job nobody watches
        try:
            jobstore.update(job_dir, status=FAILED, ended_at=time.time(), error=f"supervisor error: {exc!r}")
        finally:
            raise


if __name__ == "__main__":
    sys.exit(main())
