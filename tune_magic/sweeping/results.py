"""A sweep's results: each trial's losses, the best trial, the frame and the metric rows.

Losses come from each trial's summary (:meth:`tune_magic.job.Job.summary`, kept current from its
logs: the DiskLogger file, else the progress bar), the metric named ``loss``: its last step, the
loss there and the lowest loss. The best trial is the one with the lowest **final** loss (the loss
at its last logged step), ties broken by the lowest **minimum** loss, then by trial order; among
the trials that succeeded while any has (a trial that failed early may have logged a low loss at a
step the others passed), else among every trial with a loss.

Every view asks :func:`best` of :func:`results` (``Sweep.best()``, the sweep card and its text form,
``tune-magic sweeps`` and its ``--json``, ``jobs --sweep`` and its ``--json``): one measure on one
input, so they never disagree on a tie.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

#: The metric the results are about.
LOSS = "loss"


@dataclass(frozen=True)
class TrialResult:
    """One trial with its losses.

    Attributes:
        trial: the :class:`~tune_magic.sweeping.sweep.Trial` (index, name, values, status, job).
        steps: the last step with a loss, or ``None`` before the first.
        final_loss: the loss at that step, or ``None``.
        min_loss: the lowest loss logged (``nan`` ignored), or ``None``.
    """

    trial: Any
    steps: int | None
    final_loss: float | None
    min_loss: float | None

    @property
    def job(self):
        """The trial's job (``None`` while queued)."""
        return self.trial.job

    def __repr__(self) -> str:
        loss = "no loss yet" if self.final_loss is None else f"final loss {self.final_loss:.5g} at step {self.steps}"
        return f"<TrialResult {self.trial.index} {self.trial.name!r}: {self.trial.status}, {loss}>"


def loss_stats(points: Sequence) -> tuple[int | None, float | None, float | None]:
    """``(last step, loss there, lowest loss)`` of metric points (``nan`` losses ignored for the
    lowest; the final one is whatever the last step logged)."""
    losses = sorted((p.step, p.value) for p in points if p.name == LOSS)
    if not losses:
        return None, None, None
    step, final = losses[-1]
    finite = [v for _, v in losses if not math.isnan(v)]
    return step, final, (min(finite) if finite else None)


def standing(trial) -> TrialResult:
    """One trial with its losses from its job's summary (a queued trial: none). A summary written
    before it kept the lowest loss (``min_loss``) is completed from the ended job's logs."""
    job = trial.job
    if job is None:
        return TrialResult(trial, None, None, None)
    s = job.summary()
    if s.loss is not None and s.min_loss is None and not job.status.is_live:
        return TrialResult(trial, *loss_stats(job.metric_points()))
    return TrialResult(trial, s.step, s.loss, s.min_loss)


def results(trials: Sequence) -> list[TrialResult]:
    """Each trial with its losses (:func:`standing`), in the order given."""
    return [standing(t) for t in trials]


def pick_best(candidates: Iterable[tuple[int, str, float | None, float | None]]) -> int | None:
    """The index of the best trial by the module's measure, or ``None`` when none has a loss.

    Args:
        candidates: ``(trial index, status, final loss, minimum loss)`` per trial.
    """
    with_loss = [c for c in candidates if c[2] is not None]
    pool = [c for c in with_loss if c[1] == "succeeded"] or with_loss
    if not pool:
        return None

    def rank(c):
        final = math.inf if math.isnan(c[2]) else c[2]
        minimum = math.inf if c[3] is None or math.isnan(c[3]) else c[3]
        return (final, minimum, c[0])

    return min(pool, key=rank)[0]


def best(rows: Sequence[TrialResult]) -> TrialResult | None:
    """The best of ``rows`` by the module's measure, or ``None`` when none logged a loss."""
    index = pick_best((r.trial.index, r.trial.status, r.final_loss, r.min_loss) for r in rows)
    return next((r for r in rows if r.trial.index == index), None)


def frame(rows: Sequence[TrialResult], keys: Sequence[str]):
    """The DataFrame of :meth:`tune_magic.sweeping.sweep.Sweep.frame`.

    Raises:
        ImportError: pandas is not installed.
    """
    import pandas as pd

    data = []
    for r in rows:
        t = r.trial
        row: dict[str, Any] = {"trial": t.index, "name": t.name}
        row.update({k: t.values.get(k) for k in keys})
        row.update({"status": t.status, "job_id": t.job.id if t.job is not None else None, "steps": r.steps,
                    "final_loss": r.final_loss, "min_loss": r.min_loss})
        data.append(row)
    columns = ["trial", "name", *keys, "status", "job_id", "steps", "final_loss", "min_loss"]
    df = pd.DataFrame(data, columns=list(dict.fromkeys(columns)))
    df["steps"] = df["steps"].astype("Int64")
    return df.set_index("trial")


def metric_groups(trials: Sequence, keys: Sequence[str]) -> list[tuple[dict, list]]:
    """Every started trial's metric points with its labels: ``[({"trial", "job_id", <axis key>:
    item as typed...}, [MetricPoint...])]`` in trial order (for
    :func:`tune_magic.logs.export.labelled_points_to_csv`)."""
    return [({"trial": t.index, "job_id": t.job.id, **{k: t.texts.get(k) for k in keys}}, t.job.metric_points())
            for t in trials if t.job is not None]
