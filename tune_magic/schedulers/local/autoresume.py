"""``--max-resumes N`` on this machine: the supervisor relaunches a job that failed after saving a
checkpoint, from that checkpoint, as the same job, at most N times.

Unlike torchrun's ``--max-restarts`` (the same arguments again: the recipe starts over from step 0
unless it was told to resume), each new attempt runs with the resume pre-flight's overrides
(:func:`tune_magic.checkpoints.preflight.preflight`): the recipe continues from the last complete
``epoch_K/`` and its recipe state. An attempt is started again only when the outcome rule says it
failed (:func:`tune_magic.registry.outcome.decide`: never after a stop, a success or a failed resume),
and only while the pre-flight finds something to continue from; otherwise the job ends as the rule
says. Each attempt is recorded in ``record.attempts`` (:mod:`tune_magic.registry.attempts`) with its
start and end times, the reason it ended and the step it reached, and the job's log says why and
from where it goes on (``[tune_magic] ...`` lines).

Stdlib and tune_magic only; the supervisor imports this at start when the job has ``max_resumes``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tune_magic.errors import PlanError
from tune_magic.logs import endevidence
from tune_magic.checkpoints import relaunch
from tune_magic.registry import attempts as attempt_entries
from tune_magic.registry import store as jobstore
from tune_magic.registry.outcome import decide
from tune_magic.registry.record import JobRecord
from tune_magic.registry.status import Status


@dataclass(frozen=True)
class Decision:
    """What the supervisor does after an attempt ended.

    Attributes:
        changes: record fields to write before starting the next attempt (``argv``, ``overrides``,
            ``attempts``), or ``{}`` when the job ends now.
        message: one line for the job's log (why it goes on, or why not), or ``None``.
    """

    changes: dict
    message: str | None = None


def resumes_done(record: JobRecord) -> int:
    """Relaunches so far (attempts after the first)."""
    return max(0, len(record.attempts) - 1)


def next_attempt(job_dir: Path, record: JobRecord, code: int | None, *, stop: bool, step: int | None,
                 now: float) -> Decision:
    """Decide whether the attempt that just ended with ``code`` is started again, and how.

    Args:
        job_dir, record: the job (the record as the supervisor has it).
        code: the attempt's exit code (negative: a signal), or ``None`` when unknown.
        stop: a user asked to stop the job.
        step: the last global step the attempt logged, or ``None``.
        now: unix seconds (the attempt's end, and the next one's start).
    """
    allowed = record.max_resumes or 0
    if not allowed or stop or code is None or code == 0:
        return Decision({})
    evidence, _ = endevidence.evidence(job_dir, record, code, stop_requested=stop, nothing_runs=True)
    end = decide(evidence)
    if end is None or end.status is not Status.FAILED:
        return Decision({})
    if resumes_done(record) >= allowed:
        return Decision({}, f"[tune_magic] attempt {resumes_done(record) + 1} failed ({end.reason}); no resume "
                               f"left (--max-resumes {allowed}): the job ends failed")
    try:
        nxt = relaunch.next_attempt(record)
    except PlanError as exc:
        return Decision({}, f"[tune_magic] attempt {resumes_done(record) + 1} failed ({end.reason}) and is not "
                               f"resumed: {str(exc).splitlines()[0]}")
    source = nxt.resumed_from
    done = attempt_entries.finish(record.attempts, ended_at=now, reason=end.reason, step=step, returncode=code,
                                  first_started_at=record.started_at)
    attempts = attempt_entries.begin(done, started_at=now, first_started_at=record.started_at, resumed_from=source,
                                     log_offset=_size(record.log_path))
    number = len(attempts)
    added = [o for o in nxt.overrides if o not in record.argv]
    return Decision({"argv": nxt.argv, "overrides": nxt.overrides, "attempts": attempts},
                       f"[tune_magic] attempt {number - 1} failed ({end.reason})"
                       f"{'' if step is None else f' at step {step}'}; attempt {number} of "
                       f"at most {allowed + 1} resumes from {attempt_entries.where(source)} "
                       f"(--max-resumes {allowed}): {' '.join(added)}")


def set_exit_file_aside(job_dir: Path, number: int) -> None:
    """Rename the ended attempt's exit file to ``exit_code.attempt-<number>`` (kept for the
    record), so that the next attempt's exit wrapper writes a fresh one that alone settles the job."""
    try:
        os.replace(job_dir / jobstore.EXIT_CODE, job_dir / f"{jobstore.EXIT_CODE}.attempt-{number}")
    except FileNotFoundError:
        pass


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def say(log_path: str, line: str) -> None:
    """Append ``line`` to the job's combined log (best effort; a link there is not followed)."""
    try:
        fd = jobstore.open_nofollow(Path(log_path), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except OSError:
        return
    try:
        os.write(fd, ("\n" + line + "\n").encode("utf-8", "replace"))
    except OSError:
        pass
    finally:
        os.close(fd)
