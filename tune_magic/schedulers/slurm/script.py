"""The SLURM batch script of one tune_magic job, and the sbatch command that submits it. Pure.

One batch job, any number of nodes, one torchrun agent per node (``--ntasks-per-node=1``). The
script runs on the batch host, which becomes the rendezvous head: it asks
:mod:`.node` for the head's address and a free port, prints ``rendezvous <addr>:<port>``, then
``srun``s the per-node helper, which sets this node's ``--local-addr`` / ``is_host`` / socket
interface and starts the kernel's interpreter ``-m torch.distributed.run`` with the recipe, config
and overrides the local scheduler would launch (one command builder). It ends with the job's own
exit code, written to ``exit_code`` in the job directory first (the same JSON the local exit
wrapper writes), so the outcome never depends on accounting.

The scheduler's and the user's options are ``#SBATCH`` lines at the top of the script (as
torchtune's own ``.slurm`` files, submitit and torchx write them), so ``sbatch job.sbatch`` alone,
run by hand, reproduces the job; the command tune_magic runs is ``sbatch --parsable job.sbatch``.
sbatch lets an ``SBATCH_*`` variable win over a ``#SBATCH`` line, so the scheduler submits without
the variables of the options the script sets (:func:`.options.env_variables_of`): ``SBATCH_*``
still fill in only what neither the user nor the scheduler set.
"""

from __future__ import annotations

import shlex
from typing import Mapping, Sequence

from tune_magic.errors import PlanError
from tune_magic.plan.model import LaunchPlan
from tune_magic.schedulers.slurm.array import escape_filename
from tune_magic.schedulers.slurm.plan import placeholder_positions
from tune_magic.schedulers.slurm.requeue import NOT_REQUEUED, ScriptParts, command_words

def shell_word(token: str) -> str:
    """Quote ``token`` for bash so that it reaches the program exactly as written (``$``, `````,
    ``\\`` and quotes included): every user word is literal, as in a local launch."""
    return shlex.quote(token)


def shell_line(argv: Sequence[str], indent: str = "    ", width: int = 100,
               expand: Mapping[int, str] | None = None) -> str:
    """``argv`` as one bash command, continued over lines of at most ``width`` characters. The
    words at the indexes of ``expand`` become ``"${VARIABLE}"`` (the script's own values, filled in
    on each node); every other word is literal (:func:`shell_word`)."""
    expand = expand or {}
    lines, current = [], ""
    for word in (f'"${{{expand[i]}}}"' if i in expand else shell_word(a) for i, a in enumerate(argv)):
        if current and len(current) + 1 + len(word) > width:
            lines.append(current + " \\")
            current = indent + word
        else:
            current = f"{current} {word}" if current else word
    lines.append(current)
    return "\n".join(lines)


