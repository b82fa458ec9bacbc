"""What became of a SLURM job (its exit file, else the controller's word), and SLURM's own lines
in its log as a card shows them.

What became of a SLURM job: its exit file first, else the controller's word, through the one
outcome rule (:func:`tune_magic.registry.outcome.decide`).

- The exit file the batch script writes settles the job whenever it appears (also after
  ``unknown``), with SLURM's own failure verdict (a time limit, a node failure) when the controller
  gives one, and srun's own error line when srun itself failed.
- A controller that does not answer is no news: the status stays (:mod:`.status`).
- A job the controller no longer knows (a confirmed "not listed") is ``unknown``, then ``failed``
  only after :func:`.status.missing_answers` such answers over :func:`.status.missing_grace_s`
  seconds, and never while its log still grows (processes of the job write it).
- A requeued job (SLURM's restart count went up) is ``pending`` with SLURM's reason while SLURM has
  it queued, whatever its log from the first attempt shows; the time it waits there is kept in
  ``backend`` (``queued_at``, ``waited_s``) and not counted in its elapsed time (:func:`queued_s`).

Fields this module keeps in the record's ``backend``: ``job_id``, ``restarts``, ``queued_at``,
``waited_s``, ``missing_since``, ``missing_answers``, ``missing_answer_at``.

SLURM's own lines in a job's log, as a card's tail shows them (:mod:`tune_magic.logs.cardtail`). Pure.

When a SLURM job is cancelled (``scancel``: a user's stop through tune_magic, or anyone's), or
ends at its time limit, ``slurmstepd`` and ``srun`` write into the job's output file (SLURM 22.05)::

    slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-12-01T10:00:00 ***
    srun: Job step aborted: Waiting up to 12 seconds for job step to finish.
    srun: launch/slurm: _step_signal: Terminating StepId=7.0
    srun: error: n1: task 0: Killed

(``*** STEP 7.0 ON n1 CANCELLED AT ... ***`` for a step, ``... DUE TO TIME LIMIT ***`` and other
reasons at the end; one ``slurmstepd`` line per node, written ``slurmstepd-n1:`` by some nodes, one
``srun: error`` line per node's tasks). A stop through tune_magic (``scancel --signal=TERM
--full``) often ends before SLURM cancels anything: torchrun's agents get SIGTERM and stop their
workers, and srun reports each node's task as it exits (measured on the two-node test cluster)::

    torch.distributed.elastic.multiprocessing.api.SignalException: Process 10879 got signal: 15
    srun: error: tmnode1: task 0: Exited with exit code 1
    srun: launch/slurm: _step_signal: Terminating StepId=1.0
    srun: error: tmnode2: task 1: Exited with exit code 1

Read as they stand these lines look like a crash. :data:`TAIL_RULES` shows them as one line, where
the last of them was (a stop closes the tail), as the local tail shows torchrun's
``SignalException`` traceback:
``SLURM cancelled job 7 on n1 at 2026-12-01T10:00:00; srun stopped its tasks``, or, without a
cancel line, torchrun's stop line (:data:`tune_magic.logs.cardtail.SIGNAL_NOTE`) alone. ``srun``
lines with neither among them (a task killed or failed for another reason) are shown as they are.

When ``srun`` itself fails (it could not start the job's step, e.g. ``srun: error: Unable to create
step for job 26: More processors requested than permitted`` for an inherited
``SRUN_CPUS_PER_TASK``), :func:`srun_error` finds its own line, which a failed job's card then
shows first instead of the bare exit code.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from pathlib import Path
from typing import Any

from tune_magic.logs import endevidence
from tune_magic.logs.cardtail import SIGNAL_NOTE, TailRule
from tune_magic.logs.failure import FailureReason
from tune_magic.registry import outcome
from tune_magic.registry import store as jobstore
from tune_magic.registry.outcome import decide, Evidence
from tune_magic.registry.record import JobRecord
from tune_magic.registry.status import Status
from tune_magic.schedulers.slurm import status



_CANCEL = (r"slurmstepd(?:-\S+)?: error: \*\*\* (?P<what>JOB|STEP) (?P<id>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+)"
           r"(?: DUE TO (?P<why>.+?))? \*\*\*\s*$")
# not anchored: slurmstepd writes into the same file as the ranks, so its line can land in the middle
# of a progress bar's line (measured: "1|14|Loss: 0.71428571428slurmstepd-tmnode1: error: *** JOB 59 ...")
_SRUN = (r"^srun: Job step aborted: Waiting up to \d+ seconds for job step to finish\.\s*$"
         r"|^srun: launch/slurm: _step_signal: Terminating StepId=\S+\s*$"
         r"|^srun: error: \S+: tasks? [\d,\-]+: (?:Killed|Terminated|Exited with exit code \d+)\s*$"
         r"|^srun: forcing job termination\s*$")


def _cancel_summary(matches: list[re.Match], prefix: str) -> list[str]:
    """One line for a cancelled job (and torchrun's stop line, once), or torchrun's stop line alone
    for a stop SLURM cancelled nothing of; the lines themselves when neither is among them."""
    cancels = [m for m in matches if m["what"]]
    notes = list(dict.fromkeys(m.string for m in matches if m["note"]))  # one per node: shown once
    if not cancels:
        return notes or [prefix + m.string for m in matches]
    first = cancels[0]
    nodes = ", ".join(dict.fromkeys(m["node"] for m in cancels))
    job = first["id"] if first["what"] == "JOB" else f"step {first['id']}"
    why = f" ({first['why'].lower()})" if first["why"] else ""
    stopped = "; srun stopped its tasks" if len(cancels) + len(notes) < len(matches) else ""
    return [f"{prefix}SLURM cancelled job {job} on {nodes} at {first['at']}{why}{stopped}", *notes]


#: slurmstepd's cancel lines, torchrun's stop line and srun's lines that follow them, as one line.
CANCEL_RULE = TailRule(name="SLURM cancel", member=re.compile(f"{_CANCEL}|{_SRUN}|(?P<note>{SIGNAL_NOTE.pattern})"),
                       summary=_cancel_summary, at_last=True)

#: The rules a SLURM job's card tail adds to :func:`tune_magic.logs.cardtail.display_tail`.
TAIL_RULES = (CANCEL_RULE,)


# srun's report of a task's end (a consequence of a failure elsewhere, never the cause itself)
_TASK_END = re.compile(r"^srun: error: \S+: tasks? [\d,\-]+: ")
_SRUN_OWN = re.compile(r"^srun: (?:error|fatal): ")


def srun_error(text: str) -> str | None:
    """srun's own first error line in a job's log (``srun: error: Unable to create step ...``),
    not its reports of tasks that ended; ``None`` when there is none."""
    for line in text.splitlines():
        line = line.rsplit("\r", 1)[-1].strip()
        if _SRUN_OWN.match(line) and not _TASK_END.match(line) and not re.match(_SRUN, line):
            return line
    return None


_MISSING_KEYS = ("missing_since", "missing_answers", "missing_answer_at")


def queued_s(record: JobRecord, now: float | None = None) -> float:
    """Seconds the job spent back in SLURM's queue after a requeue (not part of its run time)."""
    b = record.backend
    waited = b.get("waited_s") if isinstance(b.get("waited_s"), (int, float)) else 0.0
    since = b.get("queued_at")
    if isinstance(since, (int, float)):
        end = record.ended_at or (time.time() if now is None else now)
        waited += max(0.0, end - since)
    return max(0.0, float(waited))


def end(record: JobRecord, evidence: Evidence, at: float | None = None) -> dict[str, Any]:
    """Record fields for the end :func:`decide` makes of ``evidence`` (``{}``: not ended)."""
    result = decide(evidence)
    if result is None or result.status is record.state:
        return {}
    return {**endevidence.changes(result, record, time.time() if at is None else at), "pending_reason": None}


def attempt_not_run(record: JobRecord) -> tuple[int, str] | None:
    """``(exit code, reason)`` of a requeued attempt that ran nothing: the requeue helper records it
    ended at once (the pre-flight refused, or training had finished) before the job itself ends;
    any other attempt is ended only with the job. ``None`` for every other job."""
    last = record.attempts[-1] if len(record.attempts) > 1 else None
    if not isinstance(last, dict) or last.get("ended_at") is None or not isinstance(last.get("returncode"), int):
        return None
    return last["returncode"], f"attempt {last.get('number')} {last.get('reason') or 'ran nothing'}"


def from_exit_file(job_dir: Path, record: JobRecord, exit_info, verdict: tuple[str | None, str | None]) -> dict:
    """The end the exit file says, with SLURM's failure ``verdict`` (verdict, reason) when it has one.
    A requeued attempt that ran nothing (:func:`attempt_not_run`) ends the job with its own exit
    code and reason: a batch script of an earlier release exits 3 for both."""
    not_run = attempt_not_run(record)
    if not_run is not None:  # the helper's word, not the log's: that ends with the earlier attempt's kill
        code, line = not_run
        stop = jobstore.stop_was_requested(job_dir, record)
        if code and not stop:
            endevidence.keep_failure(job_dir, FailureReason(line=line, kind="exit_code", exitcode=code))
        evidence = Evidence(returncode=code, failure_line=line if code else None, nothing_runs=True,
                            stop_requested=stop)
        return {**end(record, evidence, exit_info.ended_at), "pending_reason": None}
    evidence, reason = endevidence.evidence(job_dir, record, exit_info.returncode, nothing_runs=True, with_host=True,
                                       verdict=verdict[0], verdict_reason=verdict[1])
    generic = reason is None or reason.kind == "exit_code"  # the log named no failing rank
    if exit_info.returncode != 0 and generic and not evidence.stop_requested:
        own = srun_error(endevidence.read_tail(record.log_path, endevidence.FAILURE_TAIL_BYTES))
        if own and evidence.verdict in (None, outcome.FAILED):  # srun itself failed: its own words first
            evidence = dataclasses.replace(evidence, failure_line=own)
            reason = dataclasses.replace(reason, line=own) if reason is not None else None
    endevidence.keep_failure(job_dir, reason)
    return {**end(record, evidence, exit_info.ended_at), "pending_reason": None}


def listed(job_dir: Path, record: JobRecord, job: status.SlurmJob, started: bool) -> dict[str, Any]:
    """The controller lists the job: its queue state, or its end (SLURM's verdict) when it ended
    without an exit file (the exit file, written just before, wins when it turns up first)."""
    stop = jobstore.stop_was_requested(job_dir, record)
    time_limit = record.scheduler_options.get("time_limit")
    said = status.job_outcome(job, stopped_by_us=stop, time_limit=time_limit)
    changes: dict[str, Any] = {"nodes": list(job.nodes)} if job.nodes else {}
    backend = {k: v for k, v in record.backend.items() if k not in _MISSING_KEYS}  # it is listed again
    now = time.time()
    if job.restart_count > int(backend.get("restarts") or 0):
        backend["restarts"] = job.restart_count
    requeued = bool(backend.get("restarts"))
    if said.status is Status.PENDING and started and not requeued:  # an answer older than the start
        changes.update(status=Status.RUNNING, pending_reason=None)
    elif said.status is Status.PENDING:
        changes.update(status=Status.PENDING, pending_reason=said.reason)
        if requeued and record.state is not Status.PENDING and "queued_at" not in backend:
            backend["queued_at"] = now  # back in the queue: its wait is not run time
    elif said.verdict is None:  # running, or a state we do not map: it exists
        changes.update(status=Status.RUNNING, pending_reason=said.reason)
        if isinstance(backend.get("queued_at"), (int, float)):
            backend["waited_s"] = float(backend.get("waited_s") or 0.0) + max(0.0, now - backend.pop("queued_at"))
    else:
        reason = said.reason
        if job.state == "TIMEOUT" and not time_limit and reason:  # the partition's limit, not one we set
            reason = reason.replace("the --time limit", "the partition's time limit")
        # killed by a signal: -N, as the outcome rule reads it (23.11's JSON and scontrol give 0 and the signal apart)
        code = -job.signal if job.signal else job.exit_code
        if said.verdict == outcome.CANCELLED and not job.nodes and not started:
            code = None  # cancelled before it ever ran: SLURM's exit code (0) is no run's
        evidence, failure = endevidence.evidence(job_dir, record, code, verdict=said.verdict,
                                            verdict_reason=reason, nothing_runs=True, with_host=True)
        endevidence.keep_failure(job_dir, failure)
        changes.update(end(record, evidence))
    if backend != record.backend:
        changes["backend"] = backend
    return changes


def written_to(path: str) -> bool:
    """Whether the file at ``path`` exists and holds anything (a job's log once it started)."""
    try:
        return os.stat(path).st_size > 0
    except OSError:
        return False


def not_listed(job_dir: Path, record: JobRecord, slurm_id: str, answer: status.Answer) -> dict[str, Any]:
    """The controller answered and knows no such job, and it left no exit code: ``unknown`` (or
    ``stopped`` when a stop was asked), then ``failed`` saying so once the answers leaving it out
    have come :func:`.status.missing_answers` times over :func:`.status.missing_grace_s` seconds. A
    log that still grows means processes of the job run: the wait starts again from its last write.
    A job still ``pending`` with an empty log never started: it stays ``pending`` through the same
    wait, then ends ``stopped``, :data:`~tune_magic.registry.outcome.CANCELLED_OUTSIDE` (or plainly
    stopped when tune_magic asked for the stop)."""
    backend = dict(record.backend)
    now = time.time()
    since = backend.get("missing_since")
    since = since if isinstance(since, (int, float)) else now
    count = int(backend.get("missing_answers") or 0)
    if backend.get("missing_answer_at") != answer.at:
        count += 1
        backend["missing_answer_at"] = answer.at
    try:
        written = os.stat(record.log_path).st_mtime
    except OSError:
        written = None
    running = written is not None and written > since  # the job's processes still write its log
    if running:
        since = written
    backend.update(missing_since=since, missing_answers=count)
    changes: dict[str, Any] = {}
    settled = not running and now - since > status.missing_grace_s() and count >= status.missing_answers()
    if record.state is Status.PENDING and not written_to(record.log_path):
        # it never started (no log yet): SLURM forgot a queued job, which only a cancel does (scancel
        # of one pending array task leaves no CANCELLED entry behind, unlike a plain job's)
        if settled:
            changes = end(record, Evidence(verdict=outcome.CANCELLED, nothing_runs=True,
                                           stop_requested=jobstore.stop_was_requested(job_dir, record)))
    elif settled:
        gone = (f"SLURM no longer lists job {slurm_id} and it left no exit code in {job_dir}; its outcome "
                "cannot be known")
        changes = end(record, Evidence(verdict=outcome.FAILED, verdict_reason=gone, nothing_runs=True,
                                       stop_requested=jobstore.stop_was_requested(job_dir, record)))
    elif not running:
        evidence, _ = endevidence.evidence(job_dir, record, None, nothing_runs=True)
        changes = end(record, evidence)  # unknown records no end time
    elif record.state is Status.UNKNOWN:  # it writes its log again: it runs, whatever SLURM said
        changes = {"status": Status.RUNNING}
    if backend != record.backend:
        changes["backend"] = backend
    return changes
