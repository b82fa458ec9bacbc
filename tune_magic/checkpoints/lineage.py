"""A job's lineage: the jobs that resumed one another in one ``output_dir``, and their metrics as one run.

A resume is a new job whose record names the job it resumed (``resumed_from``, written at its
registration) and where (``resume_point``: the checkpoint folder, its epoch, the global step there
and the pre-flight's case); the resumed job's record gains ``resumed_by`` afterwards
(:mod:`tune_magic.job.resume`). Following ``resumed_from`` back gives the lineage, oldest first.

One series for the lineage (:func:`lineage_points`): each job's points up to the global step where
the next one resumed (the steps after its checkpoint were done again by the next job, whose values
replace them), then the last job's. A job that resumed with its step count restarting (the
pre-flight's ``steps_restart`` case: torchtune 0.6.1's lora_finetune_single_device without a
truncating ``max_steps_per_epoch``) logs ``Step 1`` again: its steps are shifted by the resume step
so the series runs on. Works on records (no :class:`tune_magic.job.Job`), reading each job's logs
with :class:`tune_magic.logs.metricfollow.JobMetricsFollower`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from tune_magic.errors import StateDirError
from tune_magic.logs.points import MetricPoint
from tune_magic.registry import attempts as attempt_entries
from tune_magic.registry import store as jobstore
from tune_magic.registry.store import JobRecord

#: The pre-flight's case whose resumed run numbers its steps from 1 again (tune_magic.checkpoints.preflight).
STEPS_RESTART = "steps_restart"
#: Most jobs followed back (a hand-edited record could make a long or circular chain).
MAX_DEPTH = 1000


def ancestors(record: JobRecord, root: Path | None = None) -> list[JobRecord]:
    """The jobs ``record`` descends from through ``resumed_from``, oldest first (``record`` not
    included). Stops at a job removed from the registry (``tune-magic rm``), a damaged record or a
    loop."""
    out: list[JobRecord] = []
    seen = {record.id}
    parent = record.resumed_from
    while parent and parent not in seen and len(out) < MAX_DEPTH:
        seen.add(parent)
        try:
            found = jobstore.read(jobstore.job_dir(parent, root))
        except (jobstore.CorruptRecord, OSError, StateDirError):
            break
        out.append(found)
        parent = found.resumed_from
    return out[::-1]


def record_points(record: JobRecord, *, finished: bool) -> list[MetricPoint]:
    """The job's metric points read from its logs (see ``Job.metric_points``): to their end for a
    job that ended (``finished``), else as far as written."""
    from tune_magic.logs.metricfollow import JobMetricsFollower

    with JobMetricsFollower(record.log_path, log_dir=record.metric_log_dir, started_after=record.started_at - 1,
                            max_lines=1, cwd=record.cwd, rank_log_dir=record.rank_log_dir) as follower:
        follower.finish() if finished else follower.poll()
        return follower.points()


def _resume_step(record: JobRecord) -> int | None:
    """The global step ``record`` resumed at (``resume_point["step"]``), or ``None``."""
    point = record.resume_point or {}
    step = point.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _shift(record: JobRecord) -> int:
    """Steps to add to ``record``'s logged steps to place them in the lineage's count."""
    point = record.resume_point or {}
    step = _resume_step(record)
    return step if point.get("case") == STEPS_RESTART and step is not None else 0


def lineage_points(records: Sequence[JobRecord], points: Sequence[Sequence[MetricPoint]]
                   ) -> list[tuple[str, MetricPoint]]:
    """Merge the points of a lineage's jobs (oldest first, ``points[i]`` those of ``records[i]``)
    into one series: ``(job id, point)`` pairs sorted by step then name, each job's points cut at
    the step where the next one resumed, later jobs' steps shifted where their count restarted."""
    out: list[tuple[str, MetricPoint]] = []
    for i, (record, pts) in enumerate(zip(records, points)):
        cut = _resume_step(records[i + 1]) if i + 1 < len(records) else None
        shift = _shift(record)
        for p in pts:
            step = p.step + shift
            if cut is None or step <= cut:
                out.append((record.id, p._replace(step=step) if shift else p))
    return sorted(out, key=lambda item: (item[1].step, item[1].name))


