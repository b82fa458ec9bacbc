"""A sweep's results: each trial's losses, the one ranking of the trials, the frame and the metric rows.

Training losses come from each trial's summary (:meth:`tune_magic.job.Job.summary`, kept current
from its logs: the DiskLogger file, else the progress bar), the metric named ``loss``: its last
step, the loss there and the lowest loss. Validation losses come from
:meth:`tune_magic.job.Job.val_summary` (the recipe's own ``val_loss`` lines, or the results of its
checkpoints' evaluations): the trial's lowest finite one, and how many of its evaluations are still
to finish.

The ranking (:func:`rank`) looks at the trials that succeeded while any has (a trial that failed
early may have logged a low loss at a step the others passed), else at every trial with a loss:

* **by validation loss** (``val_loss``) when every one of them has a validation loss and none of
  their evaluations is still to finish: the lowest best validation loss, ties broken by the lowest
  final loss, then by trial order;
* **else by final loss** (``final_loss``): the lowest loss at the trial's last logged step, ties
  broken by the lowest minimum loss, then by trial order. The ranking says why when the trials
  validate: evaluations still to finish (``ranking by final loss until 2 evaluations finish``), or
  the trials without a validation loss.

A NaN or infinite value is never best (a trial whose every value is NaN has no best). Every view
asks :func:`rank` of :func:`results` (``Sweep.best()``, ``Sweep.frame()``, the sweep card and its
text form, ``tune-magic sweeps`` and its ``--json``, ``jobs --sweep`` and its ``--json``): one
measure on one input, so they never disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

#: The metric the training losses are about.
LOSS = "loss"
#: :attr:`Ranking.measure`: the lowest best validation loss.
BY_VAL_LOSS = "val_loss"
#: :attr:`Ranking.measure`: the lowest final training loss.
BY_FINAL_LOSS = "final_loss"
#: How views name each measure (``best by val_loss``).
MEASURE_WORDS = {BY_VAL_LOSS: "val_loss", BY_FINAL_LOSS: "final loss"}


@dataclass(frozen=True)
class TrialResult:
    """One trial with its losses.

    Attributes:
        trial: the :class:`~tune_magic.sweeping.sweep.Trial` (index, name, values, status, job).
        steps: the last step with a loss (steps), or ``None`` before the first.
        final_loss: the loss at that step, or ``None``.
        min_loss: the lowest loss logged (``nan`` ignored), or ``None``.
        validates: the trial's job validates (a ``dataset_val``), or logged a validation loss.
        best_val_loss: its lowest finite validation loss, or ``None``.
        val_step: the step of ``best_val_loss`` (steps), or ``None``.
        validated: it has a validation loss (NaN included: evaluated, never best).
        val_pending: evaluations of its checkpoints still to finish (queued, running, or not
            launched yet by its keeper).
        ranked_by: on the best trial :func:`rank` returns, the measure it won by
            (:data:`BY_VAL_LOSS` or :data:`BY_FINAL_LOSS`); ``None`` on every other row.
    """

    trial: Any
    steps: int | None
    final_loss: float | None
    min_loss: float | None
    validates: bool = False
    best_val_loss: float | None = None
    val_step: int | None = None
    validated: bool = False
    val_pending: int = 0
    ranked_by: str | None = None

    @property
    def job(self):
        """The trial's job (``None`` while queued)."""
        return self.trial.job

    @property
    def value(self) -> float | None:
        """The value it won by (its best validation loss, or its final loss), on the best trial."""
        return self.best_val_loss if self.ranked_by == BY_VAL_LOSS else self.final_loss

    def __repr__(self) -> str:
        loss = "no loss yet" if self.final_loss is None else f"final loss {self.final_loss:.5g} at step {self.steps}"
        val = "" if self.best_val_loss is None else f", best val_loss {self.best_val_loss:.5g} at step {self.val_step}"
        by = f", best by {MEASURE_WORDS[self.ranked_by]}" if self.ranked_by else ""
        return f"<TrialResult {self.trial.index} {self.trial.name!r}: {self.trial.status}, {loss}{val}{by}>"


