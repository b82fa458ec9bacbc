"""The sweep card: one live view of a whole sweep. It only sets traits.

A :class:`~tune_magic.ui.sweepwatch.SweepWatcher` daemon thread calls :meth:`SweepCard.update`,
which assigns widget traits and nothing else (no ``print``, no ``with out:``), as the job card
does (:class:`tune_magic.ui.views.JobCard`). Widgets are created on the kernel's thread only: at
construction, and when the user opens a trial's own card (a button click runs there).
"""

from __future__ import annotations

import colorsys
import html
import math
import threading

import ipywidgets as widgets

from tune_magic.logs.progress import fmt_duration
from tune_magic.sweeping.grid import short_keys
from tune_magic.sweeping.sweep import Sweep
from tune_magic.ui.sweeptext import table_text
from tune_magic.ui.sweepwatch import SweepSnapshot, SweepWatcher
from tune_magic.ui.textfmt import cut
from tune_magic.ui.views import STATUS_COLOURS, JobCard, int_ticks, step_domain

#: The first ten trials' colours (matplotlib's tab10); more trials get hues spread evenly.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
_COLOURS = {**STATUS_COLOURS, "queued": "#6c8ebf", "cancelled": "#7f7f7f", "not started": "#d62728"}
_WRAP = "white-space:normal;overflow-wrap:anywhere;line-height:1.4"


def trial_colours(n: int) -> list[str]:
    """``n`` distinct colours, one per trial (:data:`PALETTE` up to ten)."""
    if n <= len(PALETTE):
        return list(PALETTE[:n])
    out = []
    for i in range(n):
        r, g, b = colorsys.hls_to_rgb(i / n, 0.45, 0.65)
        out.append(f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}")
    return out


def _chart():
    """Return (figure, curves mark, best-point mark, x axis, x scale): every trial's loss curve on one
    bqplot chart (one Lines mark, a row per trial), the best trial's last point as a black diamond."""
    import bqplot

    x, y = bqplot.LinearScale(), bqplot.LinearScale()
    curves = bqplot.Lines(x=[], y=[], scales={"x": x, "y": y}, colors=[PALETTE[0]], marker="circle", marker_size=10,
                          stroke_width=1.5)
    best = bqplot.Scatter(x=[], y=[], scales={"x": x, "y": y}, marker="diamond", colors=["#000000"], default_size=160,
                          stroke="#ffffff", visible=False)
    x_axis = bqplot.Axis(scale=x, label="step", tick_format="d", tick_values=[])
    fig = bqplot.Figure(marks=[curves, best], axes=[x_axis, bqplot.Axis(scale=y, side="left", label="loss")],
                        layout=widgets.Layout(width="100%", min_width="0", height="280px", margin="2px 0px",
                                              overflow="hidden", display="none"),
                        padding_y=0.05, padding_x=0.03, fig_margin={"top": 10, "bottom": 40, "left": 60, "right": 25})
    return fig, curves, best, x_axis, x


