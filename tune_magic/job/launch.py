"""The launch pipeline: words -> a checked plan -> a registered job handed to its scheduler.
One concept: a launch is one sequence of checks then one atomic registration, whatever starts it
(the magic, the CLI, the panel, a sweep's trial, a resume, a checkpoint's evaluation).

A launch registers a record under ``$TUNE_MAGIC_HOME/jobs/<id>/`` and hands it to a scheduler
(:mod:`tune_magic.schedulers`: ``local`` runs it on this machine under a supervisor process). So a
job outlives the process that launched it, and any later process (a new kernel, the CLI) lists,
follows and stops it through the same records (:mod:`tune_magic.job`).

Registration is atomic: the job's directory is prepared under a hidden staging name and renamed
into place with its record in one step, under the launch lock, after the clash checks (GPUs,
directories and rendezvous ports of live jobs). A launcher killed at any moment leaves either
nothing, a staging directory that the next listing removes, or a registered job whose status
becomes true at the next look (``failed``: "the launch was interrupted") — never a directory
without a record or a running record without a process. The steps are fault-injection points
(:mod:`tune_magic.faultpoints`).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from tune_magic import faultpoints, schedulers
from tune_magic.job.clashes import busy_gpus, check_clashes, live_jobs
from tune_magic.errors import PlanError, StateDirError, UserError, warn_launch
from tune_magic.job import Job
from tune_magic.config import catalog
from tune_magic.plan.build import describe_run, place_here
from tune_magic.config.checks import check_overrides
from tune_magic.plan.configview import resolve_dirs, write_overlaid_config
from tune_magic.plan.model import LaunchPlan
from tune_magic.config.resolve import resolve_config
from tune_magic.config.launchwords import check_job_id, split_args, tokenise, with_config
from tune_magic.registry import store as jobstore
from tune_magic.registry.ids import new_job_id
from tune_magic.registry.owner import TOKEN_ENV, new_token
from tune_magic.plan.argsize import check_command_size, check_word_sizes
from tune_magic.registry.store import JobRecord
from tune_magic.schedulers.base import Scheduler, SchedulerOptions
from tune_magic.job.validation import check_dataset_val, disk_warning, keep_checks, val_split_words, validation_of
from tune_magic import gpus as gpu_mod

#: Environment variable: when "1", every launch is a dry run that returns the LaunchPlan.
DRY_RUN_ENV = "TUNE_MAGIC_DRY_RUN"
#: Longest job name accepted, in characters (listings cut names to 40 anyway).
MAX_NAME_CHARS = 1000
#: Largest YAML cell body accepted, in bytes (UTF-8). A config is a few KB; a long value (a prompt
#: template, a list of files) fits many times over. Larger bodies take OmegaConf tens of seconds.
MAX_CELL_BODY_BYTES = 4 << 20


def dry_run_requested(env: Mapping[str, str] | None = None) -> bool:
    """Return True when ``TUNE_MAGIC_DRY_RUN`` asks for dry runs (``1``/``true``/``yes``/``on``);
    ``0``/``false``/``no``/``off`` or unset/empty mean a real launch.

    Raises:
        PlanError: any other value (it fails closed: a typo never starts a real job).
    """
    value = (os.environ if env is None else env).get(DRY_RUN_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise PlanError(f"{DRY_RUN_ENV}={value!r} is neither on (1, true, yes, on) nor off (0, false, no, off); "
                    f"set one of them or unset it")


def launch_options(generic_flags: Sequence[str]) -> list:
    """A launching command's own options: the generic ones named (e.g.
    :data:`tune_magic.plan.options.RUN`), then every installed scheduler's."""
    return [*generic_flags, *schedulers.all_options()]


def scheduler_values(own: Mapping[str, Any]) -> dict[str, Any]:
    """The scheduler options among own options split off a command line (name -> value as typed)."""
    names = {o.name for o in schedulers.all_options()}
    return {k: v for k, v in own.items() if k in names}


