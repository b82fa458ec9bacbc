"""Serialise metric points: strict JSON, CSV, or a ``pandas.DataFrame``.

Used by ``tune-magic metrics`` and :meth:`tune_magic.job.Job.metrics_frame`.
"""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Iterable, Mapping, Sequence

from tune_magic.logs.metricstore import MetricStore
from tune_magic.logs.points import MetricPoint

__all__ = ["points_to_json", "points_to_csv", "points_to_frame", "labelled_points_to_json",
           "labelled_points_to_csv"]


def _json_value(value: float) -> float | str:
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


def points_to_json(points: Iterable[MetricPoint]) -> str:
    """Serialise points as strict JSON (no ``NaN``/``Infinity`` literals).

    Returns:
        A JSON array of ``{"step": int, "name": str, "value": number|"nan"|"inf"|"-inf",
        "epoch": int (only when known), "source": str}`` objects, in the given order.
    """
    return labelled_points_to_json([({}, points)])


def points_to_csv(points: Iterable[MetricPoint]) -> str:
    """Serialise points as CSV with header ``step,name,value,epoch,source``.

    Values use Python's float repr (``nan``, ``inf``, ``-inf`` for non-finite); an unknown
    epoch is an empty field. Lines end with ``\\n``.
    """
    return labelled_points_to_csv((), [({}, points)])


def labelled_points_to_json(groups: Iterable[tuple[Mapping[str, object], Iterable[MetricPoint]]]) -> str:
    """As :func:`points_to_json` for points of several jobs, each object starting with its
    group's labels (e.g. a sweep's trial, job id and axis values)."""
    rows = []
    for labels, points in groups:
        for p in points:
            row: dict[str, object] = {**labels, "step": p.step, "name": p.name, "value": _json_value(p.value)}
            if p.epoch is not None:
                row["epoch"] = p.epoch
            row["source"] = p.source
            rows.append(row)
    return json.dumps(rows, allow_nan=False)


def labelled_points_to_csv(columns: Sequence[str],
                           groups: Iterable[tuple[Mapping[str, object], Iterable[MetricPoint]]]) -> str:
    """As :func:`points_to_csv` for points of several jobs: the header is ``columns`` (each
    group's labels, by name; missing ones empty) then ``step,name,value,epoch,source``."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow((*columns, "step", "name", "value", "epoch", "source"))
    for labels, points in groups:
        head = tuple("" if labels.get(c) is None else labels[c] for c in columns)
        for p in points:
            writer.writerow((*head, p.step, p.name, repr(float(p.value)), "" if p.epoch is None else p.epoch,
                             p.source))
    return buf.getvalue()


def points_to_frame(points: Iterable[MetricPoint]):  # -> pandas.DataFrame (pandas is optional)
    """Return a long-form ``pandas.DataFrame``: one row per (step, metric name).

    Columns: ``step`` (int64), ``name`` (str), ``value`` (float64, non-finite kept),
    ``epoch`` (nullable Int64), ``source`` (str); rows sorted by step then name. Points that
    repeat a (name, step) are merged first with :class:`~tune_magic.logs.metricstore.MetricStore`'s rule.

    Raises:
        ImportError: pandas is not installed (``pip install pandas``).
    """
    try:
        import pandas as pd
    except ImportError as exc:  # pandas is an optional ("notebook") dependency
        raise ImportError(
            "points_to_frame needs pandas, which is not installed: pip install pandas"
        ) from exc
    store = MetricStore()
    store.add_points(points)
    merged = store.points()
    return pd.DataFrame(
        {
            "step": pd.Series([p.step for p in merged], dtype="int64"),
            "name": pd.Series([p.name for p in merged], dtype="str"),
            "value": pd.Series([p.value for p in merged], dtype="float64"),
            "epoch": pd.Series([p.epoch for p in merged], dtype="Int64"),
            "source": pd.Series([p.source for p in merged], dtype="str"),
        }
    )
