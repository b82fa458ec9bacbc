"""Merged metric series, one value per (metric name, step), kept compactly: :class:`MetricStore`.

Fed by :class:`~tune_magic.logs.metricfollow.JobMetricsFollower` (and :func:`~tune_magic.logs.export.points_to_frame`)
with the parser's :class:`~tune_magic.logs.points.MetricBatch`; read by the card's charts (:meth:`MetricStore.series`).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from itertools import islice, repeat
from operator import itemgetter, lt
from typing import Iterable, Iterator, NamedTuple

from tune_magic.logs.points import (
    SOURCE_DISKLOGGER,
    SOURCE_EVALUATION,
    SOURCE_JSONL,
    SOURCE_PROGRESS,
    MetricBatch,
    MetricPoint,
    new_point,
)

__all__ = ["MetricStore", "Series"]


class Series(NamedTuple):
    """One metric's values for charts: parallel lists, ordered by step."""

    steps: list[int]
    values: list[float]


_CODE = {SOURCE_PROGRESS: 0, SOURCE_DISKLOGGER: 1, SOURCE_JSONL: 2, SOURCE_EVALUATION: 3}
_SOURCE = (SOURCE_PROGRESS, SOURCE_DISKLOGGER, SOURCE_JSONL, SOURCE_EVALUATION)
# Merge precedence: a metric file's value (an evaluation's result file too) beats the progress
# bar's rounded echo of it.
_RANK = (0, 1, 1, 1)
_NO_EPOCH = -1
_EPOCH_LIMIT = 1 << 63
# dict.get(x, x) maps in C: None <-> _NO_EPOCH, any other epoch to itself.
_EPOCH_IN = {None: _NO_EPOCH}
_EPOCH_OUT = {_NO_EPOCH: None}
_STEP_NAME = itemgetter(0, 1)  # sort key of MetricPoint: (step, name)


class _Column:
    """One metric's merged points, sorted by step, in typed arrays (25 bytes per point)."""

    __slots__ = ("steps", "values", "epochs", "sources", "taken_step", "changed")

    def __init__(self) -> None:
        self.steps = array("q")
        self.values = array("d")
        self.epochs = array("q")
        self.sources = array("b")
        # Steps <= taken_step were reported by take_changes(); changes among them are in `changed`.
        self.taken_step: int | None = None
        self.changed: set[int] = set()

    def points(self, name: str, start: int) -> Iterator[MetricPoint]:
        """Points ``start:`` as MetricPoint, built at C speed."""
        epochs = self.epochs[start:]
        return map(
            new_point,
            repeat(MetricPoint),
            zip(
                self.steps[start:],
                repeat(name),
                self.values[start:],
                map(_EPOCH_OUT.get, epochs, epochs),
                map(_SOURCE.__getitem__, self.sources[start:]),
            ),
        )

    def points_at(self, name: str, indexes: list[int]) -> Iterator[MetricPoint]:
        """Points at ``indexes`` as MetricPoint, built at C speed."""
        epochs = list(map(self.epochs.__getitem__, indexes))
        return map(
            new_point,
            repeat(MetricPoint),
            zip(
                map(self.steps.__getitem__, indexes),
                repeat(name),
                map(self.values.__getitem__, indexes),
                map(_EPOCH_OUT.get, epochs, epochs),
                map(_SOURCE.__getitem__, map(self.sources.__getitem__, indexes)),
            ),
        )

    def point(self, name: str, i: int) -> MetricPoint:
        epoch = self.epochs[i]
        return MetricPoint(
            self.steps[i],
            name,
            self.values[i],
            None if epoch == _NO_EPOCH else epoch,
            _SOURCE[self.sources[i]],
        )