def build_plan(
    args: str | Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    gpus: str | Iterable[int] | None = None,
    job_id: str | None = None,
    job_dir: str | os.PathLike | None = None,
    scheduler: str | None = None,
    **options: Any,
) -> LaunchPlan:
    """Build the launch plan for ``tune run``-style arguments, without starting anything.

    Args:
        args: ``[TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value | ~key ...]`` as one string
            (split with :func:`shlex.split`) or a list of strings (taken as is). ``--config=X`` is
            accepted like ``--config X``. RECIPE is a torchtune recipe name, a shipped recipe name
            (``tune-magic ls``) or a ``.py`` path relative to ``cwd``; CONFIG likewise, without
            ``.yaml`` for names.
        env: the job's whole environment (the caller's ``os.environ`` plus the job's additions);
            ``PET_*`` variables in it count like the torchrun flags. Default ``os.environ``.
        cwd: directory that relative paths are resolved from; default the current directory.
        gpus: GPU ids for the job (``"0,1"`` or ``[0, 1]``); sets ``CUDA_VISIBLE_DEVICES`` in the
            plan's env and implies that many processes per node.
        job_id: when given, and the user set no ``output_dir``, the plan adds
            ``output_dir=<config's output_dir>/<job_id>`` so concurrent jobs never share a
            directory. Without it, previews show ``<job-id>`` in its place.
        job_dir: the job's directory (its record and logs). When ``--redirects``/``--tee`` send
            worker output to files and no ``--log-dir`` is given, the plan adds
            ``--log-dir <job_dir>/ranks`` so the files can be found (``<job-dir>`` in its place
            when ``None``).
        scheduler: where the job runs (default ``local``, this machine); the plan is then what each
            node runs (e.g. one torchrun agent per node of one SLURM job).
        options: the scheduler's own options (e.g. ``nodes=2``; see ``tune-magic run --help``).

    Returns:
        The :class:`~tune_magic.plan.model.LaunchPlan`.

    Raises:
        PlanError: any bad input (unknown recipe, missing ``--config``, a multi-node run with no
            endpoint, a malformed endpoint, a torchrun flag after the recipe, an option of another
            scheduler, ...). The message names the fix. Nothing has been started.
    """
    read = schedulers.read_options(scheduler, env, **options)
    spec = describe_run(args, env=env, cwd=cwd, gpus=gpus, job_id=job_id, job_dir=job_dir)
    return schedulers.get(read.scheduler).place(spec, read)


@dataclass
class _Request:
    """One launch's inputs, checked: what :func:`launch` was asked, and the scheduler."""

    tokens: list[str]
    caller_env: dict[str, str]
    cwd: str
    name: str | None
    gpus: Any
    force: bool
    config_overlay: str | None
    options: SchedulerOptions
    sched: Scheduler
    job_id: str
    record_fields: Mapping[str, Any] | None = None
    max_resumes: int | None = None
    sweep: dict | None = None
    val_split: float | None = None
    keep_checkpoints: int | str | None = None


