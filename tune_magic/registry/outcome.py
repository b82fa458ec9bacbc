"""The one outcome rule: how every job ends, whatever the scheduler. Pure.

Each scheduler gathers what it knows about a job — the exit code or signal, whether and when a
stop was asked, what the job's log showed at that moment, the engine's own verdict (SLURM's
``TIMEOUT``, ``NODE_FAIL``, ``CANCELLED``...), or that the engine did not answer — into an
:class:`Evidence`, and :func:`decide` turns it into the job's end (or into "not ended yet"):

1. No exit code and no verdict: not ended — unless a stop was asked and nothing of the job runs
   (``stopped``, or ``succeeded`` as in rule 2), or the scheduler knows nothing of it runs
   (``unknown``: "outcome unknown"). An engine that did not answer is no news: it never ends a job.
2. A stop asked before the job ended gives ``stopped`` (its exit code kept), unless its log showed
   its last planned step and the save that follows it before the stop reached it (when the stop
   was asked, or at its end): training had ended, and the stop only cut short what comes after (a
   process group's teardown, an upload), so the job ``succeeded`` with the reason
   :data:`STOPPED_AFTER_END`, whatever its exit code (torchrun's agent exits 1 whenever a signal
   reached it, whatever its workers did). A Resume of it would find nothing to resume.
3. No stop asked: an engine's verdict of its own (time limit, node failure, out of memory) is
   ``failed`` with that reason, even with exit code 0 (srun exits 0 when a node of its step fails,
   measured on SLURM 22.05); else exit 0 is ``succeeded``; an end by a termination signal nobody in
   tune_magic sent (SIGTERM/SIGINT/SIGHUP, or the engine's ``CANCELLED``) is ``stopped`` with the
   reason :data:`CANCELLED_OUTSIDE`; any other end is ``failed`` with the log's failure line (or the
   exit code in words).
4. A resume that fell back to the base model (its log says so: full_finetune_distributed's
   "Training will start from the base checkpoint", torchtune 0.6.1) is ``failed`` with that line
   even when it exited 0: it was asked to continue from a checkpoint and trained from the base
   model instead. A stop asked still gives ``stopped``; a crash keeps its own failure line.

A stop asked after the job ended changes nothing: a terminal status is never left
(:func:`tune_magic.registry.status.transition`).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from tune_magic.registry.status import Status

#: The reason of a job someone else cancelled (``scancel``, ``kill``), as every listing shows it.
CANCELLED_OUTSIDE = "cancelled outside tune_magic"
#: The reason of a job whose launching process died after registering it and before its scheduler
#: started anything: it never ran, so a sweep queues its trial again (once).
LAUNCH_INTERRUPTED = "the launch was interrupted before the job started (the launching process died)"
#: The reason's start for a resume that trained from the base model instead (rule 4).
FAILED_RESUME = "failed resume: the recipe did not load its checkpoint and trained from the base model"
#: The reason of a job that succeeded though a stop was asked: its training had ended (rule 2).
STOPPED_AFTER_END = "the stop arrived after training ended"
#: Signals that end a job on purpose (as opposed to a crash: SIGKILL, SIGSEGV, ...).
TERMINATION_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})

#: Engine verdicts :func:`decide` understands (a scheduler maps its engine's states to these).
COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY = (
    "completed", "failed", "cancelled", "timeout", "node_fail", "out_of_memory")
VERDICTS = (COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY)


def exit_text(code: int | None) -> str:
    """``"exited with code N"``, or ``"killed by SIGKILL"`` for a negative code (a signal)."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


