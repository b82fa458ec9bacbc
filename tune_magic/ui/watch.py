"""Follow a job or a sweep in a named daemon thread and hand snapshots of it to a sink callback.
One concept: the watcher, one thread and one rule of what a view is shown, for either.

One watcher, two things it follows: :class:`Watcher` is the thread, the sink and the rule of when a
snapshot is handed on; :class:`JobWatcher` reads one job (its log, metric file and record, woken by
file-change notification) and :class:`SweepWatcher` every trial of a sweep. The thread never
prints and never touches widgets itself: the sink (a card) receives a snapshot
(:mod:`tune_magic.ui.snapshot`) and only sets widget traits. Snapshots are taken at most every
``interval_s`` seconds and handed on only when something changed (or the elapsed time ticked a whole
second), which bounds the traffic to the browser however fast the job writes. :func:`stream_text`
follows either in the calling thread, as text (``--wait``).
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import replace
from typing import Callable, Union

from tune_magic import schedulers
from tune_magic.checkpoints.validation import VAL_LOSS
from tune_magic.logs.metricfollow import JobMetricsFollower
from tune_magic.job import Job
from tune_magic.job.evaluate import EvaluationFollower, is_evaluated
from tune_magic.registry.store import RECORD
from tune_magic.logs.progress import SAVED, SAVING, Bar, RunProgress, checkpoint_state, parse_bar, run_progress
from tune_magic.registry.status import Status
from tune_magic.logs.cardtail import display_tail
from tune_magic.ui.cardlines import shown_overrides

from tune_magic.sweeping.results import rank, results
from tune_magic.sweeping.sweep import Sweep, sweep_status
from tune_magic.checkpoints.validation import SaveSteps
from tune_magic.checkpoints.catalog import best_kept
from tune_magic.ui.snapshot import (LOSS, READ_PER_SHOWN, THROUGHPUT, JobSnapshot, SweepSnapshot, TrialRow,  # noqa: F401
                                    checkpoint_rows, progress_summary, val_fields)  # (views import them from here too)

#: What a watcher follows.
Target = Union[Job, Sweep]


class Watcher:
    """The thread of a watcher: poll, hand the snapshot to ``sink`` when it changed, wait, again
    until :attr:`finished`. Subclasses read (:meth:`_poll`) and may wait their own way (:meth:`_run`).

    Args:
        sink: called with each new snapshot, from the watcher thread (or from the caller of
            :meth:`poll_once`). It must only set widget traits.
        interval_s: seconds between polls.
        name: the thread's name.
    """

    def __init__(self, sink: Callable | None, interval_s: float, name: str):
        self.sink = sink
        self.interval_s = interval_s
        self.changed = False  # whether the last poll found something new
        self._name = name
        self._stop = threading.Event()
        self._poll_lock = threading.Lock()  # the thread and a caller (e.g. text()) may poll at once
        self._thread: threading.Thread | None = None
        self._last = None

    def poll_once(self):
        """Read what is new, return the snapshot, and hand it to the sink if it changed."""
        with self._poll_lock:
            return self._poll()

    def _poll(self):  # pragma: no cover - every watcher reads its own way
        raise NotImplementedError

    def _hand_over(self, snap, changed: bool, ticked: bool):
        """Keep ``snap`` as the last one; give it to the sink when it changed or a second ticked."""
        self.changed = changed
        self._last = snap
        if (changed or ticked) and self.sink is not None:
            self.sink(snap)
        return snap

    @property
    def finished(self) -> bool:
        """True once what it follows ended and was read to its end."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 - a view never kills its watcher; the next poll retries
                pass
            if self.finished:
                return
            self._stop.wait(self.interval_s)

    def start(self):
        """Start the daemon thread; return self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 2.0) -> None:
        """Stop following (what it follows goes on)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (once what it follows ended and was read)."""
        if self._thread is not None:
            self._thread.join(timeout)


class JobWatcher(Watcher):
    """Follow a job's log and metric file; call ``sink(snapshot)`` when something changed.

    With ``notify`` (the default) the watcher waits for "a followed file changed or the interval
    elapsed": a file-change notification (:mod:`tune_magic.logs.notify`, inotify) wakes it early, so a
    new loss reaches the sink about the notifier's debounce (20 ms) after it was written, and it
    still polls at least every ``max_interval_s`` whatever notification says, because inotify never reports
    writes made on another node of a network filesystem (NFS, Lustre) and may be unavailable
    (no inotify instance or watch left): both fall back to polling silently. When polls keep
    finding writes that no notification announced (such a filesystem), it polls on the
    ``notify=False`` schedule until a notification comes again.

    Woken polls are spaced at least ``interval_s`` apart, and ``2 * interval_s`` apart while the
    job is chatty (three notifications in a row came within ``interval_s / 2`` of the poll before)
    until it is quiet for ``interval_s`` after a poll: a job writing hundreds of lines a second
    costs two polls a second, one writing a loss every few seconds is shown within the notifier's
    debounce. A replaced record (the job ended, failed or was stopped) is shown at once. While
    nothing wakes it, it polls on the wall clock's whole seconds, so the idle cards of a process
    wake together. A poll that finds the log, the metric file and the record as they were
    (one ``stat`` each) reads nothing. A job whose checkpoints are evaluated by jobs of their own
    (:attr:`evals`) is followed until no evaluation is to come, its evaluator started again should
    it have died, at least every ``max_interval_s / 2`` while one is queued or running (their result
    files wake nothing: a ``stat`` each a poll, :class:`~tune_magic.job.evaluate.EvaluationFollower`).

    Args:
        job: the job to follow.
        sink: called with each new :class:`JobSnapshot`, from the watcher thread (or from the
            caller of :meth:`poll_once`). It must only set widget traits.
        interval_s: seconds between polls without notification, and the least spacing of woken
            polls (default 0.25: at most 4 updates a second).
        tail_lines: log lines kept in snapshots.
        max_points: most points of the loss curve handed to a chart (older ones thinned; the full
            series stays on disk).
        max_interval_s: the longest wait between two polls (seconds). Without notification the
            interval backs off (x1.5 a poll) up to this while nothing changes, so idle jobs cost
            almost nothing; any change brings it back to ``interval_s``.
        notify: wait for file-change notifications (True), or only poll (False: the behaviour
            before notification existed, reading the logs on every poll; the benchmarks' anchor).
        notifier: the :class:`tune_magic.logs.notify.Notifier` to use (default: the process's one).
    """

    #: Polls that found writes no notification announced, since the last notification, before
    #: the watcher stops trusting notifications for this job (its files are on a network filesystem).
    BLIND_AFTER = 2

    def __init__(self, job: Job, sink: Callable[[JobSnapshot], None] | None = None, *,
                 interval_s: float = 0.25, tail_lines: int = 20, max_points: int = 2000,
                 max_interval_s: float = 1.0, notify: bool = True, notifier=None):
        super().__init__(sink, interval_s, f"tune_magic-watch-{job.id}")
        self.job = job
        self.tail_lines = tail_lines
        self.max_points = max_points
        self.max_interval_s = max(max_interval_s, interval_s)
        self.notify = notify
        self.notifier = notifier
        self.polls = 0  #: polls done
        self.woken = 0  #: polls started by a notification
        self.missed = 0  #: polls since the last notification that found writes none announced
        self.fast = False  #: the job is chatty: woken polls are 2 intervals apart
        self.subscription = None  #: the notifier subscription while the thread runs (notify=True)
        r = job.record
        # more lines are kept than shown: bar redraws and repeated warnings collapse out of them
        self.follower = JobMetricsFollower(r.log_path, log_dir=r.metric_log_dir, started_after=r.started_at - 1,
                                           rank_log_dir=r.rank_log_dir,
                                           max_lines=max(tail_lines * READ_PER_SHOWN, 1), cwd=r.cwd)
        self._record_path = os.path.join(str(job.dir), RECORD)
        self._wake = threading.Event()
        self._finished = False
        self._curve: tuple | None = None  # (steps, losses, step, loss) of the last snapshot
        self._seen: tuple | None = None  # identity of the record and the files at the last read
        self.files_changed = False  #: whether the last poll found a followed file changed
        self._followed_key: tuple | None = None  # (metric file, metric dir) the subscription follows
        self._followed: tuple[list, list] = ([], [])
        self._last_run: RunProgress | None = None  # the last run progress read, and the elapsed time then
        self._run_at = 0.0
        self._checkpoint: str | None = None  # checkpoint state, and the step it was entered at
        self._checkpoint_step: int | None = None
        self._first_step: tuple[float, int] | None = None  # (monotonic s, step) of the first step seen
        self._failure = None  # a failed job's FailureReason, read once
        self._earlier = None  # the lineage's earlier curve (tune_magic.checkpoints.lineage.EarlierCurve), read once
        #: the job's checkpoint evaluations, followed (a job that validates by checkpoints), else None
        self.evals = EvaluationFollower(job, revive=True) if is_evaluated(r) else None
        self._in_loop: dict[int, float] | None = None  # the val_loss points the recipe logged, by step
        self._val: tuple = (None, None)  # (what the validation fields were made from, those fields)
        self._saves = SaveSteps()  # the step each epoch_N/ was saved at, from the bars read
        self._ckpt: tuple = (None, -math.inf, ())  # (what the checkpoint rows were read from, when, the rows)
        self._ckpt_settings = None  # the config's save settings, read once

    def poll_once(self) -> JobSnapshot:
        """Read what is new, return the snapshot, and hand it to the sink if it changed."""
        with self._poll_lock:
            self.polls += 1
            return self._poll()

    def _files(self) -> tuple:
        """Identity of what a poll reads: the record object, then (inode, size, mtime) of the
        log and of the metric file, or of the directory where it will appear."""
        f = self.follower
        where = f.metrics_path if f.metrics_path is not None else f.log_dir
        return (self.job.record, _stat(self.job.log_path), _stat(where) if where is not None else None)

    def _poll(self) -> JobSnapshot:
        status = self.job.status
        evaluated = self.evals is not None and self.evals.poll()
        seen = self._files() if self.notify else None
        self.files_changed = seen is None or self._seen is None or seen[1:] != self._seen[1:]
        last = self._last
        if (seen is not None and last is not None and seen == self._seen and self.follower.caught_up
                and (status.is_live or self._finished)):
            # nothing was written and the record is the same object: only the elapsed time moved
            # (and, while its checkpoints are evaluated, what their evaluations wrote)
            fields = self._val_fields(()) if evaluated else {}
            snap = replace(last, elapsed_s=self.job.elapsed_s, engine_note=self.job.engine_note, **fields,
                           checkpoints=self._checkpoint_rows(status, last.run.checkpoint,
                                                             fields.get("evaluations", last.evaluations)))
            changed = snap.engine_note != last.engine_note or evaluated or snap.checkpoints != last.checkpoints
        else:
            snap = self._read(status)
            self._seen = seen
            # elapsed time moves on every poll; "changed" means the job wrote something or changed state
            changed = last is None or replace(snap, elapsed_s=0.0) != replace(last, elapsed_s=0.0)
        return self._hand_over(snap, changed, last is None or int(snap.elapsed_s) != int(last.elapsed_s))

    def _read(self, status) -> JobSnapshot:
        if not status.is_live and not self._finished:
            changes = self.follower.finish()
            self._finished = True
        else:
            changes = self.follower.poll()
        if self._curve is None or any(p.name == LOSS for p in changes):
            # the curve is copied only when a loss point was added or changed
            series = self.follower.series(LOSS, self.max_points)
            last = self.follower.last(LOSS)
            self._curve = (tuple(series.steps), tuple(series.values),
                           last.step if last else None, last.value if last else None)
        steps, losses, step, loss = self._curve
        r = self.job.record
        if status == Status.FAILED and self._failure is None:
            self._failure = self.job.failure() or False  # written before the record says failed
        failure = self._failure or None
        tail, raw = self._tail(failure)
        for lines in raw:
            self._saves.feed_lines(lines)
        for p in changes:  # the bars' points carry their 1-based epoch: every save's step, not only the tail's
            if p.epoch is not None:
                self._saves.note(p.epoch, p.step)
        run = self._progress(status, step, raw)
        nodes = ()
        if status.is_live and (r.num_nodes > 1 or not schedulers.get_or_missing(r.scheduler).runs_on_this_machine):
            nodes = tuple(self.job.nodes)
        return JobSnapshot(
            job_id=r.id, name=r.name, status=r.status, elapsed_s=self.job.elapsed_s,
            gpus=tuple(r.gpus) if r.gpus else None,
            physical_gpus=tuple(r.physical_gpus) if r.physical_gpus else None, endpoint=r.rendezvous_endpoint,
            output_dir=r.output_dir,
            progress=self.follower.latest_progress, tail=tail,
            steps=steps, losses=losses, step=step, loss=loss, error=r.error, returncode=r.returncode,
            run=run, run_at_s=self._run_at, traceback=failure.traceback if failure else None,
            pending_reason=r.pending_reason if status == Status.PENDING else None, nodes=nodes,
            num_nodes=r.num_nodes, warnings=tuple(r.warnings), log_lost_at=r.log_lost_at,
            overrides=tuple(shown_overrides(self.job.overrides, r.id)), engine_id=self.job.engine_id,
            engine_id_label=self.job.engine_id_label, **self._lineage(r),
            engine_note=self.job.engine_note, **(val := self._val_fields(changes)),
            checkpoints=self._checkpoint_rows(status, run.checkpoint, val["evaluations"]),
        )

    def _val_fields(self, changes) -> dict:
        """The snapshot's validation fields: the ``val_loss`` points the recipe logged (copied only
        when ``changes`` added or changed one) and the values of its checkpoints' evaluations, by
        step; their latest and best; the evaluations."""
        if self._in_loop is None or any(p.name == VAL_LOSS for p in changes):
            full = self.follower.series(VAL_LOSS, None)
            self._in_loop = dict(zip(full.steps, full.values))
        evaluations = self.evals.evaluations if self.evals is not None else ()
        made_from = self._val[0]  # (the in-loop points' dict, the evaluations) they were made from
        if made_from is None or made_from[0] is not self._in_loop or made_from[1] != evaluations:
            self._val = ((self._in_loop, evaluations), val_fields(self._in_loop, evaluations, self.max_points))
        return self._val[1]

    def _checkpoint_rows(self, status, saving, evaluations) -> tuple:
        """The card's checkpoint rows (:func:`~tune_magic.ui.snapshot.checkpoint_rows`), read again
        only when what they come from changed (the output_dir's and ``pruned.jsonl``'s stat, a save
        starting or ending, the job ending, an evaluation's value) and at most once a second while
        the job runs: a poll otherwise costs two ``stat`` calls."""
        from tune_magic.job.checkpoints import PRUNED, job_config, listing

        r = self.job.record
        if not r.output_dir:
            return ()
        made_from, at, rows = self._ckpt
        key = (_stat(r.output_dir), _stat(self.job.dir / PRUNED), saving, status.is_live,
               tuple((e.epoch, e.val_loss) for e in evaluations), len(self._in_loop or ()))
        now = time.monotonic()
        if key == made_from or (status.is_live and now - at < 1.0):
            return rows
        if self._ckpt_settings is None:
            from tune_magic.checkpoints.catalog import SaveSettings

            cfg = job_config(r)
            self._ckpt_settings = SaveSettings.from_config(cfg) if cfg is not None else False
        losses = {e.epoch: e.val_loss for e in evaluations if e.val_loss is not None}
        if not losses and self._in_loop:
            losses = {n - 1: self._in_loop[step] for n, step in self._saves.last.items() if step in self._in_loop}
        from tune_magic.checkpoints.catalog import resume_epoch

        try:
            found = listing(r, self.job.dir, self._ckpt_settings or None, steps=self._saves, losses=losses,
                            resume=resume_epoch(r.output_dir))
        except OSError:
            return rows
        self._ckpt = (key, now, checkpoint_rows(found, live=status.is_live))
        return self._ckpt[2]

    def _lineage(self, r) -> dict:
        """The snapshot's lineage fields: the earlier runs' curve (read once: they have ended) and
        the resume markers and notes (the record's attempts change while the job runs)."""
        from tune_magic.checkpoints.lineage import ancestors, attempt_marks, earlier_curve, notes

        if self._earlier is None:
            self._earlier = earlier_curve(r, ancestors(r, self.job.dir.parent)) if r.resumed_from else ()
        curve = self._earlier or None
        marks = tuple(sorted({*(curve.resumed_at if curve else ()), *attempt_marks(r)}))
        return dict(earlier_steps=curve.steps if curve else (), earlier_losses=curve.values if curve else (),
                    resumed_at=marks, lineage_notes=tuple(notes(r)))

    def _tail(self, failure=None) -> tuple[tuple[str, ...], list[list[str]]]:
        """The shown tail (a failed job's ending with the rank ``failure`` names), and the raw last
        lines of each followed log (combined, rank files)."""
        keep = self.tail_lines * READ_PER_SHOWN
        if not self.job.record.rank_log_dir:
            raw = self.follower.tail(keep)
            return tuple(display_tail(raw, self.tail_lines, rules=self.job.tail_rules, failure=failure)), [raw]
        sections = self.follower.log_sections(keep)
        shown = display_tail(sections[0][1], self.tail_lines, rules=self.job.tail_rules, failure=failure)
        for label, lines in sections[1:]:
            shown += [f"[{label}] {line}" for line in display_tail(lines, self.tail_lines, rules=self.job.tail_rules)]
        return tuple(shown), [lines for _, lines in sections]

    def _progress(self, status, step: int | None, raw: list[list[str]]) -> RunProgress:
        """Where the run is; :attr:`_run_at` moves only when it changed (its ETA counts down)."""
        r = self.job.record
        bar = _latest_bar(raw) or parse_bar(self.follower.latest_progress)
        current = max((s for s in (step, bar and bar.step) if s is not None), default=None)
        # steps per second as seen here (the fallback when the bar gives no rate), recomputed only
        # when the step moved, so that a snapshot changes only when the job wrote something
        observed = self._last_run.rate if self._last_run is not None else None
        if current is not None and (self._last_run is None or current != self._last_run.step):
            now = time.monotonic()
            if self._first_step is None or current < self._first_step[1]:
                self._first_step = (now, current)
            elif current > self._first_step[1] and now > self._first_step[0]:
                observed = (current - self._first_step[1]) / (now - self._first_step[0])
        checkpoint = None
        if status.is_live:
            states = [checkpoint_state(lines) for lines in raw]
            decided = SAVING if SAVING in states else SAVED if SAVED in states else None
            if decided is not None:
                if decided != self._checkpoint:
                    self._checkpoint_step = current
                checkpoint = decided
            elif self._checkpoint is not None and current == self._checkpoint_step:
                # only a new step ends it: the bar's closing redraw after a save, or the deciding
                # line scrolling out of the lines kept, leave it as it was
                checkpoint = self._checkpoint
            self._checkpoint = checkpoint
        point = self.follower.last(THROUGHPUT)
        run = run_progress(bar, epochs=r.epochs, max_steps_per_epoch=r.max_steps_per_epoch, metric_step=step,
                           observed_rate=observed, throughput=point.value if point is not None else None,
                           checkpoint=checkpoint)
        if run != self._last_run:
            self._last_run, self._run_at = run, self.job.elapsed_s
        return self._last_run

    @property
    def finished(self) -> bool:
        """True once the job ended and its logs were read to the end, and, for a job whose
        checkpoints are evaluated, no evaluation is queued or running and its evaluator is done."""
        return self._finished and (self.evals is None or not self.evals.open)

    @property
    def trusting_notifications(self) -> bool:
        """Whether the watcher now waits on notifications (``max_interval_s`` between polls when
        none comes) rather than on the polling schedule."""
        sub = self.subscription
        return sub is not None and sub.watching and self.missed < self.BLIND_AFTER

    def _follow(self) -> bool:
        """Point the subscription at the files the follower reads now and re-arm their watches
        (call just before reading). Returns whether that set changed (the metric file became
        known after the job started; until then, names appearing in its directory wake)."""
        f = self.follower
        key = (f.metrics_path, f.log_dir)
        if key != self._followed_key:
            files = [self.job.log_path, self._record_path]
            dirs = []
            if f.metrics_path is not None:
                files.append(f.metrics_path)
            elif f.log_dir is not None:
                dirs.append(f.log_dir)
            self._followed = (files, dirs)
            self._followed_key = key
            self.subscription.watch(*self._followed)
            return True
        self.subscription.rearm()
        return False

    def _run(self) -> None:
        if self.notify:
            from tune_magic.logs.notify import get_notifier

            self.subscription = (self.notifier or get_notifier()).subscribe(self._wake.set)
        try:
            self._loop()
        finally:
            if self.subscription is not None:
                self.subscription.close()

    def _loop(self) -> None:
        delay = self.interval_s
        woken, first = False, True
        short = 0  # notifications in a row that came within interval_s / 2 of the poll before
        sub = self.subscription
        while not self._stop.is_set():
            started = time.monotonic()
            self._wake.clear()  # a write during the poll sets it again: the next wait ends at once
            try:
                if sub is not None:
                    self._follow()  # re-arm before reading: no write falls between
                self.poll_once()
                if sub is not None and self._follow_changed():
                    self._follow()
            except Exception:  # a view must never kill the watcher; the next poll retries
                pass
            if self.finished:
                return
            if woken:
                self.missed = 0
            elif self.files_changed and sub is not None and not first:
                self.missed += 1  # written, yet nothing woke us since the last notification
            first = False
            delay = self.interval_s if self.changed else min(delay * 1.5, self.max_interval_s)
            if not self.trusting_notifications:
                timeout = delay
            elif woken or first:
                timeout = self.max_interval_s
            else:
                # idle: poll on the wall clock's whole seconds, so that the idle cards of a process
                # wake together rather than each on its own
                timeout = self.max_interval_s - time.time() % self.max_interval_s
            if self.evals is not None and self.evals.pending:
                # an evaluation's result file wakes nothing: it reaches the card within a second
                timeout = min(timeout, self.max_interval_s / 2)
            woken = self._wake.wait(timeout)
            if self._stop.is_set():
                return
            if not woken:
                short = 0
                continue
            self.woken += 1
            since = time.monotonic() - started
            short = short + 1 if since < self.interval_s / 2 else 0
            if since >= self.interval_s:
                self.fast = False  # quiet for a whole interval after a poll: not a chatty job
            elif short >= 3:
                self.fast = True  # it wrote again within half an interval of each of 3 polls
            if self._record_path in sub.take_woken_by():
                continue  # the job's state changed (it ended, failed, was stopped): show it now
            hold = started + self.interval_s * (2 if self.fast else 1) - time.monotonic()
            if hold > 0:
                self._stop.wait(hold)  # coalesce: at most one poll per interval (two while fast)

    def _follow_changed(self) -> bool:
        f = self.follower
        return (f.metrics_path, f.log_dir) != self._followed_key

    def stop(self, timeout: float | None = 2.0) -> None:
        """Stop following (the job keeps running); the thread releases its file watches."""
        self._stop.set()
        self._wake.set()
        super().stop(timeout)


def stopped_how(snap: JobSnapshot) -> str:
    """How a stopped job was stopped, in words: ``stopped by the user at step 6``, or with its
    reason when someone else stopped it: ``stopped: cancelled outside tune_magic at step 6``."""
    at = "" if snap.step is None else f" at step {snap.step}"
    return f"stopped: {snap.error}{at}" if snap.error else f"stopped by the user{at}"


def _latest_bar(sections: list[list[str]]) -> Bar | None:
    """The newest torchtune bar in the last lines of the logs: tqdm leaves its line open, so the
    latest redraw is the line still being written, which the parser has not seen yet."""
    best = None
    for lines in sections:
        for line in reversed(lines):
            if "Loss: " in line:
                # the line's last redraw: a log line glued after it does not hide it
                bar = parse_bar(line)
                if bar is not None:
                    if best is None or (bar.step, bar.n is not None) > (best.step, best.n is not None):
                        best = bar
                    break
    return best


def _epoch_dirs(output_dir) -> tuple:
    """``(name, mtime in ns)`` of each ``epoch_*`` entry of ``output_dir``: it changes when a
    checkpoint folder appears, gains a file or is pruned."""
    try:
        with os.scandir(output_dir or "") as entries:
            return tuple(sorted((e.name, e.stat().st_mtime_ns) for e in entries if e.name.startswith("epoch_")))
    except OSError:
        return ()


def _stat(path) -> tuple | None:
    """``(inode, size, mtime in ns)`` of ``path``, or ``None`` if it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class SweepWatcher(Watcher):
    """Follow a sweep: every trial's status from its job's record and summary, each started trial's
    losses through its own incremental follower (read while the trial runs, once more when it
    ends). Each look also starts the sweep process again when it died with trials queued
    (:meth:`tune_magic.sweeping.sweep.Sweep.revive`: a card of such a sweep would wait for good), and
    the keeper of an ended trial whose checkpoints still await their evaluation
    (:func:`tune_magic.job.keeper.keep_evaluating`). It is done once the trials ended and no
    evaluation of theirs can still change the ranking.

    Args:
        sweep: the sweep.
        sink: as :class:`Watcher`'s; receives a :class:`~tune_magic.ui.snapshot.SweepSnapshot`.
        interval_s: seconds between looks.
    """

    #: Most points per trial handed to the chart (older ones thinned; the logs keep every one).
    MAX_POINTS = 500

    def __init__(self, sweep: Sweep, sink: Callable[[SweepSnapshot], None] | None = None, *,
                 interval_s: float = 0.5):
        super().__init__(sink, interval_s, f"tune_magic-sweep-{sweep.id}")
        self.sweep = sweep
        self._followers: dict[str, JobMetricsFollower] = {}
        self._ended: set[str] = set()
        self._curves: dict[str, tuple] = {}
        self._best_ckpts: dict[str, tuple] = {}
        self.done = False  #: the sweep ended and every trial's logs were read to their end

    @property
    def finished(self) -> bool:
        return self.done

    def _poll(self) -> SweepSnapshot:
        snap = self._read()
        last = self._last
        ticked = last is None or any(int(a.elapsed_s) != int(b.elapsed_s) for a, b in zip(snap.rows, last.rows))
        return self._hand_over(snap, last is None or snap != last, ticked)

    def _read(self) -> SweepSnapshot:
        from tune_magic.job.keeper import keep_evaluating

        self.sweep.revive()
        rows, evaluating = [], False
        trials = self.sweep.trials
        standings = results(trials)
        for t, r in zip(trials, standings):
            texts = tuple(t.texts.items())
            if t.job is None:
                rows.append(TrialRow(t.index, t.name, texts, t.status, note=t.error or t.waiting))
                continue
            steps, losses, lowest = self._curve(t.job)
            if r.val_pending and not t.job.record.state.is_live:  # its keeper, started again if it died
                evaluating = keep_evaluating(t.job) or evaluating
            rows.append(TrialRow(t.index, t.name, texts, t.status, t.job.id, steps[-1] if steps else None,
                                 losses[-1] if losses else None, lowest, t.job.elapsed_s, note=t.error,
                                 steps=steps, losses=losses, validates=r.validates, best_val_loss=r.best_val_loss,
                                 val_pending=r.val_pending, best_checkpoint=self._best_checkpoint(t, r)))
        status = sweep_status([r.status for r in rows], self.sweep.record.stop_requested_at)
        ranking = rank(standings)  # the one measure on the one input every view uses
        # the trials ended, their logs read to the end, and no evaluation of theirs can still change the ranking
        self.done = status != "running" and all(r.job_id in self._ended for r in rows if r.job_id) and not evaluating
        rec = self.sweep.record
        return SweepSnapshot(sweep_id=rec.id, name=rec.name, status=status, keys=tuple(rec.keys),
                             max_parallel=rec.max_parallel, slots=tuple(tuple(s) if s else None for s in rec.slots),
                             rows=tuple(rows), best=None if ranking.best is None else ranking.best.trial.index,
                             ranked_by=ranking.measure, ranking_note=ranking.note)

    def _best_checkpoint(self, trial, result) -> str | None:
        """The name of the trial's kept checkpoint with the lowest validation loss (the one
        ``checkpoint="best"`` loads), or ``None``. Listing checkpoints reads the job's log, so it is
        asked again only when the trial's validation losses, status or ``epoch_N`` folders changed."""
        if result.best_val_loss is None:
            return None
        job = trial.job
        key = (result.best_val_loss, result.val_step, result.val_pending, trial.status,
               _epoch_dirs(job.record.output_dir))
        known = self._best_ckpts.get(job.id)
        if known is None or known[0] != key:
            best = best_kept(job.checkpoints())
            known = self._best_ckpts[job.id] = (key, None if best is None else best.name)
        return known[1]

    def _curve(self, job) -> tuple[tuple[int, ...], tuple[float, ...], float | None]:
        """The job's loss curve and lowest loss: its follower is read while it runs, and once more
        to the end when it has ended; an ended job's curve is kept as read."""
        if job.id in self._ended:
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
            series = follower.series(LOSS, self.MAX_POINTS)
            lowest = self._curves.get(job.id, ((), (), None))[2]
            finite = [p.value for p in changes if p.name == LOSS and p.value == p.value]  # nan != nan
            if finite:
                lowest = min(finite) if lowest is None else min(lowest, *finite)
            self._curves[job.id] = (tuple(series.steps), tuple(series.values), lowest)
        if ended:
            self._ended.add(job.id)
            self._followers.pop(job.id).close()
        return self._curves[job.id]

    def stop(self, timeout: float | None = 2.0) -> None:
        """Stop following (the sweep goes on); close the followers."""
        super().stop(timeout)
        with self._poll_lock:
            for follower in self._followers.values():
                follower.close()
            self._followers.clear()


def watcher_for(target: Target, sink: Callable | None = None, *, interval_s: float = 0.5, **options) -> Watcher:
    """The watcher of a job (:class:`JobWatcher`, ``options`` passed on) or of a sweep
    (:class:`SweepWatcher`)."""
    if isinstance(target, Sweep):
        return SweepWatcher(target, sink, interval_s=interval_s)
    return JobWatcher(target, sink, interval_s=interval_s, **options)


def stream_text(target: Target, write: Callable[[str], None], *, interval_s: float = 0.5):
    """Follow a job or a sweep in the calling thread, writing a line for each new thing (a job's
    loss and validation-loss points; a sweep's trials as they start and end) and a final summary
    (``%%tune_run --wait``, where widgets cannot render; ``tune-magic run --wait`` of a sweep).
    Returns the final snapshot."""
    watcher = watcher_for(target, interval_s=interval_s, tail_lines=5)
    before = None
    while True:
        snap = watcher.poll_once()
        for line in snap.news(before):
            write(line + "\n")
        before = snap
        if watcher.finished:
            break
        time.sleep(interval_s)
    watcher.stop()
    write(snap.summary() + "\n")
    return snap