def launch(
    args: str | Sequence[str],
    *,
    name: str | None = None,
    gpus: str | Iterable[int] | None = None,
    cwd: str | os.PathLike | None = None,
    force: bool = False,
    env: Mapping[str, str] | None = None,
    dry_run: bool | None = None,
    config_overlay: str | None = None,
    scheduler: str | None = None,
    job_id: str | None = None,
    record_fields: Mapping[str, Any] | None = None,
    max_resumes: int | None = None,
    sweep_trial: Mapping[str, Any] | None = None,
    val_split: float | None = None,
    keep_checkpoints: int | str | None = None,
    **options: Any,
) -> "Job | LaunchPlan":
    """Launch a ``tune run``-style job in the background and return at once.

    Long: the public API's documented arguments and their type checks; the steps are
    :func:`_dry_run` and :func:`_register_and_submit`.

    Args:
        args: ``[TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value ...]`` (see
            :func:`build_plan`).
        name: free-text name shown in listings (default: the recipe name).
        gpus: GPU ids (``"0,1"``, ``[2, 3]``), or ``"auto"`` for as many free GPUs as the job has
            processes per node. Sets ``CUDA_VISIBLE_DEVICES`` in the job's environment only.
        cwd: working directory of the job and of relative paths (default: the current one).
        force: allow sharing a GPU or an ``output_dir`` with a running job.
        env: the caller's environment (default ``os.environ``); the job gets it plus the plan's
            additions.
        dry_run: return the :class:`LaunchPlan` without starting or registering anything.
            Default: ``TUNE_MAGIC_DRY_RUN=1`` in the environment.
        config_overlay: YAML text of a config mapping (a ``%%tune_run`` cell body). Merged over
            ``--config`` when one is given, else used as the config; the result is saved as
            ``config.yaml`` in the job's directory and launched with ``--config`` pointing at it.
        scheduler: where the job runs: ``"local"`` (default, or ``$TUNE_MAGIC_SCHEDULER``),
            ``"slurm"``, or an installed scheduler's name.
        job_id: the id a dry run's plan is built for (default: a new one, as a launch would pick);
            a real launch always picks its own.
        record_fields: fields of the job's record set when it is registered, in the same atomic
            step (a resume's ``resumed_from`` and ``resume_point``: :mod:`tune_magic.job.resume`).
        max_resumes: when the job fails after saving a checkpoint, start it again from that
            checkpoint, as the same job, at most this many times (``--max-resumes N``; each
            attempt is recorded in ``record.attempts``). For schedulers that do it
            (``Scheduler.relaunches_from_checkpoint``: ``local``) and recipes the resume
            pre-flight knows.
        sweep_trial: set by a sweep for each of its trials (:mod:`tune_magic.sweeping`): the job
            record's ``sweep`` field, ``{"id": sweep id, "trial": index, "name": sweep name}``.
        val_split: hold out the last fraction F (0 < F < 1, whole percents) of the training data as
            ``dataset_val`` (``--val-split F``: ``dataset.split=train[:P%]`` and a copy of ``dataset``
            with ``split=train[P%:]``; :func:`tune_magic.checkpoints.validation.val_split_overrides`).
            A config with a ``dataset_val`` (or ``--val-split``) validates: in the recipe's loop when
            it reads ``dataset_val``, else each saved checkpoint is evaluated by a job of its own
            (:mod:`tune_magic.job.evaluate`); the launch first builds ``dataset_val`` as the recipe
            would.
        keep_checkpoints: keep only the newest N ``epoch_N/`` checkpoints (an int >= 1), or
            ``"best"`` (the best by validation loss and the newest, which a resume needs); older
            ones are removed by the job's keeper once a newer one is complete (and, for ``best``,
            evaluated): :mod:`tune_magic.job.keeper`. Default: every one kept. Either way the
            launch compares what the checkpoints will take with the free space of ``output_dir``'s
            file system: a warning with the numbers when they will not fit, a refusal when not
            even one checkpoint does (:mod:`tune_magic.checkpoints.diskspace`).
        options: the scheduler's own options by name (``nodes=2, partition="gpu"`` for SLURM;
            ``tune-magic run --help`` lists each scheduler's). Another scheduler's option is refused.

    Returns:
        The :class:`~tune_magic.job.Job` (or the plan, for a dry run).

    Raises:
        PlanError: bad arguments, unknown or busy GPUs, an ``output_dir`` used by a running job,
            validation keys or a ``dataset_val`` that cannot work. Nothing has been started.
        StateDirError: ``$TUNE_MAGIC_HOME`` cannot take the job (read-only, full disk).
        JobStartError: the scheduler could not start the job (its record says why).
    """
    request, dry_run = _request(args, name=name, gpus=gpus, cwd=cwd, force=force, env=env, dry_run=dry_run,
                                config_overlay=config_overlay, scheduler=scheduler, job_id=job_id,
                                record_fields=record_fields, max_resumes=max_resumes, sweep_trial=sweep_trial,
                                options=options, val_split=val_split, keep_checkpoints=keep_checkpoints)
    if dry_run:
        return _dry_run(request)
    job = _register_and_submit(request)
    warn_launch(job.record.warnings)  # at the caller's line; the card shows them too
    return job


def register_trial(args: Sequence[str], *, sweep_trial: Mapping[str, Any], name: str, gpus, cwd: str,
                   force: bool, env: Mapping[str, str], config_overlay: str | None, scheduler: str,
                   val_split: float | None = None, keep_checkpoints: int | str | None = None,
                   **options: Any) -> RegisteredJob:
    """Register one trial of a sweep as a job of its scheduler, checked and planned as
    :func:`launch` does, without submitting it: the sweep process registers under the sweep's
    lock and submits outside it (several trials start side by side), and a scheduler that runs a
    whole sweep as one engine job (``Scheduler.sweep_engine``) submits every registered trial at once.

    Returns:
        The :class:`RegisteredJob` (its directory, record and plan); call its ``submit()``, or its
        ``release()`` once the job was handed on by other means.

    Raises:
        PlanError, StateDirError: as :func:`launch`; nothing is registered then.
    """
    request, _ = _request(args, name=name, gpus=gpus, cwd=cwd, force=force, env=env, dry_run=False,
                          config_overlay=config_overlay, scheduler=scheduler, job_id=None, record_fields=None,
                          max_resumes=None, sweep_trial=sweep_trial, options=options, val_split=val_split,
                          keep_checkpoints=keep_checkpoints)
    return _register(request)


