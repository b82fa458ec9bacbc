"""The cards' loss-vs-step charts (bqplot): a job's curve, a sweep's trials' curves, integer step
ticks, each label once. Presentation only."""

from __future__ import annotations

import colorsys
import html

import ipywidgets as widgets

#: Most x-axis ticks on a card's chart (integer steps, each label once).
MAX_TICKS = 8
#: The first ten trials' colours (matplotlib's tab10); more trials get hues spread evenly.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


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


def loss_chart():
    """Return (figure, lines mark, x axis, x scale) of a loss-vs-step chart (bqplot)."""
    import bqplot

    x, y = bqplot.LinearScale(), bqplot.LinearScale()
    line = bqplot.Lines(x=[], y=[], scales={"x": x, "y": y}, colors=[LOSS_COLOUR], marker="circle",
                        marker_size=16, labels=["loss"])
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


#: The loss curve's colour on a card; the validation loss's, a contrast to it (tab10's first two).
LOSS_COLOUR, VAL_COLOUR = "#1f77b4", "#ff7f0e"


def val_mark(figure, line):
    """Add to a card's loss chart the validation losses' own series (``val_loss``: its own colour,
    a larger square at each point, drawn over the loss curve, on the same scales); return the
    bqplot ``Lines`` mark. ``line`` is the job's loss mark."""
    import bqplot

    val = bqplot.Lines(x=[], y=[], scales=line.scales, colors=[VAL_COLOUR], marker="square", marker_size=40,
                       stroke_width=2, labels=["val_loss"], display_legend=False)
    figure.marks = [*figure.marks, val]
    return val


def legend_html(items) -> str:
    """A chart's legend as one HTML line above it (never drawn over the curves): ``items`` are
    ``(label, colour, marker)``, the marker a character (``●``, ``■``) drawn on a short line."""
    items = "".join(f"<span class='tm-legend-item' style='margin-right:1.2em;white-space:nowrap'><span "
                    f"style='color:{colour};letter-spacing:-2px'>━{marker}━</span> {html.escape(label)}</span>"
                    for label, colour, marker in items)
    return f"<div class='tm-legend' style='font-size:11px;line-height:1.6'>{items}</div>"


def fit_steps(x_scale, x_axis, steps) -> None:
    """Set a chart's x range to ``steps`` (:func:`step_domain`) and its integer ticks
    (:func:`int_ticks`), touching only the traits that change."""
    lo, hi = step_domain(steps)
    if (x_scale.min, x_scale.max) != (lo, hi):
        x_scale.min, x_scale.max = float(lo), float(hi)
    ticks = int_ticks(lo, hi)
    if list(x_axis.tick_values if x_axis.tick_values is not None else []) != ticks:
        x_axis.tick_values = ticks


def trial_colours(n: int) -> list[str]:
    """``n`` distinct colours, one per trial (:data:`PALETTE` up to ten)."""
    if n <= len(PALETTE):
        return list(PALETTE[:n])
    out = []
    for i in range(n):
        r, g, b = colorsys.hls_to_rgb(i / n, 0.45, 0.65)
        out.append(f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}")
    return out


def trials_chart():
    """Return (figure, curves mark, best-point mark, x axis, x scale): every trial's loss curve on one
    chart (one Lines mark, a row per trial), the best trial's last point as a black diamond."""
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
