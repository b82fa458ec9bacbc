"""What a job's own files say about its end: the evidence a scheduler hands the outcome rule.

Every scheduler calls :func:`evidence` with what it knows (an exit code, its engine's verdict) and
gets back an :class:`~tune_magic.registry.outcome.Evidence` completed from the job's directory:
whether a stop was asked and what the log showed then, the failure line of the log's end (the
failing rank, its host and its error; :mod:`tune_magic.logs.failure`), whether torchrun's agent
itself was told to stop by a signal (its ``SignalException``), which no exit code says, and, for a
resumed run, whether its recipe fell back to the base model (:func:`failed_resume_line`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from tune_magic.logs.failure import Evidence as FailureEvidence
from tune_magic.logs.failure import FailureReason, describe_failure
from tune_magic.logs.logfiles import read_rank_logs
from tune_magic.registry import attempts as attempt_entries
from tune_magic.registry import store as jobstore
from tune_magic.registry.outcome import Evidence, Outcome
from tune_magic.registry.record import JobRecord

#: Bytes from the end of the log read to explain a failure.
FAILURE_TAIL_BYTES = 256 * 1024

# torchrun's agent (torch 2.x, elastic/agent/server/api.py and multiprocessing/api.py) when a signal
# reaches it: "Received Signals.SIGTERM death signal, shutting down workers", then a traceback
# ending "torch.distributed.elastic.multiprocessing.api.SignalException: Process 123 got signal: 15"
_DEATH_RE = re.compile(r"Received (?:Signals\.)?(SIG[A-Z]+) death signal")
_SIGNAL_EXC_RE = re.compile(r"SignalException: Process \d+ got signal: (\d+)")


def read_tail(path: str | os.PathLike, nbytes: int) -> str:
    """Return the last ``nbytes`` of a file as text (invalid UTF-8 replaced; '' if missing). A
    link at ``path`` is not followed."""
    try:
        fd = jobstore.open_nofollow(Path(path), os.O_RDONLY)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        try:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - nbytes))
            return f.read(nbytes).decode("utf-8", errors="replace")
        except OSError:
            return ""


#: The line full_finetune_distributed (torchtune 0.6.1) logs when the distributed checkpoint it was
#: asked to resume from (``enable_async_checkpointing``) did not load: "Failed to load distributed
#: checkpoint: <error>. Training will start from the base checkpoint." It then trains on from the
#: base model.
FAILED_RESUME_TEXT = "Training will start from the base checkpoint"
_SCAN_BYTES = 4 << 20


def is_resume(record: JobRecord) -> bool:
    """Whether the job's command asks its recipe to resume (``resume_from_checkpoint=True``)."""
    return any(a.lower() == "resume_from_checkpoint=true" for a in record.argv)


def failed_resume_line(path: str | os.PathLike, since: int = 0) -> str | None:
    """The line of the log at ``path``, from byte ``since`` on, saying a resume fell back to the base
    checkpoint (:data:`FAILED_RESUME_TEXT`), stripped; ``None`` when there is none. Read in chunks of
    4 MiB, never whole (the line comes at the run's start, a long run's log is large); a link at
    ``path`` is not followed."""
    needle = FAILED_RESUME_TEXT.encode()
    try:
        fd = jobstore.open_nofollow(Path(path), os.O_RDONLY)
    except OSError:
        return None
    try:
        offset, carry = max(0, since), b""
        while True:
            chunk = os.pread(fd, _SCAN_BYTES, offset)
            if not chunk:
                return None
            window = carry + chunk  # the end of what came before: a line cut by the chunks is found whole
            found = window.find(needle)
            if found >= 0:
                at = offset - len(carry) + found  # where the text starts in the file
                start = max(0, at - 4096)
                around = os.pread(fd, 8192 + len(needle), start)
                # the line's part before the text and after it, to the nearest \n or \r (a tqdm redraw)
                line = re.split(rb"[\r\n]", around[:at - start])[-1] + re.split(rb"[\r\n]", around[at - start:], 1)[0]
                return line.decode("utf-8", "replace").strip()
            offset += len(chunk)
            carry = window[-(len(needle) - 1):]
    except OSError:
        return None
    finally:
        os.close(fd)


#: Bytes from the end of the log read to tell whether training had ended before a stop reached it.
FINISHED_TAIL_BYTES = 256 * 1024