def _request(args, *, name, gpus, cwd, force, env, dry_run, config_overlay, scheduler, job_id, record_fields,
             max_resumes, sweep_trial, options, val_split=None, keep_checkpoints=None) -> "tuple[_Request, bool]":
    """Check :func:`launch`'s arguments; return the request and whether it is a dry run."""
    caller_env = dict(os.environ if env is None else env)
    if name is not None and not isinstance(name, str):
        raise PlanError(f"name={name!r}: the job name must be a string")
    if name is not None and len(name) > MAX_NAME_CHARS:
        raise PlanError(f"the job name is {len(name)} characters long; give at most {MAX_NAME_CHARS}")
    if not isinstance(args, (str, list, tuple)):
        raise PlanError(f"args={args!r}: give the tune run-style words as a string or a list of strings")
    for flag, value in (("force", force), ("dry_run", dry_run)):
        if value is not None and not isinstance(value, bool):
            raise PlanError(f"{flag}={value!r}: give True or False")
    read = schedulers.read_options(scheduler, caller_env, **options)
    max_resumes = _check_max_resumes(max_resumes, schedulers.get(read.scheduler))
    if dry_run is None:
        dry_run = dry_run_requested(caller_env)
    tokens = split_args(args)
    check_word_sizes(tokens)  # first: the checks of a 1 MB value would take tens of seconds
    if job_id is not None and not dry_run:
        raise PlanError("job_id is for dry runs only; a launch picks its own id")
    if val_split is not None:  # a number, or its text from a command line or a magic
        from tune_magic.checkpoints.validation import fraction_of

        val_split = fraction_of(val_split)
    request = _Request(tokens=tokens, caller_env=caller_env,
                       cwd=os.path.abspath(os.getcwd() if cwd is None else os.fspath(cwd)), name=name, gpus=gpus,
                       force=force, config_overlay=config_overlay, options=read, sched=schedulers.get(read.scheduler),
                       job_id=check_job_id(job_id) if job_id is not None else new_job_id(),
                       record_fields=record_fields, max_resumes=max_resumes,
                       sweep=dict(sweep_trial) if sweep_trial is not None else None, val_split=val_split,
                       keep_checkpoints=_keep_policy(keep_checkpoints))
    return request, dry_run


def _keep_policy(value: Any) -> "int | str | None":
    """``keep_checkpoints`` read (``None``, an int >= 1, ``"best"``; a string of either is read too).

    Raises:
        PlanError: anything else, e.g. 0 (the message says what is accepted).
    """
    if value is None:
        return None
    from tune_magic.plan.options import generic

    return generic("--keep-checkpoints").read(value if isinstance(value, str) else str(value)
                                             if isinstance(value, int) and not isinstance(value, bool) else value)


def _check_max_resumes(value: Any, sched: Scheduler) -> int | None:
    """``max_resumes`` read (a whole number >= 1, or ``None``), for a scheduler that honours it.

    Raises:
        PlanError: another value, or a scheduler that does not relaunch jobs itself.
    """
    from tune_magic.plan.options import generic

    value = generic("--max-resumes").read(value)
    if value is not None and not sched.relaunches_from_checkpoint:
        raise PlanError(f"--max-resumes {value}: scheduler {sched.name} does not relaunch failed jobs itself; leave "
                        f"--max-resumes out there (its own options may offer a requeue), or resume by hand: "
                        "tune-magic resume JOB")
    return value


def _resumable_recipe(plan: LaunchPlan, max_resumes: int | None) -> None:
    """With ``max_resumes``: the recipe must be one the resume pre-flight knows.

    Raises:
        PlanError: it is not; the message lists the recipes it knows.
    """
    if max_resumes:
        from tune_magic.checkpoints.recipes import recipe_support

        try:
            recipe_support(plan.recipe, plan.recipe_name)
        except PlanError as exc:
            raise PlanError(f"--max-resumes {max_resumes}: {exc}") from None


