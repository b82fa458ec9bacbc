"""A sweep on SLURM is ONE job array: ``sbatch --array=0-(N-1)%K``, array task ``i`` = trial ``i``.

There the array is the queue (the local sweep process is not used). Each trial is registered as a
normal SLURM job of tune_magic first (its record, its directory, its own batch script
``job.sbatch``: :func:`.script.batch_script`), then one array script in the sweep's directory
(``array.sbatch``: :func:`.script.array_script`) runs trial ``i``'s script in array task ``i``,
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
import shutil
from pathlib import Path
from typing import Callable, Mapping

from tune_magic import faultpoints
from tune_magic.errors import JobStartError, PlanError, UserError
from tune_magic.registry import store as jobstore
from tune_magic.registry import sweepstore
from tune_magic.schedulers.base import SweepSubmission
from tune_magic.schedulers.slurm import options as sopts
from tune_magic.schedulers.slurm import queue
from tune_magic.schedulers.slurm.array import (ArrayLimits, array_option, check_array_size, expand_filename,
                                               parse_array_limits, task_output_pattern)
from tune_magic.schedulers.slurm.parseerror import SqueueParseError
from tune_magic.schedulers.slurm.sbatchcall import (CLIENT_TIMEOUT_S, call_sbatch, parse_sbatch_id, sbatch_lines,
                                                    submit_env, write_script)
from tune_magic.schedulers.slurm.script import array_script, sbatch_argv

#: The array's batch script, in the sweep's directory.
ARRAY_SCRIPT = "array.sbatch"
#: The folder of the tasks' output files, in the sweep's directory.
TASK_LOGS = "logs"
#: Seconds ``scontrol show config`` may take (the limit is then not checked: sbatch still is).
LIMITS_TIMEOUT_S = 10.0


def array_limits(env: Mapping[str, str]) -> ArrayLimits | None:
    """The cluster's array limits (``scontrol show config``), or ``None`` when it does not answer
    in :data:`LIMITS_TIMEOUT_S` seconds (sbatch then refuses an array too large itself)."""
    r = queue.run_bounded(["scontrol", "show", "config"], env, LIMITS_TIMEOUT_S)
    if r is None or r.returncode != 0:
        return None
    try:
        return parse_array_limits(r.stdout)
    except SqueueParseError:
        return None


def find_array(sweep_id: str, env: Mapping[str, str]) -> tuple[str | None, bool]:
    """SLURM's id of the array submitted as ``tune_magic-<sweep_id>`` (a submitter killed between
    sbatch and recording the id leaves only the name), or ``None``; and whether squeue answered."""
    r = queue.run_bounded(["squeue", f"--name=tune_magic-{sweep_id}", "--states=all", "--noheader", "--format=%F"],
                          env, queue.query_timeout_s())
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
            "log_path": expand_filename(output_pattern(sweep_dir), array_job_id=array_id, task_id=task)}


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
    return array_id, output_pattern(sweep.sweep_dir), env


def output_pattern(sweep_dir: Path) -> str:
    """The tasks' ``--output`` pattern: ``<sweep dir>/logs/%A_%a.log`` (the sweep's directory escaped).

    Raises:
        PlanError: a backslash in the path (SLURM would drop it and expand nothing).
    """
    return task_output_pattern(f"{sweep_dir / TASK_LOGS}/")


def array_text(sweep_dir: Path, job_dirs: list[Path], first_plan, max_parallel: int, options, cwd: str,
               script_name: str) -> str:
    """The array's batch script: ``#SBATCH`` lines with the launch's options, ``--array=0-(N-1)%K``
    and the per-task output (:func:`output_pattern`), then task ``i`` running ``job_dirs[i]``'s
    ``script_name`` (:func:`.script.array_script`).

    Raises:
        PlanError: an ``--sbatch`` option the scheduler owns, or a path SLURM would mangle.
    """
    lines = sbatch_lines(options, job_id=sweep_dir.name, job_dir=str(sweep_dir), cwd=cwd,
                         nodes=int(first_plan.nnodes or 1), output=output_pattern(sweep_dir),
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
