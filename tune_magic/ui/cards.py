"""The cards: one live view of a job or of a sweep, in one frame. They only set traits.

:class:`Card` is the frame both share: the bordered box, the Stop button that stops in a thread of
its own (the kernel stays free while a stop waits its grace period), the text/plain and text/html
forms for frontends that do not draw widgets (and the "kernel is gone" line), and the watcher
(:mod:`tune_magic.ui.watch`) whose daemon thread calls the card's ``update``, which assigns widget
traits and nothing else: no ``print``, no ``with out:``, so nothing lands in whatever cell happens
to be running. :class:`JobCard` shows one job, :class:`SweepCard` every trial of a sweep (and a
trial's own JobCard on request). Widgets are created on the kernel's thread only: at construction,
and when a button click runs there.
"""

from __future__ import annotations

import html
import math
import threading
import weakref

import ipywidgets as widgets

from tune_magic.gpus import gpus_label
from tune_magic.job import Job
from tune_magic.logs.progress import fmt_duration
from tune_magic.registry.status import Status
from tune_magic.sweeping.grid import short_keys
from tune_magic.sweeping.sweep import Sweep
from tune_magic.ui.cardlines import engine_id_text, fallback_html, gone_hint, gone_html, overrides_html, overrides_text
from tune_magic.ui.charts import (LOSS_COLOUR, VAL_COLOUR, fit_steps, legend_html, loss_chart, trial_colours,
                                  trials_chart, val_mark)
from tune_magic.ui.resumeview import ResumeControl, lineage_marks, show_lineage
from tune_magic.ui.snapshot import SweepSnapshot, table_text, val_text
from tune_magic.ui.textfmt import cut
from tune_magic.ui.watch import JobSnapshot, JobWatcher, SweepWatcher, Watcher, stopped_how

#: Longest log line shown in a card, in characters (the full line stays on disk).
MAX_LINE_CHARS = 400
#: Each status's colour in cards and tables.
STATUS_COLOURS = {"pending": "#ff7f0e", "running": "#1f77b4", "unknown": "#8c564b", "succeeded": "#2ca02c",
                  "failed": "#d62728", "stopped": "#7f7f7f"}
#: A sweep's and its trials' statuses' colours (a trial is ``queued`` before its job exists).
SWEEP_COLOURS = {**STATUS_COLOURS, "queued": "#6c8ebf", "cancelled": "#7f7f7f", "not started": "#d62728"}

# text that wraps anywhere (long paths, long log lines), never widening the card
_CARD_WRAP = "white-space:normal;overflow-wrap:anywhere;word-break:break-word;line-height:1.4"
_WRAP = "white-space:normal;overflow-wrap:anywhere;line-height:1.4"


def set_html(widget: widgets.HTML, value: str) -> None:
    """Set ``widget.value`` only when it changes (each change is a message to the browser)."""
    if widget.value != value:
        widget.value = value


def set_shown(widget: widgets.Widget, shown: bool) -> None:
    """Show or hide ``widget`` (its layout's ``display``), only when that changes."""
    want = None if shown else "none"
    if widget.layout.display != want:
        widget.layout.display = want