def batch_script(plan: LaunchPlan, *, job_id: str, job_dir: str, cwd: str, python: str, nodes: int,
                 cpus_per_node: int | None, rdzv_conf: str | None, user_endpoint: bool,
                 sbatch_lines: Sequence[str] = (), requeue: ScriptParts | None = None) -> str:
    """The batch script text (bash).

    Args:
        plan: the job's plan; ``plan.argv`` is the per-node torchrun command. Only the words
            :func:`.plan.placeholder_positions` names are filled in by the script
            (``${SLURM_JOB_NUM_NODES}``, ``${SLURM_JOB_ID}``, ``${TUNE_MAGIC_RDZV_ENDPOINT}``);
            every other word, the user's overrides and paths included, reaches the recipe as typed.
        job_id: tune_magic's id of the job.
        job_dir: the job's directory (on a filesystem every node shares).
        cwd: the job's working directory.
        python: the kernel's interpreter (``sys.executable``), also on every node.
        nodes: nodes in the allocation.
        cpus_per_node: CPUs per node, repeated on the ``srun`` line (srun no longer inherits
            ``--cpus-per-task`` since SLURM 22.05), or ``None``.
        rdzv_conf: the user's ``--rdzv-conf`` (merged with the scheduler's on each node), or ``None``.
        user_endpoint: the user gave ``--rdzv-endpoint``: it goes unchanged to every node (no port
            picked, no ``is_host``).
        sbatch_lines: the ``#SBATCH`` lines (:func:`directives`), placed right after the first line
            (sbatch reads directives only before the first command).
        requeue: a requeueable job's own lines (:func:`.requeue.script_parts`), or ``None``.
    """
    env_lines = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in plan.env.items())
    srun = ["srun", f"--nodes={nodes}", "--ntasks-per-node=1"]
    if cpus_per_node:
        srun.append(f"--cpus-per-task={cpus_per_node}")
    srun += ["--kill-on-bad-exit=1", python, "-m", "tune_magic.schedulers.slurm.node", "run"]
    if user_endpoint:
        srun.append("--user-endpoint")
    srun += ["--"]
    expand = {len(srun) + i: var for i, var in placeholder_positions(plan).items()}
    words, array_at = command_words(plan, requeue)
    if array_at is not None:  # a requeued attempt's overrides come from the resume pre-flight: the script's array
        expand[len(srun) + array_at] = "overrides[@]"
    srun += words
    conf = f"export TUNE_MAGIC_RDZV_CONF={shlex.quote(rdzv_conf)}\n" if rdzv_conf else ""
    head = "".join(f"{line}\n" for line in sbatch_lines)
    parts = requeue or NOT_REQUEUED
    return f"""#!/bin/bash
{head}# tune_magic job {job_id}: one torchrun agent per node on {nodes} node(s).
# Written by tune_magic (the SLURM scheduler); sbatch this file to run the job again.
set -u
cd {shlex.quote(cwd)} || exit 1
{env_lines}
job_dir={shlex.quote(job_dir)}
{parts.prelude}# the head is this batch host: its address (never a loopback one) and a port free on it now
read -r head_host head_addr rdzv_port < <({shlex.quote(python)} -m tune_magic.schedulers.slurm.node head)
if [ -z "${{rdzv_port:-}}" ]; then echo "tune_magic: could not find the head node's address" >&2; exit 1; fi
export TUNE_MAGIC_HEAD_HOST="$head_host" TUNE_MAGIC_HEAD_ADDR="$head_addr"
export TUNE_MAGIC_RDZV_ENDPOINT="$head_addr:$rdzv_port"
{conf}echo "rendezvous $TUNE_MAGIC_RDZV_ENDPOINT"
{shell_line(srun, expand=expand)}{parts.run_end}
rc=$?
# the job's own exit code, in the job directory: the outcome never depends on accounting
printf '{{"returncode": %d, "ended_at": %s}}\\n' "$rc" "$(date +%s.%N)" > "$job_dir/.exit_code.$$" \\
    && mv -f "$job_dir/.exit_code.$$" {parts.exit_path}
exit "$rc"
"""