def _dry_run(req: _Request) -> LaunchPlan:
    """The plan a launch would start; nothing is registered. One file per distinct cell body holds
    its config for the preview."""
    tokens = req.tokens
    if req.config_overlay is not None:
        d = Path(tempfile.gettempdir()) / "tune_magic_dry_run"
        d.mkdir(mode=0o700, exist_ok=True)
        digest = hashlib.sha256(f"{tokens}\0{req.config_overlay}\0{req.cwd}".encode()).hexdigest()[:16]
        tokens, body_warnings = _apply_overlay(tokens, req.config_overlay, req.cwd, d / f"config-{digest}.yaml")
    else:
        body_warnings = []
    plan, _ = _plan(tokens, req.job_id, gpus=req.gpus, cwd=req.cwd, env=req.caller_env, busy={}, options=req.options)
    if req.val_split is not None:
        tokens = tokens + val_split_words(plan, req.val_split)
        plan, _ = _plan(tokens, req.job_id, gpus=req.gpus, cwd=req.cwd, env=req.caller_env, busy={},
                        options=req.options)
    validation, cfg = validation_of(plan)
    keep_checks(req.keep_checkpoints, validation, plan)
    disk = disk_warning(plan, cfg, req.keep_checkpoints)
    plan = replace(plan, warnings=body_warnings + plan.warnings + ([disk] if disk else []))
    _resumable_recipe(plan, req.max_resumes)
    # the job's directory as it would be (the same id-dependent paths a launch gets)
    would_be = jobstore.jobs_root(req.caller_env, create=False) / req.job_id
    plan = replace(plan, **req.sched.prepare(plan, req.options, req.caller_env, would_be))
    problems = resolve_dirs(plan, cwd=req.cwd).errors  # here, a launch would refuse these
    try:
        check_command_size(plan, req.caller_env)
    except PlanError as exc:
        problems.append(str(exc))
    return replace(plan, warnings=plan.warnings + [f"a launch here would refuse this: {e}" for e in problems])


@dataclass
class RegisteredJob:
    """A job registered (listed, its record written) and not handed to its scheduler yet. It holds
    the job's ``supervisor.lock``, so no listing takes it for a launch that died meanwhile.

    Attributes:
        dir: the job's directory.
        record: its first record.
        plan: its plan, as its scheduler prepared it.
        lock_fd: the held lock (``None`` once released).
    """

    dir: Path
    record: JobRecord
    plan: LaunchPlan
    lock_fd: int | None
    _req: _Request

    def submit(self) -> Job:
        """Hand the job to its scheduler (once; the lock goes to its supervisor, or is released).

        Raises:
            JobStartError: the scheduler did not start it (its record says why).
            PlanError: the engine refused it as described; the job is removed again.
        """
        try:
            try:
                self._req.sched.submit(self.dir, self.record, self.plan, self._req.options, self._req.caller_env,
                                       self.lock_fd)
            except UserError:
                jobstore.remove_tree(self.dir)  # the engine refused it as described: nothing runs, nothing listed
                raise
            faultpoints.reached("submitted")
            job = Job(self.dir)
            job.ensure_keeper(env=self._req.caller_env)  # its checkpoints evaluated, and kept as asked
            return job
        finally:
            self.release()

    def release(self) -> None:
        """Let the lock go (after the job was submitted by other means, e.g. one engine job for a sweep)."""
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def _register_and_submit(req: _Request) -> Job:
    """Stage the job's directory, register it under the launch lock, hand it to the scheduler."""
    return _register(req).submit()