class Card(widgets.VBox):
    """The frame of every card: a bordered box following one job or sweep (``target``) through its
    ``watcher``, with a Stop button, and text forms for frontends without widgets.

    Args:
        target: the job or sweep shown (it has ``id`` and ``stop()``).
        watcher: its watcher (:mod:`tune_magic.ui.watch`), whose sink is the card's ``update``.
        children: the card's widgets, top to bottom.
        what: ``"job"`` or ``"sweep"``, for the "kernel is gone" lines.
    """

    def __init__(self, target, watcher: Watcher, children: list, *, what: str = "job"):
        self.watcher = watcher
        self._target, self._what = target, what
        super().__init__(children=children, layout=widgets.Layout(border="1px solid #ddd", padding="6px",
                                                                  min_width="0", max_width="100%"))
        self.add_class("tune-magic-card")

    def make_stop_button(self, description: str, tooltip: str) -> widgets.Button:
        """The card's Stop button: a click stops the target in a thread of its own."""
        button = widgets.Button(description=description, button_style="danger", icon="stop", tooltip=tooltip)
        button.on_click(self._on_stop)
        self._stop_label = description
        return button

    def show_stop_button(self, live: bool) -> None:
        """Show the Stop button while the target is live; it stays disabled once clicked."""
        self.stop_button.layout.display = None if live else "none"
        self.stop_button.disabled = not live or self.stop_button.description != self._stop_label

    def _on_stop(self, _button=None) -> None:
        self.stop_button.disabled = True
        self.stop_button.description = "Stopping…"
        # stop() waits up to its grace period; keep the kernel free for other cells meanwhile
        threading.Thread(target=self._target.stop, name=f"tune_magic-stop-{self._target.id}", daemon=True).start()

    def text(self) -> str:  # pragma: no cover - every card says its own
        """The card as plain text."""
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs):
        """The widget, and for frontends that cannot draw it (a saved notebook whose kernel is gone:
        :mod:`tune_magic.ui.cardlines`) text/html and text/plain saying so, with the card's text."""
        bundle = super()._repr_mimebundle_(**kwargs)
        text = self.text()
        bundle["text/plain"] = text + "\n" + gone_hint(self._target.id, self._what)
        bundle["text/html"] = fallback_html(self._target.id, text, self._what)
        return bundle

    def close(self) -> None:
        """Stop following (the job or sweep goes on) and close the widgets."""
        watcher = getattr(self, "watcher", None)
        if watcher is not None:
            watcher.stop()
        super().close()


