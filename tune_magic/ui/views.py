"""Widgets that show jobs: a live card per job and a jobs table. They only set traits.

Each card owns a :class:`~tune_magic.ui.watch.JobWatcher` whose daemon thread calls
:meth:`JobCard.update`, which assigns widget traits and nothing else: no ``print``, no
``with out:``, so nothing lands in whatever cell happens to be running. Where widgets cannot render
(terminal IPython, nbconvert), the text/plain form of a card is the same information as text.
The jobs table has one refresher thread of its own, bound by the same rule (:class:`JobsTable`).
"""

from __future__ import annotations

import html
import itertools
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Iterable

import ipywidgets as widgets

from tune_magic.registry import store as jobstore
from tune_magic.schedulers.local.gpus import gpus_label
from tune_magic.job import Job, jobs
from tune_magic.registry.status import Status
from tune_magic.ui.textfmt import cut, escape, table
from tune_magic.ui.watch import JobSnapshot, JobWatcher

#: Longest log line shown in a card, in characters (the full line stays on disk).
MAX_LINE_CHARS = 400

_STATUS_COLOURS = {"pending": "#ff7f0e", "running": "#1f77b4", "unknown": "#8c564b", "succeeded": "#2ca02c",
                   "failed": "#d62728", "stopped": "#7f7f7f"}
#: Each status's colour in cards and tables (the sweep card uses them too).
STATUS_COLOURS = _STATUS_COLOURS


