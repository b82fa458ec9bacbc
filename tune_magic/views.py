"""Widgets that show jobs: a live card per job and a jobs table. They only set traits.

Each card owns a :class:`~tune_magic.watch.JobWatcher` whose daemon thread calls
:meth:`JobCard.update`, which assigns widget traits and nothing else: no ``print``, no
``with out:``, so nothing lands in whatever cell happens to be running. Where widgets cannot render
(terminal IPython, nbconvert), the text/plain form of a card is the same information as text.
"""

from __future__ import annotations

import html
import threading
import weakref
from typing import Iterable

import ipywidgets as widgets

from .gpus import gpus_label
from .jobctl import Job, jobs
from .status import Status
from .watch import JobSnapshot, JobWatcher, progress_summary

#: Longest log line shown in a card, in characters (the full line stays on disk).
MAX_LINE_CHARS = 400

_STATUS_COLOURS = {"pending": "#ff7f0e", "running": "#1f77b4", "unknown": "#8c564b", "succeeded": "#2ca02c",
                   "failed": "#d62728", "stopped": "#7f7f7f"}


def _fmt_elapsed(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


#: Most x-axis ticks on a card's chart (integer steps, each label once).
MAX_TICKS = 8
# text that wraps anywhere (long paths, long log lines), never widening the card
_WRAP = "white-space:normal;overflow-wrap:anywhere;word-break:break-word;line-height:1.4"


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
    ``log_tail`` (HTML: the last log lines, :func:`tune_magic.tailview.display_tail`; long lines
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
        _set(self.header, f"<div class='tm-header' style='{_WRAP}'>" + " · ".join(bits) + "</div>")
        notes = snap.notes()
        _set(self.notes, f"<div class='tm-notes' style='{_WRAP};font-size:11px;color:#8a6d3b'>"
             + "<br>".join(html.escape(n) for n in notes) + "</div>")
        _show(self.notes, bool(notes))
        parts = [f"<span class='{cls}'>{html.escape(text)}</span>{html.escape(suffix)}"
                 for cls, text, suffix in snap.progress_parts()]
        _set(self.progress, f"<div class='tm-progress' style='{_WRAP}'>" + " · ".join(parts) + "</div>")
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
            _set(self.error, f"<div class='tm-error' style='{_WRAP};color:#d62728;font-weight:bold' "
                             f"title='failed'>{html.escape(line)}</div>")
            _show(self.error, True)
            if snap.traceback:
                _set(self.traceback_html, "<pre class='tm-traceback' style='font-size:11px;margin:0;"
                     "white-space:pre-wrap;overflow-wrap:anywhere;word-break:break-all'>"
                     + html.escape(snap.traceback) + "</pre>")
                _show(self.traceback, True)
        elif status is Status.STOPPED:
            at = "" if snap.step is None else f" at step {snap.step}"
            _set(self.error, f"<div class='tm-stopped' style='{_WRAP};color:#7f7f7f'><b>stopped</b> by the user{at}</div>")
            _show(self.error, True)
        elif status is Status.UNKNOWN:
            _set(self.error, f"<div class='tm-unknown' style='{_WRAP};color:#8c564b'><b>outcome unknown</b>: its "
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
        details = [gpus_label(snap.gpus, snap.physical_gpus) or None,
                   f"rendezvous {snap.endpoint}" if snap.endpoint else None,
                   f"output_dir {snap.output_dir}" if snap.output_dir else None]
        if any(details):
            lines.append("  ".join(d for d in details if d))
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


class JobsTable(widgets.VBox):
    """All jobs (including those started by earlier kernels): id, name, status, step, last loss,
    elapsed, and a Stop button per live job. ``rows`` maps job id -> that row's widgets.

    Rows are filled from each job's summary (:meth:`Job.summary`), never from its whole log."""

    COLUMNS = ("id", "name", "status", "step", "loss", "elapsed", "")

    def __init__(self, listed: Iterable[Job] | None = None):
        self.jobs = list(jobs() if listed is None else listed)
        self.rows: dict[str, dict[str, widgets.Widget]] = {}
        self.summaries: dict[str, tuple] = {}
        cells = [widgets.HTML(f"<b>{c}</b>") for c in self.COLUMNS]
        for job in self.jobs:
            s = job.summary()
            state = job.record.state
            self.summaries[job.id] = (job.name, state.label, s.step, s.loss, job.elapsed_s)
            button = widgets.Button(description="Stop", button_style="danger", disabled=not state.is_live,
                                    layout=widgets.Layout(width="70px"))
            button.on_click(lambda _b, job=job, b=button: self._stop(job, b))
            row = {
                "id": widgets.HTML(f"<code>{job.id}</code>"), "name": widgets.HTML(html.escape(job.name)),
                "status": widgets.HTML(state.label), "step": widgets.HTML("" if s.step is None else str(s.step)),
                "loss": widgets.HTML("" if s.loss is None else f"{s.loss:.5g}"),
                "elapsed": widgets.HTML(_fmt_elapsed(job.elapsed_s)), "stop": button,
            }
            self.rows[job.id] = row
            cells += list(row.values())
        grid = widgets.GridBox(cells, layout=widgets.Layout(grid_template_columns="repeat(6, max-content) 80px",
                                                             grid_gap="2px 14px"))
        super().__init__(children=[grid])

    def _stop(self, job: Job, button: widgets.Button) -> None:
        button.disabled = True

        def run():
            status = job.stop()
            self.rows[job.id]["status"].value = status

        threading.Thread(target=run, name=f"tune_magic-stop-{job.id}", daemon=True).start()

    def text(self) -> str:
        """The table as plain text."""
        rows = [self.COLUMNS[:-1]]
        for job_id, (name, status, step, loss, elapsed) in self.summaries.items():
            rows.append((job_id, name, status, "" if step is None else str(step),
                         "" if loss is None else f"{loss:.5g}", _fmt_elapsed(elapsed)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text()
        return bundle
