"""The SLURM batch script of one tune_magic job, and the sbatch command that submits it. Pure.

One batch job, any number of nodes, one torchrun agent per node (``--ntasks-per-node=1``). The
script runs on the batch host, which becomes the rendezvous head: it asks
:mod:`.node` for the head's address and a free port, prints ``rendezvous <addr>:<port>``, then
``srun``s the per-node helper, which sets this node's ``--local-addr`` / ``is_host`` / socket
interface and starts the kernel's interpreter ``-m torch.distributed.run`` with the recipe, config
and overrides the local scheduler would launch (one command builder). It ends with the job's own
exit code, written to ``exit_code`` in the job directory first (the same JSON the local exit
wrapper writes), so the outcome never depends on accounting.

The user's and the scheduler's options go on the sbatch command line (so ``SBATCH_*`` variables
only fill what nobody set); none are ``#SBATCH`` lines.
"""

from __future__ import annotations

import re
import shlex
from typing import Sequence

from tune_magic.plan.model import LaunchPlan

#: Shell variables a plan's argv may name (rendered so the shell expands them on each node).
EXPANDED = ("SLURM_JOB_NUM_NODES", "SLURM_JOB_ID", "TUNE_MAGIC_RDZV_ENDPOINT")
_VAR = re.compile(r"\$\{(" + "|".join(EXPANDED) + r")\}")


def shell_word(token: str) -> str:
    """Quote ``token`` for bash; the placeholders of :data:`EXPANDED` stay expandable."""
    if not _VAR.search(token):
        return shlex.quote(token)
    parts, pos = [], 0
    for m in _VAR.finditer(token):
        if m.start() > pos:
            parts.append(shlex.quote(token[pos : m.start()]))
        parts.append(f'"${{{m.group(1)}}}"')
        pos = m.end()
    if pos < len(token):
        parts.append(shlex.quote(token[pos:]))
    return "".join(parts)


def shell_line(argv: Sequence[str], indent: str = "    ", width: int = 100) -> str:
    """``argv`` as one bash command, continued over lines of at most ``width`` characters."""
    lines, current = [], ""
    for word in (shell_word(a) for a in argv):
        if current and len(current) + 1 + len(word) > width:
            lines.append(current + " \\")
            current = indent + word
        else:
            current = f"{current} {word}" if current else word
    lines.append(current)
    return "\n".join(lines)


def batch_script(plan: LaunchPlan, *, job_id: str, job_dir: str, cwd: str, python: str, nodes: int,
                 cpus_per_node: int | None, rdzv_conf: str | None, user_endpoint: bool) -> str:
    """The batch script text (bash).

    Args:
        plan: the job's plan; ``plan.argv`` is the per-node torchrun command (it may name
            ``${SLURM_JOB_NUM_NODES}``, ``${SLURM_JOB_ID}``, ``${TUNE_MAGIC_RDZV_ENDPOINT}``).
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
    """
    env_lines = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in plan.env.items())
    srun = ["srun", f"--nodes={nodes}", "--ntasks-per-node=1"]
    if cpus_per_node:
        srun.append(f"--cpus-per-task={cpus_per_node}")
    srun += ["--kill-on-bad-exit=1", python, "-m", "tune_magic.schedulers.slurm.node", "run"]
    if user_endpoint:
        srun.append("--user-endpoint")
    srun += ["--", *plan.argv]
    conf = f"export TUNE_MAGIC_RDZV_CONF={shlex.quote(rdzv_conf)}\n" if rdzv_conf else ""
    return f"""#!/bin/bash
# tune_magic job {job_id}: one torchrun agent per node on {nodes} node(s).
# Written by tune_magic (the SLURM scheduler); submitted with sbatch, options on its command line.
set -u
cd {shlex.quote(cwd)} || exit 1
{env_lines}
job_dir={shlex.quote(job_dir)}
# the head is this batch host: its address (never a loopback one) and a port free on it now
read -r head_host head_addr rdzv_port < <({shlex.quote(python)} -m tune_magic.schedulers.slurm.node head)
if [ -z "${{rdzv_port:-}}" ]; then echo "tune_magic: could not find the head node's address" >&2; exit 1; fi
export TUNE_MAGIC_HEAD_HOST="$head_host" TUNE_MAGIC_HEAD_ADDR="$head_addr"
export TUNE_MAGIC_RDZV_ENDPOINT="$head_addr:$rdzv_port"
{conf}echo "rendezvous $TUNE_MAGIC_RDZV_ENDPOINT"
{shell_line(srun)}
rc=$?
# the job's own exit code, in the job directory: the outcome never depends on accounting
printf '{{"returncode": %d, "ended_at": %s}}\\n' "$rc" "$(date +%s.%N)" > "$job_dir/.exit_code.$$" \\
    && mv -f "$job_dir/.exit_code.$$" "$job_dir/exit_code"
exit "$rc"
"""


def sbatch_argv(*, job_id: str, job_dir: str, script_path: str, cwd: str, nodes: int,
                gpus_per_node: int | None, cpus_per_node: int | None, partition: str | None,
                time_limit: str | None, account: str | None, user_options: Sequence[str],
                requeue: bool) -> list[str]:
    """The sbatch command: the scheduler's options, then the user's (``--sbatch=...``), then the
    script. The job's output file is the job's combined log (``output.log`` in its directory)."""
    argv = ["sbatch", "--parsable", f"--job-name=tune_magic-{job_id}", f"--nodes={nodes}", "--ntasks-per-node=1",
            f"--output={job_dir}/output.log", f"--error={job_dir}/output.log", "--open-mode=append",
            f"--chdir={cwd}", "--export=ALL"]
    if gpus_per_node:
        argv.append(f"--gpus-per-node={gpus_per_node}")
    if cpus_per_node:
        argv.append(f"--cpus-per-task={cpus_per_node}")
    if partition:
        argv.append(f"--partition={partition}")
    if time_limit:
        argv.append(f"--time={time_limit}")
    if account:
        argv.append(f"--account={account}")
    if not requeue:
        argv.append("--no-requeue")
    argv += list(user_options)
    argv.append(script_path)
    return argv