def _register(req: _Request) -> RegisteredJob:
    """Stage the job's directory and register it under the launch lock (the clash checks first)."""
    root = jobstore.jobs_root(req.caller_env)
    jobstore.collect_staging(root)
    stage = jobstore.staging_dir(req.job_id, root)
    final = root / req.job_id
    lock_fd: int | None = None
    try:
        try:
            stage.mkdir(mode=0o700)
            faultpoints.reached("staging")
            # held from now until the supervisor inherits it: a registered job always has a live
            # holder (launcher or supervisor) until its supervisor exits
            lock_fd = jobstore.open_nofollow(stage / jobstore.SUPERVISOR_LOCK, os.O_RDWR | os.O_CREAT)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            plan, dirs, resolved, record = _stage(req, root, stage, final)
            # one launch at a time checks for clashes and registers, so two cannot both take a directory or GPU
            with jobstore.flocked(root / jobstore.LAUNCH_LOCK):
                check_clashes(resolved, dirs, live_jobs(jobstore.list_records(root)), force=req.force, plan=plan)
                os.rename(stage, final)
            faultpoints.reached("registered")
            if plan.output_dir and dirs.output_dir:
                _make_private_dir(Path(dirs.output_dir))
        except OSError as exc:
            raise state_error(exc, root) from None
        return RegisteredJob(final, record, plan, lock_fd, req)
    except BaseException:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)  # nothing registered, nothing left behind
        if lock_fd is not None:
            os.close(lock_fd)
        raise


def _stage(req: _Request, root: Path, stage: Path, final: Path):
    """Plan the job for its final directory and write its record, process file and lock into the
    staging directory; return (plan, resolved dirs, resolved GPUs, record)."""
    tokens, body_warnings = req.tokens, []
    if req.config_overlay is not None:  # the job reads it at its final place, once registered
        tokens, body_warnings = _apply_overlay(tokens, req.config_overlay, req.cwd, stage / "config.yaml")
    plan, dirs, resolved = checked_plan(tokens, req.job_id, gpus=req.gpus, cwd=req.cwd, env=req.caller_env,
                                         root=root, force=req.force, job_dir=final, options=req.options)
    if req.val_split is not None:
        tokens = tokens + val_split_words(plan, req.val_split)
        plan, dirs, resolved = checked_plan(tokens, req.job_id, gpus=req.gpus, cwd=req.cwd, env=req.caller_env,
                                             root=root, force=req.force, job_dir=final, options=req.options)
    validation, cfg = validation_of(plan)
    keep_checks(req.keep_checkpoints, validation, plan)
    disk = disk_warning(plan, cfg, req.keep_checkpoints, refuse=True)
    if validation is not None:
        check_dataset_val(plan, cfg, cwd=req.cwd, env=req.caller_env)
    # the record keeps them: the card shows them
    plan = replace(plan, warnings=body_warnings + plan.warnings + ([disk] if disk else []))
    _resumable_recipe(plan, req.max_resumes)
    if req.config_overlay is not None:
        plan = _replace_config(plan, str(final / "config.yaml"))
    plan = replace(plan, **req.sched.prepare(plan, req.options, req.caller_env, final))
    faultpoints.reached("planned")
    record = _record(req, plan, dirs, resolved, final, tokens)
    record.validation = validation.to_record() if validation is not None else None
    record.keep_checkpoints = req.keep_checkpoints
    # the job's secret token, in the environment its processes get (record.env; not in the plan, which
    # a dry run shows alike): a stop signals only processes that carry it (tune_magic.registry.owner)
    token = new_token(req.job_id)
    record.env = {**record.env, TOKEN_ENV: token}
    jobstore.write_record(stage, record)
    jobstore.write_procs(stage, scheduler=req.sched.name, token=token)  # a damaged record still says where it runs
    os.close(jobstore.open_nofollow(stage / jobstore.LOCK, os.O_WRONLY | os.O_CREAT))
    faultpoints.reached("staged")
    return plan, dirs, resolved, record


