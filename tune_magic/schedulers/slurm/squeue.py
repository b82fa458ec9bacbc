"""Read squeue's answer about our SLURM jobs and map SLURM's job states to ours. Pure.

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
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field

from tune_magic.registry import outcome
from tune_magic.registry.status import Status
from tune_magic.schedulers.slurm.array import array_tasks_from_json, parse_array_job_id
from tune_magic.schedulers.slurm.parseerror import SqueueParseError

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


def scontrol_invalid_id(returncode: int, stderr: str) -> bool:
    """Whether scontrol (or squeue) answered that it knows no such job: exit 1 with ``Invalid job id
    specified``, or for an array task ``Job 7_3 not found`` (22.05, measured: a pending task
    cancelled with its array); an unreachable or slow controller also exits 1, with another message."""
    text = stderr or ""
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