def _fmt_elapsed(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


#: Most x-axis ticks on a card's chart (integer steps, each label once).
MAX_TICKS = 8
# text that wraps anywhere (long paths, long log lines), never widening the card
_CARD_WRAP = "white-space:normal;overflow-wrap:anywhere;word-break:break-word;line-height:1.4"


def int_ticks(lo: int, hi: int, most: int = MAX_TICKS) -> list[int]:
    """Integer tick values between ``lo`` and ``hi`` (steps), at most ``most`` of them, each once.

    The spacing is 1, 2 or 5 x 10^k steps, the smallest that keeps the count within ``most``; ticks
    sit on its multiples (``int_ticks(1, 6)`` -> ``[1, 2, 3, 4, 5, 6]``, ``int_ticks(1, 40)`` ->
    ``[5, 10, ..., 40]``). ``hi < lo`` is taken as ``hi = lo``.
    """
    lo, hi = int(lo), int(max(hi, lo))
    span = max(hi - lo, 1)
    k = 0
    while True:
        for m in (1, 2, 5):
            spacing = m * 10 ** k
            if span // spacing + 1 <= most:
                first = -(-lo // spacing) * spacing
                return list(range(first, hi + 1, spacing)) or [lo]
        k += 1


def step_domain(steps) -> tuple[int, int]:
    """The x-axis range (steps) of a chart of ``steps`` (non-empty): their least and greatest,
    widened to a unit around a single step, never below 0."""
    lo, hi = min(steps), max(steps)
    if hi == lo:
        lo, hi = max(lo - 1, 0), lo + 1
    return int(lo), int(hi)


def _loss_chart():
    """Return (figure, lines mark, x axis, x scale) of a loss-vs-step chart (bqplot)."""
    import bqplot

    x, y = bqplot.LinearScale(), bqplot.LinearScale()
    line = bqplot.Lines(x=[], y=[], scales={"x": x, "y": y}, colors=["#1f77b4"], marker="circle",
                        marker_size=16)
    x_axis = bqplot.Axis(scale=x, label="step", tick_format="d", tick_values=[])
    fig = bqplot.Figure(
        marks=[line],
        axes=[x_axis, bqplot.Axis(scale=y, side="left", label="loss")],
        # hidden until the first point: no empty 0..1 grid. No side margins: with the widgets' default
        # 2 px each side, 100% width overflows the card by 4 px (a horizontal scrollbar). Overflow
        # clipped: bqplot redraws an off-screen figure at its new width only once it is scrolled
        # into view, and until then its old, wider drawing must not widen the card
        layout=widgets.Layout(width="100%", min_width="0", height="240px", margin="2px 0px", overflow="hidden",
                              display="none"),
        padding_y=0.05,
        padding_x=0.03, fig_margin={"top": 10, "bottom": 40, "left": 60, "right": 25},
    )
    return fig, line, x_axis, x


class JobCard(widgets.VBox):
    """A live view of one job.

    Public child widgets (stable names, for tests and tutorials), top to bottom: ``error`` (HTML,
    shown for a failed job: its first line is the job's ``error``; for a stopped one: "stopped by
    the user"), ``traceback`` (Accordion, collapsed, holding ``traceback_html``: a failed job's
    whole traceback, :meth:`Job.failure`), ``header`` (HTML: name/id, status, GPUs, endpoint,
    output_dir), ``notes`` (HTML, small: nodes of a multi-node or SLURM job, launch warnings,
    a lost log), ``progress`` (HTML: where the run is: epoch of epochs, step of steps, loss, steps
    this epoch, elapsed, ETA, throughput; "waiting for the first step", "waiting in the queue:
    <reason>", "saving checkpoint…"), ``chart`` (bqplot Figure, hidden until the first loss) with
    ``loss_line`` (its Lines mark: ``x`` steps, ``y`` losses) and ``x_axis`` (integer ticks),
    ``log_tail`` (HTML: the last log lines, :func:`tune_magic.logs.tailview.display_tail`; long lines
    wrap) and ``stop_button`` (shown while the job is pending or running). ``snapshot`` is the last
    :class:`JobSnapshot` shown.

    Args:
        job: the job to show.
        watch: start the watcher thread now (default True).
        interval_s: seconds between refreshes (at most a few per second).
        tail_lines: log lines shown.
        notify: refresh when the job's files change (file-change notification, polling at least
            once a second), or only poll every ``interval_s`` (False); see :class:`JobWatcher`.
    """

    _by_job: "weakref.WeakValueDictionary[str, JobCard]" = weakref.WeakValueDictionary()

    @classmethod
    def for_job(cls, job_id: str) -> "JobCard | None":
        """Return the most recent live card of ``job_id`` in this process, if any."""
        return cls._by_job.get(job_id)

    def __init__(self, job: Job, *, watch: bool = True, interval_s: float = 0.25, tail_lines: int = 15,
                 notify: bool = True):
        self.job = job
        hidden = dict(display="none", min_width="0")
        self.error = widgets.HTML(layout=widgets.Layout(**hidden))
        self.traceback_html = widgets.HTML(layout=widgets.Layout(min_width="0"))
        self.traceback = widgets.Accordion(children=[self.traceback_html], titles=("traceback",),
                                           selected_index=None, layout=widgets.Layout(**hidden))
        self.header = widgets.HTML(layout=widgets.Layout(min_width="0"))
        self.notes = widgets.HTML(layout=widgets.Layout(**hidden))
        self.progress = widgets.HTML(layout=widgets.Layout(min_width="0"))
        self.chart, self.loss_line, self.x_axis, self._x_scale = _loss_chart()
        self.log_tail = widgets.HTML(layout=widgets.Layout(min_width="0"))
        self.stop_button = widgets.Button(description="Stop", button_style="danger", icon="stop",
                                          tooltip=f"Stop job {job.id}")
        self.stop_button.on_click(self._on_stop)
        self.snapshot: JobSnapshot | None = None
        self._shown_steps: tuple | None = None
        super().__init__(children=[self.error, self.traceback, self.header, self.notes, self.progress, self.chart,
                                   self.log_tail, self.stop_button],
                         layout=widgets.Layout(border="1px solid #ddd", padding="6px", min_width="0",
                                               max_width="100%"))
        self.add_class("tune-magic-card")
        self.watcher = JobWatcher(job, self.update, interval_s=interval_s, tail_lines=tail_lines, notify=notify)
        JobCard._by_job[job.id] = self
        if watch:
            self.watcher.start()

    def update(self, snap: JobSnapshot) -> None:
        """Show ``snap``. Sets traits only, so it is safe from the watcher thread."""
        self.snapshot = snap
        status = Status(snap.status) if snap.status in Status._value2member_map_ else None
        colour = _STATUS_COLOURS.get(snap.status, "#000")
        bits = [f"<b>{html.escape(snap.name)}</b> <code>{snap.job_id}</code>",
                f"<span class='tm-status' style='color:{colour}'>{html.escape(snap.label)}</span>"]
        if snap.gpus:
            bits.append(html.escape(gpus_label(snap.gpus, snap.physical_gpus)))
        if snap.endpoint:
            bits.append(f"rendezvous <code class='tm-endpoint'>{html.escape(snap.endpoint)}</code>")
        if snap.output_dir:
            bits.append(f"<code>{html.escape(snap.output_dir)}</code>")
        _set(self.header, f"<div class='tm-header' style='{_CARD_WRAP}'>" + " · ".join(bits) + "</div>")
        notes = snap.notes()
        _set(self.notes, f"<div class='tm-notes' style='{_CARD_WRAP};font-size:11px;color:#8a6d3b'>"
             + "<br>".join(html.escape(n) for n in notes) + "</div>")
        _show(self.notes, bool(notes))
        parts = [f"<span class='{cls}'>{html.escape(text)}</span>{html.escape(suffix)}"
                 for cls, text, suffix in snap.progress_parts()]
        _set(self.progress, f"<div class='tm-progress' style='{_CARD_WRAP}'>" + " · ".join(parts) + "</div>")
        self._chart(snap)
        lines = [line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " …" for line in snap.tail]
        # the tail is already bounded (tail_lines), so show all of it: newest lines last, in view;
        # long lines wrap (a horizontal scrollbar would hide the end of every line)
        _set(self.log_tail, "<pre class='tm-log' style='font-size:11px;margin:0;white-space:pre-wrap;"
             "overflow-wrap:anywhere;word-break:break-all;line-height:1.35'>" + html.escape("\n".join(lines)) + "</pre>")
        self._ending(snap, status)
        live = status is not None and status.is_live
        self.stop_button.disabled = not live or self.stop_button.description != "Stop"
        self.stop_button.layout.display = None if live else "none"

    def _chart(self, snap: JobSnapshot) -> None:
        """The curve and integer step ticks; the chart stays hidden until the first point."""
        if not snap.steps or snap.steps == self._shown_steps:
            return
        self.loss_line.x, self.loss_line.y = list(snap.steps), list(snap.losses)
        lo, hi = step_domain(snap.steps)
        ticks = int_ticks(lo, hi)
        if (self._x_scale.min, self._x_scale.max) != (lo, hi):
            self._x_scale.min, self._x_scale.max = float(lo), float(hi)
        if list(self.x_axis.tick_values if self.x_axis.tick_values is not None else []) != ticks:
            self.x_axis.tick_values = ticks
        self._shown_steps = snap.steps
        self.chart.layout.display = None

    def _ending(self, snap: JobSnapshot, status: Status | None) -> None:
        """The first lines of an ended job: why it failed (and its traceback), or that it was stopped."""
        if status is Status.FAILED:
            line = snap.error or f"exited with code {snap.returncode}"
            _set(self.error, f"<div class='tm-error' style='{_CARD_WRAP};color:#d62728;font-weight:bold' "
                             f"title='failed'>{html.escape(line)}</div>")
            _show(self.error, True)
            if snap.traceback:
                _set(self.traceback_html, "<pre class='tm-traceback' style='font-size:11px;margin:0;"
                     "white-space:pre-wrap;overflow-wrap:anywhere;word-break:break-all'>"
                     + html.escape(snap.traceback) + "</pre>")
                _show(self.traceback, True)
        elif status is Status.STOPPED:
            at = "" if snap.step is None else f" at step {snap.step}"
            _set(self.error, f"<div class='tm-stopped' style='{_CARD_WRAP};color:#7f7f7f'><b>stopped</b> by the user{at}</div>")
            _show(self.error, True)
        elif status is Status.UNKNOWN:
            _set(self.error, f"<div class='tm-unknown' style='{_CARD_WRAP};color:#8c564b'><b>outcome unknown</b>: its "
                 "processes are gone and no exit code was recorded (yet)</div>")
            _show(self.error, True)
        else:
            _show(self.error, False)

    def _on_stop(self, _button=None) -> None:
        self.stop_button.disabled = True
        self.stop_button.description = "Stopping…"
        # stop() waits up to its grace period; keep the kernel free for other cells meanwhile
        threading.Thread(target=self.job.stop, name=f"tune_magic-stop-{self.job.id}", daemon=True).start()

    def text(self) -> str:
        """The card as plain text: what the widgets show (the traceback as a pointer to it)."""
        snap = self.snapshot or self.watcher.poll_once()
        lines = [f"job {snap.job_id} ({snap.name}): {snap.label}"]
        if snap.status == Status.FAILED:
            lines.append(snap.error or f"exited with code {snap.returncode}")
            if snap.traceback:
                lines.append(f"(whole traceback: tune-magic logs {snap.job_id} --error)")
        elif snap.status == Status.STOPPED:
            lines.append("stopped by the user" + ("" if snap.step is None else f" at step {snap.step}"))
        lines += snap.placement()
        lines += snap.notes()
        lines.append(snap.progress_text())
        return "\n".join(lines + list(snap.tail[-5:]))

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text()
        return bundle

    def close(self) -> None:
        """Stop following (the job keeps running) and close the widgets."""
        watcher = getattr(self, "watcher", None)
        if watcher is not None:
            watcher.stop()
        super().close()


def _set(widget: widgets.HTML, value: str) -> None:
    if widget.value != value:
        widget.value = value


def _show(widget: widgets.Widget, shown: bool) -> None:
    want = None if shown else "none"
    if widget.layout.display != want:
        widget.layout.display = want


#: Seconds between a live table's refreshes: at most one update a second.
TABLE_INTERVAL_S = 1.0
#: Hidden rows a table keeps ready for jobs that appear after it was built: widgets are created on
#: the kernel's own thread only, so the refresher fills these by setting traits.
SPARE_ROWS = 8
#: Longest failure or pending reason shown in a row, in characters (the whole text is the tooltip).
REASON_WIDTH = 160

#: A registry changed less than this many seconds ago is listed again even when its stamp did not
#: change (two changes within one filesystem timestamp tick leave one stamp).
ROOT_SETTLE_S = 2.0

_COUNTER = itertools.count(1)
# cell text that wraps (a word longer than the column too), with normal line spacing (a widget line is 28 px)
_WRAP = "white-space:normal;overflow-wrap:break-word;line-height:1.35"


class _Row:
    """One row's widgets (a slot of the grid); ``job`` is ``None`` while it is a hidden spare."""

    def __init__(self, table: "JobsTable"):
        def cell(kind: str) -> widgets.HTML:
            w = widgets.HTML(layout=widgets.Layout(display="none", min_width="0"))
            w.add_class(f"tm-cell-{kind}")
            return w

        self.job: Job | None = None
        self.done = False  # ended and shown as ended: never refreshed again
        self.live: bool | None = None  # whether the Stop button is shown
        self.shown: tuple | None = None
        self.cells = {kind: cell(kind) for kind in ("id", "name", "status", "step", "loss", "elapsed")}
        self.button = widgets.Button(description="Stop", button_style="danger", layout=widgets.Layout(width="70px"))
        self.button.on_click(lambda _b: table._stop(self))
        self.stop_cell = widgets.Box(layout=widgets.Layout(display="none"))
        self.stop_cell.add_class("tm-cell-stop")
        # the reason gets a line of its own under the row, so a long one wraps instead of widening the
        # table; grid_area, not grid_column: the frontend removes the grid-area shorthand after setting
        # grid-column (ipywidgets 8.1), which clears it
        self.reason = widgets.HTML(layout=widgets.Layout(display="none", grid_area="auto / 2 / auto / -1",
                                                         min_width="0"))
        self.reason.add_class("tm-cell-reason")

    def widgets(self) -> list[widgets.Widget]:
        return [*self.cells.values(), self.stop_cell, self.reason]

    def public(self) -> dict[str, widgets.Widget]:
        return {**self.cells, "stop": self.button, "reason": self.reason}


class JobsTable(widgets.VBox):
    """All jobs (including those started by earlier kernels and by other processes), kept live.

    Columns: id, name, status, step, last loss, elapsed, and a Stop button on the rows of live
    (pending, running) jobs; a failed row's reason and a pending row's SLURM reason (``Resources``,
    ``Priority``...) show on a line under it. ``rows`` maps job id -> that row's widgets (``id``,
    ``name``, ``status``, ``step``, ``loss``, ``elapsed``, ``reason`` HTML, ``stop`` Button);
    ``summaries`` maps job id -> ``(name, status label, step, loss, elapsed seconds, reason)`` as
    last shown; ``jobs`` lists the jobs shown, in row order.

    One named daemon thread per table (``tune_magic-jobs-table-N``) refreshes it every
    :data:`TABLE_INTERVAL_S` seconds: rows of jobs not yet ended are re-read from each job's record
    and summary (:meth:`Job.summary`: never its whole log), and a table of all jobs adds the rows of
    jobs that appeared since (one ``stat`` of the registry a second while nothing changes) and hides
    those removed. The thread only sets widget traits; it never prints.

    Args:
        listed: the jobs to show (default: every job, and jobs launched later appear too).
        live: start the refresher thread (default True).
    """

    COLUMNS = ("id", "name", "status", "step", "loss", "elapsed", "")

    def __init__(self, listed: Iterable[Job] | None = None, *, live: bool = True):
        self._discover = listed is None
        self._root = jobstore.jobs_root(create=False) if self._discover else None
        self._root_stamp: tuple | None = None
        self._lock = threading.RLock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._slots: list[_Row] = []
        self._gone: set[str] = set()  # ids removed from the registry while shown
        self.overflow: list[str] = []  # ids of new jobs found with no spare row left
        self.jobs: list[Job] = []
        self.rows: dict[str, dict[str, widgets.Widget]] = {}
        self.summaries: dict[str, tuple] = {}
        if self._discover:
            self._root_stamp = _dir_stamp(self._root)
        listed = list(jobs() if listed is None else listed)
        header = []
        for c in self.COLUMNS:
            h = widgets.HTML(f"<b>{c}</b>")
            h.add_class("tm-cell-head")
            header.append(h)
        self._header = header
        for job in listed:
            self._fill(self._new_slot(), job)
        self._top_up()
        self.grid = widgets.GridBox(self._grid_children(), layout=widgets.Layout(
            # id and name: auto, so they wrap (ids at their hyphens) rather than widen a narrow notebook
            grid_template_columns="auto auto repeat(4, max-content) 76px", justify_content="flex-start",
            grid_gap="2px 12px", align_items="center", max_width="100%"))
        self.grid.add_class("tm-jobs-grid")
        self.note = widgets.HTML(layout=widgets.Layout(display="none"))
        super().__init__(children=[self.grid, self.note], layout=widgets.Layout(max_width="100%"))
        self.add_class("tune-magic-jobs")
        if live:
            self.start()

    # -- rows ---------------------------------------------------------------------------------
    def _new_slot(self) -> _Row:
        row = _Row(self)
        self._slots.append(row)
        return row

    def _top_up(self) -> None:
        """Keep :data:`SPARE_ROWS` hidden rows ready (creates widgets: the kernel's thread only)."""
        spare = sum(1 for r in self._slots if r.job is None)
        for _ in range(SPARE_ROWS - spare):
            self._new_slot()

    def _grid_children(self) -> list[widgets.Widget]:
        return self._header + [w for r in self._slots for w in r.widgets()]

    def _fill(self, row: _Row, job: Job) -> None:
        """Give ``row`` to ``job`` and show it (sets traits only)."""
        row.job = job
        self.jobs.append(job)
        self.rows[job.id] = row.public()
        row.cells["id"].value = f"<div style='{_WRAP}'><code class='tm-job-id'>{html.escape(job.id)}</code></div>"
        for w in row.widgets()[:-1]:
            w.layout.display = None
        self._show(row)

    def add(self, job: Job) -> None:
        """Show ``job`` now (the panel calls this for its own launches); no-op if shown already.
        Call from the kernel's thread: it may create widgets for spare rows."""
        with self._lock:
            if job.id not in self.rows:
                spare = next((r for r in self._slots if r.job is None), None)
                # its own Job object: the refresher thread must not share one with the caller's code
                self._fill(spare or self._new_slot(), Job(job.dir))
            self._top_up()
            self.grid.children = self._grid_children()

    @staticmethod
    def _values(job: Job) -> tuple:
        """(name, status label, step, loss, elapsed s, reason) of ``job`` from its record and summary;
        a sweep's trial is named ``<its values> · sweep <sweep name> #<trial>``."""
        s = job.summary()  # refreshes the record first
        r = job.record
        state = r.state
        reason = ""
        if state is Status.FAILED:
            reason = r.error or s.error or (f"exit code {r.returncode}" if r.returncode is not None else "")
        elif state is Status.PENDING:
            reason = r.pending_reason or ""
        elif state is Status.UNKNOWN:
            reason = r.error or ""
        name = r.name if not r.sweep else f"{r.name} · sweep {r.sweep.get('name') or r.sweep['id']} #{r.sweep['trial']}"
        return (name, state.label, s.step, s.loss, job.elapsed_s, reason)

    def _show(self, row: _Row) -> None:
        """Re-read ``row``'s job and set the traits that changed."""
        job = row.job
        values = self._values(job)
        name, label, step, loss, elapsed, reason = values
        state = job.record.state
        self.summaries[job.id] = values
        if values == row.shown:
            return
        old = row.shown or (None,) * 6
        c = row.cells
        if name != old[0]:  # a long name wraps (the table never widens past its notebook)
            c["name"].value = (f"<div title='{html.escape(escape(name))}' style='{_WRAP}'>"
                               f"{html.escape(cut(name))}</div>")
        if label != old[1]:
            colour = _STATUS_COLOURS.get(state.value, "#000")
            c["status"].value = f"<span class='tm-status' style='color:{colour}'>{html.escape(label)}</span>"
        if step != old[2]:
            c["step"].value = "" if step is None else f"<span class='tm-step'>{step}</span>"
        if loss != old[3]:
            c["loss"].value = "" if loss is None else f"<span class='tm-loss'>{loss:.5g}</span>"
        if int(elapsed) != int(old[4] or 0) or old[4] is None:
            c["elapsed"].value = _fmt_elapsed(elapsed)
        if reason != old[5]:
            if reason:
                kind = "pending" if state is Status.PENDING else "error"
                why = "waiting for" if kind == "pending" else "failed:" if state is Status.FAILED else ""
                row.reason.value = (f"<div class='tm-reason tm-reason-{kind}' title='{html.escape(escape(reason))}' "
                                    f"style='color:{_STATUS_COLOURS.get(state.value, '#000')};{_WRAP}'>"
                                    f"{why} {html.escape(cut(reason, REASON_WIDTH))}</div>")
            row.reason.layout.display = None if reason else "none"
        live = state.is_live
        if live != row.live:
            row.live = live
            row.button.disabled = not live
            row.button.description = "Stop"
            row.stop_cell.children = (row.button,) if live else ()
        row.shown = values
        row.done = state.is_terminal

    # -- refreshing ---------------------------------------------------------------------------
    def refresh_once(self) -> None:
        """Find new and removed jobs (a table of all jobs) and re-read the rows of jobs not ended.
        Sets traits only; what the thread runs each :data:`TABLE_INTERVAL_S` seconds."""
        with self._lock:
            if self._discover:
                self._find_new()
            for row in self._slots:
                if row.job is not None and not row.done and row.job.id not in self._gone:
                    try:
                        self._show(row)
                    except Exception:  # noqa: BLE001 - one unreadable job must not stop the others
                        continue

    def _find_new(self) -> None:
        stamp = _dir_stamp(self._root)
        # unchanged since the last look, and not changed so recently that a second change within the
        # same timestamp tick could hide behind the first
        if stamp == self._root_stamp and (stamp is None or time.time() - stamp[1] / 1e9 > ROOT_SETTLE_S):
            return
        self._root_stamp = stamp
        try:
            names = {e.name for e in os.scandir(self._root)
                     if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)}
        except OSError:
            return
        for row in self._slots:
            if row.job is not None and row.job.id not in names and row.job.id not in self._gone:
                self._gone.add(row.job.id)  # removed (tune-magic rm): hide its row
                for w in row.widgets():
                    w.layout.display = "none"
        found = []
        for name in names - set(self.rows) - set(self.overflow):
            try:
                job = Job(self._root / name)
            except Exception:  # noqa: BLE001 - not a job directory (yet): listed when it becomes one
                continue
            if not job.damaged:
                found.append(job)
        for job in sorted(found, key=lambda j: (j.started_at, j.id)):
            spare = next((r for r in self._slots if r.job is None), None)
            if spare is None:
                self.overflow.append(job.id)
                continue
            self._fill(spare, job)
        if self.overflow:
            self.note.value = (f"<span class='tm-hint'>{len(self.overflow)} more new job(s) since this table was "
                               "shown: run %tune_jobs again to list them</span>")
            self.note.layout.display = None

    def _run(self) -> None:
        while not self._stop_event.wait(TABLE_INTERVAL_S):
            try:
                self.refresh_once()
            except Exception:  # noqa: BLE001 - the refresher never dies and never prints
                pass

    def start(self) -> "JobsTable":
        """Start the refresher thread (``tune_magic-jobs-table-N``, daemon); return self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"tune_magic-jobs-table-{next(_COUNTER)}",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 2.0) -> None:
        """Stop refreshing (the jobs keep running)."""
        self._stop_event.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def close(self) -> None:
        """Stop refreshing and close the widgets."""
        if hasattr(self, "_stop_event"):
            self.stop()
        for w in getattr(self, "_header", []) + [w for r in getattr(self, "_slots", []) for w in r.widgets()]:
            w.close()
        super().close()

    def _stop(self, row: _Row) -> None:
        job = row.job
        if job is None:
            return
        row.button.disabled = True
        row.button.description = "Stopping…"
        # stop() waits up to its grace period; the refresher shows the outcome
        threading.Thread(target=job.stop, name=f"tune_magic-stop-{job.id}", daemon=True).start()

    # -- text ---------------------------------------------------------------------------------
    def text(self) -> str:
        """The table as plain text: one line per job (name and reason escaped and cut)."""
        rows = [self.COLUMNS[:-1] + ("reason",)]
        with self._lock:
            items = [(i, v) for i, v in self.summaries.items() if i not in self._gone]
        for job_id, (name, status, step, loss, elapsed, reason) in items:
            rows.append((job_id, cut(name), status, "" if step is None else str(step),
                         "" if loss is None else f"{loss:.5g}", _fmt_elapsed(elapsed), cut(reason, REASON_WIDTH)))
        return "\n".join(table(rows))

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text()
        return bundle


def _dir_stamp(path: Path | None) -> tuple | None:
    """(inode, mtime ns) of a directory: changes when an entry is added, removed or renamed."""
    try:
        st = os.stat(path)
    except (OSError, TypeError):
        return None
    return (st.st_ino, st.st_mtime_ns)
