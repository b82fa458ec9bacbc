"""What SLURM's controller says about our jobs: the squeue command and its answer read (states
mapped to ours), and the one bounded query shared by every job and process. One concept: the
controller's word, from the command to the cached answer (squeue's JSON and plain forms, the
array forms, the query's lock and cache are one protocol, split only for its size before).

Read squeue's answer about our SLURM jobs and map SLURM's job states to ours.

- :func:`squeue_argv`: the one squeue command for a batch of job ids (``--json``, or the plain
  ``--format`` fallback where ``--json`` fails).
- :func:`parse_squeue_json` / :func:`parse_squeue_format`: squeue's output -> :class:`SlurmJob`.
- :func:`parse_scontrol_jobs`: ``scontrol --oneliner show job N`` -> :class:`SlurmJob` (the check
  when squeue's answer leaves a job out), :func:`scontrol_invalid_id`: its "no such job" answer.
- :func:`job_outcome`: a :class:`SlurmJob` -> our :class:`~tune_magic.registry.status.Status` and the
  reason a card shows.
- :func:`expand_hostlist`: SLURM's compressed host lists (``n[1-2]``) -> host names. At run
  time ``scontrol show hostnames`` is the engine's own expander; this one serves the parser.

Formats: ``squeue --json`` of SLURM 22.05 (data_parser v0.0.38: ``job_state`` a string, numbers
plain) and of 23.11+ (data_parser v0.0.40+: ``job_state`` a list of the base state and its flags,
numbers as ``{"set", "infinite", "number"}``, ``exit_code`` as ``{"return_code", "signal",
"status"}``); ``scontrol --oneliner show job`` of 22.05 (``Key=value`` pairs, ``ExitCode=code:signal``).
Recorded samples: ``tests/data/slurm/``.

What SLURM's controller says about our jobs: one bounded query, shared by every job and process.

A listing, a card or a table never waits long on the controller. At most one query per
:func:`interval_s` for all live SLURM jobs of the registry at once (one ``squeue --jobs=... --json``,
the plain ``--format`` where that fails), bounded by :func:`query_timeout_s` seconds in all; its
answer is kept on disk with its time (``$TUNE_MAGIC_HOME/cache/slurm-queue-<cluster>.json``), so
other processes read it instead of asking again, and the process that asks holds a lock meanwhile.

Absence of an answer is not an answer. Each asked job comes out as one of:

- ``listed``: squeue (or ``scontrol show job``) described it;
- ``not_listed``: the controller answered and does not know it: a structured squeue answer
  without it, confirmed by ``scontrol show job N`` saying "Invalid job id" (squeue exiting 0 with
  nothing, or 1 for an id it calls invalid, is a doubt until scontrol confirms);
- ``no_answer``: the query failed or timed out (an unreachable, paused or overloaded controller):
  no news, which never changes a job's status; :meth:`QueueWatcher.note` then says since when;
- ``not_asked``: the job was not among the last query's ids yet (launched a moment ago).

Settings (read at each use, so tests and CLI subprocesses run outages of seconds):
``TUNE_MAGIC_SLURM_INTERVAL_S`` (default :data:`SQUEUE_INTERVAL_S`),
``TUNE_MAGIC_SLURM_QUERY_TIMEOUT_S`` (:data:`QUERY_TIMEOUT_S`), ``TUNE_MAGIC_SLURM_GRACE_S``
(:data:`MISSING_GRACE_S`) and ``TUNE_MAGIC_SLURM_MISSING_ANSWERS`` (:data:`MISSING_ANSWERS`).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

from tune_magic.paths import home
from tune_magic.registry import outcome
from tune_magic.registry import store as jobstore
from tune_magic.registry.status import Status
from tune_magic.schedulers.slurm.array import array_tasks_from_json, parse_array_job_id, SqueueParseError


#: The plain fallback's fields, ``|``-separated: job id, state (long form), reason, node count,
#: node list, time limit, name (last: the only field that may itself hold a ``|``).
SQUEUE_FORMAT = "%i|%T|%r|%D|%N|%l|%j"

#: Reason shown for a job cancelled by anyone but tune_magic's own stop (the outcome rule's).
CANCELLED_OUTSIDE = outcome.CANCELLED_OUTSIDE

#: SLURM's base job states (``job_state_string`` in src/common/slurm_protocol_defs.c).
BASE_STATES = frozenset({
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
    "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
})

# flags that mean processes of the job still exist, whatever the base state says
_STILL_RUNNING_FLAGS = ("COMPLETING", "CONFIGURING", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "POWER_UP_NODE")
# flags that put the job back in the queue
_REQUEUED_FLAGS = ("REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT", "RESV_DEL_HOLD")

# SLURM's states that have a verdict of their own in the outcome rule (the others are "failed")
_VERDICTS = {"NODE_FAIL": outcome.NODE_FAIL, "OUT_OF_MEMORY": outcome.OUT_OF_MEMORY}

_FAILURE_REASONS = {
    "NODE_FAIL": "NODE_FAIL: a node of the job failed",
    "OUT_OF_MEMORY": "OUT_OF_MEMORY: a process of the job ran out of memory",
    "BOOT_FAIL": "BOOT_FAIL: a node of the job failed to boot",
    "DEADLINE": "DEADLINE: the job reached its --deadline",
    "PREEMPTED": "PREEMPTED: SLURM preempted the job",
    "LAUNCH_FAILED": "LAUNCH_FAILED: SLURM could not launch the batch script",
    "REVOKED": "REVOKED: the job was revoked (federation)",
}


@dataclass(frozen=True)
class SlurmJob:
    """One job as squeue describes it.

    Attributes:
        job_id: SLURM's job id, as text (``"12"``).
        name: the job name (``tune_magic-<id>`` for ours).
        state: the base state (one of :data:`BASE_STATES`), or None when squeue gave only a
            flag (22.05 prints ``COMPLETING`` instead of the base state).
        flags: further states: the rest of the 23.11+ list, or the 22.05 string when it is a flag.
        reason: squeue's reason (``Resources``, ``Priority``, ``NonZeroExitCode``...); None for ``None``.
        nodes: host names (expanded), in SLURM's order; () while pending.
        num_nodes: nodes requested or allocated; None if squeue did not say.
        time_limit_minutes: the time limit in minutes; None if unlimited or not given.
        exit_code: the batch script's exit code, if squeue gave one (JSON only), else None.
        signal: the signal that ended the batch script (23.11+ JSON only), else None.
        restart_count: how many times SLURM requeued the job (JSON ``restart_cnt``), 0 when
            squeue did not say.
    """

    job_id: str
    name: str
    state: str | None
    flags: tuple[str, ...] = ()
    reason: str | None = None
    nodes: tuple[str, ...] = ()
    num_nodes: int | None = None
    time_limit_minutes: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    restart_count: int = 0


@dataclass(frozen=True)
class Outcome:
    """What a SLURM job's state means to tune_magic.

    Attributes:
        status: pending, running, succeeded, failed, stopped, or unknown (a state this
            module does not know).
        reason: what a card shows next to the status: squeue's pending reason, or why it
            failed or was cancelled; None when there is nothing to add.
        verdict: for an ended job, SLURM's word on the end as the outcome rule takes it (one of
            :data:`tune_magic.registry.outcome.VERDICTS`), else None. The job's end itself is
            decided by :func:`tune_magic.registry.outcome.decide`.
    """

    status: Status
    reason: str | None = None
    verdict: str | None = field(default=None, compare=False)


def squeue_argv(job_ids: list[str] | tuple[str, ...], json_output: bool = True) -> list[str]:
    """Return the squeue command that describes ``job_ids`` in one call.

    ``--states=all`` keeps ended jobs (for ``MinJobAge`` seconds after they end, 300 by default);
    ``--array`` (``-r``) prints each array task on a line of its own (``7_3``, a trial of a sweep),
    never folded with its array's other pending tasks (``7_[2-5%2]``).

    Raises:
        ValueError: no job ids, or an id that is not a number.
    """
    if not job_ids:
        raise ValueError("squeue_argv needs at least one job id")
    bad = [j for j in job_ids if not re.fullmatch(r"\d+(_\d+)?", str(j))]
    if bad:
        raise ValueError(f"not SLURM job ids: {bad}")
    jobs = f"--jobs={','.join(str(j) for j in job_ids)}"
    if json_output:
        return ["squeue", jobs, "--states=all", "--json"]
    return ["squeue", jobs, "--states=all", "--array", "--noheader", f"--format={SQUEUE_FORMAT}"]


# --- host lists ------------------------------------------------------------------------------

def expand_hostlist(text: str | None) -> list[str]:
    """Expand a SLURM host list (``n[1-3,5]``, ``r[1-2]-n[01-02]``, ``a,b``) into host names.

    Ranges keep their zero padding (``n[08-10]`` -> n08, n09, n10); several bracket groups in
    one name multiply out in order. Empty text, ``(null)`` and ``None`` give [].

    Raises:
        SqueueParseError: unbalanced brackets or a range that runs backwards.
    """
    text = (text or "").strip()
    if not text or text == "(null)":
        return []
    out: list[str] = []
    for item in _split_top_level(text):
        out.extend(_expand_item(item, text))
    return out


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SqueueParseError(f"unbalanced ']' in host list {text!r}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise SqueueParseError(f"unbalanced '[' in host list {text!r}")
    items.append(text[start:])
    return [i for i in (s.strip() for s in items) if i]


def _expand_item(item: str, whole: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", item)
    if not m:
        return [item]
    head, tail = item[: m.start()], item[m.end():]
    out = []
    for part in m.group(1).split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise SqueueParseError(f"bad range {part!r} in host list {whole!r}")
        if not dash:
            values = [lo]
        else:
            if int(hi) < int(lo):
                raise SqueueParseError(f"range {part!r} runs backwards in host list {whole!r}")
            width = len(lo) if lo.startswith("0") else 0
            values = [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
        for v in values:
            out.extend(_expand_item(head + v + tail, whole))
    return out


# --- squeue --json ---------------------------------------------------------------------------

def _number(value: object) -> tuple[bool, int | None]:
    """Return (infinite, number) for a JSON number: plain (22.05) or ``{set, infinite, number}`` (23.11+)."""
    if isinstance(value, dict):
        if value.get("infinite"):
            return True, None
        if not value.get("set", True):
            return False, None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False, None
    return False, int(value)


def _split_state(raw: object) -> tuple[str | None, tuple[str, ...]]:
    if isinstance(raw, str):
        words = [raw]
    elif isinstance(raw, list) and all(isinstance(s, str) for s in raw):
        words = list(raw)
    else:
        raise SqueueParseError(f"job_state is neither a string nor a list of strings: {raw!r}")
    words = [w.strip().upper() for w in words if w.strip()]
    base = next((w for w in words if w in BASE_STATES), None)
    return base, tuple(w for w in words if w != base)


def _exit(raw: object) -> tuple[int | None, int | None]:
    """Return (exit code, signal) of the batch script from ``exit_code``.

    22.05 gives the raw wait status (exit 3 -> 768, SIGTERM -> 15); 23.11+ a struct with
    ``return_code`` and ``signal.id`` already split (src/plugins/data_parser/v0.0.40).
    """
    if isinstance(raw, dict):
        _, code = _number(raw.get("return_code"))
        _, sig = _number((raw.get("signal") or {}).get("id"))
        return code, sig or None
    _, status = _number(raw)
    if status is None:
        return None, None
    if status & 0x7F == 0:  # WIFEXITED
        return (status >> 8) & 0xFF, None
    return None, status & 0x7F  # WIFSIGNALED (WTERMSIG)


def parse_job_json(job: dict) -> SlurmJob:
    """Return the :class:`SlurmJob` of one element of ``squeue --json``'s ``jobs`` list.

    Raises:
        SqueueParseError: no ``job_id`` or no readable ``job_state``.
    """
    if not isinstance(job, dict) or "job_id" not in job or "job_state" not in job:
        raise SqueueParseError(f"a job without job_id/job_state: {str(job)[:200]!r}")
    state, flags = _split_state(job["job_state"])
    reason = job.get("state_reason")
    infinite, limit = _number(job.get("time_limit"))
    _, num_nodes = _number(job.get("node_count"))
    code, sig = _exit(job.get("exit_code"))
    return SlurmJob(
        job_id=str(_number(job["job_id"])[1] if not isinstance(job["job_id"], str) else job["job_id"]),
        name=str(job.get("name") or ""),
        state=state,
        flags=flags,
        reason=None if reason in (None, "", "None") else str(reason),
        nodes=tuple(expand_hostlist(job.get("nodes"))),
        num_nodes=num_nodes,
        time_limit_minutes=None if infinite else limit,
        exit_code=code,
        signal=sig,
        restart_count=_number(job.get("restart_cnt"))[1] or 0,
    )


def parse_squeue_json(text: str, job_ids: "list[str] | tuple[str, ...] | None" = None) -> dict[str, SlurmJob]:
    """Parse ``squeue --json`` output into {job id: job}, keeping only ``job_ids`` if given.

    SLURM 22.05's ``squeue --json`` ignores ``--jobs`` and ``--states`` and prints every job
    it knows (measured, tests/data/slurm/squeue_22.05_unknown_id.txt), so the caller passes the
    ids it asked for. Jobs squeue no longer knows (ended more than ``MinJobAge`` ago) are
    simply absent; for them the caller decides (exit file, then unknown).

    Raises:
        SqueueParseError: not JSON, no ``jobs`` list, squeue reported errors, or a job is unreadable.
    """
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SqueueParseError(f"squeue --json printed no JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise SqueueParseError(f"squeue --json printed no 'jobs' list: {text[:200]!r}")
    errors = [e for e in data.get("errors") or [] if e]
    if errors and not data["jobs"]:
        raise SqueueParseError(f"squeue --json reported errors: {errors}")
    wanted = None if job_ids is None else {str(j) for j in job_ids}
    out = {}
    for raw in data["jobs"]:
        job = parse_job_json(raw)
        if _number(raw.get("array_job_id"))[1] and _number(raw.get("array_task_id"))[1] is None:
            # the record of an array's tasks that never started: its exit code (0) is no task's
            job = dataclasses.replace(job, exit_code=None, signal=None)
        for key in _json_keys(raw, job):
            if wanted is None or key in wanted:
                out[key] = dataclasses.replace(job, job_id=key)
    return out


def _json_keys(raw: dict, job: SlurmJob) -> list[str]:
    """The ids one ``squeue --json`` record answers for: its job id, or for an array task
    ``A_T`` (a task's own job id is another number, and the last task keeps the array's id), one
    per task of a record of pending tasks (``array_task_string`` ``2-5%2``). The record of an
    array's pending tasks cancelled together keeps neither task id nor list (measured, 22.05): it
    answers for the array's own id (``A``; those tasks themselves are then unknown to the
    controller), which a trial asks about when its task is not listed."""
    try:
        tasks = array_tasks_from_json(raw)
    except SqueueParseError:
        return [str(_number(raw.get("array_job_id"))[1])] if _number(raw.get("array_job_id"))[1] else []
    return [job.job_id] if tasks is None else list(tasks.ids)


# --- squeue --format (fallback) --------------------------------------------------------------

def parse_time_limit(text: str) -> int | None:
    """Return the minutes of squeue's ``%l`` (``[D-]H:MM:SS``, ``M:SS``; ``UNLIMITED``/``NOT_SET`` -> None).

    Raises:
        SqueueParseError: anything else.
    """
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NOT_SET", "N/A", ""):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text)
    if not m:
        raise SqueueParseError(f"not a squeue time limit: {text!r}")
    d, h, mins, s = (int(g) if g else 0 for g in m.groups())
    return d * 1440 + h * 60 + mins + (1 if s else 0)


def parse_squeue_format(text: str) -> dict[str, SlurmJob]:
    """Parse the output of :func:`squeue_argv` with ``json_output=False`` into {job id: job}.

    Raises:
        SqueueParseError: a line without the 7 fields of :data:`SQUEUE_FORMAT`.
    """
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 6)
        if len(parts) != 7:
            raise SqueueParseError(f"squeue line without the {SQUEUE_FORMAT} fields: {line!r}")
        job_id, state, reason, num_nodes, nodes, limit, name = (p.strip() for p in parts)
        base, flags = _split_state(state)
        job = SlurmJob(
            job_id=job_id,
            name=name,
            state=base,
            flags=flags,
            reason=None if reason in ("", "None") else reason,
            nodes=tuple(expand_hostlist(nodes)),
            num_nodes=int(num_nodes) if num_nodes.isdigit() else None,
            time_limit_minutes=parse_time_limit(limit),
        )
        for key in _task_keys(job_id):
            out[key] = dataclasses.replace(job, job_id=key)
    return out


def _task_keys(job_id: str) -> list[str]:
    """The ids a job id squeue printed answers for: itself, or each task of an array record of
    pending tasks folded into one (``7_[2-5%2]``, printed without ``--array``)."""
    tasks = parse_array_job_id(job_id)
    return [job_id] if tasks is None else list(tasks.ids)


# --- scontrol show job (the check when squeue leaves a job out) --------------------------------

_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")


def _fields(line: str) -> dict[str, str]:
    """``Key=value`` pairs of one ``scontrol --oneliner`` line; a value runs up to the next key, so
    a job name with spaces stays whole."""
    keys = list(_KEY.finditer(line))
    return {m.group(1): line[m.end(): keys[i + 1].start() if i + 1 < len(keys) else len(line)].strip()
            for i, m in enumerate(keys)}


def parse_scontrol_jobs(text: str) -> dict[str, SlurmJob]:
    """Parse ``scontrol --oneliner show job [N]`` into {job id: job} (one job a line).

    Raises:
        SqueueParseError: a ``JobId=`` line without a readable ``JobState``.
    """
    out = {}
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        f = _fields(line)
        if not f.get("JobState"):
            raise SqueueParseError(f"scontrol line without JobState: {line[:200]!r}")
        base, flags = _split_state(f["JobState"])
        code, _, sig = f.get("ExitCode", "").partition(":")
        nodes = f.get("NodeList", "")
        limit = f.get("TimeLimit", "")
        try:
            minutes = parse_time_limit(limit) if limit else None
        except SqueueParseError:
            minutes = None
        key = f["JobId"]
        if f.get("ArrayJobId", "").isdigit() and f.get("ArrayTaskId", "").isdigit():
            key = f"{f['ArrayJobId']}_{f['ArrayTaskId']}"  # a task's JobId is its own number
        out[key] = SlurmJob(
            job_id=key, name=f.get("JobName", ""), state=base, flags=flags,
            reason=None if f.get("Reason") in (None, "", "None") else f["Reason"],
            nodes=tuple(expand_hostlist(nodes)),
            num_nodes=int(f["NumNodes"]) if f.get("NumNodes", "").isdigit() else None,
            time_limit_minutes=minutes,
            exit_code=int(code) if code.isdigit() else None,
            signal=int(sig) if sig.isdigit() and int(sig) else None,
            restart_count=int(f["Restarts"]) if f.get("Restarts", "").isdigit() else 0,
        )
    return out


def scontrol_invalid_id(returncode: int, stderr: str, stdout: str = "") -> bool:
    """Whether scontrol (or squeue) answered that it knows no such job: exit 1 with ``Invalid job id
    specified``, or for an array task ``Job 7_3 not found`` (22.05, measured: a pending task
    cancelled with its array, or by itself with ``scancel 7_3``, which 22.05 prints on *stdout*);
    an unreachable or slow controller also exits 1, with another message. Both streams are read:
    SLURM's clients do not agree on where an answer goes."""
    text = f"{stderr or ''}\n{stdout or ''}"
    return returncode == 1 and ("Invalid job id specified" in text
                                or re.search(r"\bJob [0-9]+_[0-9]+ not found", text) is not None)