@dataclass(frozen=True)
class EarlierCurve:
    """What a card draws of a job's earlier runs: their loss points (lineage steps), and the steps
    where a run of the lineage resumed."""

    steps: tuple[int, ...] = ()
    values: tuple[float, ...] = ()
    resumed_at: tuple[int, ...] = ()


def earlier_curve(record: JobRecord, earlier: Sequence[JobRecord], name: str = "loss") -> EarlierCurve:
    """The earlier runs' ``name`` points (``earlier``: :func:`ancestors` of ``record``, all ended)
    and the steps where a run of the lineage resumed, for ``record``'s card (its own attempts:
    :func:`attempt_marks`)."""
    chain = [*earlier, record]
    pts = [record_points(r, finished=True) for r in earlier] + [[]]
    merged = [p for _, p in lineage_points(chain, pts) if p.name == name]
    marks = {s for s in (_resume_step(r) for r in chain[1:]) if s is not None}
    return EarlierCurve(tuple(p.step for p in merged), tuple(p.value for p in merged), tuple(sorted(marks)))


def attempt_marks(record: JobRecord) -> list[int]:
    """Global steps where an attempt of ``record`` resumed (``--max-resumes``, a requeue)."""
    out = []
    for a in attempt_entries.parse(record.attempts)[1:]:
        step = (a.resumed_from or {}).get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            out.append(step)
    return out


def notes(record: JobRecord) -> list[str]:
    """Lines a card shows about ``record``'s place in its lineage and its attempts: where it resumed
    from, each relaunch of its own ("attempt 2: resumed from epoch_0/ at step 2 after ..."), and
    the job that resumed it."""
    out = []
    if record.resumed_from:
        point = record.resume_point or {}
        if point.get("fresh"):
            out.append(f"started again from the beginning after job {record.resumed_from} (it saved no checkpoint)")
        else:
            where = attempt_entries.where(point if isinstance(point.get("checkpoint"), str) else None)
            out.append(f"resumed job {record.resumed_from} from {where}")
    out += attempt_entries.notes(attempt_entries.parse(record.attempts))
    if record.resumed_by:
        out.append(f"resumed by job {record.resumed_by}")
    return out


def mark(record: JobRecord) -> str:
    """A listing's short word on ``record``'s lineage: ``"resume of <id> from epoch_1/"``,
    ``"resumed by <id>"``, ``"2 attempts"`` (joined by ``", "``), or ``""``."""
    out = []
    if record.resumed_from:
        checkpoint = (record.resume_point or {}).get("checkpoint")
        out.append(f"resume of {record.resumed_from}" + (f" from {checkpoint}" if isinstance(checkpoint, str) else ""))
    if record.resumed_by:
        out.append(f"resumed by {record.resumed_by}")
    if len(record.attempts) > 1:
        out.append(f"{len(record.attempts)} attempts")
    return ", ".join(out)


def link_resumes(records: Iterable[JobRecord], root: Path | None = None) -> None:
    """Write ``resumed_by`` into each record a listed job resumed and which lacks it (a resume whose
    process died between registering the new job and linking the old one). Best effort: a
    registry that cannot be written is left as it is (the new job's ``resumed_from`` holds the link)."""
    records = list(records)
    by_id = {r.id: r for r in records}
    for r in records:
        parent = by_id.get(r.resumed_from or "")
        if parent is not None and not parent.resumed_by:
            try:
                parent.resumed_by = jobstore.update(jobstore.job_dir(parent.id, root), resumed_by=r.id).resumed_by
            except (OSError, jobstore.CorruptRecord, StateDirError):
                continue
