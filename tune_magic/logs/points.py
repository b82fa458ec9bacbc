"""Metric points: one value of one metric at one step, and the parser's columnar batch of them.

The data model shared by the parser (:mod:`tune_magic.logs.parse`), the merged store
(:mod:`tune_magic.logs.metricstore`) and the serialisers (:mod:`tune_magic.logs.export`).
"""

from __future__ import annotations

from itertools import repeat
from typing import Iterator, NamedTuple

__all__ = ["SOURCE_DISKLOGGER", "SOURCE_EVALUATION", "SOURCE_JSONL", "SOURCE_PROGRESS", "MetricPoint", "MetricBatch",
           "new_point"]

#: ``MetricPoint.source`` of a point read from a DiskLogger/StdoutLogger ``Step N | ...`` line.
SOURCE_DISKLOGGER = "disklogger"
#: ``MetricPoint.source`` of a point read from a JSON-lines metric file.
SOURCE_JSONL = "jsonl"
#: ``MetricPoint.source`` of a loss read from the tqdm progress-bar description.
SOURCE_PROGRESS = "progress"
#: ``MetricPoint.source`` of a ``val_loss`` from a checkpoint's evaluation job (its ``val_loss.json``).
SOURCE_EVALUATION = "evaluation"


class MetricPoint(NamedTuple):
    """One value of one metric at one optimizer step.

    Attributes:
        step: the recipe's ``global_step`` (steps, not samples).
        name: metric name as the recipe logged it (``loss``, ``lr``, ``tokens_per_second_per_gpu``...).
        value: the value as a float; ``nan``/``inf``/``-inf`` are kept as such.
        epoch: 1-based epoch when the format carries one (progress bar only), else ``None``.
        source: ``"disklogger"``, ``"jsonl"``, ``"progress"`` or ``"evaluation"``.
    """

    step: int
    name: str
    value: float
    epoch: int | None = None
    source: str = SOURCE_DISKLOGGER


#: ``new_point(MetricPoint, (step, name, value, epoch, source))`` builds a point without
#: NamedTuple's Python-level ``__new__``: about 3x faster per point, for bulk conversions.
new_point = tuple.__new__


class MetricBatch:
    """Metric points held as parallel columns, in parse order.

    The parser's native output: filling five lists is several times cheaper than building one
    :class:`MetricPoint` per value, which matters for million-line metric files. Iterating
    yields :class:`MetricPoint` objects.

    Attributes:
        steps: ``list[int]``, global steps.
        names: ``list[str]``, metric names.
        values: ``list[float]``, values (non-finite kept).
        epochs: ``list[int | None]``, 1-based epochs or ``None``.
        sources: ``list[str]``, ``"disklogger"`` / ``"jsonl"`` / ``"progress"``.
    """

    __slots__ = ("steps", "names", "values", "epochs", "sources")

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.names: list[str] = []
        self.values: list[float] = []
        self.epochs: list[int | None] = []
        self.sources: list[str] = []

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[MetricPoint]:
        return map(
            new_point,
            repeat(MetricPoint),
            zip(self.steps, self.names, self.values, self.epochs, self.sources),
        )

    def __repr__(self) -> str:
        return f"MetricBatch({len(self)} points)"

    def points(self) -> list[MetricPoint]:
        """Return the points as a list of :class:`MetricPoint`."""
        return list(self)

    def append(self, point: MetricPoint) -> None:
        """Add one point at the end."""
        step, name, value, epoch, source = point
        self.steps.append(step)
        self.names.append(name)
        self.values.append(value)
        self.epochs.append(epoch)
        self.sources.append(source)

    def extend(self, other: MetricBatch) -> None:
        """Add all of ``other``'s points at the end."""
        self.steps += other.steps
        self.names += other.names
        self.values += other.values
        self.epochs += other.epochs
        self.sources += other.sources