# --- states -> Status ------------------------------------------------------------------------

def format_minutes(minutes: int) -> str:
    """Return ``minutes`` the way SLURM prints a time limit: ``H:MM:SS`` or ``D-HH:MM:SS``."""
    d, rest = divmod(minutes, 1440)
    h, m = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:00" if d else f"{h}:{m:02d}:00"


def job_outcome(job: SlurmJob, *, stopped_by_us: bool = False, time_limit: str | None = None) -> Outcome:
    """Map a SLURM job's state to tune_magic's status and the reason a card shows.

    ==============================================  =========  ======================================
    SLURM state                                     status     reason
    ==============================================  =========  ======================================
    PENDING                                         pending    squeue's reason (Resources, Priority..)
    REQUEUED, REQUEUE_HOLD, ... (back to queue)     pending    squeue's reason, or ``requeued``
    RUNNING, CONFIGURING, COMPLETING, SUSPENDED...  running    ``suspended`` for SUSPENDED
    COMPLETED                                       succeeded  --
    FAILED                                          failed     ``exit code N`` when known
    TIMEOUT                                         failed     ``hit the --time limit T``
    NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, ...        failed     the state and what it means
    CANCELLED                                       stopped    --, or :data:`CANCELLED_OUTSIDE`
    anything else                                   unknown    ``SLURM state X``
    ==============================================  =========  ======================================

    A flag that means processes still exist (COMPLETING, CONFIGURING...) wins over the base
    state: 23.11+ lists ``["CANCELLED", "COMPLETING"]`` while a cancelled job's processes end.

    Args:
        job: the job as squeue describes it.
        stopped_by_us: tune_magic's own stop cancelled it; decides CANCELLED's reason.
        time_limit: the ``--time`` the user gave, for TIMEOUT's reason; default: squeue's
            limit, printed as SLURM prints it.
    """
    flags = set(job.flags)
    if flags & set(_STILL_RUNNING_FLAGS):
        return Outcome(Status.RUNNING, "suspended" if job.state == "SUSPENDED" else None)
    if flags & set(_REQUEUED_FLAGS):  # back to the queue, whatever ended the run before
        return Outcome(Status.PENDING, job.reason or "requeued")
    state = job.state
    if state == "PENDING":
        return Outcome(Status.PENDING, job.reason)
    if state == "RUNNING":
        return Outcome(Status.RUNNING)
    if state == "SUSPENDED":
        return Outcome(Status.RUNNING, "suspended")
    if state == "COMPLETED":
        return Outcome(Status.SUCCEEDED, verdict=outcome.COMPLETED)
    if state == "CANCELLED":
        return Outcome(Status.STOPPED, None if stopped_by_us else CANCELLED_OUTSIDE, outcome.CANCELLED)
    if state == "TIMEOUT":
        limit = time_limit or (format_minutes(job.time_limit_minutes) if job.time_limit_minutes else None)
        return Outcome(Status.FAILED, f"hit the --time limit {limit}" if limit else "hit the --time limit",
                       outcome.TIMEOUT)
    if state == "FAILED":
        if job.signal:
            return Outcome(Status.FAILED, f"the batch script was killed by signal {job.signal}", outcome.FAILED)
        return Outcome(Status.FAILED, f"exit code {job.exit_code}" if job.exit_code else None, outcome.FAILED)
    for word in (state, *job.flags):
        if word in _FAILURE_REASONS:
            return Outcome(Status.FAILED, _FAILURE_REASONS[word], _VERDICTS.get(word, outcome.FAILED))
    shown = state or "/".join(job.flags) or "(none)"
    return Outcome(Status.UNKNOWN, f"SLURM state {shown}")