@dataclass(frozen=True)
class Ranking:
    """The best trial and how it was chosen (:func:`rank`).

    Attributes:
        best: the best trial (``ranked_by`` set), or ``None`` while none has a finite value.
        measure: :data:`BY_VAL_LOSS` or :data:`BY_FINAL_LOSS`.
        pending: evaluations of the ranked trials still to finish (then the measure is the final
            loss until they have).
        without_val: the ranked trials that have no validation loss while others validate (then
            the measure is the final loss), by index.
    """

    best: TrialResult | None
    measure: str
    pending: int = 0
    without_val: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        """``"best by val_loss"`` or ``"best by final loss"``."""
        return f"best by {MEASURE_WORDS[self.measure]}"

    @property
    def note(self) -> str | None:
        """Why the trials that validate are ranked by final loss, or ``None``."""
        if self.measure != BY_FINAL_LOSS:
            return None
        if self.pending:
            return f"ranking by final loss until {self.pending} " + ("evaluations finish" if self.pending > 1
                                                                     else "evaluation finishes")
        if self.without_val:
            which = ", ".join(map(str, self.without_val))
            return f"ranked by final loss: trial{'s' if len(self.without_val) > 1 else ''} {which} without a validation loss"
        return None


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
    """One trial with its losses from its job's summary and validation summary (a queued trial:
    none). A summary written before it kept the lowest loss (``min_loss``) is completed from the
    ended job's logs."""
    job = trial.job
    if job is None:
        return TrialResult(trial, None, None, None)
    s = job.summary()
    if s.loss is not None and s.min_loss is None and not job.status.is_live:
        train = loss_stats(job.metric_points())
    else:
        train = (s.step, s.loss, s.min_loss)
    val = job.val_summary()
    if val is None:
        return TrialResult(trial, *train)
    return TrialResult(trial, *train, validates=True, best_val_loss=val.best, val_step=val.best_step,
                       validated=val.latest is not None, val_pending=val.pending)


def results(trials: Sequence) -> list[TrialResult]:
    """Each trial with its losses (:func:`standing`), in the order given."""
    return [standing(t) for t in trials]


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _or_inf(value: float | None) -> float:
    """``value`` for a sort key: NaN, infinities and ``None`` last."""
    return value if value is not None and math.isfinite(value) else math.inf


def rank(rows: Sequence[TrialResult]) -> Ranking:
    """The one ranking of a sweep's trials (the module docstring's rule), from :func:`results`.

    Returns:
        The :class:`Ranking`: the best trial (with ``ranked_by``), the measure, and what keeps
        trials that validate from being ranked by validation loss.
    """
    with_loss = [r for r in rows if r.final_loss is not None]
    pool = [r for r in with_loss if r.trial.status == "succeeded"] or with_loss
    pending = sum(r.val_pending for r in pool)
    validating = any(r.validates or r.validated for r in pool)
    without = tuple(r.trial.index for r in pool if not r.validated)
    if pool and validating and not pending and not without:
        measure = BY_VAL_LOSS
        keyed = [((v, _or_inf(r.final_loss), r.trial.index), r)
                 for r in pool if (v := _finite(r.best_val_loss)) is not None]
    else:
        measure = BY_FINAL_LOSS
        keyed = [((v, _or_inf(r.min_loss), r.trial.index), r)
                 for r in pool if (v := _finite(r.final_loss)) is not None]
    top = replace(min(keyed, key=lambda k: k[0])[1], ranked_by=measure) if keyed else None
    return Ranking(top, measure, pending if validating else 0, without if validating else ())


def frame(rows: Sequence[TrialResult], keys: Sequence[str]):
    """The DataFrame of :meth:`tune_magic.sweeping.sweep.Sweep.frame`; its ``attrs`` hold the
    ranking: ``best`` (the best trial's index, or ``None``), ``ranked_by`` (``val_loss`` or
    ``final_loss``), ``ranking`` (``best by val_loss``), ``note`` (:attr:`Ranking.note`).

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
                    "final_loss": r.final_loss, "min_loss": r.min_loss, "best_val_loss": r.best_val_loss})
        data.append(row)
    columns = ["trial", "name", *keys, "status", "job_id", "steps", "final_loss", "min_loss", "best_val_loss"]
    df = pd.DataFrame(data, columns=list(dict.fromkeys(columns)))
    df["steps"] = df["steps"].astype("Int64")
    df["best_val_loss"] = df["best_val_loss"].astype("float64")
    df = df.set_index("trial")
    ranking = rank(rows)
    df.attrs.update(best=None if ranking.best is None else ranking.best.trial.index, ranked_by=ranking.measure,
                    ranking=ranking.label, note=ranking.note)
    return df


def metric_groups(trials: Sequence, keys: Sequence[str]) -> list[tuple[dict, list]]:
    """Every started trial's metric points with its labels: ``[({"trial", "job_id", <axis key>:
    item as typed...}, [MetricPoint...])]`` in trial order (for
    :func:`tune_magic.logs.export.labelled_points_to_csv`)."""
    return [({"trial": t.index, "job_id": t.job.id, **{k: t.texts.get(k) for k in keys}}, t.job.metric_points())
            for t in trials if t.job is not None]
