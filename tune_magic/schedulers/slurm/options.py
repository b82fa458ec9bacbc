"""The SLURM scheduler's own options (their checks, and the environment sbatch runs with) and
what ``sinfo`` says of the cluster (whether a controller answers, its partitions).

Checks of the SLURM scheduler's own options, and the environment sbatch runs with.

- :func:`check_time`: ``--time`` in sbatch's own forms.
- :func:`check_nodes` / :func:`check_count`: ``--nodes N`` and the other per-node counts.
- :func:`check_sbatch_options`: the repeatable ``--sbatch=OPT``, handed to sbatch as written
  except the options the scheduler owns (refused, naming the tune_magic option that sets them).
- :func:`sbatch_env`: the kernel's environment minus what must not reach sbatch.

sbatch's option table (:data:`SBATCH_LONG_OPTIONS`, :data:`SBATCH_SHORT_OPTIONS`) is the union
of the options sbatch accepts in SLURM 22.05.8, 23.11.11 and 25.11.7 (``common_options`` in
``src/common/slurm_opt.c``, each option's ``has_arg``). sbatch parses its command line with
``getopt_long``, so a long option may be abbreviated to any unique prefix (``--out=f`` is
``--output=f``): ownership is checked on the resolved name, never on the spelling.

Every error is a :class:`~tune_magic.errors.PlanError` whose message says how to fix it.

Ask ``sinfo`` whether a SLURM controller answers from here, and which partitions it has.

``sbatch`` on PATH says only that SLURM's client tools are installed; whether a controller answers
is another matter (a login node's config missing, a controller down, a machine outside the
cluster). ``sinfo -h -o %P`` answers both questions at once: the partitions, or why not (SLURM
22.05 prints e.g. ``slurm_load_partitions: Unable to contact slurm controller (connect failure)``
after retrying for about 9 s, or ``sinfo: fatal: Could not establish a configuration source``
at once without a config). One answer is kept for :data:`ANSWER_TTL_S` seconds per environment,
so a panel's scheduler note and its partition list cost one run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from tune_magic.errors import PlanError
from tune_magic.plan.options import Option


#: Seconds ``sinfo`` may take; a slower answer counts as none.
SINFO_TIMEOUT_S = 5.0
#: Seconds an answer is reused for the same PATH and SLURM_CONF.
ANSWER_TTL_S = 10.0

_lock = threading.Lock()
_answers: dict[tuple, tuple[float, str | None, str]] = {}


def ask(env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """Run ``sinfo -h -o %P`` (at most once per :data:`ANSWER_TTL_S` for the same PATH and
    SLURM_CONF). Returns ``(its stdout, "")`` when it answered, else ``(None, why)``: ``why`` is
    sinfo's last line of complaint, ``"sinfo is not on PATH"``, or that it did not answer in time."""
    env = os.environ if env is None else env
    key = (env.get("PATH"), env.get("SLURM_CONF"))
    with _lock:
        kept = _answers.get(key)
        if kept is not None and time.monotonic() - kept[0] < ANSWER_TTL_S:
            return kept[1], kept[2]
    exe = shutil.which("sinfo", path=env.get("PATH"))
    if exe is None:
        out, why = None, "sinfo is not on PATH"
    else:
        try:
            r = subprocess.run([exe, "-h", "-o", "%P"], capture_output=True, text=True, timeout=SINFO_TIMEOUT_S,
                               stdin=subprocess.DEVNULL, env=dict(env))
            lines = [line.strip() for line in (r.stderr or r.stdout).splitlines() if line.strip()]
            last = lines[-1].removeprefix("sinfo: ").removeprefix("fatal: ").removeprefix("error: ") if lines else ""
            out, why = (r.stdout, "") if r.returncode == 0 else (None, last or f"sinfo exited with {r.returncode}")
        except subprocess.TimeoutExpired:
            out, why = None, f"sinfo did not answer within {SINFO_TIMEOUT_S:g} s"
        except OSError as exc:
            out, why = None, f"sinfo could not run ({exc.strerror or exc})"
    with _lock:
        _answers[key] = (time.monotonic(), out, why)
    return out, why


