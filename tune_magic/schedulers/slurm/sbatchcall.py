"""How sbatch is called: the ``#SBATCH`` lines of a launch's options, the script file, the
environment sbatch runs with, and its answer. Shared by one job and one job array (a sweep)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Mapping, Sequence

from tune_magic.errors import JobStartError, PlanError
from tune_magic.registry import store as jobstore
from tune_magic.schedulers.base import SchedulerOptions
from tune_magic.schedulers.slurm import options as sopts
from tune_magic.schedulers.slurm.script import directives

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
    array) with the launch's options (:func:`.script.directives`); ``own_options``: the scheduler's
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


