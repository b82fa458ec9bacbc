"""A launch's own options — tune_magic's, written before the torchrun options — declared once and
split off the ``tune run``-style words. Pure; shared by ``%%tune_run``, ``tune-magic run`` / ``cmd``
and the panel.

::

    [OWN OPTIONS] [TORCHRUN OPTIONS] RECIPE --config CONFIG [key=value ...]

Own options are this module's generic ones (:data:`GENERIC`: ``--name``, ``--gpus``,
``--scheduler``, ...) plus each scheduler's, which a scheduler declares as :class:`Option` rows in
its own package (``Scheduler.options``); everything that shows or reads them — the magic's and the
CLI's arguments and help, ``launch(**options)``, the panel's fields, the record — derives from those
rows. Own options come first; the first word that is not one of them starts the ``tune run`` part
(a ``--`` ends them explicitly). An own option written later is refused with "put it first", so it
is never handed to torchrun or the recipe. No short forms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from tune_magic.errors import PlanError

#: The kinds of option: how the value is written and read.
#: ``text`` one word (``--x V`` or ``--x=V``); ``count`` a whole number >= 1; ``words`` repeatable,
#: ``--x=V`` only, values collected in a list; ``switch`` no value (True when given).
KINDS = ("text", "count", "words", "switch")


@dataclass(frozen=True)
class Option:
    """One own option of a launch, declared once.

    Attributes:
        flag: ``--nodes``.
        name: keyword of :func:`tune_magic.launch` it sets, and its key in the record (``nodes``).
        kind: one of :data:`KINDS`.
        help: one line for help texts.
        example: a valid value, shown in messages and placeholders (``2``, ``2:00:00``).
        check: for scheduler options, a function that takes the value the kind's own reading gave
            and returns it normalised, or raises :class:`~tune_magic.errors.PlanError` naming the fix.
        choices: values to suggest (the panel's choices), from the caller's environment; ``None``
            when any value of the kind goes.
        default: the value when not given (``None``: not asked, the engine's own default).
    """

    flag: str
    name: str
    kind: str
    help: str
    example: str = ""
    check: Callable[[Any], Any] | None = None
    choices: Callable[[Mapping[str, str]], Sequence[str]] | None = None
    default: Any = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"option {self.flag}: kind {self.kind!r} is not one of {KINDS}")
        if not re.fullmatch(r"--[a-z][a-z0-9-]*", self.flag) or not self.name.isidentifier():
            raise ValueError(f"option {self.flag!r} ({self.name!r}): a flag is --lower-case-words and a name an "
                             "identifier")

    def read(self, value: Any) -> Any:
        """Return ``value`` checked and normalised (``None``: not given).

        Raises:
            PlanError: a value of the wrong form; the message names the flag and an example.
        """
        if value is None:
            return None
        example = f", e.g. {self.flag} {self.example}" if self.example else ""
        if self.kind == "switch":
            if not isinstance(value, bool):
                raise PlanError(f"{self.name}={value!r}: give True or False")
        elif self.kind == "count":
            if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):  # ASCII digits only
                value = int(value.strip())
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"{self.flag} {value!r} must be a positive integer{example or f', e.g. {self.flag} 2'}")
        elif self.kind == "words":
            if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(
                    isinstance(v, str) for v in value):
                raise PlanError(f"{self.name} is a list of strings, each one {self.flag}=VALUE as written"
                                f"{f', e.g. [{self.example!r}]' if self.example else ''}")
            value = tuple(value)
        elif self.check is None or not isinstance(value, (int, float)) or isinstance(value, bool):
            if not isinstance(value, str) or not value.strip() or any(c.isspace() or ord(c) < 32 for c in value):
                raise PlanError(f"{self.flag} {value!r} must be one word{example}")
        return self.check(value) if self.check is not None else value


def _keep(value: Any) -> "int | str":
    """``--keep-checkpoints``' value: a whole number >= 1 (the newest N) or ``best``."""
    text = str(value).strip().lower() if not isinstance(value, bool) else ""
    if text == "best":
        return "best"
    if re.fullmatch(r"[0-9]+", text) and int(text) >= 1:
        return int(text)
    raise PlanError(f"--keep-checkpoints {value!r}: give how many of the newest checkpoints to keep (a whole number "
                    ">= 1, e.g. --keep-checkpoints 2), or best (the best by validation loss and the newest, which a "
                    "resume needs)")


GENERIC: tuple[Option, ...] = (
    Option("--name", "name", "text", "free-text job name (default: the recipe name)"),
    Option("--gpus", "gpus", "text", "GPU ids for this job, e.g. 0,1 (relative to the CUDA_VISIBLE_DEVICES you "
                                     "were given; sets the job's CUDA_VISIBLE_DEVICES only), or auto"),
    Option("--force", "force", "switch", "allow sharing a GPU or output_dir with a running job"),
    Option("--wait", "wait", "switch", "block and stream plain text until the job ends (nbconvert/papermill)"),
    Option("--dry-run", "dry_run", "switch", "show the command (and a job script, for schedulers that submit one) "
                                             "and return the LaunchPlan; start nothing"),
    Option("--scheduler", "scheduler", "text", "where the job runs: local (default, or $TUNE_MAGIC_SCHEDULER) or "
                                               "another installed scheduler (see the groups below)"),
    Option("--max-resumes", "max_resumes", "count", "relaunch the job from its last checkpoint when it fails after "
                                                    "saving one, at most N times, as the same job (torchrun's "
                                                    "--max-restarts starts the recipe over)", example="2"),
    Option("--fresh", "fresh", "switch", "the job saved no checkpoint: start it again from the beginning with the "
                                         "same settings"),
    Option("--json", "json", "switch", "print the plan as JSON"),
    Option("--job-id", "job_id", "text", "build the plan for this job id (per-job output_dir)"),
    Option("--help", "help", "switch", "show this help"),
    Option("--sweep", "sweep", "switch", "run a grid of trials: every override whose value is a comma list (or "
                                         "range(start,stop[,step])) is an axis; one job per combination"),
    Option("--max-parallel", "max_parallel", "count", "with --sweep: most trials at once (default: every group of "
                                                      "--gpus; 1 without GPUs)", example="2"),
    Option("--gpus-per-trial", "gpus_per_trial", "count", "with --sweep: GPUs of the --gpus pool each trial gets "
                                                          "(default: its processes per node)", example="2"),
    Option("--max-trials", "max_trials", "count", "with --sweep: the cap on the number of trials (default 1000)",
           example="2000"),
    # its value is read where the config is known: tune_magic.checkpoints.validation.fraction_of
    Option("--val-split", "val_split", "text", "hold out the last fraction F of the training data as dataset_val "
                                               "(dataset.split=train[:P%], dataset_val: the rest): the run "
                                               "validates", example="0.1"),
    Option("--keep-checkpoints", "keep_checkpoints", "text", "keep only the newest N epoch_N/ checkpoints, or best "
                                                             "(the best by validation loss and the newest); older "
                                                             "ones are removed once a newer one is complete",
           example="2", check=_keep),
)
_GENERIC = {o.flag: o for o in GENERIC}
_HELP = _GENERIC["--help"]

#: The own options of a sweep (``--sweep`` and those that only go with it).
SWEEP = ("--sweep", "--max-parallel", "--gpus-per-trial", "--max-trials")
#: The generic own options of a launch (``%%tune_run``, ``tune-magic run``); schedulers add theirs.
RUN = ("--name", "--gpus", "--force", "--wait", "--dry-run", "--scheduler", "--max-resumes", "--val-split",
       "--keep-checkpoints", *SWEEP, "--help")
#: The generic own options of a resume (``%tune_resume``, ``tune-magic resume``).
RESUME = ("--name", "--gpus", "--wait", "--dry-run", "--fresh", "--scheduler", "--max-resumes", "--help")
#: The generic own options of ``tune-magic cmd``.
CMD = ("--json", "--gpus", "--job-id", "--scheduler", "--val-split", "--keep-checkpoints", *SWEEP, "--help")


def check_sweep_options(own: Mapping[str, Any]) -> None:
    """Refuse an option that only goes with ``--sweep`` given without it.

    Args:
        own: the own options split off a command line (name -> value).

    Raises:
        PlanError: naming the option and the fix.
    """
    if own.get("sweep"):
        return
    given = [o for o in map(generic, SWEEP[1:]) if own.get(o.name) is not None]
    if given:
        flag = given[0].flag
        raise PlanError(f"{flag} goes with --sweep (a grid of trials); add --sweep, or drop {flag} to run one job")


def sweep_kwargs(own: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :func:`tune_magic.sweep` among own options split off a line (the
    generic ones; the caller adds the scheduler's): the magic's, the CLI's and the panel's."""
    return {"name": own.get("name"), "gpus": own.get("gpus"), "force": bool(own.get("force")),
            "max_parallel": own.get("max_parallel"), "gpus_per_trial": own.get("gpus_per_trial"),
            "max_trials": own.get("max_trials"), "scheduler": own.get("scheduler"), "val_split": own.get("val_split"),
            "keep_checkpoints": own.get("keep_checkpoints")}


def generic(flag: str) -> Option:
    """The generic option ``flag`` (``-h`` is ``--help``).

    Raises:
        KeyError: not a generic option.
    """
    return _HELP if flag == "-h" else _GENERIC[flag]


def _table(allowed: Iterable[str | Option]) -> dict[str, Option]:
    table = {}
    for item in allowed:
        opt = item if isinstance(item, Option) else generic(item)
        table[opt.flag] = opt
    if "--help" in table:
        table["-h"] = table["--help"]
    return table


def split_own(tokens: Sequence[str], allowed: Iterable[str | Option], where: str = "%%tune_run") -> tuple[dict, list[str]]:
    """Split the leading own options off ``tokens``.

    Args:
        tokens: the words after the magic or command name.
        allowed: the own options of this command: generic flags (e.g. :data:`RUN`) and
            :class:`Option` rows (the schedulers').
        where: the command's name, for messages.

    Returns:
        (``{name: value}`` for the options given — ``True`` for switches, a list for ``words``
        options, the word as typed otherwise — and the remaining ``tune run``-style words).

    Raises:
        PlanError: a value missing, a ``words`` option without ``=``, an option given twice with
            different values, or an own option after the ``tune run`` part began ("put it first").
    """
    table = _table(allowed)
    values: dict = {}
    i = 0
    tokens = list(tokens)
    while i < len(tokens):
        token = tokens[i]
        if token == "--":
            i += 1
            break
        name, eq, attached = token.partition("=")
        opt = table.get(name)
        if opt is None:
            break
        if opt.kind == "switch":
            if eq:
                raise PlanError(f"{name} takes no value; write it alone")
            values[opt.name] = True
            i += 1
            continue
        if opt.kind == "words":
            if not eq:
                example = opt.example or "VALUE"
                raise PlanError(f"write {name}=VALUE (one value per {name}, = form), e.g. {name}={example}")
            values.setdefault(opt.name, []).append(attached)
            i += 1
            continue
        if eq:
            value, i = attached, i + 1
        else:
            if i + 1 >= len(tokens):
                raise PlanError(f"{name} needs a value: {name} VALUE")
            value, i = tokens[i + 1], i + 2
        if opt.name in values and values[opt.name] != value:
            raise PlanError(f"{name} is given twice with different values ({values[opt.name]!r} and {value!r}); keep one")
        values[opt.name] = value
    rest = tokens[i:]
    check_misplaced(rest, table, where)
    return values, rest


def split_job_words(tokens: Sequence[str], allowed: Iterable[str | Option], where: str) -> tuple[str | None, dict, list[str]]:
    """Split the words of a command on one job, ``JOB [OWN OPTIONS] [key=value ...]`` (the own options
    may also come before ``JOB``).

    Returns:
        (the job id, or ``None`` when none was given; the own options as :func:`split_own` reads
        them; the remaining words).

    Raises:
        PlanError: as :func:`split_own`.
    """
    tokens = list(tokens)
    if tokens and not tokens[0].startswith("-"):
        own, rest = split_own(tokens[1:], allowed, where)
        return tokens[0], own, rest
    own, rest = split_own(tokens, allowed, where)
    return (rest[0], own, rest[1:]) if rest else (None, own, [])


def check_misplaced(rest: Sequence[str], allowed: Iterable[str | Option] | Mapping[str, Option],
                    where: str = "%%tune_run") -> None:
    """Refuse an own option written after the torchrun options or the recipe began.

    Raises:
        PlanError: naming the option and where it belongs.
    """
    flags = set(allowed if isinstance(allowed, Mapping) else _table(allowed)) - {"-h"}  # "-h" there is the recipe's
    for token in rest:
        name = token.split("=", 1)[0]
        if name in flags:
            raise PlanError(f"{name} is an option of {where} itself: put it first, before the torchrun options and "
                            "the recipe")


def _shown(opt: Option) -> str:
    if opt.flag == "--help":
        return "-h, --help"
    return {"words": f"{opt.flag}=VALUE", "switch": opt.flag}.get(opt.kind, f"{opt.flag} VALUE")


def help_text(allowed: Iterable[str], usage: str, groups: Sequence[tuple[str, Sequence[Option]]] = ()) -> str:
    """A help text listing a command's generic own options, then each scheduler's.

    Args:
        allowed: the generic flags (e.g. :data:`RUN`).
        usage: the usage line.
        groups: ``(scheduler name, its options)`` pairs, shown under "options of --scheduler NAME".
    """
    lines = [f"usage: {usage}", "", "options (before the torchrun options and the recipe):"]
    for flag in dict.fromkeys(allowed):
        opt = generic(flag)
        lines.append(f"  {_shown(opt):<22} {opt.help}")
    for scheduler, options in groups:
        if options:
            lines += ["", f"options of --scheduler {scheduler}:"]
            lines += [f"  {_shown(opt):<22} {opt.help}" for opt in options]
    return "\n".join(lines)