class JobCard(Card):
    """A live view of one job.

    Public child widgets (stable names, for tests and tutorials), top to bottom: ``error`` (HTML,
    shown for a failed job: its first line is the job's ``error``; for a stopped one: "stopped by
    the user"), ``traceback`` (Accordion, collapsed, holding ``traceback_html``: a failed job's
    whole traceback, :meth:`Job.failure`), ``header`` (HTML: name/id, status, the engine's id of the
    job (``SLURM ID 7``), GPUs, endpoint, output_dir; above them a line, hidden while the card is
    live, saying that its kernel is gone, :func:`~tune_magic.ui.cardlines.gone_html`),
    ``overrides`` (HTML: the overrides the job ran with, one collapsed line,
    :mod:`tune_magic.ui.cardlines`), ``notes`` (HTML, small: nodes of a multi-node or SLURM job,
    launch warnings, a lost log, an evaluation of a checkpoint that failed), ``progress`` (HTML: where
    the run is: epoch of epochs, step of steps, loss, the latest and the best validation loss, steps
    this epoch, elapsed, ETA, throughput, the checkpoints being evaluated; "waiting for the first
    step", "waiting in the queue: <reason>", "saving checkpoint…"), ``legend`` (HTML, shown once
    the job has a validation loss: ``loss`` and ``val_loss``), ``checkpoints`` (HTML, hidden until the
    first: one line per saved ``epoch_N/``: step, size, validation loss with the best marked ◆, pruned
    or the one a resume needs, its path; ``Job.checkpoints``), ``chart`` (bqplot Figure, hidden
    until the first loss) with ``loss_line`` (its Lines mark: ``x`` steps, ``y`` losses),
    ``val_line`` (the validation losses: ``x`` steps, ``y`` values) and ``x_axis`` (integer ticks),
    ``log_tail`` (HTML: the last log lines, :func:`tune_magic.logs.cardtail.display_tail`; long lines
    wrap), ``stop_button`` (shown while the job is pending or running) and ``resume_control``
    (stopped, failed, unknown jobs: :class:`~tune_magic.ui.resumeview.ResumeControl`); the chart's
    ``earlier_line`` and ``resume_markers`` draw its lineage. ``snapshot``: the last :class:`JobSnapshot` shown.

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
        self.overrides = widgets.HTML(layout=widgets.Layout(**hidden))
        self.notes = widgets.HTML(layout=widgets.Layout(**hidden))
        self.progress = widgets.HTML(layout=widgets.Layout(min_width="0"))
        self.chart, self.loss_line, self.x_axis, self._x_scale = loss_chart()
        self.legend = widgets.HTML(legend_html([("loss", LOSS_COLOUR, "●"), ("val_loss", VAL_COLOUR, "■")]),
                                   layout=widgets.Layout(**hidden))
        self.log_tail = widgets.HTML(layout=widgets.Layout(min_width="0"))
        self.checkpoints = widgets.HTML(layout=widgets.Layout(display="none", min_width="0"))
        self.stop_button = self.make_stop_button("Stop", f"Stop job {job.id}")
        self.snapshot: JobSnapshot | None = None
        self._shown_steps: tuple | None = None
        self.earlier_line, self.resume_markers = lineage_marks(self.chart, self.loss_line)
        self.val_line = val_mark(self.chart, self.loss_line)
        self.resume_control = ResumeControl(job, JobCard)
        watcher = JobWatcher(job, self.update, interval_s=interval_s, tail_lines=tail_lines, notify=notify)
        super().__init__(job, watcher, [self.error, self.traceback, self.header, self.overrides, self.notes,
                                        self.progress, self.legend, self.chart, self.checkpoints, self.log_tail,
                                        self.stop_button, self.resume_control])
        JobCard._by_job[job.id] = self
        if watch:
            self.watcher.start()

    def update(self, snap: JobSnapshot) -> None:
        """Show ``snap``. Sets traits only, so it is safe from the watcher thread."""
        self.snapshot = snap
        status = Status(snap.status) if snap.status in Status._value2member_map_ else None
        colour = STATUS_COLOURS.get(snap.status, "#000")
        bits = [f"<b>{html.escape(snap.name)}</b> <code>{snap.job_id}</code>",
                f"<span class='tm-status' style='color:{colour}'>{html.escape(snap.label)}</span>"]
        if snap.engine_id:
            engine = engine_id_text(snap.engine_id_label, snap.engine_id)
            bits.append(f"<span class='tm-engine-id'>{html.escape(engine)}</span>")
        if snap.gpus:
            bits.append(html.escape(gpus_label(snap.gpus, snap.physical_gpus)))
        if snap.endpoint:
            bits.append(f"rendezvous <code class='tm-endpoint'>{html.escape(snap.endpoint)}</code>")
        if snap.output_dir:
            bits.append(f"<code>{html.escape(snap.output_dir)}</code>")
        set_html(self.header, gone_html(snap.job_id) + f"<div class='tm-header' style='{_CARD_WRAP}'>"
             + " · ".join(bits) + "</div>")
        set_html(self.overrides, overrides_html(snap.overrides))
        set_shown(self.overrides, bool(snap.overrides))
        notes = snap.notes()
        set_html(self.notes, f"<div class='tm-notes' style='{_CARD_WRAP};font-size:11px;color:#8a6d3b'>"
             + "<br>".join(html.escape(n) for n in notes) + "</div>")
        set_shown(self.notes, bool(notes))
        parts = [f"<span class='{cls}'>{html.escape(text)}</span>{html.escape(suffix)}"
                 for cls, text, suffix in snap.progress_parts()]
        set_html(self.progress, f"<div class='tm-progress' style='{_CARD_WRAP}'>" + " · ".join(parts) + "</div>")
        self._chart(snap)
        set_html(self.checkpoints, checkpoints_html(snap.checkpoints))
        set_shown(self.checkpoints, bool(snap.checkpoints))
        lines = [line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " …" for line in snap.tail]
        # the tail is already bounded (tail_lines), so show all of it: newest lines last, in view;
        # long lines wrap (a horizontal scrollbar would hide the end of every line)
        set_html(self.log_tail, "<pre class='tm-log' style='font-size:11px;margin:0;white-space:pre-wrap;"
             "overflow-wrap:anywhere;word-break:break-all;line-height:1.35'>" + html.escape("\n".join(lines)) + "</pre>")
        self._ending(snap, status)
        live = status is not None and status.is_live
        self.show_stop_button(live)
        self.resume_control.show_for(self.job.record)

    def _chart(self, snap: JobSnapshot) -> None:
        """The curve, the validation losses' series with the legend naming both, and integer step
        ticks; the chart stays hidden until the first point."""
        steps = snap.steps + snap.earlier_steps + snap.val_steps  # the earlier runs of its lineage, dimmed
        shown = (snap.steps, snap.earlier_steps, snap.resumed_at, snap.val_steps, snap.val_losses)
        if not steps or shown == self._shown_steps:
            return
        self.loss_line.x, self.loss_line.y = list(snap.steps), list(snap.losses)
        if shown[3:] != (self._shown_steps or ())[3:]:
            self.val_line.x, self.val_line.y = list(snap.val_steps), list(snap.val_losses)
        set_shown(self.legend, bool(snap.val_steps))
        show_lineage(self.earlier_line, self.resume_markers, snap)
        fit_steps(self._x_scale, self.x_axis, steps)
        self._shown_steps = shown
        self.chart.layout.display = None

    def _ending(self, snap: JobSnapshot, status: Status | None) -> None:
        """The first lines of an ended job: why it failed (and its traceback), or that it was stopped."""
        if status is Status.FAILED:
            line = snap.error or f"exited with code {snap.returncode}"
            set_html(self.error, f"<div class='tm-error' style='{_CARD_WRAP};color:#d62728;font-weight:bold' "
                             f"title='failed'>{html.escape(line)}</div>")
            set_shown(self.error, True)
            if snap.traceback:
                set_html(self.traceback_html, "<pre class='tm-traceback' style='font-size:11px;margin:0;"
                     "white-space:pre-wrap;overflow-wrap:anywhere;word-break:break-all'>"
                     + html.escape(snap.traceback) + "</pre>")
                set_shown(self.traceback, True)
        elif status is Status.STOPPED:
            set_html(self.error, f"<div class='tm-stopped' style='{_CARD_WRAP};color:#7f7f7f'><b>stopped</b>"
                 f"{html.escape(stopped_how(snap)[len('stopped'):])}</div>")
            set_shown(self.error, True)
        elif status is Status.SUCCEEDED and snap.error:  # "the stop arrived after training ended"
            set_html(self.error, f"<div class='tm-note' style='{_CARD_WRAP};color:#7f7f7f'><b>succeeded</b>: "
                 f"{html.escape(snap.error)}</div>")
            set_shown(self.error, True)
        elif status is Status.UNKNOWN:
            set_html(self.error, f"<div class='tm-unknown' style='{_CARD_WRAP};color:#8c564b'><b>outcome unknown</b>: its "
                 "processes are gone and no exit code was recorded (yet)</div>")
            set_shown(self.error, True)
        else:
            set_shown(self.error, False)

    def text(self) -> str:
        """The card as plain text: what the widgets show (the traceback as a pointer to it)."""
        snap = self.snapshot or self.watcher.poll_once()
        lines = [f"job {snap.job_id} ({snap.name}): {snap.label}"]
        if snap.status == Status.FAILED:
            lines.append(snap.error or f"exited with code {snap.returncode}")
            if snap.traceback:
                lines.append(f"(whole traceback: tune-magic logs {snap.job_id} --error)")
        elif snap.status == Status.STOPPED:
            lines.append(stopped_how(snap))
        elif snap.status == Status.SUCCEEDED and snap.error:  # "the stop arrived after training ended"
            lines.append(f"succeeded: {snap.error}")
        lines += snap.placement()
        lines += [overrides_text(snap.overrides)] if snap.overrides else []
        lines += snap.notes()
        lines.append(snap.progress_text())
        lines += [snap.val_text()] if snap.val_steps else []
        lines += [f"checkpoint {c.text()}" for c in snap.checkpoints]
        return "\n".join(lines + list(snap.tail[-5:]))


class SweepCard(Card):
    """A live view of one sweep.

    Public child widgets (stable names, for tests and tutorials), top to bottom: ``header`` (HTML:
    name, id, status, how many at a time, the count of trials per status), ``table`` (HTML: one row
    per trial: index, a column per axis, status — ``queued`` while queued —, step, loss, best loss
    so far, best validation loss when the trials validate, the best checkpoint (``epoch_N``, the one
    ``checkpoint="best"`` loads) when one has it, elapsed; the best trial's row marked ◆;
    under it, which measure chose it: ``◆ best by val_loss`` or ``◆ best by final loss``, and the
    ranking's note, e.g. ``ranking by final loss until 2 evaluations finish``), ``legend`` (HTML: each trial's colour and
    values), ``chart`` (bqplot Figure, hidden until the first loss: ``curves``, a Lines mark with
    one row per trial that logged a loss, one colour each; ``best_mark``, a black diamond on the best
    trial's last point; ``x_axis``, integer step ticks), ``stop_button`` (stops the whole sweep:
    queued trials never start), ``trial_picker`` (Dropdown of the trials) with ``open_button``, and
    ``trial_card`` (a box that holds the chosen trial's own :class:`~tune_magic.ui.views.JobCard`).
    ``snapshot`` is the last :class:`~tune_magic.ui.sweepwatch.SweepSnapshot` shown.

    The best trial (:func:`tune_magic.sweeping.results.rank`, as every view): among the trials that
    succeeded while any has, the lowest validation loss when every one has one and no evaluation of
    theirs is still to finish, else the lowest final loss (ties broken by the lowest minimum loss).

    Args:
        sweep: the sweep to show.
        watch: start the watcher thread now (default True).
        interval_s: seconds between looks.
    """

    def __init__(self, sweep: Sweep, *, watch: bool = True, interval_s: float = 0.5):
        self.sweep = sweep
        rec = sweep.record
        self.colours = trial_colours(len(rec.trials))
        self._short = short_keys(rec.keys)
        self.header = widgets.HTML(layout=widgets.Layout(min_width="0"))
        self.table = widgets.HTML(layout=widgets.Layout(min_width="0", max_width="100%", overflow="auto"))
        self.legend = widgets.HTML(layout=widgets.Layout(min_width="0"))
        self.chart, self.curves, self.best_mark, self.x_axis, self._x_scale = trials_chart()
        self.stop_button = self.make_stop_button("Stop sweep", f"Stop every trial of sweep {rec.id}; queued ones never start")
        self.trial_picker = widgets.Dropdown(options=[(cut(f"{t.index}: {t.name}", 60), t.index) for t in rec.trials],
                                             description="trial", layout=widgets.Layout(width="auto", max_width="30em"))
        self.open_button = widgets.Button(description="Open card", icon="external-link",
                                          tooltip="show the chosen trial's own card below")
        self.open_button.on_click(self._on_open)
        self.trial_card = widgets.VBox(layout=widgets.Layout(min_width="0"))
        self.snapshot: SweepSnapshot | None = None
        self._shown_curves: tuple | None = None
        controls = widgets.HBox([self.stop_button, self.trial_picker, self.open_button],
                                layout=widgets.Layout(flex_flow="row wrap", max_width="100%"))
        watcher = SweepWatcher(sweep, self.update, interval_s=interval_s)
        super().__init__(sweep, watcher, [self.header, self.table, self.legend, self.chart, controls, self.trial_card],
                         what="sweep")
        self.add_class("tune-magic-sweep")
        if watch:
            self.watcher.start()

    # -- showing ----------------------------------------------------------------------------------
    def update(self, snap: SweepSnapshot) -> None:
        """Show ``snap``. Sets traits only, so it is safe from the watcher thread."""
        self.snapshot = snap
        colour = SWEEP_COLOURS.get(snap.status, "#1f77b4" if snap.status == "running" else "#000")
        counts = " · ".join(f"<span style='color:{SWEEP_COLOURS.get(s, '#000')}'>{n} {html.escape(s)}</span>"
                            for s, n in snap.counts().items())
        gpus = [",".join(map(str, s)) for s in snap.slots if s]
        where = f" on GPUs {html.escape(' | '.join(gpus))}" if gpus else ""
        set_html(self.header, gone_html(snap.sweep_id, "sweep") + f"<div class='tm-header' style='{_WRAP}'><b>sweep {html.escape(snap.name)}</b> "
                          f"<code>{snap.sweep_id}</code> · <span class='tm-status' style='color:{colour}'>"
                          f"{snap.status}</span> · {len(snap.rows)} trials, {snap.max_parallel} at a time{where}"
                          f" · <span class='tm-counts'>{counts}</span></div>")
        set_html(self.table, self._table_html(snap))
        self._chart(snap)
        self.show_stop_button(snap.status == "running")

    def _table_html(self, snap: SweepSnapshot) -> str:
        head = "".join(f"<th>{html.escape(self._short.get(k, k))}</th>" for k in snap.keys)
        val, ckpt = snap.validates, snap.has_checkpoints
        rows = []
        for r in snap.rows:
            texts = dict(r.texts)
            best = snap.best == r.index
            status = (f"<span class='tm-trial-status' style='color:{SWEEP_COLOURS.get(r.status, '#000')}'>"
                      f"{html.escape(r.status)}</span>")
            if r.note:
                status += (f"<div class='tm-trial-note' style='font-size:11px;color:#8a6d3b;{_WRAP}'>"
                           f"{html.escape(cut(r.note, 160))}</div>")
            cells = [f"<td><span style='display:inline-block;width:10px;height:10px;margin-right:4px;"
                     f"background:{self.colours[r.index]}'></span>{r.index}{' ◆' if best else ''}</td>",
                     *(f"<td><code>{html.escape(cut(texts.get(k, ''), 24))}</code></td>" for k in snap.keys),
                     f"<td>{status}</td>", f"<td class='tm-trial-step'>{'' if r.step is None else r.step}</td>",
                     f"<td class='tm-trial-loss'>{_num(r.loss)}</td>", f"<td class='tm-trial-best'>{_num(r.best_loss)}</td>",
                     *([f"<td class='tm-trial-val'>{html.escape(val_text(r))}</td>"] if val else []),
                     *([f"<td class='tm-trial-ckpt'><code>{html.escape(r.best_checkpoint or '-')}</code></td>"]
                       if ckpt else []),
                     f"<td>{fmt_duration(r.elapsed_s) if r.job_id else ''}</td>"]
            style = " style='font-weight:bold;background:#fff8e1'" if best else ""
            rows.append(f"<tr class='tm-trial{' tm-best' if best else ''}' data-trial='{r.index}'{style}>"
                        + "".join(cells) + "</tr>")
        return ("<table class='tm-sweep-table' style='border-collapse:collapse;font-size:12px'>"
                "<style>.tm-sweep-table td,.tm-sweep-table th{padding:1px 8px;text-align:left;"
                "border-bottom:1px solid #eee}</style>"
                f"<tr><th>#</th>{head}<th>status</th><th>step</th><th>loss</th><th>best loss</th>"
                f"{'<th>best val_loss</th>' if val else ''}{'<th>best checkpoint</th>' if ckpt else ''}"
                "<th>elapsed</th></tr>"
                + "".join(rows) + "</table>" + self._ranking_html(snap))

    @staticmethod
    def _ranking_html(snap: SweepSnapshot) -> str:
        """Under the table: by which measure the ◆ trial is best, and the ranking's note."""
        if snap.best is None and not snap.ranking_note:
            return ""
        parts = [f"◆ {html.escape(snap.ranking)}"] if snap.best is not None else []
        parts += [f"<span class='tm-ranking-note' style='color:#8a6d3b'>{html.escape(snap.ranking_note)}</span>"] \
            if snap.ranking_note else []
        return f"<div class='tm-ranking' style='font-size:11px;margin-top:2px'>{' · '.join(parts)}</div>"

    def _chart(self, snap: SweepSnapshot) -> None:
        """Every trial's curve (one row each, NaN-padded to one length), the legend, the best
        trial's diamond, integer step ticks; hidden until the first point."""
        drawn = [r for r in snap.rows if r.steps]
        key = (tuple((r.index, r.steps, r.losses) for r in drawn), snap.best)
        if not drawn or key == self._shown_curves:
            return
        width = max(len(r.steps) for r in drawn)
        pad = lambda seq: [float(v) for v in seq] + [math.nan] * (width - len(seq))  # noqa: E731
        self.curves.colors = [self.colours[r.index] for r in drawn]
        self.curves.labels = [r.name for r in drawn]
        self.curves.x, self.curves.y = [pad(r.steps) for r in drawn], [pad(r.losses) for r in drawn]
        best = next((r for r in drawn if r.index == snap.best), None)
        if best is not None:
            self.best_mark.x, self.best_mark.y = [float(best.steps[-1])], [float(best.losses[-1])]
        self.best_mark.visible = best is not None
        fit_steps(self._x_scale, self.x_axis, [s for r in drawn for s in (r.steps[0], r.steps[-1])])
        set_html(self.legend, "<div class='tm-legend' style='font-size:11px;line-height:1.6'>" + "".join(
            f"<span class='tm-legend-item' style='margin-right:1.2em;white-space:nowrap'><span style='display:"
            f"inline-block;width:1.6em;height:3px;vertical-align:middle;background:{self.colours[r.index]}'></span> "
            f"{html.escape(cut(r.name, 60))}{' ◆ best' if r.index == snap.best else ''}</span>" for r in drawn)
            + "</div>")
        self._shown_curves = key
        self.chart.layout.display = None

    # -- actions ----------------------------------------------------------------------------------
    def open_trial(self, index: int) -> JobCard | None:
        """Show trial ``index``'s own card in :attr:`trial_card` (replacing the one shown); return
        it, or ``None`` while the trial has no job (queued). Call from the kernel's thread."""
        trial = next((t for t in self.sweep.trials if t.index == index), None)
        for old in self.trial_card.children:
            old.close()
        if trial is None or trial.job is None:
            why = "has not started" if trial is not None else "does not exist"
            self.trial_card.children = (widgets.HTML(f"<span class='tm-hint'>trial {index} {why}: its card "
                                                     "appears once it starts</span>"),)
            return None
        card = JobCard(trial.job)
        self.trial_card.children = (card,)
        return card

    def _on_open(self, _button=None) -> None:
        self.open_trial(self.trial_picker.value)

    # -- text -------------------------------------------------------------------------------------
    def text(self) -> str:
        """The card as plain text: the header line, the trial table, the best trial."""
        return table_text(self.snapshot or self.watcher.poll_once())

    def close(self) -> None:
        """Stop following (the sweep goes on) and close the widgets, the open trial's card too."""
        for card in getattr(self, "trial_card", widgets.VBox()).children:
            card.close()
        super().close()


def checkpoints_html(rows) -> str:
    """A job card's list of its checkpoints (:class:`~tune_magic.ui.snapshot.CheckpointRow`): one line
    each, newest last: name, step, size, validation loss (the best marked ◆), pruned, path."""
    if not rows:
        return ""
    lines = []
    for c in rows:
        style = "color:#7f7f7f" if c.pruned_bytes is not None else (
            "font-weight:bold" if c.best else "")
        lines.append(f"<div class='tm-checkpoint{' tm-best' if c.best else ''}' data-name='{html.escape(c.name)}' "
                     f"style='{style}'>{html.escape(c.text())}</div>")
    return (f"<details class='tm-checkpoints' style='{_CARD_WRAP};font-size:11px' open><summary>checkpoints "
            f"({len(rows)})</summary>" + "".join(lines) + "</details>")


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.5g}"
