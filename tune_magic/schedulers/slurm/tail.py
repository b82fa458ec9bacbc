"""SLURM's own lines in a job's log, as a card's tail shows them (:mod:`tune_magic.logs.tailview`). Pure.

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
cancel line, torchrun's stop line (:data:`tune_magic.logs.tailview.SIGNAL_NOTE`) alone. ``srun``
lines with neither among them (a task killed or failed for another reason) are shown as they are.

When ``srun`` itself fails (it could not start the job's step, e.g. ``srun: error: Unable to create
step for job 26: More processors requested than permitted`` for an inherited
``SRUN_CPUS_PER_TASK``), :func:`srun_error` finds its own line, which a failed job's card then
shows first instead of the bare exit code.
"""

from __future__ import annotations

import re

from tune_magic.logs.tailview import SIGNAL_NOTE, TailRule

__all__ = ["TAIL_RULES", "CANCEL_RULE", "srun_error"]

_CANCEL = (r"^slurmstepd(?:-\S+)?: error: \*\*\* (?P<what>JOB|STEP) (?P<id>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+)"
           r"(?: DUE TO (?P<why>.+?))? \*\*\*\s*$")
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

#: The rules a SLURM job's card tail adds to :func:`tune_magic.logs.tailview.display_tail`.
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