#: Seconds between queries of the controller (one for every live SLURM job).
SQUEUE_INTERVAL_S = 5.0
#: Seconds one query (squeue, and scontrol for the jobs it left out) may take in all.
QUERY_TIMEOUT_S = 3.0
#: Seconds a job may be missing from the controller's answers, without an exit file, before it is
#: called failed (and only after :data:`MISSING_ANSWERS` such answers).
MISSING_GRACE_S = 60.0
#: Answers that must leave the job out (over :data:`MISSING_GRACE_S`) before it is called failed.
MISSING_ANSWERS = 3

LISTED, NOT_LISTED, NO_ANSWER, NOT_ASKED = "listed", "not_listed", "no_answer", "not_asked"


def setting(name: str, default: float) -> float:
    """The setting ``TUNE_MAGIC_SLURM_<NAME>`` from the environment (a number >= 0), else ``default``."""
    raw = os.environ.get(f"TUNE_MAGIC_SLURM_{name}", "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else default


def interval_s() -> float:
    """Seconds between two queries of the controller."""
    return setting("INTERVAL_S", SQUEUE_INTERVAL_S)


def query_timeout_s() -> float:
    """Seconds one query may take in all."""
    return setting("QUERY_TIMEOUT_S", QUERY_TIMEOUT_S)


def missing_grace_s() -> float:
    """Seconds of "not listed" answers before a job without an exit file is called failed."""
    return setting("GRACE_S", MISSING_GRACE_S)


def missing_answers() -> int:
    """Answers leaving a job out that must come (over the grace period) before it is called failed."""
    return max(1, int(setting("MISSING_ANSWERS", MISSING_ANSWERS)))


@dataclass(frozen=True)
class Answer:
    """The controller's word on one job.

    Attributes:
        kind: :data:`LISTED`, :data:`NOT_LISTED`, :data:`NO_ANSWER` or :data:`NOT_ASKED`.
        job: the job as described (``listed`` only).
        at: unix seconds of the answer (of the last query, for ``no_answer``).
        failing_since: unix seconds since which the controller has not answered, else ``None``.
    """

    kind: str
    job: SlurmJob | None = None
    at: float | None = None
    failing_since: float | None = None


def run_bounded(argv: list[str], env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess | None:
    """Run a SLURM client for at most ``timeout`` seconds; ``None`` when it could not run or took
    longer (it runs in a session of its own, which is then killed whole: a hanging wrapper script
    leaves no child behind)."""
    try:
        p = subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    except OSError:
        return None
    try:
        out, err = p.communicate(timeout=max(timeout, 0.05))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the group this call made, led by its own child
        except OSError:
            pass
        try:
            p.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:  # a grandchild left the group and holds the pipes
            for stream in (p.stdout, p.stderr):
                stream.close()
            p.wait()
        return None
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def _job_from(data: dict) -> SlurmJob:
    return SlurmJob(**{**data, "flags": tuple(data.get("flags") or ()), "nodes": tuple(data.get("nodes") or ())})


@dataclass
class _View:
    """One cluster's last query: when (unix and monotonic seconds), which ids it asked, which it
    answered (listed: ``jobs``; confirmed unknown: ``gone``), and since when the controller fails."""

    asked_at: float = float("-inf")
    mono: float = float("-inf")
    ids: frozenset = frozenset()
    answered: frozenset = frozenset()
    jobs: dict | None = None
    gone: frozenset = frozenset()
    failing_since: float | None = None
    error: str | None = None

    def to_json(self) -> dict:
        return {"asked_at": self.asked_at, "ids": sorted(self.ids), "answered": sorted(self.answered),
                "jobs": {k: asdict(v) for k, v in (self.jobs or {}).items()}, "gone": sorted(self.gone),
                "failing_since": self.failing_since, "error": self.error}

    @classmethod
    def from_json(cls, data: dict) -> "_View":
        asked = float(data["asked_at"])
        age = max(0.0, time.time() - asked)
        return cls(asked_at=asked, mono=time.monotonic() - age, ids=frozenset(data["ids"]),
                   answered=frozenset(data["answered"]), jobs={k: _job_from(v) for k, v in data["jobs"].items()},
                   gone=frozenset(data["gone"]), failing_since=data.get("failing_since"), error=data.get("error"))


def _cache_file(conf: str) -> Path:
    digest = hashlib.sha256(conf.encode()).hexdigest()[:12]
    return home() / "cache" / f"slurm-queue-{digest}.json"


def _read_view(path: Path) -> _View | None:
    try:
        return _View.from_json(jobstore.read_json(path, 16 << 20))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class QueueWatcher:
    """Every process's shared view of the controller (see the module docstring). ``ids_for(conf)``
    gives the SLURM ids of the registry's live jobs on that cluster (the scheduler's)."""

    def __init__(self, ids_for: Callable[[str], Iterable[str]]) -> None:
        self._lock = threading.Lock()
        self._views: dict[str, _View] = {}
        self._ids_for = ids_for
        self._forced = False
        self.queries = 0  #: queries made by this process (tests and benchmarks read it)

    def forget(self) -> None:
        """Drop what is known: the next :meth:`get` asks the controller at once."""
        with self._lock:
            self._views.clear()
            self._forced = True

    def get(self, slurm_id: str, env: Mapping[str, str]) -> Answer:
        """The controller's word on ``slurm_id`` (asking it when the last answer is older than
        :func:`interval_s`, here or on disk); never takes longer than about :func:`query_timeout_s`."""
        conf = env.get("SLURM_CONF", "")
        with self._lock:
            view = self._fresh_view(conf, slurm_id, env)
        return self._answer(view, slurm_id)

    def note(self, env: Mapping[str, str]) -> str | None:
        """``"SLURM not answering since HH:MM"`` while the last query of this cluster failed (from
        this process's view or the one on disk), else ``None``. Never asks the controller."""
        conf = env.get("SLURM_CONF", "")
        with self._lock:
            view = self._views.get(conf)
            if view is None or time.monotonic() - view.mono >= interval_s():
                view = _read_view(_cache_file(conf)) or view
        if view is None or view.failing_since is None:
            return None
        return "SLURM not answering since " + time.strftime("%H:%M", time.localtime(view.failing_since))

    @staticmethod
    def _answer(view: _View, slurm_id: str) -> Answer:
        if slurm_id in view.answered:
            if slurm_id in (view.jobs or {}):
                return Answer(LISTED, view.jobs[slurm_id], view.asked_at)
            return Answer(NOT_LISTED, None, view.asked_at)
        if slurm_id in view.ids:
            return Answer(NO_ANSWER, None, view.asked_at, view.failing_since or view.asked_at)
        return Answer(NOT_ASKED, None, view.asked_at, view.failing_since)

    def _fresh_view(self, conf: str, slurm_id: str, env: Mapping[str, str]) -> _View:
        """This process's view if recent, else the one on disk if recent, else a new query (one
        process at a time asks: the others wait for its answer, as long as a query may take)."""
        now = time.monotonic()
        every = interval_s()
        view = self._views.get(conf)
        if view is not None and now - view.mono < every:
            return view
        path = _cache_file(conf)
        forced, self._forced = self._forced, False

        def recent_on_disk() -> _View | None:
            disk = None if forced else _read_view(path)
            fresh = disk is not None and 0 <= time.monotonic() - disk.mono < every and slurm_id in disk.ids
            return disk if fresh else None

        disk = recent_on_disk()
        if disk is not None:
            self._views[conf] = disk
            return disk
        lock_fd, busy = self._take_lock(path)
        try:
            if busy:  # another process asked all this time: what it found, or no news
                disk = _read_view(path)
                view = disk if disk is not None and slurm_id in disk.ids else _View(
                    asked_at=time.time(), mono=time.monotonic(), failing_since=view.failing_since if view else None)
            elif (disk := recent_on_disk()) is not None:  # another process answered while this one waited
                view = disk
            else:
                view = self._query(conf, slurm_id, env, view or _read_view(path))
                try:
                    jobstore.write_atomic(path, json.dumps(view.to_json()).encode(), fsync=False)
                except OSError:
                    pass  # a read-only or full home: this process keeps it in memory
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._views[conf] = view
        return view

    @staticmethod
    def _take_lock(path: Path) -> tuple[int | None, bool]:
        """Hold the cache's lock, waiting while another process queries (at most about one query's
        time): ``(fd, False)``; ``(None, True)`` when it stayed busy; ``(None, False)`` without a
        writable home (every process then asks alone)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = jobstore.open_nofollow(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT)
        except OSError:
            return None, False
        deadline = time.monotonic() + query_timeout_s() + 0.5
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd, False
            except OSError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    return None, True
                time.sleep(0.05)

    def _query(self, conf: str, slurm_id: str, env: Mapping[str, str], previous: _View | None) -> _View:
        """Ask the controller about every live job of ``conf`` and ``slurm_id``, within one deadline."""
        ids = {slurm_id}
        try:
            ids.update(self._ids_for(conf))
        except Exception:  # a listing problem never blocks the query for this job
            pass
        ids = sorted(ids, key=lambda x: int(x.split("_")[0]) if x.split("_")[0].isdigit() else 0)
        deadline = time.monotonic() + query_timeout_s()
        self.queries += 1
        jobs, error = _squeue(ids, env, deadline)
        answered: set[str] = set()
        gone: set[str] = set()
        if jobs is not None:
            answered = {i for i in ids if i in jobs}
            for missing in (i for i in ids if i not in jobs):  # a doubt until scontrol confirms it
                found = _scontrol(missing, env, deadline)
                if found is None:
                    continue
                answered.add(missing)
                if found is False:
                    gone.add(missing)
                else:
                    jobs[missing] = found
        failing = None if answered else (previous.failing_since if previous and previous.failing_since
                                         else time.time())
        last_jobs = jobs if jobs is not None else (previous.jobs if previous else None)
        return _View(asked_at=time.time(), mono=time.monotonic(), ids=frozenset(ids), answered=frozenset(answered),
                     jobs=last_jobs, gone=frozenset(gone), failing_since=failing, error=error)


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


def _squeue(ids: list[str], env: Mapping[str, str], deadline: float) -> tuple[dict | None, str | None]:
    """squeue's jobs among ``ids`` ({} when it answered and listed none of them), or ``(None,
    why)`` when it gave no answer in time. ``--json`` first, the plain format where that fails."""
    r = run_bounded(squeue_argv(ids, json_output=True), env, _left(deadline))
    if r is None:
        return None, "squeue did not answer in time"
    if r.returncode == 0:
        try:
            return parse_squeue_json(r.stdout, ids), None
        except (SqueueParseError, ValueError):
            pass  # older or odd squeue, or "errors" without jobs: the plain format says more
    if _left(deadline) <= 0:
        return None, "squeue did not answer in time"
    r = run_bounded(squeue_argv(ids, json_output=False), env, _left(deadline))
    if r is None:
        return None, "squeue did not answer in time"
    if r.returncode == 0 or scontrol_invalid_id(r.returncode, r.stderr, r.stdout):
        try:
            return parse_squeue_format(r.stdout if r.returncode == 0 else ""), None
        except SqueueParseError as exc:
            return None, str(exc)
    return None, " ".join((r.stderr or r.stdout or f"squeue exited {r.returncode}").split())[:300]


def _scontrol(slurm_id: str, env: Mapping[str, str], deadline: float) -> "SlurmJob | bool | None":
    """``scontrol show job``'s word on one job: the job, ``False`` (it knows no such job), or
    ``None`` (no answer in time)."""
    left = _left(deadline)
    if left <= 0:
        return None
    r = run_bounded(["scontrol", "--oneliner", "show", "job", slurm_id], env, left)
    if r is None:
        return None
    if scontrol_invalid_id(r.returncode, r.stderr, r.stdout):
        return False
    if r.returncode != 0:
        return None
    try:
        job = parse_scontrol_jobs(r.stdout).get(slurm_id)
    except SqueueParseError:
        return None
    return job
