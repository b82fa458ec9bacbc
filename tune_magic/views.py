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


def _loss_chart():
    """Return (figure, lines mark) of a loss-vs-step chart (bqplot)."""
    import bqplot

    x, y = bqplot.LinearScale(), bqplot.LinearScale()
    line = bqplot.Lines(x=[], y=[], scales={"x": x, "y": y}, colors=["#1f77b4"], marker="circle",
                        marker_size=16)
    fig = bqplot.Figure(
        marks=[line],
        axes=[bqplot.Axis(scale=x, label="step", tick_format="d"), bqplot.Axis(scale=y, side="left", label="loss")],
        layout=widgets.Layout(width="100%", height="240px"), padding_y=0.05,
        fig_margin={"top": 10, "bottom": 40, "left": 60, "right": 25},
    )
    return fig, line


class JobCard(widgets.VBox):
    """A live view of one job.

    Public child widgets (stable names, for tests and tutorials): ``error`` (HTML, shown on
    failure), ``header`` (HTML: name/id, status with elapsed time, GPUs, endpoint, output_dir),
    ``progress`` (HTML: the current progress line), ``chart`` (bqplot Figure) with ``loss_line``
    (its Lines mark: ``x`` steps, ``y`` losses), ``log_tail`` (HTML: the last ``tail_lines`` log lines)
    and ``stop_button``. ``snapshot`` is the last :class:`JobSnapshot` shown.

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
        self.error = widgets.HTML(layout=widgets.Layout(display="none"))
        self.header = widgets.HTML()
        self.progress = widgets.HTML()
        self.chart, self.loss_line = _loss_chart()
        self.log_tail = widgets.HTML()
        self.stop_button = widgets.Button(description="Stop", button_style="danger", icon="stop",
                                          tooltip=f"Stop job {job.id}")
        self.stop_button.on_click(self._on_stop)
        self.snapshot: JobSnapshot | None = None
        super().__init__(children=[self.error, self.header, self.progress, self.chart, self.log_tail, self.stop_button],
                         layout=widgets.Layout(border="1px solid #ddd", padding="6px"))
        self.add_class("tune-magic-card")
        self.watcher = JobWatcher(job, self.update, interval_s=interval_s, tail_lines=tail_lines, notify=notify)
        JobCard._by_job[job.id] = self
        if watch:
            self.watcher.start()

    def update(self, snap: JobSnapshot) -> None:
        """Show ``snap``. Sets traits only, so it is safe from the watcher thread."""
        self.snapshot = snap
        colour = _STATUS_COLOURS.get(snap.status, "#000")
        bits = [f"<b>{html.escape(snap.name)}</b> <code>{snap.job_id}</code>",
                f"<span class='tm-status' style='color:{colour}'>{snap.status}</span> {_fmt_elapsed(snap.elapsed_s)}"]
        if snap.gpus:
            bits.append(html.escape(gpus_label(snap.gpus, snap.physical_gpus)))
        if snap.endpoint:
            bits.append(f"rendezvous <code class='tm-endpoint'>{html.escape(snap.endpoint)}</code>")
        if snap.output_dir:
            bits.append(f"<code>{html.escape(snap.output_dir)}</code>")
        self.header.value = " · ".join(bits)
        parts = [] if snap.step is None else [f"<span class='tm-step'>step {snap.step}</span>",
                                               f"<span class='tm-loss'>loss {snap.loss:.5g}</span>"]
        bar = progress_summary(snap.progress)
        if bar:
            parts.append(f"<span class='tm-bar'>{html.escape(bar)}</span>")
        self.progress.value = " · ".join(parts)
        if snap.steps:
            self.loss_line.x, self.loss_line.y = list(snap.steps), list(snap.losses)
        lines = [line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " …" for line in snap.tail]
        # the tail is already bounded (tail_lines), so show all of it: newest lines last, in view
        self.log_tail.value = ("<pre class='tm-log' style='font-size:11px;overflow-x:auto;margin:0'>"
                               + html.escape("\n".join(lines)) + "</pre>")
        if snap.status == Status.FAILED:
            self.error.value = (f"<div class='tm-error' style='color:#d62728'><b>failed</b>: "
                                f"{html.escape(snap.error or 'exit code %s' % snap.returncode)}</div>")
            self.error.layout.display = None
        elif snap.status == Status.STOPPED:
            at = "" if snap.step is None else f" at step {snap.step}"
            self.error.value = f"<div class='tm-stopped' style='color:#7f7f7f'><b>stopped</b> by the user{at}</div>"
            self.error.layout.display = None
        running = Status(snap.status).is_live
        self.stop_button.disabled = not running
        self.stop_button.layout.display = None if running else "none"

    def _on_stop(self, _button=None) -> None:
        self.stop_button.disabled = True
        self.stop_button.description = "Stopping…"
        # stop() waits up to its grace period; keep the kernel free for other cells meanwhile
        threading.Thread(target=self.job.stop, name=f"tune_magic-stop-{self.job.id}", daemon=True).start()

    def text(self) -> str:
        """The card as plain text."""
        snap = self.snapshot or self.watcher.poll_once()
        return snap.summary() + ("\n" + "\n".join(snap.tail[-5:]) if snap.tail else "")

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
