"""Submitting to SLURM: the per-node command, the batch script, the sbatch call, and a sweep as
one job array. One concept: everything between a launch's plan and SLURM's job id, for one job
and for one array (they share the directives, the script writer and the sbatch call).

The per-node command of a SLURM job (one torchrun agent per node), from the same words as a
local launch: the plan says what to run, this module where and on how many nodes.

The SLURM batch script of one tune_magic job, and the sbatch command that submits it.

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

How sbatch is called: the ``#SBATCH`` lines of a launch's options, the script file, the
environment sbatch runs with, and its answer. Shared by one job and one job array (a sweep).

A sweep on SLURM is ONE job array: ``sbatch --array=0-(N-1)%K``, array task ``i`` = trial ``i``.

There the array is the queue (the local sweep process is not used). Each trial is registered as a
normal SLURM job of tune_magic first (its record, its directory, its own batch script
``job.sbatch``: :func:`.submit.batch_script`), then one array script in the sweep's directory
(``array.sbatch``: :func:`.submit.array_script`) runs trial ``i``'s script in array task ``i``,
so each trial writes its own exit file in its own job directory, as a job of its own does.

- Each task's output is its own file, ``<sweep dir>/logs/<array id>_<task>.log`` (``--output``
  with ``%A_%a``): the trial's log (``record.log_path``).
- Each trial's record keeps ``job_id`` = ``<array id>_<task>`` (``7_3``) in its ``backend``, with
  ``array_job_id``, ``array_task`` and ``array_of`` (the sweep id), so its status comes from
  squeue's line of that task (pending reason included), its stop is ``scancel 7_3`` (the trial
  alone), and the engine id column shows ``7_3``: the single-job code does all of that.
- Stopping the sweep cancels the array's pending tasks (``scancel --state=PENDING <array id>``:
  they never start); each running trial is stopped as a job (a polite signal, then a hard one).
- An array larger than the cluster's ``MaxArraySize`` (``scontrol show config``) is refused
  before anything is registered or submitted (:func:`.array.check_array_size`).

The sweep record's ``engine`` keeps ``array_job_id``, ``script`` and ``conf``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

from tune_magic import faultpoints
from tune_magic.errors import JobStartError, PlanError, UserError
from tune_magic.plan.build import RunSpec
from tune_magic.plan.model import LaunchPlan
from tune_magic.plan.torchrun import check_endpoint, check_nproc, parse_nnodes, rank_log_dir, truthy
from tune_magic.sweeping import store as sweepstore
from tune_magic.registry import store as jobstore
from tune_magic.schedulers.base import SchedulerOptions, SweepSubmission
from tune_magic.schedulers.slurm import status
from tune_magic.schedulers.slurm import options as sopts
from tune_magic.schedulers.slurm.array import (array_option, ArrayLimits, check_array_size, escape_filename,
                                               expand_filename, parse_array_limits, SqueueParseError,
                                               task_output_pattern)
from tune_magic.schedulers.slurm.requeue import NOT_REQUEUED, command_words, ScriptParts


#: torchrun options the SLURM scheduler sets on each node itself: refused under SLURM.
_SLURM_REFUSED = ("node_rank", "master_addr", "master_port", "local_addr", "standalone")


#: torchrun options the SLURM scheduler takes from the user and places itself.
_SLURM_PLACED = ("nnodes", "nproc_per_node", "rdzv_endpoint", "rdzv_backend", "rdzv_id", "rdzv_conf")

#: The scheduler's own torchrun options whose value the batch script fills in on each node, and
#: the variable that value comes from (the plan shows it as ``${VARIABLE}``).
PLACEHOLDERS = {"--nnodes": "SLURM_JOB_NUM_NODES", "--rdzv-endpoint": "TUNE_MAGIC_RDZV_ENDPOINT",
                "--rdzv-id": "SLURM_JOB_ID"}
# the torchrun options :func:`place` writes first, in pairs, before any word of the user's
_OWN_PAIRS = 5
_TORCHRUN_START = 3  # argv: python, -m, torch.distributed.run, <torchrun options>...


def placeholder_positions(plan: LaunchPlan) -> dict[int, str]:
    """``{argv index: variable}`` of the words of ``plan.argv`` that :func:`place` wrote as
    placeholders for the batch script to fill in. Found by position among the scheduler's own
    leading torchrun options, never by their text: a user's word that looks the same (an override
    ``tag=${SLURM_JOB_ID}``, a path) is not one and reaches the recipe exactly as typed."""
    out: dict[int, str] = {}
    if plan.scheduler != "slurm" or plan.rendezvous == "standalone":
        return out
    for k in range(_OWN_PAIRS):
        i = _TORCHRUN_START + 2 * k
        if i + 1 >= len(plan.argv):
            break
        var = PLACEHOLDERS.get(plan.argv[i])
        if var is not None and plan.argv[i + 1] == f"${{{var}}}" and not (
                var == "TUNE_MAGIC_RDZV_ENDPOINT" and plan.rendezvous == "user"):
            out[i + 1] = var
    return out


def place(spec: RunSpec, *, nodes: int | None, gpus_per_node: int | None) -> LaunchPlan:
    """The per-node command of a SLURM job (one torchrun agent per node) for ``spec``.

    On one node without an endpoint of the user's the agent runs ``--standalone`` inside the
    allocation; otherwise every node runs ``--nnodes ${SLURM_JOB_NUM_NODES} --rdzv-endpoint
    ${TUNE_MAGIC_RDZV_ENDPOINT} --rdzv-id ${SLURM_JOB_ID}``, placeholders the batch script fills in
    (the head is the batch host, see :mod:`.submit`; which words they are:
    :func:`placeholder_positions`), or the user's endpoint unchanged.

    Raises:
        PlanError: ``--gpus`` (SLURM allocates GPUs), a torchrun option the scheduler sets per node,
            an elastic ``--nnodes`` range or one that disagrees with ``--nodes``, a one-device
            recipe on several processes.
    """
    _refuse_set_per_node(spec)
    nodes = _node_count(spec, nodes)
    endpoint, warnings = _user_rendezvous(spec)
    nproc, nproc_src = spec.given("nproc_per_node")
    if nproc is not None:
        check_nproc(nproc, nproc_src)
    else:
        nproc = str(gpus_per_node) if gpus_per_node else "1"
    if spec.supports_distributed is False and (nodes > 1 or nproc not in ("1",)):
        raise PlanError(f"recipe {spec.recipe_name} runs on one device and cannot use {nodes} node(s) x {nproc} processes; "
                        "use a *_distributed recipe")
    keep = [t for dest, group in spec.parsed.groups if dest not in _SLURM_REFUSED + _SLURM_PLACED for t in group]
    added_log_dir, rank_logs = rank_log_dir(spec.parsed.torchrun, spec.env, spec.job_dir, spec.cwd)
    keep += added_log_dir
    if nodes == 1 and endpoint is None:
        torchrun_args = ["--standalone", "--nproc_per_node", nproc, *keep]
        rendezvous = "standalone"
    else:
        backend = spec.given("rdzv_backend")[0] or "c10d"
        # the first _OWN_PAIRS pairs are the scheduler's own (placeholder_positions reads them)
        torchrun_args = ["--nnodes", "${SLURM_JOB_NUM_NODES}", "--nproc_per_node", nproc, "--rdzv-backend", backend,
                         "--rdzv-endpoint", endpoint or "${TUNE_MAGIC_RDZV_ENDPOINT}", "--rdzv-id", "${SLURM_JOB_ID}",
                         *keep]
        rendezvous = "user" if endpoint is not None else "scheduler"
    return LaunchPlan(argv=[sys.executable, "-m", "torch.distributed.run", *torchrun_args, *spec.recipe_args],
                      distributed=True, rendezvous=rendezvous, endpoint=endpoint, nproc_per_node=nproc,
                      nnodes=str(nodes), torchrun_args=torchrun_args, rank_log_dir=rank_logs, scheduler="slurm",
                      rdzv_conf=spec.given("rdzv_conf")[0],
                      **{**spec.common, "warnings": [*spec.common.get("warnings", ()), *warnings]})


def _refuse_set_per_node(spec: RunSpec) -> None:
    """Refuse ``--gpus`` and the torchrun options the scheduler sets on each node itself."""
    if spec.gpu_ids is not None:
        raise PlanError("--gpus picks GPUs of this machine; under --scheduler slurm SLURM allocates them: "
                        "give --gpus-per-node G instead")
    for dest in _SLURM_REFUSED:
        value, src = spec.given(dest)
        if value is not None and (dest != "standalone" or truthy(value)):
            fix = f"unset {src}" if src.startswith("PET_") else f"drop {src}"
            raise PlanError(f"{src} is set per node by the SLURM scheduler (head address, a free port, each node's "
                            f"address); {fix}, or use --scheduler local")


def _node_count(spec: RunSpec, nodes: int | None) -> int:
    """The number of nodes: ``--nodes``, or torchrun's ``--nnodes`` (a fixed count), else 1."""
    nnodes, nnodes_src = spec.given("nnodes")
    if nnodes is not None:
        lo, hi = parse_nnodes(nnodes, nnodes_src)
        if lo != hi:
            raise PlanError(f"{nnodes_src} {nnodes}: an elastic range is not supported under SLURM, which allocates "
                            "a fixed number of nodes; give --nodes N")
        if nodes is not None and nodes != lo:
            raise PlanError(f"{nnodes_src} {nnodes} and --nodes {nodes} differ; give one of them (they mean the same)")
        nodes = lo
    return nodes or 1