def _record(req: _Request, plan: LaunchPlan, dirs, resolved, final: Path, tokens: list[str]) -> JobRecord:
    """The job's first record (with ``req.record_fields``, and what a resume launches again: the
    recipe name, the torchrun options as given in ``tokens``, the overrides)."""
    record = JobRecord(
        id=req.job_id, name=req.name or plan.recipe_name or Path(plan.recipe).stem, argv=plan.argv, env=plan.env,
        cwd=req.cwd, log_path=str(final / jobstore.OUTPUT_LOG), started_at=time.time(),
        output_dir=dirs.output_dir, metric_log_dir=dirs.metric_log_dir, checkpoint_dir=dirs.checkpoint_dir,
        gpus=plan.gpus, physical_gpus=resolved.physical if resolved else None, distributed=plan.distributed,
        nproc_per_node=plan.nproc_per_node, rendezvous=plan.rendezvous, rendezvous_endpoint=plan.endpoint,
        warnings=list(dict.fromkeys(dirs.warnings + plan.warnings)),
        recipe=plan.recipe, config=plan.config, rank_log_dir=plan.rank_log_dir, scheduler=req.sched.name,
        scheduler_options=_json_options(req.options), status=req.sched.initial_status.value,
        num_nodes=int(plan.nnodes) if (plan.nnodes or "").isdigit() else 1,
        epochs=dirs.epochs, max_steps_per_epoch=dirs.max_steps_per_epoch, recipe_name=plan.recipe_name,
        torchrun_options=tokenise(tokens).torchrun_tokens, overrides=list(plan.overrides),
        max_resumes=req.max_resumes, sweep=req.sweep,
    )
    for key, value in (req.record_fields or {}).items():
        if key not in JobRecord.__dataclass_fields__ or key in ("id", "status", "extra"):
            raise PlanError(f"record_fields: {key!r} is not a record field a launch may set")
        setattr(record, key, value)
    return record


