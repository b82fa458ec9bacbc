"""One prompt answered by several jobs, or by every trial of a sweep: :func:`compare`.

Each job answers from the checkpoint asked (``"best"`` by default: its lowest validation loss)
with the generation recipe's one-shot mode (:func:`tune_magic.job.generate.generate_once`), one
after the other, so no model stays loaded afterwards. The result is a pandas DataFrame, one row per
job or trial; a job that cannot answer (no checkpoint yet, no validation loss for ``"best"``, the
recipe's refusal) has its reason in ``error`` and no text. The notebook's table of it is
:func:`tune_magic.ui.generation.compare_html`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from tune_magic.errors import PlanError, UserError
from tune_magic.job import Job, get_job
from tune_magic.job.generate import GenOptions, check_checkpoint_name, check_prompt, choose_checkpoint, generate_once
from tune_magic.sweeping import store as sweepstore
from tune_magic.sweeping.sweep import Sweep, get_sweep

#: The columns of every row after the job's (and a sweep's axis values).
COLUMNS = ("checkpoint", "val_loss", "text", "error")


def _is_sweep_name(spec: str) -> bool:
    if sweepstore.is_sweep_id(spec):
        return True
    try:
        return any(r.name == spec for r in sweepstore.list_records())
    except Exception:  # noqa: BLE001 - an unreadable sweep registry: then it names a job
        return False


def _targets(jobs_or_sweep: Any) -> tuple[Sweep | None, list[tuple[dict[str, Any], Job | None, str | None]]]:
    """(the sweep or ``None``, rows to fill: (their first columns, the job or ``None``, why there is none)).

    Raises:
        JobNotFound: a job or sweep that does not exist. PlanError: nothing to compare.
    """
    target = jobs_or_sweep
    if isinstance(target, str) and _is_sweep_name(target):
        target = get_sweep(target)
    if isinstance(target, Sweep):
        rows = []
        for t in target.trials:
            head = {"trial": t.index, "job_id": t.job.id if t.job is not None else None, "name": t.name,
                    **{k: t.values.get(k) for k in target.keys}}
            rows.append((head, t.job, None if t.job is not None else f"trial not started ({t.status})"))
        return target, rows
    if isinstance(target, (str, Job)):
        target = [target]
    if not isinstance(target, Iterable):
        raise PlanError(f"compare takes a sweep, a job, or a list of jobs (or their ids/names), not "
                        f"{type(jobs_or_sweep).__name__}")
    jobs = [j if isinstance(j, Job) else get_job(j) for j in target]
    if not jobs:
        raise PlanError("nothing to compare: give a sweep or at least one job")
    return None, [({"job_id": j.id, "name": j.name}, j, None) for j in jobs]


def compare(jobs_or_sweep: Any, prompt: str, checkpoint: Any = "best", *, max_new_tokens: int = 64,
            temperature: float = 0.0, top_k: int | None = None, seed: int = 0,
            on_row: Callable[[dict[str, Any]], None] | None = None):
    """Answer ``prompt`` with each job (or each trial of a sweep) and return the answers side by side.

    Args:
        jobs_or_sweep: a :class:`~tune_magic.sweeping.sweep.Sweep`, a sweep's id or name, a
            :class:`~tune_magic.job.Job`, a job's id or name, or a list of jobs / ids / names.
        prompt: the user message (``str``).
        checkpoint: each job's checkpoint: ``"best"`` (lowest validation loss), ``"last"``,
            ``"epoch_N"``, ``"base"`` (see :meth:`tune_magic.job.Job.generate`).
        max_new_tokens, temperature, top_k, seed: as :meth:`tune_magic.job.Job.generate`'s.
        on_row: called with each row (a ``dict`` of the columns) as soon as it is done, in this thread.

    Returns:
        A pandas DataFrame, one row per job (indexed by ``trial`` for a sweep), columns
        ``job_id``, ``name``, the sweep's axis keys (their values, as the recipe reads them),
        ``checkpoint`` (``epoch_N`` or ``base``), ``val_loss`` (float or NaN), ``text`` (str, or
        None), ``error`` (None, or why that job has no text).

    Raises:
        PlanError, CheckpointError: a bad prompt, option or checkpoint name (nothing started).
        JobNotFound: a job or sweep that does not exist (nothing started).
        ImportError: pandas is not installed.
    """
    import pandas as pd

    prompt = check_prompt(prompt)
    opts = GenOptions.checked(max_new_tokens, temperature, top_k, seed)
    check_checkpoint_name(checkpoint)
    sweep, targets = _targets(jobs_or_sweep)
    rows = []
    for head, job, missing in targets:
        row = {**head, "checkpoint": None, "val_loss": None, "text": None, "error": missing}
        if job is not None:
            try:
                chosen = choose_checkpoint(job, checkpoint)
                row.update(checkpoint=chosen.label, val_loss=chosen.val_loss)
                row["text"] = generate_once(job, prompt, chosen=chosen, max_new_tokens=opts.max_new_tokens,
                                            temperature=opts.temperature, top_k=opts.top_k, seed=opts.seed)
            except UserError as exc:
                row["error"] = str(exc)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    keys = list(sweep.keys) if sweep is not None else []
    columns = list(dict.fromkeys([*(["trial"] if sweep is not None else []), "job_id", "name", *keys, *COLUMNS]))
    frame = pd.DataFrame(rows, columns=columns)
    frame["val_loss"] = frame["val_loss"].astype(float)
    for column in ("checkpoint", "text", "error"):  # None where missing (pandas' own str dtype would say NaN)
        frame[column] = pd.Series([r[column] for r in rows], index=frame.index, dtype=object)
    return frame.set_index("trial") if sweep is not None else frame