def partitions(env: Mapping[str, str] | None = None) -> list[str]:
    """The partitions sinfo lists (the default one's ``*`` removed, the default first), or ``[]``
    when sinfo is missing, fails or takes longer than :data:`SINFO_TIMEOUT_S` seconds."""
    out, _ = ask(env)
    names, default = [], None
    for line in (out or "").splitlines():
        name = line.strip()
        if name.endswith("*"):
            name = default = name[:-1]
        if name and name not in names:
            names.append(name)
    return ([default] if default else []) + [n for n in names if n != default]


def controller_note(env: Mapping[str, str] | None = None) -> str | None:
    """``None`` when a controller answers sinfo, else one line saying that none does and why."""
    out, why = ask(env)
    if out is not None:
        return None
    return f"sbatch is here, but no SLURM controller answers ({why}): a job sent to slurm would not start"


# --- sbatch's options -------------------------------------------------------------------------

_REQUIRED = """
account acctg-freq array autocomplete batch bb bbf begin chdir cluster cluster-constraint clusters
comment constraint container container-id context core-spec cores-per-socket cpu-freq cpus-per-gpu
cpus-per-task deadline delay-boot dependency distribution error exclude export export-file extra
extra-node-info gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres
gres-flags hint input job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem
mem-bind mem-per-cpu mem-per-gpu mincpus network nodefile nodelist nodes ntasks ntasks-per-core
ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres open-mode output partition power
prefer priority profile qos reservation resources segment signal sockets-per-node switches
tasks-per-node thread-spec threads-per-core time time-min tmp tres-bind tres-per-task uid
wait-all-nodes wckey wrap
"""
# an optional argument is only ever attached (--requeue=..., -k...): it never takes the next word
_OPTIONAL = "exclusive get-user-env nice no-kill oom-kill-step propagate requeue resv-ports"
_NONE = """
consolidate-segments contiguous external help hold ignore-pbs no-requeue overcommit oversubscribe
parsable quiet reboot spread-job spread-segments stepmgr test-only usage use-min-nodes verbose
version wait
"""

#: sbatch's long options (without ``--``) -> ``"required"``, ``"optional"`` or ``"none"`` (argument).
SBATCH_LONG_OPTIONS: dict[str, str] = {
    **{n: "required" for n in _REQUIRED.split()},
    **{n: "optional" for n in _OPTIONAL.split()},
    **{n: "none" for n in _NONE.split()},
}

#: sbatch's short options -> their long name.
SBATCH_SHORT_OPTIONS: dict[str, str] = {
    "A": "account", "B": "extra-node-info", "C": "constraint", "D": "chdir", "F": "nodefile",
    "G": "gpus", "H": "hold", "J": "job-name", "L": "licenses", "M": "clusters", "N": "nodes",
    "O": "overcommit", "Q": "quiet", "S": "core-spec", "V": "version", "W": "wait", "a": "array",
    "b": "begin", "c": "cpus-per-task", "d": "dependency", "e": "error", "h": "help", "i": "input",
    "k": "no-kill", "m": "distribution", "n": "ntasks", "o": "output", "p": "partition", "q": "qos",
    "s": "oversubscribe", "t": "time", "v": "verbose", "w": "nodelist", "x": "exclude",
}

_OUTPUT_FIX = "tune_magic sets it: the job's log is the output file in its job directory"

#: Options the scheduler sets itself (long name -> what sets them, for the error message).
OWNED_OPTIONS: dict[str, str] = {
    "nodes": "--nodes N sets it",
    "ntasks": "--nodes N sets it (one torchrun agent per node; processes per node: --nproc_per_node)",
    "ntasks-per-node": "--nodes N sets it (one torchrun agent per node; processes per node: --nproc_per_node)",
    "tasks-per-node": "--nodes N sets it (one torchrun agent per node; processes per node: --nproc_per_node)",
    "output": _OUTPUT_FIX,
    "error": _OUTPUT_FIX,
    "open-mode": _OUTPUT_FIX,
    "chdir": "tune_magic sets the job's working directory",
    "export": ("tune_magic passes the kernel's environment (--export=ALL); set variables there instead, or name "
               "variables to keep or set with --sbatch=--export=NAME,NAME=VALUE (e.g. SRUN_CPUS_PER_TASK, which "
               "is otherwise dropped)"),
    "array": "one tune_magic job is one SLURM job; a sweep (--sweep) is one job array: run a sweep instead",
    "wrap": "tune_magic writes the batch script",
    "wait": "use tune-magic run --wait, or job.wait(), instead",
    "parsable": "tune_magic sets it to read the SLURM job id",
    "job-name": "tune_magic names the job tune_magic-<id>",
}