def trained_to_the_end(record: JobRecord, text: str | None = None) -> bool:
    """Whether the job's log (its last :data:`FINISHED_TAIL_BYTES`, or ``text``) shows its last
    planned step and the checkpoint save after it (:func:`tune_magic.logs.progress.finished_and_saved`,
    with the config's ``epochs``): what a stop's signal could no longer undo. A process killed by
    it writes nothing more, so a save line in the log was written before the stop reached it."""
    from tune_magic.logs.progress import finished_and_saved

    if not record.epochs:
        return False
    if text is None:
        text = read_tail(record.log_path, FINISHED_TAIL_BYTES)
    lines = [line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r") for line in text.split("\n")]
    return finished_and_saved(lines, record.epochs)


def agent_signal(text: str) -> int | None:
    """The signal number that told torchrun's agent to stop, from its log lines, or ``None``."""
    import signal

    m = _SIGNAL_EXC_RE.search(text)
    if m:
        return int(m.group(1))
    m = _DEATH_RE.search(text)
    if m:
        try:
            return int(signal.Signals[m.group(1)])
        except KeyError:
            return None
    return None


def explain(record: JobRecord, code: int | None, *, stopped: bool = False, oom=None,
            pid: int | None = None, text: str | None = None) -> FailureReason | None:
    """The job's :class:`~tune_magic.logs.failure.FailureReason` from the end of its log (``text``
    when already read) and of each rank's files (``--redirects``/``--tee``), with the OOM killer's
    evidence, or ``None``."""
    rank_logs = read_rank_logs(record.rank_log_dir, record.started_at - 1) if record.rank_log_dir else None
    if text is None:
        text = read_tail(record.log_path, FAILURE_TAIL_BYTES)
    return describe_failure(text, rank_logs=rank_logs or None,
                            evidence=FailureEvidence(stopped=stopped, oom=oom, returncode=code, pid=pid))


def evidence(job_dir: Path, record: JobRecord, returncode: int | None, *, verdict: str | None = None,
             verdict_reason: str | None = None, nothing_runs: bool = False, answered: bool = True,
             stop_requested: bool | None = None, oom=None, pid: int | None = None, with_host: bool = False,
             ) -> tuple[Evidence, FailureReason | None]:
    """Complete what a scheduler knows about a job's end with what its files say.

    Args:
        job_dir, record: the job.
        returncode: its exit code (negative: a signal), or ``None``.
        verdict, verdict_reason, nothing_runs, answered: the scheduler's own evidence (see
            :class:`~tune_magic.registry.outcome.Evidence`).
        stop_requested: whether a stop was asked, when the caller knows better than the registry
            (the supervisor got the stop signal); default: the record or the stop marker file.
        oom, pid: the OOM killer's evidence and the agent's pid, for the failure reason.
        with_host: name the failing rank's host in the failure line (jobs on other machines).

    Returns:
        The evidence, and the failure reason read from the log (``None`` when none was needed or
        found); the caller keeps it (``failure.json``).
    """
    stop = jobstore.stop_was_requested(job_dir, record) if stop_requested is None else stop_requested
    reason = None
    signalled = None
    if (returncode not in (0, None) or verdict == "failed") and not stop:
        text = read_tail(record.log_path, FAILURE_TAIL_BYTES)
        reason = explain(record, returncode, oom=oom, pid=pid, text=text)
        # a signal to the agent counts only when it is the first failure: srun's --kill-on-bad-exit
        # also signals the other nodes' agents after a rank somewhere raised
        if reason is None or (reason.exc_type or "").endswith("SignalException"):
            signalled = agent_signal(text)
    # the stop may have been asked while the last save was under way, and reached the job after it
    finished = bool(record.finished_at_stop) or (stop and trained_to_the_end(record))
    failed_resume = None
    if (returncode == 0 or verdict == "completed") and not stop and is_resume(record):
        since = record.attempts[-1].get("log_offset", 0) if record.attempts else 0
        failed_resume = failed_resume_line(record.log_path, since if isinstance(since, int) else 0)
    ev = Evidence(returncode=returncode, stop_requested=stop, finished_at_stop=finished,
                  verdict=verdict, verdict_reason=verdict_reason, signalled=signalled,
                  failure_line=(reason.line_on_host() if with_host else reason.line) if reason is not None else None,
                  nothing_runs=nothing_runs, answered=answered, failed_resume=failed_resume)
    return ev, reason


def changes(outcome: Outcome, record: JobRecord, ended_at: float, *, step: int | None = None) -> dict:
    """Record fields for ``outcome`` (``ended_at``: unix seconds of the end; an end already recorded is
    kept, except one recorded while the outcome was unknown). ``unknown`` records no end time. A job
    that was tried more than once (``record.attempts``) has its last attempt ended too, with
    ``step`` (the last global step it logged, when the caller knows it)."""
    out: dict = {"status": outcome.status}
    if outcome.status.is_terminal:
        # an end seen while the job was "unknown" is no end time: the evidence's time replaces it
        out["ended_at"] = ended_at if record.state.value == "unknown" or not record.ended_at else record.ended_at
        if record.attempts:
            out["attempts"] = attempt_entries.finish(record.attempts, ended_at=out["ended_at"], reason=outcome.reason,
                                                     step=step, returncode=outcome.returncode)
    if outcome.returncode is not None:
        out["returncode"] = outcome.returncode
    if outcome.reason and not record.error:
        out["error"] = outcome.reason
    return out


def keep_failure(job_dir: Path, reason: FailureReason | None) -> None:
    """Write ``failure.json`` (the whole traceback) for a failed job; best effort."""
    if reason is None:
        return
    try:
        jobstore.write_atomic(job_dir / jobstore.FAILURE, json.dumps(reason.to_dict()).encode(), fsync=False)
    except OSError:
        pass