@dataclass(frozen=True)
class Evidence:
    """What a scheduler knows about a job's end.

    Attributes:
        returncode: the job's exit code (negative: killed by that signal), or ``None`` when none
            is known (no exit file, the engine gave none).
        stop_requested: a user asked tune_magic to stop the job.
        finished_at_stop: before the stop reached the job (when it was asked, or as the log reads at
            the job's end), its log showed its last planned step and the checkpoint save after it
            (see :func:`tune_magic.logs.progress.finished_and_saved`).
        verdict: the engine's own word on the end, one of :data:`VERDICTS`, or ``None``.
        verdict_reason: the engine's words for a ``failed``-type verdict (``"hit the --time limit
            10"``, ``"a node failed (NODE_FAIL)"``), shown as the reason.
        signalled: the job ended by this termination signal (number), seen in its log (torchrun's
            ``SignalException``) when the exit code alone does not say so; else ``None``.
        failure_line: the failure line read from the log (failing rank, its error), or ``None``.
        nothing_runs: the scheduler knows that nothing of the job runs any more.
        answered: ``False`` when the engine was asked and did not answer (a failed or timed-out
            query): no news, which never ends a job.
        failed_resume: the log line saying a resume fell back to the base checkpoint (see rule 4),
            or ``None``.
    """

    returncode: int | None = None
    stop_requested: bool = False
    finished_at_stop: bool = False
    verdict: str | None = None
    verdict_reason: str | None = None
    signalled: int | None = None
    failure_line: str | None = None
    nothing_runs: bool = False
    answered: bool = True
    failed_resume: str | None = None

    def __post_init__(self) -> None:
        if self.verdict is not None and self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {VERDICTS}")


@dataclass(frozen=True)
class Outcome:
    """A job's end: its status, the reason shown with it (``None`` for a success or a user's stop),
    and its exit code (``None`` when none is known)."""

    status: Status
    reason: str | None = None
    returncode: int | None = None

    @property
    def ended(self) -> bool:
        """Whether this outcome ends the job (``unknown`` does not)."""
        return self.status.is_terminal


def _terminated(ev: Evidence) -> bool:
    """The job ended by a termination signal (SIGTERM/SIGINT/SIGHUP) rather than a crash."""
    # only a negative code is "killed by a signal": a shell's or srun's 128+N is also what a task
    # killed by the launcher itself returns (srun --kill-on-bad-exit after another rank failed)
    code = ev.returncode
    return (code is not None and -code in TERMINATION_SIGNALS) or ev.signalled in TERMINATION_SIGNALS


def decide(ev: Evidence) -> Outcome | None:
    """The job's end from ``ev`` (see the module docstring), or ``None``: not ended, nothing to
    record (no answer, or no evidence of an end yet).

    Raises:
        ValueError: an unknown verdict (see :class:`Evidence`).
    """
    code = ev.returncode
    if code is None and ev.verdict is None:
        if not ev.answered or not ev.nothing_runs:
            return None
        if ev.stop_requested:
            return Outcome(Status.SUCCEEDED, STOPPED_AFTER_END) if ev.finished_at_stop else Outcome(Status.STOPPED)
        return Outcome(Status.UNKNOWN)
    if code is None and ev.verdict == COMPLETED:
        code = 0
    if ev.stop_requested:
        if ev.finished_at_stop:
            return Outcome(Status.SUCCEEDED, STOPPED_AFTER_END, code)
        return Outcome(Status.STOPPED, None, code)
    if ev.verdict in (TIMEOUT, NODE_FAIL, OUT_OF_MEMORY):  # even over exit 0: srun exits 0 on a node failure
        return Outcome(Status.FAILED, ev.verdict_reason or ev.verdict.replace("_", " "), code)
    if code == 0:
        if ev.failed_resume:
            return Outcome(Status.FAILED, f"{FAILED_RESUME}: {ev.failed_resume}", 0)
        return Outcome(Status.SUCCEEDED, None, 0)
    if ev.verdict == CANCELLED or _terminated(ev):
        return Outcome(Status.STOPPED, CANCELLED_OUTSIDE, code)
    reason = ev.failure_line or ev.verdict_reason or (exit_text(code) if code is not None else "failed")
    return Outcome(Status.FAILED, reason, code)