#: Options that have a tune_magic option of their own (both would reach sbatch and disagree).
OWN_OPTION_EQUIVALENTS: dict[str, str] = {
    "partition": "--partition",
    "time": "--time",
    "account": "--account",
    "cpus-per-task": "--cpus-per-node",
    "gpus-per-node": "--gpus-per-node",
}

#: Options that would break following the job (nothing submitted, or submitted elsewhere).
UNSUPPORTED_OPTIONS: dict[str, str] = {
    "help": "it prints help and submits nothing",
    "usage": "it prints help and submits nothing",
    "version": "it prints the version and submits nothing",
    "test-only": "it submits nothing",
    "clusters": "tune_magic follows jobs on the cluster of SLURM_CONF only",
    "cluster": "tune_magic follows jobs on the cluster of SLURM_CONF only",
}


@dataclass(frozen=True)
class SbatchOptions:
    """The checked ``--sbatch=OPT`` values.

    Attributes:
        argv: the words to hand to sbatch, in the order given (each ``OPT`` split like a shell
            would, so ``--sbatch='--constraint a100'`` gives two words).
        requeue: the user asked for requeue (``--requeue``, not undone by a later
            ``--no-requeue``); without it the scheduler submits with ``--no-requeue``.
        long_names: the long names of the options given (``qos`` for ``-q``/``--qos``).
        groups: the words of each ``--sbatch=`` value (one ``#SBATCH`` line each), without the
            ``--export`` the scheduler merges into its own.
        exports: the variables named by ``--sbatch=--export=NAME[=VALUE],...`` (kept in, or set
            in, the job's environment although the scheduler would drop them), in order.
    """

    argv: tuple[str, ...] = ()
    requeue: bool = False
    long_names: frozenset[str] = frozenset()
    groups: tuple[tuple[str, ...], ...] = ()
    exports: tuple[str, ...] = ()

    def exported_names(self) -> frozenset[str]:
        """The names of :attr:`exports` (``SRUN_CPUS_PER_TASK`` of ``SRUN_CPUS_PER_TASK=4``)."""
        return frozenset(item.split("=", 1)[0] for item in self.exports)


_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(=.*)?", re.DOTALL)


def _export_items(value: str) -> list[str] | None:
    """The variables of an ``--export`` value that only names variables (``NAME``, ``NAME=VALUE``,
    after an optional leading ``ALL``), else ``None`` (``NONE``, ``NIL``, anything else)."""
    items = value.split(",")
    if items and items[0] == "ALL":
        items = items[1:]
    if not items or not all(_VARIABLE.fullmatch(i) for i in items) or items[0] in ("NONE", "NIL"):
        return None
    return items


def _export_word(word: str, words: list[str], i: int, written: str) -> tuple[list[str], int] | None:
    """``(variables, words used)`` when ``words[i]`` is an ``--export`` that only names variables."""
    name, eq, value = word[2:].partition("=")
    if not name or _resolve_long(name, written) != "export":
        return None
    if not eq:
        if i + 1 >= len(words):
            return None
        value = words[i + 1]
    items = _export_items(value)
    return (items, 1 if eq else 2) if items is not None else None


def _resolve_long(name: str, written: str) -> str | None:
    """Return the sbatch long option ``name`` abbreviates (getopt_long's rule), or None if unknown."""
    if name in SBATCH_LONG_OPTIONS:
        return name
    matches = sorted(n for n in SBATCH_LONG_OPTIONS if n.startswith(name))
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        shown = ", ".join(f"--{m}" for m in matches[:6]) + (", ..." if len(matches) > 6 else "")
        raise PlanError(f"--sbatch={written}: --{name} is ambiguous in sbatch ({shown}); write the option in full")
    return None  # not in our table: a newer sbatch may know it; sbatch itself will judge


