"""Follow one job in a named daemon thread and hand snapshots of it to a sink callback.

The thread never prints and never touches widgets itself: the sink (a view) receives a
:class:`JobSnapshot` and only sets widget traits. Snapshots are taken at most every
``interval_s`` seconds and handed on only when something changed, which bounds the traffic to the
browser however fast the job writes.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from .follow import JobMetricsFollower
from .gpus import gpus_label
from .jobctl import Job

#: Metric plotted by the views.
LOSS = "loss"

# tqdm's bar after torchtune's description: "40%|####      | 2/5 [00:00<00:01,  3.87it/s]"
_BAR = re.compile(r"(\d+%)\|[^|]*\|\s*(\d+/\d+)\s*(\[[^\]]*\])?")


def progress_summary(text: str | None) -> str:
    """Shorten a torchtune progress line to tqdm's counters: ``"2/5 40% [00:00<00:01, 3.87it/s]"``.

    The description (``epoch|step|Loss: ...``) is dropped because views show step and loss from the
    metric file, and whatever a later log write appended to the same line is cut off. Text that is
    not a tqdm bar is returned as is, at most 200 characters.
    """
    if not text:
        return ""
    m = _BAR.search(text)
    if m is None:
        return text[:200]
    return " ".join(part for part in (m[2], m[1], m[3]) if part)


@dataclass(frozen=True)
class JobSnapshot:
    """What a view shows of a job at one moment.

    Attributes:
        job_id, name: the job's id and name.
        status: ``running``, ``succeeded``, ``failed`` or ``stopped``.
        elapsed_s: seconds since launch (the whole run once ended).
        gpus: GPU ids as typed (relative to the kernel's CUDA_VISIBLE_DEVICES) or ``None``.
        physical_gpus: the same GPUs as nvidia-smi indices (MIG ids as strings), or ``None``.
        endpoint: real rendezvous ``host:port`` once known.
        output_dir: the job's output directory.
        progress: the latest progress-bar line (``1|12|Loss: 2.31: 60%|...| 12/20 [00:10<00:06, ...]``).
        tail: the last lines of the log (bounded by the watcher's ``tail_lines``).
        steps, losses: the loss curve (possibly thinned to ``max_points`` for charts).
        step, loss: the latest step with a loss, and that loss.
        error: the failing rank and message for a failed job.
        returncode: exit code once ended.
    """

    job_id: str
    name: str
    status: str
    elapsed_s: float
    gpus: tuple[int, ...] | None
    physical_gpus: tuple[int | str, ...] | None
    endpoint: str | None
    output_dir: str | None
    progress: str | None
    tail: tuple[str, ...]
    steps: tuple[int, ...]
    losses: tuple[float, ...]
    step: int | None
    loss: float | None
    error: str | None
    returncode: int | None

    def summary(self) -> str:
        """A plain-text rendering (terminals, nbconvert, ``--wait``)."""
        lines = [f"job {self.job_id} ({self.name}): {self.status}, {self.elapsed_s:.0f} s"]
        if self.error:
            lines.append(f"error: {self.error}")
        details = [gpus_label(self.gpus, self.physical_gpus) or None,
                   f"rendezvous {self.endpoint}" if self.endpoint else None,
                   f"output_dir {self.output_dir}" if self.output_dir else None]
        if any(details):
            lines.append("  ".join(d for d in details if d))
        if self.step is not None:
            lines.append(f"step {self.step} loss {self.loss:.6g}  {progress_summary(self.progress)}".rstrip())
        return "\n".join(lines)


class JobWatcher:
    """Follow a job's log and metric file; call ``sink(snapshot)`` when something changed.

    Args:
        job: the job to follow.
        sink: called with each new :class:`JobSnapshot`, from the watcher thread (or from the
            caller of :meth:`poll_once`). It must only set widget traits.
        interval_s: seconds between polls (default 0.25: at most 4 updates a second).
        tail_lines: log lines kept in snapshots.
        max_points: most points of the loss curve handed to a chart (older ones thinned; the full
            series stays on disk).
        max_interval_s: while nothing changes the poll interval backs off (x1.5 a poll) up to this,
            so idle jobs cost almost nothing; any change brings it back to ``interval_s``.
    """

    def __init__(self, job: Job, sink: Callable[[JobSnapshot], None] | None = None, *,
                 interval_s: float = 0.25, tail_lines: int = 20, max_points: int = 2000,
                 max_interval_s: float = 1.0):
        self.job = job
        self.sink = sink
        self.interval_s = interval_s
        self.tail_lines = tail_lines
        self.max_points = max_points
        self.max_interval_s = max(max_interval_s, interval_s)
        self.changed = False  # whether the last poll found something new
        r = job.record
        self.follower = JobMetricsFollower(r.log_path, log_dir=r.metric_log_dir, started_after=r.started_at - 1,
                                           max_lines=max(tail_lines, 1), cwd=r.cwd)
        self._stop = threading.Event()
        self._poll_lock = threading.Lock()  # the thread and a caller (e.g. text()) may poll at once
        self._thread: threading.Thread | None = None
        self._last: JobSnapshot | None = None
        self._finished = False

    def poll_once(self) -> JobSnapshot:
        """Read what is new, return the snapshot, and hand it to the sink if it changed."""
        with self._poll_lock:
            return self._poll()

    def _poll(self) -> JobSnapshot:
        status = self.job.status
        if not status.is_live and not self._finished:
            self.follower.finish()
            self._finished = True
        else:
            self.follower.poll()
        r = self.job.record
        series = self.follower.series(LOSS, self.max_points)
        last = self.follower.last(LOSS)
        snap = JobSnapshot(
            job_id=r.id, name=r.name, status=r.status, elapsed_s=self.job.elapsed_s,
            gpus=tuple(r.gpus) if r.gpus else None,
            physical_gpus=tuple(r.physical_gpus) if r.physical_gpus else None, endpoint=r.rendezvous_endpoint,
            output_dir=r.output_dir,
            progress=self.follower.latest_progress, tail=tuple(self.follower.tail(self.tail_lines)),
            steps=tuple(series.steps), losses=tuple(series.values),
            step=last.step if last else None, loss=last.value if last else None,
            error=r.error, returncode=r.returncode,
        )
        last = self._last
        # elapsed time moves on every poll; "changed" means the job wrote something or changed state
        self.changed = last is None or replace(snap, elapsed_s=0.0) != replace(last, elapsed_s=0.0)
        ticked = last is None or int(snap.elapsed_s) != int(last.elapsed_s)
        self._last = snap
        if (self.changed or ticked) and self.sink is not None:
            self.sink(snap)
        return snap

    @property
    def finished(self) -> bool:
        """True once the job ended and its logs were read to the end."""
        return self._finished

    def _run(self) -> None:
        delay = self.interval_s
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # a view must never kill the watcher; the next poll retries
                pass
            if self._finished:
                return
            # elapsed time changes every poll; "changed" means the job wrote or changed state
            delay = self.interval_s if self.changed else min(delay * 1.5, self.max_interval_s)
            self._stop.wait(delay)

    def start(self) -> "JobWatcher":
        """Start the daemon thread ``tune_magic-watch-<job id>``; return self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"tune_magic-watch-{self.job.id}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 2.0) -> None:
        """Stop following (the job keeps running)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (it ends once the job ended and was read)."""
        if self._thread is not None:
            self._thread.join(timeout)


def stream_text(job: Job, write: Callable[[str], None], *, interval_s: float = 0.5) -> JobSnapshot:
    """Follow ``job`` in the calling thread, writing one line per new loss point and a final summary.

    Used by ``%%tune_run --wait`` and the CLI, where widgets cannot render. Returns the final snapshot.
    """
    watcher = JobWatcher(job, interval_s=interval_s, tail_lines=5)
    shown = -1
    while True:
        snap = watcher.poll_once()
        for step, loss in zip(snap.steps, snap.losses):
            if step > shown:
                write(f"step {step} | loss {loss:.6g}\n")
                shown = step
        if watcher.finished:
            break
        time.sleep(interval_s)
    write(snap.summary() + "\n")
    return snap
