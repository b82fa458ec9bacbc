"""The cards' loss-vs-step chart (bqplot): integer step ticks, each label once. Presentation only."""

from __future__ import annotations

import ipywidgets as widgets

#: Most x-axis ticks on a card's chart (integer steps, each label once).
MAX_TICKS = 8


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
