"""A SLURM job that SLURM requeues (preemption, ``scontrol requeue``, a node failure) or that
requeues itself before its time limit: attempts, their exit files, and the resume of each.

SLURM starts a requeued batch job again under the same job id, with ``SLURM_RESTART_COUNT`` set
to the number of requeues so far; the batch script (:mod:`.submit`) calls its run number the
attempt (``attempt = SLURM_RESTART_COUNT + 1``).

- Each attempt writes its own exit file (:func:`exit_file_name`): ``exit_code`` for the first
  (the name every earlier release wrote and reads), ``exit_code.attempt-N`` for attempt N ≥ 2,
  so a first attempt killed by a requeue never leaves a file that ends the second.
  :func:`current_exit` reads the current attempt's only.
- With tune_magic's ``--requeue`` (or ``--resume-on-timeout N``) a requeued attempt runs
  ``python -m tune_magic.schedulers.slurm.requeue JOB_DIR ATTEMPT`` before its ``srun``
  (:func:`main`): the resume pre-flight on the job's ``output_dir``
  (:func:`tune_magic.checkpoints.relaunch.next_attempt`: the last checkpoint, or the beginning when the
  job saved none), the attempt recorded in the record's ``attempts``
  (:mod:`tune_magic.registry.attempts`: the earlier one's end, reason and step, the new one's
  checkpoint), and the overrides of the new attempt printed to stdout, NUL-separated, for the
  script's ``overrides`` array. ``--sbatch=--requeue`` alone keeps SLURM's own meaning: the same
  command runs again from the start.
- ``--resume-on-timeout N`` asks SLURM for ``USR1`` :func:`signal_margin_s` seconds before the
  time limit (``#SBATCH --signal=B:USR1@S``, the batch shell only); the script's trap leaves a
  marker (:data:`TIMEOUT_MARKER`) and runs ``scontrol requeue $SLURM_JOB_ID``, at most N times in
  all (it counts the markers): SLURM never requeues a job that hit its time limit itself.

Why an attempt ended (the reason in ``attempts``) comes from that marker, else from the line
slurmstepd writes into the job's output when it kills a job (``slurmstepd-n1: error: *** JOB 7 ON
n1 CANCELLED AT 2026-12-01T23:23:23 DUE TO JOB REQUEUE ***``, as on the test cluster, SLURM 22.05;
``PREEMPTION``, ``NODE FAILURE``, ``TIME LIMIT`` in the same place).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tune_magic.errors import PlanError
from tune_magic.registry import store as jobstore
from tune_magic.registry.record import JobRecord

#: The requeue helper's exit status (and the attempt's exit code) when the attempt cannot continue the job.
REFUSED_RC = 3
#: The helper's exit status when training had finished: the script ends the job with exit code 0.
FINISHED_RC = 4
#: The reason an attempt records when the pre-flight refuses it (the error follows).
CANNOT_CONTINUE = "cannot continue the job"
#: The reason an attempt records when the checkpoints say training had finished.
TRAINING_FINISHED = "training had finished"


class AttemptNotRun(PlanError):
    """A requeued attempt that runs nothing: the pre-flight refused (``finished`` False), or
    training had finished (``finished`` True). Its attempt entry is recorded already."""

    def __init__(self, message: str, *, finished: bool = False) -> None:
        super().__init__(message)
        self.finished = finished


#: The marker the ``--resume-on-timeout`` trap leaves for attempt N before it requeues the job.
TIMEOUT_MARKER = "requeued-on-timeout.attempt-"
#: Most seconds before the time limit the ``--resume-on-timeout`` signal is asked for.
MAX_MARGIN_S = 120
#: The margin when the job gives no ``--time`` (the partition's limit applies, unknown here).
DEFAULT_MARGIN_S = 120
#: Bytes of the end of an attempt's log read for slurmstepd's cancel line.
_TAIL_BYTES = 64 << 10
_CANCEL_LINE = re.compile(r"\*\*\* JOB \d+ ON \S+ CANCELLED AT \S+ DUE TO ([A-Z ]+?) \*\*\*")
_WHY = {"PREEMPTION": "preempted", "JOB REQUEUE": "scontrol requeue", "NODE FAILURE": "node failure",
        "TIME LIMIT": "time limit"}


def exit_file_name(attempt: int) -> str:
    """The exit file of ``attempt`` (1-based): ``exit_code``, then ``exit_code.attempt-N``."""
    return jobstore.EXIT_CODE if attempt <= 1 else f"{jobstore.EXIT_CODE}.attempt-{attempt}"


def signal_margin_s(time_limit: str | None) -> int:
    """Seconds before the time limit that ``--resume-on-timeout`` asks for ``USR1``: three
    quarters of a short limit (45 s of a 1-minute one: SLURM checks limits about every 30 s, so
    the signal may come that much later), at most :data:`MAX_MARGIN_S`."""
    from tune_magic.schedulers.slurm.options import time_limit_seconds

    limit = time_limit_seconds(time_limit) if time_limit else None
    if not limit:
        return DEFAULT_MARGIN_S
    return max(1, min(MAX_MARGIN_S, limit * 3 // 4))


def directive_options(*, requeue: bool, resume_on_timeout: int | None, time_limit: str | None) -> list[str]:
    """The scheduler's own sbatch options for ``--requeue`` / ``--resume-on-timeout N``:
    ``--requeue``, and ``--signal=B:USR1@S`` (:func:`signal_margin_s`) for the timeout trap."""
    out = ["--requeue"] if requeue or resume_on_timeout else []
    if resume_on_timeout:
        out.append(f"--signal=B:USR1@{signal_margin_s(time_limit)}")
    return out


@dataclass(frozen=True)
class ScriptParts:
    """What a requeueable job adds to its batch script (:func:`script_parts`; used by
    :func:`.submit.batch_script`).

    Attributes:
        prelude: bash lines after ``job_dir=``: the attempt number, its exit file (``$exit_file``),
            and with resume the ``overrides`` array and the pre-flight of a requeued attempt, with
            ``--resume-on-timeout`` the ``USR1`` trap.
        overrides: how many trailing words of the per-node command the ``overrides`` array replaces
            (0: none; the command runs as planned on every attempt).
        background: ``srun`` runs in the background and ``wait_srun`` waits for it (bash runs a
            trap only between commands: a foreground ``srun`` would hold the ``USR1`` trap back).
        exit_path: where the script's last lines write the attempt's exit code (bash words).
    """

    prelude: str
    overrides: int = 0
    background: bool = False
    exit_path: str = '"$exit_file"'

    @property
    def run_end(self) -> str:
        """What follows the ``srun`` line: ``&`` and ``wait_srun`` when it runs in the background."""
        return " &\nwait_srun $!" if self.background else ""


#: A job SLURM never runs again: the script as before requeue existed (one exit file, ``exit_code``).
NOT_REQUEUED = ScriptParts("", exit_path='"$job_dir/exit_code"')


def _timeout_trap(n: int, margin_s: int) -> list[str]:
    """Bash lines of ``--resume-on-timeout n``: the ``USR1`` trap (requeue the job itself while
    fewer than ``n`` markers say it did) and ``wait_srun``."""
    marker = shlex.quote(TIMEOUT_MARKER)
    return [
        f"# --resume-on-timeout {n}: SLURM sends this script USR1 {margin_s} s before the time limit; it requeues",
        f"# itself (at most {n} times in all) and the next attempt resumes from the last checkpoint",
        "on_time_limit() {",
        "    trapped=1",
        "    local used=0 f",
        f'    for f in "$job_dir"/{marker}*; do if [ -e "$f" ]; then used=$((used + 1)); fi; done',
        f'    if [ "$used" -ge {n} ]; then',
        f'        echo "[tune_magic] the time limit is near and --resume-on-timeout {n} is used up: the job ends at '
        'its limit" >&2',
        "        return",
        "    fi",
        f'    : > "$job_dir/"{marker}"$attempt"',
        f'    echo "[tune_magic] the time limit is near: requeueing job $SLURM_JOB_ID (resume $((used + 1)) of {n})" >&2',
        '    if scontrol requeue "$SLURM_JOB_ID"; then exit 0; fi',
        f'    rm -f "$job_dir/"{marker}"$attempt"',
        '    echo "[tune_magic] scontrol requeue failed: the job ends at its time limit" >&2',
        "}",
        "trap on_time_limit USR1",
        "wait_srun() {  # a trapped signal ends `wait` early: wait again until srun itself ended",
        "    local code",
        '    while :; do trapped=0; wait "$1"; code=$?; if [ "$trapped" != 1 ]; then return "$code"; fi; done',
        "}",
    ]


def script_parts(*, overrides: Sequence[str], python: str, resume: bool, resume_on_timeout: int | None,
                 margin_s: int) -> ScriptParts:
    """The batch script's requeue handling (see the module docstring). Every value is quoted
    (``shlex.quote``); the text passes ``bash -n``.

    Args:
        overrides: the job's overrides, the last words of its per-node command.
        python: the interpreter that runs the pre-flight (the kernel's, on every node).
        resume: a requeued attempt resumes from the last checkpoint (tune_magic's ``--requeue``).
        resume_on_timeout: N of ``--resume-on-timeout N``, or ``None``.
        margin_s: seconds before the time limit the signal comes (for the comment).
    """
    exit_name = jobstore.EXIT_CODE
    lines = [
        "# SLURM runs a requeued job again under its id: each attempt writes its own exit file",
        "attempt=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))",
        f'exit_file="$job_dir/{exit_name}"',
        f'if [ "$attempt" -gt 1 ]; then exit_file="$job_dir/{exit_name}.attempt-$attempt"; fi',
    ]
    if resume:
        lines += [
            "overrides=(" + " ".join(shlex.quote(o) for o in overrides) + ")",
            'if [ "$attempt" -gt 1 ]; then',
            "    # requeued: continue from the job's last checkpoint (from the start when it saved none)",
            f'    {shlex.quote(python)} -m tune_magic.schedulers.slurm.requeue "$job_dir" "$attempt" \\',
            '        > "$job_dir/.overrides.$$"',
            "    rc=$?",
            '    if [ "$rc" -ne 0 ]; then',
            f'        if [ "$rc" -eq {FINISHED_RC} ]; then rc=0; else rc={REFUSED_RC}; fi  # 4: training had finished, a success',
            '        rm -f "$job_dir/.overrides.$$"',
            "        printf '{\"returncode\": %d, \"ended_at\": %s}\\n' \"$rc\" \"$(date +%s.%N)\" "
            '> "$job_dir/.exit_code.$$" \\',
            '            && mv -f "$job_dir/.exit_code.$$" "$exit_file"',
            '        exit "$rc"',
            "    fi",
            "    mapfile -d '' -t overrides < \"$job_dir/.overrides.$$\"",
            '    rm -f "$job_dir/.overrides.$$"',
            "fi",
        ]
    if resume_on_timeout:
        lines += _timeout_trap(int(resume_on_timeout), margin_s)
    return ScriptParts("\n".join(lines) + "\n", len(overrides) if resume else 0, bool(resume_on_timeout))


def command_words(plan, parts: ScriptParts | None) -> tuple[list[str], int | None]:
    """The per-node command's words for the script's ``srun`` line, and the index of the one word
    that stands for the ``overrides`` array (``None``: the command as planned): ``plan.argv`` with
    its trailing overrides replaced by that word when ``parts`` resume a requeued attempt.

    Raises:
        PlanError: the command does not end with the plan's overrides (it could not be resumed).
    """
    from tune_magic.errors import PlanError

    n = parts.overrides if parts is not None else 0
    if not n:
        return list(plan.argv), None
    if list(plan.argv[len(plan.argv) - n:]) != list(plan.overrides):
        raise PlanError("the job's command does not end with its overrides, so a requeued attempt could not resume "
                        "it; launch it without --requeue")
    return [*plan.argv[:len(plan.argv) - n], "overrides"], len(plan.argv) - n


def prepare(plan, options, extra, *, python: str) -> tuple[list[str], ScriptParts | None]:
    """The sbatch options and batch-script lines of a launch's requeue options: tune_magic's
    ``requeue`` and ``resume_on_timeout`` in ``options``, the user's ``--sbatch=--requeue`` in
    ``extra`` (:class:`.options.SbatchOptions`; a job SLURM may run again gets per-attempt exit
    files, and resumes only with tune_magic's options). ``([], None)`` for a job never requeued.

    Raises:
        PlanError: ``--resume-on-timeout`` with the user's own ``--sbatch=--signal``, a
            ``--sbatch=--no-requeue`` that contradicts them, or a recipe the resume pre-flight
            does not know (a requeued attempt could not continue it).
    """
    from tune_magic.errors import PlanError
    from tune_magic.checkpoints.recipes import recipe_support

    resume, timeout_n = bool(options.get("requeue")), options.get("resume_on_timeout")
    if timeout_n and "signal" in extra.long_names:
        raise PlanError("--resume-on-timeout asks SLURM for its own warning signal (--signal=B:USR1@S); drop "
                        "--sbatch=--signal, or drop --resume-on-timeout")
    if (resume or timeout_n) and "no-requeue" in extra.long_names and not extra.requeue:
        flag = "--requeue" if resume else "--resume-on-timeout"
        raise PlanError(f"{flag} needs a requeueable job; drop --sbatch=--no-requeue, or drop {flag}")
    if not (resume or timeout_n or extra.requeue):
        return [], None
    if resume or timeout_n:
        try:
            recipe_support(plan.recipe, plan.recipe_name)
        except PlanError as exc:
            flag = "--requeue" if resume else "--resume-on-timeout"
            raise PlanError(f"{flag} resumes each requeued attempt from the last checkpoint, but {exc}; or give "
                            "--sbatch=--requeue instead (SLURM then runs the job again from the start)") from None
    time_limit = options.get("time_limit")
    parts = script_parts(overrides=list(plan.overrides), python=python, resume=resume or bool(timeout_n),
                         resume_on_timeout=timeout_n, margin_s=signal_margin_s(time_limit))
    return directive_options(requeue=resume, resume_on_timeout=timeout_n, time_limit=time_limit), parts


def requeueable(record: JobRecord) -> bool:
    """Whether SLURM may run the job again (submitted with ``--requeue``: tune_magic's option,
    ``--resume-on-timeout``, or the user's ``--sbatch=--requeue``)."""
    from tune_magic.errors import PlanError
    from tune_magic.schedulers.slurm.options import check_sbatch_options

    opts = record.scheduler_options
    if opts.get("requeue") or opts.get("resume_on_timeout"):
        return True
    try:
        return check_sbatch_options(list(opts.get("sbatch") or ())).requeue
    except (PlanError, TypeError):  # words another release took (or a hand-edited record): SLURM's own default
        return False


def requeued_since(job, attempt: int) -> bool:
    """Whether the controller's fresh word on the job (a :class:`.status.SlurmJob`, or ``None``:
    no answer) shows a requeue after attempt ``attempt`` ended: a restart count that reached it
    (squeue's JSON), or the job queued again (a requeued flag or ``PENDING``: the plain format has
    no restart count)."""
    from tune_magic.registry.status import Status
    from tune_magic.schedulers.slurm import status as sq

    if job is None:
        return False
    return job.restart_count >= attempt or sq.job_outcome(job).status is Status.PENDING


def current_attempt(job_dir: Path, record: JobRecord) -> int:
    """The job's latest attempt (1-based) as far as anything shows: SLURM's restart count the
    record keeps, the attempts the batch script recorded, and the exit files written."""
    known = max(int(record.backend.get("restarts") or 0) + 1, len(record.attempts), 1)
    prefix = f"{jobstore.EXIT_CODE}.attempt-"
    try:
        names = os.listdir(job_dir)
    except OSError:
        names = []
    for name in names:
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            known = max(known, int(name[len(prefix):]))
    return known


def current_exit(job_dir: Path, record: JobRecord | None) -> tuple[jobstore.ExitInfo | None, int]:
    """The current attempt's exit (``None`` while it runs) and that attempt's number. A job that
    cannot be requeued has one attempt and one exit file (``exit_code``)."""
    if record is None or not requeueable(record):
        return jobstore.read_exit_code(job_dir), 1
    attempt = current_attempt(job_dir, record)
    return jobstore.read_exit_code(job_dir, exit_file_name(attempt)), attempt


def last_attempt_ended(job_dir: Path, record: JobRecord, changes: dict) -> dict:
    """``changes`` (an end, which settles the last attempt: :func:`tune_magic.logs.endevidence.changes`)
    with the step the last attempt reached, from the job's log, when they end a job tried more than once."""
    from tune_magic.logs.summary import current_summary

    attempts = changes.get("attempts")
    if not attempts or attempts[-1].get("step") is not None:
        return changes
    step = current_summary(job_dir, record, kept=False, final=True, write=False).step
    return {**changes, "attempts": [*attempts[:-1], {**attempts[-1], "step": step}]}


def _attempt_reason(job_dir: Path, record: JobRecord, number: int, since: int) -> str:
    """Why attempt ``number`` ended in a requeue: the timeout trap's marker, else slurmstepd's
    cancel line in its part of the log (from byte ``since``)."""
    if os.path.lexists(job_dir / f"{TIMEOUT_MARKER}{number}"):
        limit = record.scheduler_options.get("resume_on_timeout")
        return f"requeued (time limit near; --resume-on-timeout {limit})"
    try:
        with open(record.log_path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(since, size - _TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        tail = ""
    found = _CANCEL_LINE.findall(tail)
    if found:
        return f"requeued ({_WHY.get(found[-1], found[-1].lower())})"
    return "requeued by SLURM"


def _ended_at(job_dir: Path, record: JobRecord, number: int) -> float:
    """When attempt ``number`` ended: its exit file's time, else its log's last write, else now."""
    info = jobstore.read_exit_code(job_dir, exit_file_name(number))
    if info is not None:
        return info.ended_at
    try:
        return min(time.time(), os.stat(record.log_path).st_mtime)
    except OSError:
        return time.time()


def begin_attempt(job_dir: Path, attempt: int) -> tuple[list[str], str]:
    """Record attempt ``attempt`` (≥ 2) of the job in ``job_dir`` and return its overrides and a
    line for the job's log: the earlier attempt ended (reason, step reached), the new one continues
    from the last checkpoint, or from the beginning when there is none.

    Raises:
        AttemptNotRun: the pre-flight refuses (a damaged checkpoint, an unknown recipe, a record
            whose command does not end with its overrides), or training had finished; the
            attempt is recorded as ended, with that reason.
        CorruptRecord: the record cannot be read.
    """
    from tune_magic.checkpoints import relaunch
    from tune_magic.errors import NothingToResume
    from tune_magic.logs.summary import current_summary
    from tune_magic.registry import attempts as entries

    record = jobstore.read(job_dir)
    if len(record.attempts) >= attempt:  # this attempt was recorded already (the helper ran twice)
        return list(record.overrides or []), f"[tune_magic] attempt {attempt} goes on as recorded"
    before = entries.parse(record.attempts)
    since = before[-1].log_offset if before else 0
    reason = _attempt_reason(job_dir, record, attempt - 1, since)
    step = current_summary(job_dir, record, kept=False, final=True, write=False).step
    done = entries.finish(record.attempts, ended_at=_ended_at(job_dir, record, attempt - 1), reason=reason,
                          step=step, returncode=None, first_started_at=record.started_at)
    size = _size(record.log_path)
    try:
        nxt = relaunch.next_attempt(record, from_start_if_none=True)
    except PlanError as exc:
        # the attempt is recorded all the same, ended at once with its reason: the record, the card
        # and `logs --error` say why the job ended, not just the batch script's exit code
        finished = isinstance(exc, NothingToResume) and exc.finished
        now = time.time()
        ended = entries.finish(
            entries.begin(done, started_at=now, first_started_at=record.started_at, resumed_from=None,
                          log_offset=size),
            ended_at=now, reason=f"{TRAINING_FINISHED}: {exc}" if finished else f"{CANNOT_CONTINUE}: {exc}",
            step=step, returncode=0 if finished else REFUSED_RC)
        jobstore.update(job_dir, attempts=ended)
        raise AttemptNotRun(str(exc), finished=finished) from exc
    new = entries.begin(done, started_at=time.time(), first_started_at=record.started_at,
                        resumed_from=nxt.resumed_from, log_offset=size)
    jobstore.update(job_dir, attempts=new, argv=nxt.argv, overrides=nxt.overrides)
    how = (f"resumes from {entries.where(nxt.resumed_from)}" if nxt.resumed_from
           else "starts over from the beginning (no checkpoint yet)")
    added = [o for o in nxt.overrides if o not in record.argv]
    line = (f"[tune_magic] attempt {attempt - 1} {reason}" + ("" if step is None else f" at step {step}")
            + f"; attempt {attempt} {how}" + (f": {' '.join(added)}" if added else ""))
    return nxt.overrides, line


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tune_magic.schedulers.slurm.requeue JOB_DIR ATTEMPT``: see the module docstring.
    Prints the overrides NUL-separated on stdout and says what it does on stderr (the job's log);
    exit status 0, or 3 when the job cannot go on (the reason on stderr), 2 for bad arguments."""
    from tune_magic.errors import TuneMagicError

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or not args[1].isdigit() or int(args[1]) < 2:
        print("usage: python -m tune_magic.schedulers.slurm.requeue JOB_DIR ATTEMPT (ATTEMPT >= 2)", file=sys.stderr)
        return 2
    try:
        overrides, line = begin_attempt(Path(args[0]), int(args[1]))
    except AttemptNotRun as exc:
        if exc.finished:
            print(f"[tune_magic] attempt {args[1]}: {TRAINING_FINISHED}: {exc}", file=sys.stderr)
            return FINISHED_RC
        print(f"[tune_magic] attempt {args[1]} {CANNOT_CONTINUE}: {exc}", file=sys.stderr)
        return REFUSED_RC
    except (TuneMagicError, jobstore.CorruptRecord, OSError, ValueError) as exc:
        print(f"[tune_magic] attempt {args[1]} {CANNOT_CONTINUE}: {exc}", file=sys.stderr)
        return REFUSED_RC
    print(line, file=sys.stderr, flush=True)
    sys.stdout.write("".join(f"{o}\0" for o in overrides))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
