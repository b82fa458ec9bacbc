"""A launch's own options — tune_magic's, written before the torchrun options — split off the
``tune run``-style words. Pure; shared by ``%%tune_run``, ``tune-magic run`` / ``cmd`` and the panel.

::

    [OWN OPTIONS] [TORCHRUN OPTIONS] RECIPE --config CONFIG [key=value ...]

Own options come first; the first word that is not one of them starts the ``tune run`` part (a
``--`` ends them explicitly). An own option written later is refused with "put it first", so it is
never handed to torchrun or the recipe. No short forms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from tune_magic.errors import PlanError


@dataclass(frozen=True)
class OwnOption:
    """One own option.

    Attributes:
        flag: ``--nodes``.
        dest: keyword of :func:`tune_magic.launch` it sets (``nodes``).
        kind: ``"value"`` (``--x V`` or ``--x=V``), ``"switch"``, or ``"repeat"`` (``--x=V`` only,
            repeatable; values collected in a list).
        help: one line for help texts.
    """

    flag: str
    dest: str
    kind: str
    help: str


_ALL = [
    OwnOption("--name", "name", "value", "free-text job name (default: the recipe name)"),
    OwnOption("--gpus", "gpus", "value", "GPU ids for this job, e.g. 0,1 (relative to the CUDA_VISIBLE_DEVICES you "
                                         "were given; sets the job's CUDA_VISIBLE_DEVICES only), or auto"),
    OwnOption("--force", "force", "switch", "allow sharing a GPU or output_dir with a running job"),
    OwnOption("--wait", "wait", "switch", "block and stream plain text until the job ends (nbconvert/papermill)"),
    OwnOption("--dry-run", "dry_run", "switch", "show the command (and a SLURM batch script) and return the "
                                                "LaunchPlan; start nothing"),
    OwnOption("--scheduler", "scheduler", "value", "where the job runs: local (default, or $TUNE_MAGIC_SCHEDULER) "
                                                   "or slurm"),
    OwnOption("--nodes", "nodes", "value", "SLURM: nodes for the one job (torchrun's --nnodes)"),
    OwnOption("--gpus-per-node", "gpus_per_node", "value", "SLURM: GPUs per node (processes per node unless "
                                                           "--nproc_per_node is given)"),
    OwnOption("--cpus-per-node", "cpus_per_node", "value", "SLURM: CPUs per node, for the agent and its workers"),
    OwnOption("--partition", "partition", "value", "SLURM: partition (sbatch --partition)"),
    OwnOption("--time", "time_limit", "value", "SLURM: time limit in sbatch's forms (M, M:S, H:M:S, D-H, D-H:M, "
                                               "D-H:M:S, UNLIMITED)"),
    OwnOption("--account", "account", "value", "SLURM: account to charge (sbatch --account)"),
    OwnOption("--sbatch", "sbatch", "repeat", "SLURM: one more sbatch option as written, e.g. --sbatch=--qos=high "
                                              "(repeatable; = form)"),
    OwnOption("--json", "json", "switch", "print the plan as JSON"),
    OwnOption("--job-id", "job_id", "value", "build the plan for this job id (per-job output_dir)"),
    OwnOption("--help", "help", "switch", "show this help"),
    OwnOption("-h", "help", "switch", "show this help"),
]
OPTIONS: dict[str, OwnOption] = {o.flag: o for o in _ALL}

#: The own options of a launch (``%%tune_run``, ``tune-magic run``).
RUN = ("--name", "--gpus", "--force", "--wait", "--dry-run", "--scheduler", "--nodes", "--gpus-per-node",
       "--cpus-per-node", "--partition", "--time", "--account", "--sbatch", "-h", "--help")
#: The own options of ``tune-magic cmd``.
CMD = ("--json", "--gpus", "--job-id", "--scheduler", "--nodes", "--gpus-per-node", "--cpus-per-node",
       "--partition", "--time", "--account", "--sbatch", "-h", "--help")
#: The scheduler's options (``SchedulerOptions`` fields besides ``scheduler``).
SCHEDULER_DESTS = ("nodes", "gpus_per_node", "cpus_per_node", "partition", "time_limit", "account", "sbatch")


def split_own(tokens: Sequence[str], allowed: Iterable[str], where: str = "%%tune_run") -> tuple[dict, list[str]]:
    """Split the leading own options off ``tokens``.

    Args:
        tokens: the words after the magic or command name.
        allowed: the own option flags of this command (e.g. :data:`RUN`).
        where: the command's name, for messages.

    Returns:
        (``{dest: value}`` for the options given — ``True`` for switches, a list for repeatable
        ones — and the remaining ``tune run``-style words).

    Raises:
        PlanError: a value missing, ``--sbatch OPT`` without ``=``, an option given twice with
            different values, or an own option after the ``tune run`` part began ("put it first").
    """
    allowed = set(allowed)
    values: dict = {}
    i = 0
    tokens = list(tokens)
    while i < len(tokens):
        token = tokens[i]
        if token == "--":
            i += 1
            break
        name, eq, attached = token.partition("=")
        opt = OPTIONS.get(name)
        if opt is None or name not in allowed:
            break
        if opt.kind == "switch":
            if eq:
                raise PlanError(f"{name} takes no value; write it alone")
            values[opt.dest] = True
            i += 1
            continue
        if opt.kind == "repeat":
            if not eq:
                raise PlanError(f"write {name}=OPTION (one option per {name}, = form), e.g. {name}=--qos=high")
            values.setdefault(opt.dest, []).append(attached)
            i += 1
            continue
        if eq:
            value, i = attached, i + 1
        else:
            if i + 1 >= len(tokens):
                raise PlanError(f"{name} needs a value: {name} VALUE")
            value, i = tokens[i + 1], i + 2
        if opt.dest in values and values[opt.dest] != value:
            raise PlanError(f"{name} is given twice with different values ({values[opt.dest]!r} and {value!r}); keep one")
        values[opt.dest] = value
    rest = tokens[i:]
    check_misplaced(rest, allowed, where)
    return values, rest


def check_misplaced(rest: Sequence[str], allowed: Iterable[str], where: str = "%%tune_run") -> None:
    """Refuse an own option written after the torchrun options or the recipe began.

    Raises:
        PlanError: naming the option and where it belongs.
    """
    allowed = set(allowed) - {"-h"}  # "-h" after the recipe is the recipe's business
    for token in rest:
        name = token.split("=", 1)[0]
        if name in allowed:
            raise PlanError(f"{name} is an option of {where} itself: put it first, before the torchrun options and "
                            "the recipe")


def help_text(allowed: Iterable[str], usage: str) -> str:
    """A help text listing the own options of a command."""
    lines = [f"usage: {usage}", "", "options (before the torchrun options and the recipe):"]
    seen = set()
    for flag in allowed:
        opt = OPTIONS[flag]
        if opt.dest in seen:
            continue
        seen.add(opt.dest)
        shown = "-h, --help" if opt.dest == "help" else (
            f"{flag}=OPT" if opt.kind == "repeat" else flag if opt.kind == "switch" else f"{flag} VALUE")
        lines.append(f"  {shown:<22} {opt.help}")
    return "\n".join(lines)