class SweepCard(widgets.VBox):
    """A live view of one sweep.

    Public child widgets (stable names, for tests and tutorials), top to bottom: ``header`` (HTML:
    name, id, status, how many at a time, the count of trials per status), ``table`` (HTML: one row
    per trial: index, a column per axis, status — ``queued`` while queued —, step, loss, best loss
    so far, elapsed; the best trial's row marked ◆), ``legend`` (HTML: each trial's colour and
    values), ``chart`` (bqplot Figure, hidden until the first loss: ``curves``, a Lines mark with
    one row per trial that logged a loss, one colour each; ``best_mark``, a black diamond on the best
    trial's last point; ``x_axis``, integer step ticks), ``stop_button`` (stops the whole sweep:
    queued trials never start), ``trial_picker`` (Dropdown of the trials) with ``open_button``, and
    ``trial_card`` (a box that holds the chosen trial's own :class:`~tune_magic.ui.views.JobCard`).
    ``snapshot`` is the last :class:`~tune_magic.ui.sweepwatch.SweepSnapshot` shown.

    The best trial: the lowest final loss, ties broken by the lowest minimum loss, among the trials
    that succeeded while any has (:mod:`tune_magic.sweeping.results`).

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
        self.chart, self.curves, self.best_mark, self.x_axis, self._x_scale = _chart()
        self.stop_button = widgets.Button(description="Stop sweep", button_style="danger", icon="stop",
                                          tooltip=f"Stop every trial of sweep {rec.id}; queued ones never start")
        self.stop_button.on_click(self._on_stop)
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
        super().__init__(children=[self.header, self.table, self.legend, self.chart, controls, self.trial_card],
                         layout=widgets.Layout(border="1px solid #ddd", padding="6px", min_width="0", max_width="100%"))
        self.add_class("tune-magic-card")
        self.add_class("tune-magic-sweep")
        self.watcher = SweepWatcher(sweep, self.update, interval_s=interval_s)
        if watch:
            self.watcher.start()

    # -- showing ----------------------------------------------------------------------------------
    def update(self, snap: SweepSnapshot) -> None:
        """Show ``snap``. Sets traits only, so it is safe from the watcher thread."""
        self.snapshot = snap
        colour = _COLOURS.get(snap.status, "#1f77b4" if snap.status == "running" else "#000")
        counts = " · ".join(f"<span style='color:{_COLOURS.get(s, '#000')}'>{n} {html.escape(s)}</span>"
                            for s, n in snap.counts().items())
        gpus = [",".join(map(str, s)) for s in snap.slots if s]
        where = f" on GPUs {html.escape(' | '.join(gpus))}" if gpus else ""
        _set(self.header, f"<div class='tm-header' style='{_WRAP}'><b>sweep {html.escape(snap.name)}</b> "
                          f"<code>{snap.sweep_id}</code> · <span class='tm-status' style='color:{colour}'>"
                          f"{snap.status}</span> · {len(snap.rows)} trials, {snap.max_parallel} at a time{where}"
                          f" · <span class='tm-counts'>{counts}</span></div>")
        _set(self.table, self._table_html(snap))
        self._chart(snap)
        live = snap.status == "running"
        self.stop_button.layout.display = None if live else "none"
        self.stop_button.disabled = not live or self.stop_button.description != "Stop sweep"

    def _table_html(self, snap: SweepSnapshot) -> str:
        head = "".join(f"<th>{html.escape(self._short.get(k, k))}</th>" for k in snap.keys)
        rows = []
        for r in snap.rows:
            texts = dict(r.texts)
            best = snap.best == r.index
            status = (f"<span class='tm-trial-status' style='color:{_COLOURS.get(r.status, '#000')}'>"
                      f"{html.escape(r.status)}</span>")
            if r.note:
                status += (f"<div class='tm-trial-note' style='font-size:11px;color:#8a6d3b;{_WRAP}'>"
                           f"{html.escape(cut(r.note, 160))}</div>")
            cells = [f"<td><span style='display:inline-block;width:10px;height:10px;margin-right:4px;"
                     f"background:{self.colours[r.index]}'></span>{r.index}{' ◆' if best else ''}</td>",
                     *(f"<td><code>{html.escape(cut(texts.get(k, ''), 24))}</code></td>" for k in snap.keys),
                     f"<td>{status}</td>", f"<td class='tm-trial-step'>{'' if r.step is None else r.step}</td>",
                     f"<td class='tm-trial-loss'>{_num(r.loss)}</td>", f"<td class='tm-trial-best'>{_num(r.best_loss)}</td>",
                     f"<td>{fmt_duration(r.elapsed_s) if r.job_id else ''}</td>"]
            style = " style='font-weight:bold;background:#fff8e1'" if best else ""
            rows.append(f"<tr class='tm-trial{' tm-best' if best else ''}' data-trial='{r.index}'{style}>"
                        + "".join(cells) + "</tr>")
        return ("<table class='tm-sweep-table' style='border-collapse:collapse;font-size:12px'>"
                "<style>.tm-sweep-table td,.tm-sweep-table th{padding:1px 8px;text-align:left;"
                "border-bottom:1px solid #eee}</style>"
                f"<tr><th>#</th>{head}<th>status</th><th>step</th><th>loss</th><th>best loss</th><th>elapsed</th></tr>"
                + "".join(rows) + "</table>")

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
        lo, hi = step_domain([s for r in drawn for s in (r.steps[0], r.steps[-1])])
        if (self._x_scale.min, self._x_scale.max) != (lo, hi):
            self._x_scale.min, self._x_scale.max = float(lo), float(hi)
        ticks = int_ticks(lo, hi)
        if list(self.x_axis.tick_values if self.x_axis.tick_values is not None else []) != ticks:
            self.x_axis.tick_values = ticks
        _set(self.legend, "<div class='tm-legend' style='font-size:11px;line-height:1.6'>" + "".join(
            f"<span class='tm-legend-item' style='margin-right:1.2em;white-space:nowrap'><span style='display:"
            f"inline-block;width:1.6em;height:3px;vertical-align:middle;background:{self.colours[r.index]}'></span> "
            f"{html.escape(cut(r.name, 60))}{' ◆ best' if r.index == snap.best else ''}</span>" for r in drawn)
            + "</div>")
        self._shown_curves = key
        self.chart.layout.display = None

    # -- actions ----------------------------------------------------------------------------------
    def _on_stop(self, _button=None) -> None:
        self.stop_button.disabled = True
        self.stop_button.description = "Stopping…"
        # stop() waits up to its grace period; keep the kernel free for other cells meanwhile
        threading.Thread(target=self.sweep.stop, name=f"tune_magic-stop-{self.sweep.id}", daemon=True).start()

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

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text()
        return bundle

    def close(self) -> None:
        """Stop following (the sweep goes on) and close the widgets."""
        watcher = getattr(self, "watcher", None)
        if watcher is not None:
            watcher.stop()
        for card in getattr(self, "trial_card", widgets.VBox()).children:
            card.close()
        super().close()


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.5g}"


def _set(widget: widgets.HTML, value: str) -> None:
    if widget.value != value:
        widget.value = value