def _user_rendezvous(spec: RunSpec) -> tuple[str | None, list[str]]:
    """The user's own rendezvous endpoint (checked), or ``None``; and what to warn about it and
    about a ``--rdzv-id`` of theirs, which the job id replaces."""
    warnings = []
    endpoint, endpoint_src = spec.given("rdzv_endpoint")
    if endpoint is not None:
        check_endpoint(endpoint, endpoint_src)
        warnings.append(f"every node must reach your rendezvous endpoint {endpoint} ({endpoint_src}); it goes "
                        "unchanged to every node (leave it out and the scheduler uses the head node and a free port)")
    rdzv_id, id_src = spec.given("rdzv_id")
    if rdzv_id is not None:
        warnings.append(f"{id_src} {rdzv_id} is replaced by the SLURM job id ($SLURM_JOB_ID): one id per job")
    return endpoint, warnings


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
            :func:`.submit.placeholder_positions` names are filled in by the script
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


#: Seconds to wait for sbatch (a submission is not repeated: it waits longer than a status query).
CLIENT_TIMEOUT_S = 60.0


def run_sbatch(argv: list[str], env: Mapping[str, str], timeout: float = CLIENT_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run sbatch (``argv``) with ``env``.

    Raises:
        subprocess.TimeoutExpired: no answer within ``timeout`` seconds.
        OSError: it could not run.
    """
    return subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout)


def call_sbatch(argv: list[str], env: Mapping[str, str], *, refused: str, timed_out: str) -> str:
    """Run sbatch (``argv``) and return what it printed on stdout.

    Args:
        refused: the start of the message when sbatch refuses (``"sbatch refused the job"``).
        timed_out: the message when it does not answer in time (it may still have queued the job).

    Raises:
        JobStartError: no answer within :data:`CLIENT_TIMEOUT_S` (``timed_out``).
        PlanError: sbatch could not run, or refused (``refused: <its words>``); nothing was submitted.
    """
    try:
        r = run_sbatch(argv, env)
    except subprocess.TimeoutExpired:
        raise JobStartError(timed_out) from None
    except OSError as exc:
        raise PlanError(f"sbatch could not run ({exc}); nothing was submitted") from None
    if r.returncode != 0:
        message = " ".join((r.stderr or r.stdout).split()) or f"exit code {r.returncode}"
        raise PlanError(f"{refused}: {message}")
    return r.stdout


def parse_sbatch_id(out: str) -> str | None:
    """SLURM's job id from sbatch's answer: ``--parsable`` gives ``123`` or ``123;cluster``; a site
    wrapper may still print ``Submitted batch job 123``. ``None`` when there is no id."""
    for line in reversed(out.strip().splitlines()):
        first = line.strip().split(";")[0].strip()
        if re.fullmatch(r"\d+(_\d+)?", first):
            return first
        m = re.search(r"Submitted batch job (\d+)", line)
        if m:
            return m.group(1)
    return None


def directive_names(script: str) -> set[str]:
    """The long names of the sbatch options a batch script's ``#SBATCH`` lines set."""
    names: set[str] = set()
    for line in script.splitlines():
        if not line.startswith("#SBATCH "):
            continue
        for word in shlex.split(line[len("#SBATCH "):], comments=True):
            if word.startswith("--"):
                names.add(word[2:].split("=", 1)[0])
            elif word.startswith("-") and len(word) > 1:
                names.update(sopts.short_names(word))
    return names


def sbatch_lines(options: SchedulerOptions, *, job_id: str, job_dir: str, cwd: str, nodes: int,
                 output: str | None = None, array: str | None = None, own_options: Sequence[str] = ()) -> list[str]:
    """The ``#SBATCH`` lines of a job (or, with ``array`` and a per-task ``output``, of a job
    array) with the launch's options (:func:`.submit.directives`); ``own_options``: the scheduler's
    own for ``--requeue`` / ``--resume-on-timeout`` (:func:`.requeue.prepare`).

    Raises:
        PlanError: an ``--sbatch`` option tune_magic sets itself, or a path SLURM would mangle.
    """
    extra = sopts.check_sbatch_options(list(options.get("sbatch", ())))
    return directives(job_id=job_id, job_dir=job_dir, cwd=cwd, nodes=nodes, gpus_per_node=options.get("gpus_per_node"),
                      cpus_per_node=options.get("cpus_per_node"), partition=options.get("partition"),
                      time_limit=options.get("time_limit"), account=options.get("account"), user_options=extra.groups,
                      requeue=extra.requeue, exports=extra.exports, output=output, array=array,
                      own_options=own_options)


def write_script(path: Path, text: str) -> None:
    """Write a batch script (executable, no link followed)."""
    fd = jobstore.open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def submit_env(options: SchedulerOptions, env: Mapping[str, str], script: str) -> dict[str, str]:
    """The environment sbatch runs with for ``script``: the caller's, without the surrounding
    allocation's ``SLURM_*``/``SRUN_*`` (unless the user named them: ``--export=NAME``), the kernel's
    ``CUDA_VISIBLE_DEVICES`` (SLURM allocates the job's GPUs), and the ``SBATCH_*`` variables of
    the options the script's ``#SBATCH`` lines set (sbatch would let those win)."""
    named = sopts.check_sbatch_options(list(options.get("sbatch", ()))).exported_names()
    client_env, _ = sopts.sbatch_env(env, keep=named)
    client_env.pop("CUDA_VISIBLE_DEVICES", None)
    for name in sopts.env_variables_of(directive_names(script)):
        client_env.pop(name, None)
    return client_env


#: The array's batch script, in the sweep's directory.
ARRAY_SCRIPT = "array.sbatch"
#: The folder of the tasks' output files, in the sweep's directory.
TASK_LOGS = "logs"
#: Seconds ``scontrol show config`` may take (the limit is then not checked: sbatch still is).
LIMITS_TIMEOUT_S = 10.0


def array_limits(env: Mapping[str, str]) -> ArrayLimits | None:
    """The cluster's array limits (``scontrol show config``), or ``None`` when it does not answer
    in :data:`LIMITS_TIMEOUT_S` seconds (sbatch then refuses an array too large itself)."""
    r = status.run_bounded(["scontrol", "show", "config"], env, LIMITS_TIMEOUT_S)
    if r is None or r.returncode != 0:
        return None
    try:
        return parse_array_limits(r.stdout)
    except SqueueParseError:
        return None


def find_array(sweep_id: str, env: Mapping[str, str]) -> tuple[str | None, bool]:
    """SLURM's id of the array submitted as ``tune_magic-<sweep_id>`` (a submitter killed between
    sbatch and recording the id leaves only the name), or ``None``; and whether squeue answered."""
    r = status.run_bounded(["squeue", f"--name=tune_magic-{sweep_id}", "--states=all", "--noheader", "--format=%F"],
                          env, status.query_timeout_s())
    if r is None or r.returncode != 0:
        return None, False
    ids = [line.strip() for line in r.stdout.splitlines() if line.strip().isdigit()]
    return (ids[0] if ids else None), True


def adopt_task(job_dir: Path, record, env: Mapping[str, str]) -> dict:
    """The record fields of a trial whose submitter died between sbatch and recording the array's id
    (its ``backend`` has ``array_of`` and ``array_task`` only): its task id and its log, found by
    its array's name; ``{}`` while squeue lists no such array (or does not answer)."""
    array_id, _ = find_array(str(record.backend.get("array_of")), env)
    if array_id is None:
        return {}
    task = int(record.backend.get("array_task"))
    sweep_dir = job_dir.parent.parent / sweepstore.SWEEPS / str(record.backend["array_of"])
    backend = {**record.backend, "array_job_id": array_id, "job_id": f"{array_id}_{task}"}
    if env.get("SLURM_CONF"):
        backend["conf"] = env["SLURM_CONF"]
    return {"backend": backend,
            "log_path": expand_filename(sweep_output_pattern(sweep_dir), array_job_id=array_id, task_id=task)}


def submit_array(sweep: SweepSubmission, *, script_name: str, clients_missing: str) -> None:
    """Register every trial and submit the sweep as one job array (see the module docstring).

    Args:
        sweep: the registered sweep.
        script_name: each trial's batch script's file name in its job directory.
        clients_missing: the message when sbatch is not on PATH.

    Raises:
        PlanError: sbatch missing, an array larger than the cluster takes, a trial a launch
            refuses, or sbatch refused the array; nothing is left registered or submitted.
        JobStartError: sbatch did not answer in time (the trials stay listed; they are found by
            the array's name if SLURM took it).
    """
    if shutil.which("sbatch", path=sweep.env.get("PATH")) is None:
        raise PlanError(clients_missing)
    record, n = sweep.record, len(sweep.record.trials)
    limits = array_limits(sopts.sbatch_env(sweep.env)[0])
    if limits is not None:
        check_array_size(n, limits)
    with sweepstore.locked(sweep.sweep_dir) as rec:
        rec.engine = {"array_job_id": None}  # an engine runs it: no sweep process is ever started for it
    registered = []
    try:
        try:
            for i in range(n):
                job = sweep.register_trial(i)
                registered.append(job)
                write_script(job.dir / script_name, job.plan.batch_script)
                jobstore.update(job.dir, backend={"array_of": record.id, "array_task": i})
            array_id, pattern, env = _sbatch(sweep, [job.dir for job in registered], registered[0].plan, script_name)
            faultpoints.reached("array-sbatch-returned")  # fault tests: killed before the array's id is recorded
        except UserError:
            for job in registered:  # refused as described: nothing runs, nothing listed
                jobstore.remove_tree(job.dir)
            raise
        conf = env.get("SLURM_CONF")
        for i, job in enumerate(registered):
            backend = {"array_of": record.id, "array_task": i, "array_job_id": array_id, "job_id": f"{array_id}_{i}"}
            if conf:
                backend["conf"] = conf
            jobstore.update(job.dir, backend=backend,
                            log_path=expand_filename(pattern, array_job_id=array_id, task_id=i))
        with sweepstore.locked(sweep.sweep_dir) as rec:
            rec.engine = {"array_job_id": array_id, "script": str(sweep.sweep_dir / ARRAY_SCRIPT), "conf": conf}
    finally:
        for job in registered:
            job.release()


def _sbatch(sweep: SweepSubmission, job_dirs: list[Path], first_plan, script_name: str) -> tuple[str, str, dict]:
    """Write the array script and submit it; return (the array's id, the tasks' output pattern,
    the environment sbatch ran with).

    Raises:
        PlanError: sbatch refused it, or could not run.
        JobStartError: no answer in time, or an answer without an id.
    """
    record = sweep.record
    (sweep.sweep_dir / TASK_LOGS).mkdir(mode=0o700, exist_ok=True)  # SLURM creates no folder for an output file
    text = array_text(sweep.sweep_dir, job_dirs, first_plan, record.max_parallel, sweep.options, record.cwd,
                      script_name)
    path = sweep.sweep_dir / ARRAY_SCRIPT
    write_script(path, text)
    env = submit_env(sweep.options, sweep.env, text)
    out = call_sbatch(sbatch_argv(str(path)), env, refused="sbatch refused the sweep's job array",
                      timed_out=f"sbatch did not answer within {CLIENT_TIMEOUT_S:.0f} s; sweep {record.id}'s trials "
                      f"stay listed and are found in squeue as tune_magic-{record.id} if SLURM took the array")
    array_id = parse_sbatch_id(out) or find_array(record.id, env)[0]
    if array_id is None:
        raise JobStartError(f"sbatch answered {out.strip()[:200]!r}, not a job id, and squeue lists no "
                            f"tune_magic-{record.id}; see {sweep.sweep_dir}")
    return array_id, sweep_output_pattern(sweep.sweep_dir), env


def sweep_output_pattern(sweep_dir: Path) -> str:
    """The tasks' ``--output`` pattern: ``<sweep dir>/logs/%A_%a.log`` (the sweep's directory escaped).

    Raises:
        PlanError: a backslash in the path (SLURM would drop it and expand nothing).
    """
    return task_output_pattern(f"{sweep_dir / TASK_LOGS}/")


def array_text(sweep_dir: Path, job_dirs: list[Path], first_plan, max_parallel: int, options, cwd: str,
               script_name: str) -> str:
    """The array's batch script: ``#SBATCH`` lines with the launch's options, ``--array=0-(N-1)%K``
    and the per-task output (:func:`sweep_output_pattern`), then task ``i`` running ``job_dirs[i]``'s
    ``script_name`` (:func:`.submit.array_script`).

    Raises:
        PlanError: an ``--sbatch`` option the scheduler owns, or a path SLURM would mangle.
    """
    lines = sbatch_lines(options, job_id=sweep_dir.name, job_dir=str(sweep_dir), cwd=cwd,
                         nodes=int(first_plan.nnodes or 1), output=sweep_output_pattern(sweep_dir),
                         array=array_option(len(job_dirs), max_parallel))
    return array_script(sweep_id=sweep_dir.name, job_dirs=[str(d) for d in job_dirs], script_name=script_name,
                        sbatch_lines=lines)


def cancel_array(record, scancel: Callable[[list[str], Mapping[str, str]], None]) -> None:
    """Cancel the array's pending tasks (they never start); running trials are stopped as jobs.

    Args:
        record: the sweep's record (``engine["array_job_id"]``).
        scancel: runs ``scancel ARGS`` with an environment (raises when SLURM does not take it).
    """
    array_id = record.engine.get("array_job_id")
    if not array_id:
        return
    env, _ = sopts.sbatch_env(os.environ)
    if record.engine.get("conf"):
        env["SLURM_CONF"] = record.engine["conf"]
    scancel(["--state=PENDING", str(array_id)], env)