def _json_options(options: SchedulerOptions) -> dict[str, Any]:
    """The scheduler's options as the record keeps them (tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in options.given().items()}


def _plan(tokens: list[str], job_id: str, *, gpus, cwd: str, env, busy, force: bool = False,
          launching: bool = False, job_dir: Path | None = None,
          options: SchedulerOptions) -> "tuple[LaunchPlan, gpu_mod.ResolvedGpus | None]":
    """The plan and, when launching with GPUs, the GPUs resolved through the kernel's
    ``CUDA_VISIBLE_DEVICES`` (the plan's env then carries the job's real ``CUDA_VISIBLE_DEVICES``).
    Explicit ids are checked at launch only: dry runs for GPU nodes stay buildable here."""
    resolved = None
    if isinstance(gpus, str) and gpus.strip() == "auto":
        probe = place_here(describe_run(tokens, env=env, cwd=cwd))
        nproc = probe.nproc_per_node or "1"
        n = int(nproc) if nproc.isdigit() else 1
        resolved = gpu_mod.resolve_gpus("auto", n, busy, env, force=force)
        gpus = resolved.typed
    spec = describe_run(tokens, env=env, cwd=cwd, gpus=gpus, job_id=job_id, job_dir=job_dir)
    plan = schedulers.get(options.scheduler).place(spec, options)
    if launching and schedulers.get(plan.scheduler).runs_on_this_machine and plan.nproc_per_node == "gpu" and not plan.gpus:
        # torchrun would count CUDA devices in its agent and stop with "Cuda is not available."
        vis = gpu_mod.visibility(env)
        if not vis.gpus:
            raise PlanError(f"--nproc_per_node gpu starts one process per visible GPU, and {vis.describe()}; "
                            f"give a number of processes instead (--nproc_per_node 2) or run where a GPU is")
    if plan.gpus and launching:
        if resolved is None:
            resolved = gpu_mod.resolve_gpus(plan.gpus, len(plan.gpus), busy, env, force=force)
        plan = replace(plan, env={**plan.env, "CUDA_VISIBLE_DEVICES": resolved.cuda_visible_devices})
    elif plan.gpus and "CUDA_VISIBLE_DEVICES" in plan.env:
        # a dry run shows the CUDA_VISIBLE_DEVICES a launch from this kernel would give the job
        # (ids are relative to the kernel's own); it checks nothing against this machine's GPUs
        preview = gpu_mod.preview_cuda_visible_devices(plan.gpus, env)
        if preview is not None:
            plan = replace(plan, env={**plan.env, "CUDA_VISIBLE_DEVICES": preview})
        else:
            visible = env.get("CUDA_VISIBLE_DEVICES", "")
            plan = replace(plan, warnings=plan.warnings + [
                f"GPU ids {','.join(map(str, plan.gpus))} are not all among the {len([v for v in visible.split(',') if v.strip()])} "
                f"GPUs this kernel may use (CUDA_VISIBLE_DEVICES={visible!r}): a launch from here would refuse them"])
    return plan, resolved


def checked_plan(tokens: list[str], job_id: str, *, gpus, cwd: str, env, root: Path, force: bool, job_dir: Path,
                  options: SchedulerOptions):
    """Build the plan and check it against this machine (GPUs visible and free, inputs exist, dirs
    resolve). Busy GPUs are checked again under the launch lock."""
    running = live_jobs(jobstore.list_records(root))
    plan, resolved = _plan(tokens, job_id, gpus=gpus, cwd=cwd, env=env, busy=busy_gpus(running), force=force,
                           launching=True, job_dir=job_dir, options=options)
    check_command_size(plan, env)
    dirs = resolve_dirs(plan, cwd=cwd)
    if dirs.errors:
        raise PlanError(dirs.errors[0] + "; nothing was started")
    if dirs.missing_inputs:
        raise PlanError(missing_inputs_error(plan, dirs.missing_inputs, "every rank"))
    return plan, dirs, resolved


def missing_inputs_error(plan: LaunchPlan, missing, who: str) -> str:
    """The refusal of a plan whose model or tokenizer is not here (every missing path, and the
    config's own ``tune download`` command; :func:`tune_magic.config.modelfiles.missing_model_error`)."""
    from tune_magic.config.modelfiles import missing_model_error

    shipped = Path(plan.config).is_relative_to(catalog.shipped_root())
    hint = ("The shipped configs read the tiny assets: run tune-magic assets, or tune_magic.make_assets()"
            if shipped else "")
    return missing_model_error(missing, plan.config, who=who, shipped_hint=hint)


def state_error(exc: OSError, root: Path) -> StateDirError:
    """Turn a registry write failure at launch (of a job or a sweep) into one paragraph naming the fix."""
    where = root.parent
    if jobstore.disk_full(exc):
        return StateDirError(f"the disk holding TUNE_MAGIC_HOME ({where}) is full ({exc.strerror}); nothing was "
                             "started. Free some space there, or point TUNE_MAGIC_HOME at a disk with room")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return StateDirError(f"TUNE_MAGIC_HOME ({where}) is not writable ({exc.strerror}); nothing was started. "
                             "Point TUNE_MAGIC_HOME at a writable directory to launch jobs (listing works read-only)")
    if exc.errno == errno.ELOOP:
        return StateDirError(f"a symbolic link was planted inside the job registry {root} ({exc.filename}); "
                             "tune_magic never follows links there. Remove it and launch again")
    return StateDirError(f"cannot register the job under {root} ({exc.strerror or exc}); nothing was started")


def _make_private_dir(path: Path) -> None:
    """Create the per-job output_dir the plan added, mode 0700 (it will hold the resolved config
    with every override, and the checkpoints)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    os.chmod(path, 0o700)


def _apply_overlay(tokens: list[str], overlay: str, cwd: str, dest: Path) -> tuple[list[str], list[str]]:
    """Check a YAML cell body against the config it is merged over (its keys and value types, as
    overrides are), write the overlaid config to ``dest`` and point ``--config`` at it; return the
    tokens and the body's warnings (keys the config lacks), which the plan and the record keep."""
    size = len(overlay.encode("utf-8", "surrogatepass"))
    if size > MAX_CELL_BODY_BYTES:
        raise PlanError(f"the cell body is {size / 2**20:.1f} MiB; a YAML body holds a config, at most "
                        f"{MAX_CELL_BODY_BYTES >> 20} MiB: put larger data in a file the recipe reads (and its path in "
                        "the body). Nothing was started")
    tokens, base = with_config(tokens, str(dest))
    base_path = resolve_config(base, Path(cwd))[0] if base is not None else None
    try:
        body_warnings = list(check_overrides(base_path, [], overlay).warnings)
        write_overlaid_config(base_path, overlay, dest)
    except ValueError as exc:
        limit = re.search(r"YAML node expansion exceeds the configured limit of (\d+)", str(exc))
        if limit:  # OmegaConf's limit counts every node, not only the aliases its message speaks of
            raise PlanError(f"the cell body has more than {limit[1]} YAML nodes (keys, values, list items), more than "
                            "OmegaConf reads (max_yaml_expanded_nodes): put that much data in a file the recipe reads, "
                            "or give it as --config FILE. Nothing was started") from None
        raise PlanError(str(exc)) from None
    return tokens, body_warnings


def _replace_config(plan: LaunchPlan, config_at: str) -> LaunchPlan:
    """The plan with its config file moved to ``config_at`` (same content, final place)."""
    staged = plan.config
    return replace(plan, config=config_at, argv=[config_at if a == staged else a for a in plan.argv])


