"""Follow one sweep in a named daemon thread and hand snapshots of it to a sink callback.

As :class:`tune_magic.ui.watch.JobWatcher` for one job: the thread never prints and never touches
widgets; the sink (the sweep card) receives a :class:`SweepSnapshot` and only sets traits. One
thread follows every trial: each started trial's losses through its own incremental follower
(read only while the trial runs, once more when it ends), each row's status from its job's
record and summary. Each look also starts the sweep process again when it died with trials queued
(:meth:`tune_magic.sweeping.sweep.Sweep.revive`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from tune_magic.logs.metricfollow import JobMetricsFollower
from tune_magic.sweeping.sweep import Sweep, sweep_status
from tune_magic.sweeping.results import LOSS, best, results

#: Most points per trial handed to the chart (older ones thinned; the logs keep every one).
MAX_POINTS = 500


@dataclass(frozen=True)
class TrialRow:
    """One trial as the card shows it.

    Attributes:
        index, name: the trial's index and label (its values).
        texts: ``{axis key: item as typed}``.
        status: its job's status label once started; ``queued``, ``cancelled``, ``not started`` before.
        job_id: its job's id once started.
        step, loss: its latest step with a loss, and that loss.
        best_loss: its lowest loss so far (``nan`` ignored).
        elapsed_s: seconds since its job started (its whole run once ended); 0 before.
        note: why it waits or could not start, or its failure reason.
        steps, losses: its loss curve (thinned to :data:`MAX_POINTS`).
    """

    index: int
    name: str
    texts: tuple[tuple[str, str], ...]
    status: str
    job_id: str | None = None
    step: int | None = None
    loss: float | None = None
    best_loss: float | None = None
    elapsed_s: float = 0.0
    note: str | None = None
    steps: tuple[int, ...] = ()
    losses: tuple[float, ...] = ()


@dataclass(frozen=True)
class SweepSnapshot:
    """What the sweep card shows at one moment.

    Attributes:
        sweep_id, name: the sweep's id and name.
        status: ``running``, ``finished`` or ``stopped``.
        keys: the axis keys, in trial order.
        max_parallel: trials at once; ``slots``: each slot's GPUs (``None``: no GPUs).
        rows: every trial, in order.
        best: the index of the best trial so far (lowest final loss, ties by minimum), or ``None``.
    """

    sweep_id: str
    name: str
    status: str
    keys: tuple[str, ...]
    max_parallel: int
    slots: tuple
    rows: tuple[TrialRow, ...]
    best: int | None

    def counts(self) -> dict[str, int]:
        """``{status: trials}``, in the order statuses first appear."""
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.status] = out.get(r.status, 0) + 1
        return out


class SweepWatcher:
    """Follow a sweep; call ``sink(snapshot)`` when something changed (at most every ``interval_s``).

    Args:
        sweep: the sweep.
        sink: called with each new :class:`SweepSnapshot` from the watcher thread (or from the caller
            of :meth:`poll_once`); it must only set widget traits.
        interval_s: seconds between looks.
    """

    def __init__(self, sweep: Sweep, sink: Callable[[SweepSnapshot], None] | None = None, *,
                 interval_s: float = 0.5):
        self.sweep = sweep
        self.sink = sink
        self.interval_s = interval_s
        self._followers: dict[str, JobMetricsFollower] = {}
        self._finished: set[str] = set()
        self._curves: dict[str, tuple] = {}
        self._last: SweepSnapshot | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.done = False  #: the sweep ended and every trial's logs were read to their end

    def poll_once(self) -> SweepSnapshot:
        """Look at every trial; return the snapshot, handed to the sink when it changed."""
        with self._lock:
            snap = self._read()
            changed = self._last is None or snap != self._last
            ticked = self._last is None or any(int(a.elapsed_s) != int(b.elapsed_s)
                                               for a, b in zip(snap.rows, self._last.rows))
            self._last = snap
        if (changed or ticked) and self.sink is not None:
            self.sink(snap)
        return snap

    def _read(self) -> SweepSnapshot:
        self.sweep.revive()  # a card of a sweep whose process died would otherwise wait for good
        rows = []
        trials = self.sweep.trials
        for t in trials:
            texts = tuple(t.texts.items())
            if t.job is None:
                rows.append(TrialRow(t.index, t.name, texts, t.status, note=t.error or t.waiting))
                continue
            steps, losses, best_loss = self._curve(t.job)
            rows.append(TrialRow(t.index, t.name, texts, t.status, t.job.id, steps[-1] if steps else None,
                                 losses[-1] if losses else None, best_loss, t.job.elapsed_s, note=t.error,
                                 steps=steps, losses=losses))
        status = sweep_status([r.status for r in rows], self.sweep.record.stop_requested_at)
        self.done = status != "running" and all(r.job_id in self._finished for r in rows if r.job_id)
        # the one measure on the one input every view uses (the rows' curves may be a read ahead of it)
        top = best(results(trials))
        rec = self.sweep.record
        return SweepSnapshot(sweep_id=rec.id, name=rec.name, status=status, keys=tuple(rec.keys),
                             max_parallel=rec.max_parallel, slots=tuple(tuple(s) if s else None for s in rec.slots),
                             rows=tuple(rows), best=None if top is None else top.trial.index)

    def _curve(self, job) -> tuple[tuple[int, ...], tuple[float, ...], float | None]:
        """The job's loss curve and lowest loss: its follower is read while it runs, and once more
        to the end when it has ended; an ended job's curve is kept as read."""
        if job.id in self._finished:
            return self._curves[job.id]
        follower = self._followers.get(job.id)
        if follower is None:
            r = job.record
            follower = self._followers[job.id] = JobMetricsFollower(
                r.log_path, log_dir=r.metric_log_dir, started_after=r.started_at - 1, max_lines=1, cwd=r.cwd,
                rank_log_dir=r.rank_log_dir)
        ended = not job.record.state.is_live
        changes = follower.finish() if ended else follower.poll()
        if changes or job.id not in self._curves or ended:
            series = follower.series(LOSS, MAX_POINTS)
            lowest = self._curves.get(job.id, ((), (), None))[2]
            finite = [p.value for p in changes if p.name == LOSS and p.value == p.value]  # nan != nan
            if finite:
                lowest = min(finite) if lowest is None else min(lowest, *finite)
            self._curves[job.id] = (tuple(series.steps), tuple(series.values), lowest)
        if ended:
            self._finished.add(job.id)
            self._followers.pop(job.id).close()
        return self._curves[job.id]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 - a view never kills its watcher; the next look retries
                pass
            if self.done:
                return
            self._stop.wait(self.interval_s)

    def start(self) -> "SweepWatcher":
        """Start the daemon thread ``tune_magic-sweep-<id>``; return self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"tune_magic-sweep-{self.sweep.id}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 2.0) -> None:
        """Stop following (the sweep goes on); close the followers."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        with self._lock:
            for follower in self._followers.values():
                follower.close()
            self._followers.clear()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (once the sweep ended and every trial's logs were read)."""
        if self._thread is not None:
            self._thread.join(timeout)