def _check_allowed(long_name: str, written: str) -> None:
    if long_name in OWNED_OPTIONS:
        raise PlanError(f"--sbatch={written}: the scheduler owns sbatch's --{long_name}; {OWNED_OPTIONS[long_name]}")
    if long_name in OWN_OPTION_EQUIVALENTS:
        own = OWN_OPTION_EQUIVALENTS[long_name]
        raise PlanError(f"--sbatch={written}: use tune_magic's own {own} option instead of sbatch's --{long_name}")
    if long_name in UNSUPPORTED_OPTIONS:
        raise PlanError(f"--sbatch={written}: sbatch's --{long_name} is not supported: {UNSUPPORTED_OPTIONS[long_name]}")


def check_sbatch_options(values: list[str] | tuple[str, ...] | None) -> SbatchOptions:
    """Check the ``--sbatch=OPT`` values and return what to hand to sbatch.

    Each value is split like a shell would (``shlex``) and read the way sbatch's
    ``getopt_long`` reads it: long options may be abbreviated, short ones grouped (``-Hk``) or
    given their value attached (``-pgpu``) or as the next word of the same value
    (``--sbatch='-p gpu'``). An option that needs a value must have it inside the same
    ``--sbatch=``, so a value never swallows whatever tune_magic puts after it.

    ``--export`` is the scheduler's (``--export=ALL``: the job gets the kernel's environment); a
    value that only names variables (``--sbatch=--export=SRUN_CPUS_PER_TASK,FOO=1``) is merged into
    it, and keeps those variables although the scheduler drops ``SRUN_*`` and ``SLURM_*``.

    Args:
        values: the ``OPT`` of each ``--sbatch=OPT``, in order; None or empty: none.

    Returns:
        The words for sbatch, their ``#SBATCH`` lines, the variables exported by name, and whether
        the user asked for requeue.

    Raises:
        PlanError: an option the scheduler owns (naming the tune_magic option that sets it), one
            with a tune_magic option of its own, one that is not supported, an ambiguous
            abbreviation, a missing value, a word that is not an option, or unbalanced quotes.
    """
    argv: list[str] = []
    requeue = False
    names: set[str] = set()
    groups: list[tuple[str, ...]] = []
    exports: list[str] = []
    for written in values or ():
        kept, asked_requeue = _check_value(written, names, exports)
        if asked_requeue is not None:
            requeue = asked_requeue
        argv.extend(kept)
        if kept:
            groups.append(tuple(kept))
    return SbatchOptions(tuple(argv), requeue, frozenset(names), tuple(groups), tuple(exports))


def _check_value(written: str, names: set[str], exports: list[str]) -> tuple[list[str], bool | None]:
    """Check one ``--sbatch=`` value (see :func:`check_sbatch_options`): return its words for sbatch
    and the last ``--requeue``/``--no-requeue`` in it (``None``: neither); add the long names of its
    options to ``names`` and the variables of an ``--export`` that only names variables to ``exports``."""
    try:
        words = shlex.split(written)
    except ValueError as exc:
        raise PlanError(f"--sbatch={written}: {exc}; quote the value as a shell would") from None
    if not words:
        raise PlanError("--sbatch= is empty; give one sbatch option, e.g. --sbatch=--qos=high")
    i = 0
    kept: list[str] = []
    requeue = None
    while i < len(words):
        word = words[i]
        export = _export_word(word, words, i, written) if word.startswith("--") and len(word) > 2 else None
        if export is not None:  # variables to keep or set: merged into the scheduler's --export=ALL
            exports.extend(export[0])
            names.add("export")
            i += export[1]
            continue
        start = i
        if word.startswith("--") and len(word) > 2:
            long_name, used = _check_long(word, words, i, written)
            if long_name is not None:
                names.add(long_name)
            if long_name in ("requeue", "no-requeue"):
                requeue = long_name == "requeue"
            i += used
        elif word.startswith("-") and len(word) > 1 and word != "--":
            names.update(short_names(word))
            i += _check_short_group(word, words, i, written)
        else:
            raise PlanError(
                f"--sbatch={written}: {word!r} is not an sbatch option; each --sbatch= holds one "
                "option with its value, e.g. --sbatch=--qos=high or --sbatch=--constraint=a100"
            )
        kept.extend(words[start:i])
    return kept, requeue