def directive_word(value: str) -> str:
    """``value`` as one argument of an ``#SBATCH`` line, as sbatch's directive parser reads it
    (``_get_argument`` in src/sbatch/opt.c, 22.05): double quotes group, a backslash escapes the
    next character (inside quotes too), an unquoted ``#`` ends the line."""
    if any(c in "\n\r\0" for c in value):
        raise PlanError(f"{value!r}: a line break cannot be part of an sbatch option (the batch script's #SBATCH "
                        "lines hold one option a line); remove it")
    if value and not any(c.isspace() or c in "\"'\\#" for c in value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def output_pattern(path: str) -> str:
    """``path`` as sbatch's ``--output`` takes it: ``%`` starts a filename pattern there (``%j``,
    ``%N``...), so a ``%`` that is part of the path is written ``%%`` (:func:`.array.escape_filename`).

    Raises:
        PlanError: the path holds a backslash (SLURM would then drop it and expand nothing).
    """
    return escape_filename(path)


def directives(*, job_id: str, job_dir: str, cwd: str, nodes: int, gpus_per_node: int | None,
               cpus_per_node: int | None, partition: str | None, time_limit: str | None, account: str | None,
               user_options: Sequence[Sequence[str]], requeue: bool, exports: Sequence[str] = (),
               own_options: Sequence[str] = (), output: str | None = None,
               array: str | None = None) -> list[str]:
    """The batch script's ``#SBATCH`` lines: the scheduler's options, then the user's (one line
    per ``--sbatch=`` value, its words as given). The job's output file is the job's combined log
    (``output.log`` in its directory); the job gets the kernel's environment (``--export=ALL``, and
    the variables the user named: ``exports``). ``own_options``: more of the scheduler's, before the
    user's (``--requeue``, ``--signal=...``); without ``--requeue`` there or ``requeue`` (the user's
    ``--requeue``) the job is submitted ``--no-requeue``.

    Args:
        output: the output file pattern instead (already escaped: e.g. an array task's
            :func:`.array.task_output_pattern`, ``...%A_%a.log``).
        array: sbatch's ``--array`` option (:func:`.array.array_option`) for a job array.

    Raises:
        PlanError: the job directory holds a backslash (see :func:`output_pattern`).
    """
    log = output if output is not None else output_pattern(f"{job_dir}/output.log")
    opts = [f"--job-name=tune_magic-{job_id}", *([array] if array else []), f"--nodes={nodes}", "--ntasks-per-node=1",
            f"--output={log}",
            f"--error={log}", "--open-mode=append", f"--chdir={cwd}", ",".join(["--export=ALL", *exports])]
    for flag, value in (("--gpus-per-node", gpus_per_node), ("--cpus-per-task", cpus_per_node),
                        ("--partition", partition), ("--time", time_limit), ("--account", account)):
        if value:
            opts.append(f"{flag}={value}")
    opts += own_options  # the scheduler's own for --requeue / --resume-on-timeout (.requeue.directive_options)
    if not requeue and "--requeue" not in own_options:
        opts.append("--no-requeue")
    lines = [f"#SBATCH {directive_word(o)}" for o in opts]
    lines += ["#SBATCH " + " ".join(directive_word(w) for w in words) for words in user_options if words]
    return lines


def array_script(*, sweep_id: str, job_dirs: Sequence[str], script_name: str, sbatch_lines: Sequence[str]) -> str:
    """The batch script of a sweep run as one job array (bash): array task ``i`` runs trial
    ``i``'s own batch script (``<job dir>/<script_name>``, :func:`batch_script`: its ``#SBATCH``
    lines are comments there), so each trial writes its exit file in its own job directory and
    runs as a job of its own would.

    Args:
        sweep_id: tune_magic's id of the sweep.
        job_dirs: trial ``i``'s job directory at index ``i`` (quoted: any path is literal).
        script_name: the trial's batch script's file name in its job directory.
        sbatch_lines: the array's ``#SBATCH`` lines (:func:`directives` with ``array`` and a
            per-task ``output``).
    """
    head = "".join(f"{line}\n" for line in sbatch_lines)
    cases = "".join(f"    {i}) job_dir={shlex.quote(d)} ;;\n" for i, d in enumerate(job_dirs))
    return f"""#!/bin/bash
{head}# tune_magic sweep {sweep_id}: {len(job_dirs)} trial(s), one array task each (task i runs trial i).
# Written by tune_magic (the SLURM scheduler); sbatch this file to run the sweep again.
set -u
case "${{SLURM_ARRAY_TASK_ID:-}}" in
{cases}    *) echo "tune_magic: no trial for array task ${{SLURM_ARRAY_TASK_ID:-(none)}}" >&2; exit 1 ;;
esac
exec /bin/bash "$job_dir"/{shlex.quote(script_name)}
"""


def sbatch_argv(script_path: str) -> list[str]:
    """The command that submits the batch script: its options are its own ``#SBATCH`` lines;
    ``--parsable`` makes sbatch answer with the job id alone."""
    return ["sbatch", "--parsable", script_path]
