"""A SLURM job array's words: the sbatch option, per-task file names, squeue's task ids, the
cluster's array limits, and the one error of reading the SLURM clients' answers. Pure.

A sweep as one SLURM job array: the sbatch option, per-task file names, squeue's task ids and
the cluster's array limits. Pure.

- :func:`array_option`: ``--array=0-(N-1)%K``, one array task per trial (task index = trial index).
- :func:`escape_filename`, :func:`task_output_pattern`, :func:`expand_filename`: sbatch's
  ``--output`` filename patterns (``%A_%a``) with the user's part escaped, and the path a task's
  file gets.
- :func:`parse_array_job_id` / :func:`array_tasks_from_json`: squeue's job ids for array tasks
  (``7_3``; the folded pending record ``7_[2-5%2]``) -> task ids.
- :func:`parse_array_limits` / :func:`check_array_size`: ``MaxArraySize`` (and ``max_array_tasks``
  of ``SchedulerParameters``) from ``scontrol show config``, and the refusal of a sweep too large.

Formats are those of SLURM 22.05 (src/squeue/print.c ``_print_job_job_id``;
src/common/slurm_protocol_defs.c ``xlate_array_task_str``; src/slurmd/common/fname.c; src/api/
config_info.c ``slurm_print_key_pairs``), unchanged in 23.11. Samples: tests/data/slurm/.

The one error of reading the SLURM clients' answers (its own module: both the squeue and the
job array readers raise it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tune_magic.errors import PlanError, TuneMagicError


class SqueueParseError(TuneMagicError, ValueError):
    """squeue's output is not what this module reads (the message quotes the start of it).

    Not a :class:`~tune_magic.errors.UserError`: the engine answered oddly; the scheduler treats
    it as "no answer", which never ends a job."""


#: Environment for squeue so a pending array record's task list is never cut: without it SLURM
#: prints at most 64 characters of it (``0,2,4,...``), and ``squeue -r`` expands the cut text.
SQUEUE_ARRAY_ENV = {"SLURM_BITSTR_LEN": "0"}

#: MaxArraySize when slurm.conf does not set it (slurm.conf(5), 22.05).
DEFAULT_MAX_ARRAY_SIZE = 1001

# squeue cuts a task list to fit a 64-byte buffer (63 characters); xlate_array_task_str then ends
# it with "..." (a merged pending record from squeue itself is cut without the dots)
_CUT_LEN = 63


# --- sbatch --array ------------------------------------------------------------------------------

def array_option(n_tasks: int, max_running: int | None = None) -> str:
    """Return sbatch's ``--array`` option for ``n_tasks`` tasks indexed ``0..n_tasks-1``.

    Args:
        n_tasks: tasks in the array (trials), >= 1.
        max_running: at most this many tasks run at once (``%K``); ``None`` (or >= ``n_tasks``,
            where it would not limit anything) leaves it out.

    Returns:
        ``"--array=0-5%2"``; ``"--array=0-0"`` for one task.

    Raises:
        ValueError: ``n_tasks`` or ``max_running`` below 1.
    """
    if n_tasks < 1:
        raise ValueError(f"an array needs at least one task, not {n_tasks}")
    if max_running is not None and max_running < 1:
        raise ValueError(f"max_running must be >= 1, not {max_running}")
    limit = f"%{max_running}" if max_running is not None and max_running < n_tasks else ""
    return f"--array=0-{n_tasks - 1}{limit}"


# --- file name patterns --------------------------------------------------------------------------

def escape_filename(text: str) -> str:
    """Return ``text`` for an sbatch filename pattern so it means itself: ``%`` becomes ``%%``.

    Raises:
        PlanError: ``text`` holds a backslash: SLURM then drops every backslash and turns off
            every ``%`` replacement of the whole pattern (``remove_path_slashes``), so the
            job's log would go to another file (and a per-task ``%A_%a`` stay literal); choose a
            directory without one.
    """
    if "\\" in text:
        raise PlanError(f"the path {text!r} holds a backslash, which SLURM drops from an output file name (turning "
                        "off its %j/%A/%a patterns too), so the job's log would go elsewhere; nothing was submitted. "
                        "Use a TUNE_MAGIC_HOME and a directory without backslashes")
    return text.replace("%", "%%")


def task_output_pattern(prefix: str, suffix: str = ".log") -> str:
    """Return the ``--output`` pattern of an array task: ``prefix`` + ``%A_%a`` + ``suffix``, both
    escaped (:func:`escape_filename`).

    ``task_output_pattern("/home/u/100%/sweep-")`` is ``/home/u/100%%/sweep-%A_%a.log``: the
    task of index 3 of array job 7 writes ``/home/u/100%/sweep-7_3.log`` (:func:`expand_filename`).

    Raises:
        PlanError: a backslash in ``prefix`` or ``suffix``.
    """
    return f"{escape_filename(prefix)}%A_%a{escape_filename(suffix)}"


def expand_filename(pattern: str, *, array_job_id: int | str, task_id: int, job_id: int | str | None = None) -> str:
    """Return the file name SLURM makes of a batch job's filename ``pattern`` for one array task.

    Supports what tune_magic writes: ``%%``, ``%A`` (the array's job id), ``%a`` (the task
    index), ``%j`` (the task's own job id; needs ``job_id``), each with an optional zero-padding
    width (``%3a`` -> ``003``, at most 10), as src/slurmd/common/fname.c ``_create_batch_fname``
    does in SLURM 22.05. A pattern with a backslash is taken literally, backslashes dropped
    (``remove_path_slashes``).

    Raises:
        ValueError: another ``%`` replacement (``%N``, ``%u``...), or ``%j`` without ``job_id``.
    """
    if "\\" in pattern:
        return re.sub(r"\\(.)|\\$", lambda m: m.group(1) or "", pattern)
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        if pattern[i + 1:i + 2] == "%":
            out.append("%")
            i += 2
            continue
        m = re.match(r"%([0-9]*)(.?)", pattern[i:])
        width = min(int(m[1]), 10) if m[1] else 0
        kind = m[2]
        values = {"A": array_job_id, "a": task_id, "j": job_id}
        if kind not in values or values[kind] is None:
            raise ValueError(f"cannot expand %{m[1]}{kind} in {pattern!r} (supported: %%, %A, %a, %j with job_id)")
        out.append(str(values[kind]).zfill(width))
        i += m.end()
    return "".join(out)


# --- squeue's job ids of array tasks ------------------------------------------------------------

@dataclass(frozen=True)
class ArrayTasks:
    """The array tasks one squeue record stands for.

    Attributes:
        array_job_id: the array's job id (``"7"``), as text.
        task_ids: task indexes, ascending, without duplicates.
        max_running: the array's ``%K`` limit when squeue printed it (``7_[2-5%2]``), else ``None``.
        truncated: squeue cut the task list (more than 63 characters, ``0,2,4,...``): tasks after
            the cut are missing from ``task_ids``. Run squeue with :data:`SQUEUE_ARRAY_ENV`.
    """

    array_job_id: str
    task_ids: tuple[int, ...]
    max_running: int | None = None
    truncated: bool = False

    @property
    def ids(self) -> tuple[str, ...]:
        """Each task's job id as SLURM commands take it (``7_3``): for ``scancel``, ``squeue -j``."""
        return tuple(f"{self.array_job_id}_{t}" for t in self.task_ids)


_SINGLE = re.compile(r"([0-9]+)_([0-9]+)")
_FOLDED = re.compile(r"([0-9]+)_\[(.*)\]")
_ITEM = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")


def parse_task_list(text: str, what: str | None = None) -> tuple[tuple[int, ...], int | None, bool]:
    """Read SLURM's array task list (``2-5%2``, ``1,3,5-7``, ``0-20:4``, ``0,2,...``).

    Returns:
        ``(task ids ascending, %K limit or None, truncated)``. A list cut with ``...`` (or
        exactly 63 characters long: the cut squeue makes without dots) drops its last item,
        which may be cut in the middle.

    Raises:
        SqueueParseError: not ids, ``A-B`` or ``A-B:S`` ranges separated by commas.
    """
    shown = what or text
    body, pct, limit = text.strip().rpartition("%") if "%" in text else (text.strip(), "", "")
    max_running = None
    if pct:
        if not limit.isdigit():
            raise SqueueParseError(f"bad array task limit in {shown!r}")
        max_running = int(limit)
    truncated = body.endswith("...") or len(body) >= _CUT_LEN
    if body.endswith("..."):
        body = body[:-3]
    items = body.split(",")
    if truncated:
        items = items[:-1]
    ids: set[int] = set()
    for item in items:
        m = _ITEM.fullmatch(item.strip())
        if m is None:
            raise SqueueParseError(f"bad array task list {shown!r}: {item!r} is not N, A-B or A-B:STEP")
        lo = int(m[1])
        hi = int(m[2]) if m[2] is not None else lo
        step = int(m[3]) if m[3] is not None else 1
        if hi < lo or step < 1:
            raise SqueueParseError(f"bad array task list {shown!r}: {item!r} runs backwards or has step 0")
        ids.update(range(lo, hi + 1, step))
    return tuple(sorted(ids)), max_running, truncated


def parse_array_job_id(text: str) -> ArrayTasks | None:
    """Read squeue's job id (``%i``, ``JOBID``) of an array record.

    ``7_3`` is task 3 of array job 7 (a running task, or any task with ``squeue -r``); without
    ``-r`` squeue folds an array's pending tasks into one record, ``7_[2-5%2]`` (tasks 2-5, at
    most 2 at once), ``7_[1,3,5-7]``, ``7_[0-20:4]``, or a list cut at 63 characters
    (``7_[0,2,4,...]``, see :class:`ArrayTasks`). Surrounding spaces (squeue's right-aligned
    column) are ignored.

    Returns:
        :class:`ArrayTasks`, or ``None`` for a job that is not an array task (``7``, or a
        heterogeneous job's ``7+0``).

    Raises:
        SqueueParseError: anything else.
    """
    text = text.strip()
    if re.fullmatch(r"[0-9]+(\+[0-9]+)?", text):
        return None
    m = _SINGLE.fullmatch(text)
    if m:
        return ArrayTasks(m[1], (int(m[2]),))
    m = _FOLDED.fullmatch(text)
    if m is None:
        raise SqueueParseError(f"not a SLURM job id: {text!r}")
    ids, max_running, truncated = parse_task_list(m[2], text)
    return ArrayTasks(m[1], ids, max_running, truncated)


def _json_number(value: object) -> int | None:
    """A number of squeue --json: plain (22.05) or ``{set, infinite, number}`` (23.11+)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def array_tasks_from_json(job: dict) -> ArrayTasks | None:
    """The array tasks of one element of ``squeue --json``'s ``jobs`` list.

    Fields (src/plugins/openapi/v0.0.38/jobs.c in 22.05, data_parser v0.0.40 in 23.11):
    ``array_job_id`` (0 when not an array), ``array_task_id`` (null for the folded record of
    pending tasks), ``array_task_string`` (that record's task list, e.g. ``2-5%2``) and
    ``array_max_tasks``.

    Returns:
        :class:`ArrayTasks`, or ``None`` for a job that is not part of an array.

    Raises:
        SqueueParseError: an unreadable ``array_task_string``, or an array record with neither
            a task id nor a task list.
    """
    array_job = _json_number(job.get("array_job_id"))
    if not array_job:
        return None
    limit = _json_number(job.get("array_max_tasks")) or None
    task_string = job.get("array_task_string") or ""
    if task_string:
        ids, pct_limit, truncated = parse_task_list(task_string, f"{array_job}_[{task_string}]")
        return ArrayTasks(str(array_job), ids, pct_limit or limit, truncated)
    task = _json_number(job.get("array_task_id"))
    if task is None:
        raise SqueueParseError(f"array job {array_job} with neither array_task_id nor array_task_string")
    return ArrayTasks(str(array_job), (task,), limit)


# --- the cluster's limits ------------------------------------------------------------------------

@dataclass(frozen=True)
class ArrayLimits:
    """A cluster's job array limits (slurm.conf(5)).

    Attributes:
        max_array_size: ``MaxArraySize``: task indexes go up to ``max_array_size - 1``; 0 turns
            job arrays off.
        max_array_tasks: ``SchedulerParameters=max_array_tasks=N``: at most N tasks in one array,
            or ``None`` when not set (then ``MaxArraySize`` is the limit).
    """

    max_array_size: int = DEFAULT_MAX_ARRAY_SIZE
    max_array_tasks: int | None = None


def parse_array_limits(show_config: str) -> ArrayLimits:
    """Read the array limits from ``scontrol show config`` output (``Name = value`` lines,
    ``%-23s = %s`` in SLURM 22.05).

    Raises:
        SqueueParseError: no ``MaxArraySize`` line, or one that is not a number.
    """
    values = {}
    for line in show_config.splitlines():
        name, eq, value = line.partition("=")
        if eq:
            values.setdefault(name.strip(), value.strip())
    raw = values.get("MaxArraySize")
    if raw is None or not raw.isdigit():
        raise SqueueParseError(f"scontrol show config gave no MaxArraySize number (got {raw!r})")
    tasks = None
    for param in (values.get("SchedulerParameters") or "").split(","):
        name, _, value = param.strip().partition("=")
        if name == "max_array_tasks" and value.isdigit():
            tasks = int(value)
    return ArrayLimits(int(raw), tasks)


def check_array_size(n_tasks: int, limits: "ArrayLimits | int") -> None:
    """Refuse a sweep of ``n_tasks`` trials that the cluster will not take as one array.

    Task indexes are ``0..n_tasks-1``, so the highest, ``n_tasks - 1``, must be at most
    ``MaxArraySize - 1``; with ``max_array_tasks`` set, ``n_tasks`` must be at most that too.

    Args:
        n_tasks: the trials.
        limits: :class:`ArrayLimits`, or ``MaxArraySize`` alone as a number.

    Raises:
        PlanError: arrays are off (``MaxArraySize = 0``), or the array is larger than a limit;
            the message says the limit and the fix, before anything is submitted.
    """
    if isinstance(limits, int):
        limits = ArrayLimits(limits)
    size = limits.max_array_size
    if size == 0:
        raise PlanError(f"this cluster turns job arrays off (MaxArraySize = 0), and a sweep of {n_tasks} trials is "
                        "one job array there: run it with --scheduler local, or ask the cluster's admins")
    if n_tasks - 1 > size - 1:
        raise PlanError(f"a sweep of {n_tasks:,} trials needs array task indexes 0-{n_tasks - 1}, but this cluster's "
                        f"MaxArraySize is {size:,} (indexes 0-{size - 1}): narrow the sweep to at most {size:,} "
                        "trials, or split it into several sweeps")
    if limits.max_array_tasks is not None and n_tasks > limits.max_array_tasks:
        raise PlanError(f"a sweep of {n_tasks:,} trials is more than this cluster's max_array_tasks "
                        f"({limits.max_array_tasks:,} tasks in one array, SchedulerParameters): narrow the sweep "
                        "or split it into several sweeps")