def short_names(word: str) -> list[str]:
    """The long names of ``-abc``'s options (up to the first that takes a value: the rest is it)."""
    out = []
    for letter in word[1:]:
        name = SBATCH_SHORT_OPTIONS.get(letter)
        if name is None:
            break
        out.append(name)
        if SBATCH_LONG_OPTIONS[name] != "none":
            break
    return out


def _check_long(word: str, words: list[str], i: int, written: str) -> tuple[str | None, int]:
    """Check the long option ``word`` (``words[i]`` of ``--sbatch=written``); return its full name
    (``None`` for one sbatch does not know but may: passed through) and how many words it uses
    (2 when its value is the next word)."""
    name, eq, _ = word[2:].partition("=")
    long_name = _resolve_long(name, written)
    if long_name is None:
        return None, 1
    _check_allowed(long_name, written)
    kind = SBATCH_LONG_OPTIONS[long_name]
    if kind == "none" and eq:
        raise PlanError(f"--sbatch={written}: sbatch's --{long_name} takes no value")
    if kind == "required" and not eq:
        if i + 1 >= len(words):
            raise PlanError(
                f"--sbatch={written}: sbatch's --{long_name} needs a value: "
                f"write --sbatch=--{long_name}=VALUE"
            )
        return long_name, 2  # its value is the next word of the same --sbatch=
    return long_name, 1


def _check_short_group(word: str, words: list[str], i: int, written: str) -> int:
    """Check ``-abc`` (getopt's grouped short options); return how many words it used (1 or 2)."""
    for pos, letter in enumerate(word[1:], start=1):
        long_name = SBATCH_SHORT_OPTIONS.get(letter)
        if long_name is None:
            raise PlanError(f"--sbatch={written}: sbatch has no option -{letter}")
        _check_allowed(long_name, written)
        kind = SBATCH_LONG_OPTIONS[long_name]
        rest = word[pos + 1:]
        if kind == "required":
            if rest:
                return 1  # the rest of the word is its value (-pgpu)
            if i + 1 >= len(words):
                raise PlanError(
                    f"--sbatch={written}: sbatch's -{letter} (--{long_name}) needs a value: "
                    f"write --sbatch=--{long_name}=VALUE"
                )
            return 2
        if kind == "optional":
            return 1  # an optional value is only ever attached (-k...)
    return 1


# --- --time and counts ------------------------------------------------------------------------

# re.ASCII: sbatch reads ASCII digits only (a full-width "１２０" is not 120 to it)
_TIME_FORMS = (
    re.compile(r"(?P<m>\d+)", re.ASCII),  # M
    re.compile(r"(?P<m>\d+):(?P<s>\d+)", re.ASCII),  # M:S
    re.compile(r"(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)", re.ASCII),  # H:M:S
    re.compile(r"(?P<d>\d+)-(?P<h>\d+)(?::(?P<m>\d+)(?::(?P<s>\d+))?)?", re.ASCII),  # D-H, D-H:M, D-H:M:S
)
_UNLIMITED = ("UNLIMITED", "INFINITE")


def check_time(text: str) -> str:
    """Check a ``--time`` limit in one of sbatch's forms and return it (surrounding spaces removed).

    Forms (SLURM's ``time_str2secs``): ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``,
    ``D-H:M:S``, and ``UNLIMITED`` / ``INFINITE`` (any case). As in sbatch, fields are not
    range-checked (``90`` and ``1:90:00`` are 90 minutes and 2 h 30 min) and ``0`` means no limit.

    Raises:
        PlanError: any other text (``2h``, ``1:2:3:4``, ``-5``, empty, digits other than ASCII
            ``0-9`` such as ``１２０``), with the forms listed.
    """
    value = (text or "").strip(" \t\n\r\f\v") if isinstance(text, str) else str(text)
    if (value.isascii() and value.upper() in _UNLIMITED) or any(form.fullmatch(value) for form in _TIME_FORMS):
        return value
    shown = repr(text) if isinstance(text, str) else str(text)
    raise PlanError(
        f"--time {shown} is not a SLURM time limit; write minutes (120), M:S, H:M:S (2:00:00), "
        "D-H (1-12), D-H:M, D-H:M:S or UNLIMITED"
    )