class MetricStore:
    """Merged metric series: one value per (metric name, step).

    Merge rule: a value from a metric file (``"disklogger"``/``"jsonl"``) beats one from the
    progress bar for the same (name, step), whatever the arrival order; between equal ranks
    the later value replaces the earlier one (re-reading a file never duplicates a step).
    A replacing value without an epoch keeps the epoch already known for that step.

    Storage is ``array('q')`` steps, ``array('d')`` values, ``array('q')`` epochs and
    ``array('b')`` source codes per metric: 25 bytes per point.
    """

    def __init__(self) -> None:
        self._columns: dict[str, _Column] = {}
        self.dropped = 0  #: points whose step does not fit in 64 bits (skipped)
        #: changes merged since the last take_changes() (an upper bound: a key changed twice counts twice)
        self.pending = 0

    def __len__(self) -> int:
        """Number of merged points (one per name and step)."""
        return sum(len(c.steps) for c in self._columns.values())

    def names(self) -> list[str]:
        """Metric names seen, in first-seen order."""
        return list(self._columns)

    def add_points(self, points: Iterable[MetricPoint]) -> None:
        """Merge points (any order); see :meth:`take_changes` for what changed."""
        batch = MetricBatch()
        for p in points:
            batch.append(p)
        self.add_batch(batch)

    def add_batch(self, batch: MetricBatch) -> None:
        """Merge a parser batch, in its order.

        Raises:
            KeyError: a point's source is not one of the three known sources.
        """
        n = len(batch.values)
        if n == 0:
            return
        before = len(self)
        names = batch.names
        distinct = list(dict.fromkeys(names))
        m = len(distinct)
        # Parser batches are one name (progress) or a fixed name cycle (a DiskLogger block):
        # then each name's points are a strided slice, merged as a whole when they only append.
        if n >= 2 * m and all(names[j::m].count(distinct[j]) == len(names[j::m]) for j in range(m)):
            changed = 0
            for j, name in enumerate(distinct):
                changed += self._merge_run(
                    name, batch.steps[j::m], batch.values[j::m], batch.epochs[j::m], batch.sources[j::m]
                )
        else:
            changed = self._merge(zip(batch.steps, names, batch.values, batch.epochs, batch.sources))
        self.pending += changed + len(self) - before

    def _merge_run(self, name: str, steps: list, values: list, epochs: list, sources: list) -> int:
        """Merge one name's points; appended in bulk when their steps all come after the last."""
        col = self._columns.get(name)
        if col is None:
            col = self._columns[name] = _Column()
        old = col.steps
        if (not old or steps[0] > old[-1]) and all(map(lt, steps, islice(steps, 1, None))):
            codes = list(map(_CODE.__getitem__, sources))
            eps = list(map(_EPOCH_IN.get, epochs, epochs))
            if min(eps) < _NO_EPOCH:  # a negative epoch: _merge() stores it as unknown
                return self._merge(zip(steps, repeat(name), values, epochs, sources))
            n = len(old)
            try:
                old.extend(steps)
                col.epochs.extend(eps)
            except (OverflowError, TypeError):
                # a step or epoch that does not fit: undo, then point by point
                del old[n:], col.epochs[n:]
            else:
                col.values.extend(values)
                col.sources.extend(codes)
                return 0
        return self._merge(zip(steps, repeat(name), values, epochs, sources))

    def _merge(self, points: Iterable[tuple]) -> int:
        """Merge (step, name, value, epoch, source) tuples one by one; return replacements."""
        columns = self._columns
        code_of = _CODE
        rank = _RANK
        changed = 0
        for step, name, value, epoch, source in points:
            col = columns.get(name)
            if col is None:
                col = columns[name] = _Column()
            steps = col.steps
            code = code_of[source]
            if epoch is None or not 0 <= epoch < _EPOCH_LIMIT:
                epoch = _NO_EPOCH
            if not steps or step > steps[-1]:
                try:
                    steps.append(step)  # first: it is the only append that can overflow
                except OverflowError:
                    self.dropped += 1
                    continue
                col.values.append(value)
                col.epochs.append(epoch)
                col.sources.append(code)
                continue
            try:
                i = bisect_left(steps, step)
                if i < len(steps) and steps[i] == step:
                    old_code = col.sources[i]
                    if rank[code] < rank[old_code]:
                        continue
                    if epoch == _NO_EPOCH:
                        epoch = col.epochs[i]
                    old = col.values[i]
                    same = old == value or (old != old and value != value)
                    if same and old_code == code and col.epochs[i] == epoch:
                        continue
                    col.values[i] = value
                    col.epochs[i] = epoch
                    col.sources[i] = code
                    changed += 1
                else:
                    steps.insert(i, step)
                    col.values.insert(i, value)
                    col.epochs.insert(i, epoch)
                    col.sources.insert(i, code)
            except OverflowError:
                self.dropped += 1
                continue
            if col.taken_step is not None and step <= col.taken_step:
                col.changed.add(step)
        return changed

    def take_changes(self) -> list[MetricPoint]:
        """Return the points added or changed since the previous call, sorted by (step, name).

        A (name, step) changed several times appears once, with its merged value; a value
        ignored by the merge rule, or identical to the stored one, is not a change.
        """
        out: list[MetricPoint] = []
        for name, col in self._columns.items():
            steps = col.steps
            if not steps:
                continue
            start = 0 if col.taken_step is None else bisect_right(steps, col.taken_step)
            if col.changed:
                # changed steps were all <= taken_step, so they sit before `start`
                out += col.points_at(name, list(map(bisect_left, repeat(steps), col.changed)))
            out += col.points(name, start)
            col.changed.clear()
            col.taken_step = steps[-1]
        self.pending = 0
        out.sort(key=_STEP_NAME)
        return out

    def points(self) -> list[MetricPoint]:
        """Return every merged point, sorted by step then name."""
        out: list[MetricPoint] = []
        for name, col in self._columns.items():
            out += col.points(name, 0)
        out.sort(key=_STEP_NAME)
        return out

    def last(self, name: str) -> MetricPoint | None:
        """Return ``name``'s point at the highest step, or ``None`` if it has none."""
        col = self._columns.get(name)
        if col is None or not col.steps:
            return None
        return col.point(name, len(col.steps) - 1)

    def series(self, name: str, max_points: int | None = 2000) -> Series:
        """Return ``name``'s values by step, thinned to at most ``max_points`` for charts.

        Thinning splits all but the last point into ``(max_points - 1) // 2`` equal buckets of
        steps and keeps each bucket's lowest and highest finite value (so spikes survive), in
        step order, then the last point (the latest value). A bucket of only ``nan`` keeps
        its first point.

        Args:
            name: metric name; an unknown name gives empty lists.
            max_points: upper bound on the points returned (>= 2), or ``None`` for all.

        Raises:
            ValueError: ``max_points`` < 2.
        """
        col = self._columns.get(name)
        if col is None:
            return Series([], [])
        steps, values = col.steps, col.values
        n = len(steps)
        if max_points is None or n <= max_points:
            return Series(steps.tolist(), values.tolist())
        if max_points < 2:
            raise ValueError(f"max_points must be >= 2, got {max_points}")
        # Buckets over all but the last point, which is always kept (the latest value).
        buckets = (max_points - 1) // 2
        keep: list[int] = [] if buckets else [0]
        last = n - 1
        for b in range(buckets):
            lo = b * last // buckets
            hi = (b + 1) * last // buckets
            chunk = values[lo:hi]
            finite = [v for v in chunk if v == v] if any(map(math.isnan, chunk)) else chunk
            if not finite:
                keep.append(lo)
                continue
            i_min = lo + chunk.index(min(finite))
            i_max = lo + chunk.index(max(finite))
            keep.extend((i_min, i_max) if i_min < i_max else (i_max, i_min) if i_max < i_min else (i_min,))
        keep.append(last)
        return Series([steps[i] for i in keep], [values[i] for i in keep])