def time_limit_seconds(text: str) -> int | None:
    """Return the seconds a valid ``--time`` text means; None for no limit (UNLIMITED, 0).

    Raises:
        PlanError: ``text`` is not a valid ``--time`` (see :func:`check_time`).
    """
    value = check_time(text)
    if value.upper() in _UNLIMITED:
        return None
    for form in _TIME_FORMS:
        m = form.fullmatch(value)
        if m:
            parts = {k: int(v) for k, v in m.groupdict().items() if v is not None}
            total = parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600 + parts.get("m", 0) * 60 + parts.get("s", 0)
            return total or None
    raise AssertionError("unreachable: check_time accepted it")  # pragma: no cover


def check_count(option: str, value: object, minimum: int = 1) -> int:
    """Return ``value`` as a whole number ≥ ``minimum`` for the option named ``option``.

    Accepts an int or the ASCII digits of one (``"2"``); refuses bools, floats, ranges, words
    and other digits (``"２"``).

    Raises:
        PlanError: not a whole number, or below ``minimum``; the message names ``option``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        n = None
    elif isinstance(value, int):
        n = value
    else:
        n = int(value.strip()) if re.fullmatch(r"\s*[+-]?\d+\s*", value, re.ASCII) else None
    if n is None or n < minimum:
        example = f"{option} {max(minimum, 2)}"
        raise PlanError(f"{option} must be a whole number ≥ {minimum}, not {value!r}; e.g. {example}")
    return n


def check_nodes(value: object) -> int:
    """Return ``--nodes`` as an int ≥ 1 (one torchrun agent per node).

    Raises:
        PlanError: not a whole number ≥ 1 (``0``, ``-1``, ``abc``, ``1-2``...).
    """
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*-\s*\d+\s*", value, re.ASCII):
        raise PlanError(f"--nodes {value!r}: a range of nodes is not supported; give one number, e.g. --nodes 2")
    return check_count("--nodes", value, 1)


# --- the environment sbatch runs with ---------------------------------------------------------

#: SBATCH_* variables of options the scheduler owns or refuses (sbatch's env table,
#: src/sbatch/opt.c): ignored, with a warning, because they would change where the log goes,
#: what environment the job gets, or make sbatch block / submit an array / go to another cluster.
IGNORED_SBATCH_VARIABLES: dict[str, str] = {
    "SBATCH_OUTPUT": "the job's log is the output file in its job directory",
    "SBATCH_ERROR": "the job's log is the output file in its job directory",
    "SBATCH_OPEN_MODE": "the job's log is the output file in its job directory",
    "SBATCH_EXPORT": "the job gets the kernel's environment",
    "SBATCH_WAIT": "tune_magic submits without waiting; use run --wait or job.wait()",
    "SBATCH_ARRAY_INX": "one tune_magic job is one SLURM job, not an array",
    "SBATCH_JOB_NAME": "tune_magic names the job tune_magic-<id>",
    "SBATCH_CLUSTERS": "tune_magic follows jobs on the cluster of SLURM_CONF only",
}

#: SLURM_* variables kept for sbatch: which cluster to ask.
KEPT_SLURM_VARIABLES = frozenset({"SLURM_CONF"})
#: Prefixes of the variables of a surrounding allocation that the new job must not inherit.
ALLOCATION_PREFIXES = ("SLURM_", "SRUN_")


def sbatch_env(env: Mapping[str, str], keep: frozenset[str] | set[str] = frozenset()
               ) -> tuple[dict[str, str], list[str]]:
    """Return the environment to run sbatch with, and one warning per variable ignored.

    A kernel started inside a SLURM allocation carries that job's ``SLURM_*`` variables
    (``SLURM_JOB_ID``, ``SLURM_CPUS_PER_TASK``...) and its ``SRUN_*`` ones (``SRUN_CPUS_PER_TASK``,
    which sites tell users to export); sbatch would export them into the new job, where its srun
    reads them and asks for the allocation's shape ("More processors requested than permitted").
    All ``SLURM_*`` and ``SRUN_*`` are removed except :data:`KEPT_SLURM_VARIABLES` and the names
    in ``keep`` (the user named them: ``--sbatch=--export=NAME``). ``SBATCH_*`` variables stay (they
    fill in what the command line leaves out) except :data:`IGNORED_SBATCH_VARIABLES`, removed with
    a warning each. The input is not changed.

    Returns:
        (environment, warnings): a new dict; warnings in the order of :data:`IGNORED_SBATCH_VARIABLES`.
    """
    out = {
        k: v for k, v in env.items()
        if not (k.startswith(ALLOCATION_PREFIXES) and k not in KEPT_SLURM_VARIABLES and k not in keep)
        and k not in IGNORED_SBATCH_VARIABLES
    }
    warnings = [
        f"{name}={env[name]} is ignored: {why}"
        for name, why in IGNORED_SBATCH_VARIABLES.items()
        if name in env
    ]
    return out, warnings


# sbatch's input environment variables whose name is not SBATCH_ + the option's name (sbatch(1))
_ENV_NAMES = {"time": ("SBATCH_TIMELIMIT",), "mem": ("SBATCH_MEM_PER_NODE",), "array": ("SBATCH_ARRAY_INX",),
              "requeue": ("SBATCH_REQUEUE", "SBATCH_NO_REQUEUE"), "no-requeue": ("SBATCH_REQUEUE", "SBATCH_NO_REQUEUE"),
              "verbose": ("SBATCH_DEBUG",)}


def env_variables_of(long_names) -> set[str]:
    """The ``SBATCH_*`` variables that set the sbatch options ``long_names`` (``partition`` ->
    ``SBATCH_PARTITION``, ``time`` -> ``SBATCH_TIMELIMIT``). sbatch lets such a variable win over a
    ``#SBATCH`` line, so the scheduler drops them from the environment it submits with when the
    batch script sets the option: what the user asked for explicitly is what runs."""
    out: set[str] = set()
    for name in long_names:
        out.update(_ENV_NAMES.get(name, ("SBATCH_" + name.upper().replace("-", "_"),)))
    return out


# --- the scheduler's own launch options (declared once; see tune_magic.plan.options) -------------

def _time_option(value: object) -> str:
    """``--time``: one word in sbatch's forms (:func:`check_time`); a bare int is minutes, as sbatch
    reads a bare number."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip() or any(c.isspace() or ord(c) < 32 for c in value):
        raise PlanError(f"--time {value!r} must be one word, e.g. --time 2:00:00")
    return check_time(value)


#: The SLURM scheduler's own launch options.
OPTIONS = (
    Option("--nodes", "nodes", "count", "nodes for the one job (torchrun's --nnodes)", example="2"),
    Option("--gpus-per-node", "gpus_per_node", "count", "GPUs per node (processes per node unless "
                                                         "--nproc_per_node is given)", example="8"),
    Option("--cpus-per-node", "cpus_per_node", "count", "CPUs per node, for the agent and its workers", example="16"),
    Option("--partition", "partition", "text", "partition (sbatch --partition)", example="gpu",
           choices=partitions),
    Option("--time", "time_limit", "text", "time limit in sbatch's forms (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, "
                                           "UNLIMITED)", example="2:00:00", check=_time_option),
    Option("--account", "account", "text", "account to charge (sbatch --account)", example="myproject"),
    Option("--requeue", "requeue", "switch", "let SLURM requeue the job (preemption, scontrol requeue, a node "
                                             "failure); each new attempt resumes from the last checkpoint"),
    Option("--resume-on-timeout", "resume_on_timeout", "count", "requeue the job itself shortly before its time "
                                                                "limit, at most N times; each resumes from the last "
                                                                "checkpoint", example="2"),
    Option("--sbatch", "sbatch", "words", "one more sbatch option as written, e.g. --sbatch=--qos=high "
                                          "(repeatable; = form)", example="--qos=high"),
)
