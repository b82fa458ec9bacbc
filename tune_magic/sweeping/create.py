"""Making a sweep: everything checked before anything starts, then registered and handed on.

:func:`sweep` reads the axes and trials (:func:`tune_magic.sweeping.grid.plan_sweep`), the slots
(:func:`tune_magic.sweeping.slots.plan_slots`), refuses a rendezvous of the user's own, builds the first
trial's plan as a launch would (recipe, config, overrides, cell body, GPUs, directories), checks
every axis item against the config (:func:`tune_magic.config.checks.check_axis_items`), and only
then registers the sweep (``$TUNE_MAGIC_HOME/sweeps/<id>/``: staged under a hidden name and renamed
into place, as jobs are) and hands it to its scheduler (``Scheduler.sweep_engine``; without one, the
sweep process, which starts the trials). It returns at once; a dry run returns
:class:`SweepDryRun`: the trials and each one's command.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from tune_magic import schedulers
from tune_magic.errors import PlanError, UserError, warn_launch
from tune_magic.job.validation import sweep_disk_warning, validation_of
from tune_magic.job.launch import (MAX_NAME_CHARS, dry_run_requested, launch, missing_inputs_error, register_trial,
                                   state_error)
from tune_magic.config.checks import check_axis_items
from tune_magic.plan.configview import resolve_dirs
from tune_magic.plan.model import LaunchPlan
from tune_magic.gpus import parse_gpu_spec
from tune_magic.sweeping.slots import Slots, plan_slots
from tune_magic.config.shellwords import Word, as_word, split_words
from tune_magic.sweeping.grid import SweepPlan, check_sweep_rendezvous, plan_sweep
from tune_magic.config.launchwords import tokenise
from tune_magic.registry import store as jobstore
from tune_magic.sweeping import store as sweepstore
from tune_magic.registry.files import open_nofollow
from tune_magic.sweeping.record import QUEUED, STARTED, SweepRecord, TrialState
from tune_magic.schedulers.base import SweepSubmission
from tune_magic.sweeping.sweep import Sweep

#: The metric logger whose runs a sweep groups (``metric_logger.group=<sweep>``).
WANDB_LOGGER = "WandBLogger"
#: Trial commands a dry run's text shows in full (the others are summed up).
SHOWN_COMMANDS = 100


@dataclass(frozen=True)
class SweepDryRun:
    """What a sweep would start; nothing was registered.

    Attributes:
        id: the sweep id it was built for (a real sweep picks its own).
        name: the sweep's name.
        plan: the axes and trials.
        plans: each trial's :class:`~tune_magic.plan.model.LaunchPlan`, in trial order (trial i
            shown in slot ``i % max_parallel``; a real sweep starts each in the first free slot).
        engine_job: for a scheduler that submits the whole sweep as one engine job (a job array),
            that job as it would be submitted (its command and script); else ``None``.
        slots: how many trials run at once, and each slot's GPUs.
        extra_overrides: overrides every trial gets (the Weights & Biases group).
        warnings: what the checks said.
    """

    id: str
    name: str
    plan: SweepPlan
    plans: tuple[LaunchPlan, ...]
    slots: Slots
    extra_overrides: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    engine_job: str | None = None

    def __len__(self) -> int:
        return len(self.plan)

    def text(self) -> str:
        """The trials and each one's command, as ``--dry-run`` prints them."""
        grid = " x ".join(f"{len(a)} {a.key}" for a in self.plan.axes)
        gpus = [",".join(map(str, g)) for g in self.slots.gpus if g]
        where = f"on GPUs {' | '.join(gpus)}" if gpus else "without GPUs"
        lines = [f"sweep {self.name}: {len(self)} trial{'s' if len(self) != 1 else ''} ({grid}), "
                 f"{self.slots.max_parallel} at a time {where}"]
        lines += [f"every trial gets {o}" for o in self.extra_overrides]
        lines += [f"warning: {w}" for w in self.warnings]
        for trial, plan in list(zip(self.plan.trials, self.plans))[:SHOWN_COMMANDS]:
            lines += ["", f"trial {trial.index}: {trial.name}", plan.command_line()]
        if len(self) > min(SHOWN_COMMANDS, len(self.plans)):
            lines += ["", f"... and {len(self) - min(SHOWN_COMMANDS, len(self.plans))} more trials"]
        if self.engine_job:
            lines += ["", "the whole sweep is submitted as one job (each trial's command above runs it alone):",
                      self.engine_job]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<SweepDryRun {self.name!r}: {len(self)} trials>"


@dataclass
class _Inputs:
    """A sweep's inputs once read: the words, the body, the options."""

    words: list[Word]
    overlay: str | None
    body_axes: list[tuple[str, list[str]]]
    env: dict[str, str]
    cwd: str
    options: Any  # SchedulerOptions
    launch_options: dict[str, Any]


def sweep(args: "str | Sequence[str | Word]", *, name: str | None = None, gpus: "str | Iterable[int] | None" = None,
          gpus_per_trial: "int | str | None" = None, max_parallel: "int | str | None" = None,
          max_trials: "int | str | None" = None, cwd: "str | os.PathLike | None" = None, force: bool = False,
          env: Mapping[str, str] | None = None, dry_run: bool | None = None, config_overlay: str | None = None,
          scheduler: str | None = None, val_split: float | None = None, keep_checkpoints: "int | str | None" = None,
          **options: Any) -> "Sweep | SweepDryRun":
    """Run a grid of trials, each a normal job, at most ``max_parallel`` at a time; return at once.

    Args:
        args: ``[TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value ...]`` where some overrides
            are axes: a comma list outside brackets and quotes (``optimizer.lr=1e-4,3e-4``) or
            ``range(start, stop[, step])`` (:mod:`tune_magic.config.overrides` (its comma lists and ranges)). A string is split as a
            shell would, remembering quotes (``tag="a,b"`` is one value); a list is taken as is
            (:class:`~tune_magic.config.shellwords.Word` items keep their quotes).
        name: the sweep's name (default: the recipe's). Each trial's job is named by its values
            (``lr=3e-4,lora_rank=8``).
        gpus: the pool of GPU ids the trials share (``"0-7"``, ``"0,1,2,3"``, ``[0, 1]``); default
            every GPU this process may use (none on a CPU machine).
        gpus_per_trial: GPUs each trial gets (default its processes per node).
        max_parallel: most trials at once (default every group of the pool; 1 without GPUs; with a
            scheduler of its own, which queues the trials itself, e.g. a job array: no cap).
        max_trials: the cap on the number of trials (default 1,000).
        cwd, force, env, config_overlay, scheduler, options: as :func:`tune_magic.launch`; a
            YAML ``config_overlay`` may hold a ``sweep:`` mapping of keys to lists of values (more axes).
        val_split: hold out the last fraction (0 < F < 1) of the training data as ``dataset_val``
            in every trial, as :func:`tune_magic.launch`'s; the sweep then ranks by validation loss.
        keep_checkpoints: each trial's retention (an int N >= 1, or ``"best"``), as
            :func:`tune_magic.launch`'s; each trial keeps its own, and the disk pre-flight counts
            every trial's.
        dry_run: return the :class:`SweepDryRun` (each trial's command) without starting anything.
            Default: ``TUNE_MAGIC_DRY_RUN=1``.

    Returns:
        The :class:`~tune_magic.sweeping.sweep.Sweep` (or the dry run).

    Raises:
        PlanError: no axis; an axis on ``output_dir`` or another directory the recipe writes; an
            empty item; more trials than the cap (the message gives the count); ``gpus_per_trial``
            larger than the pool; ``max_parallel`` 0; a rendezvous of your own
            (``--rdzv-endpoint``: every trial would share its port); an item the config cannot
            take; anything a launch refuses. Nothing has been started.
        StateDirError: ``$TUNE_MAGIC_HOME`` cannot take the sweep.
    """
    if dry_run is not None and not isinstance(dry_run, bool):
        raise PlanError(f"dry_run={dry_run!r}: give True or False")
    inputs = _read_inputs(args, name=name, force=force, env=env, cwd=cwd, config_overlay=config_overlay,
                          scheduler=scheduler, options=options, val_split=val_split)
    if dry_run is None:
        dry_run = dry_run_requested(inputs.env)
    return _sweep(inputs, name=name, gpus=gpus, gpus_per_trial=gpus_per_trial, max_parallel=max_parallel,
                  max_trials=max_trials, force=force, dry_run=dry_run, first_only=False, keep=keep_checkpoints)


def preview(args: "str | Sequence[str | Word]", *, name: str | None = None, gpus=None, gpus_per_trial=None,
            max_parallel=None, max_trials=None, cwd=None, force: bool = False, env=None, config_overlay=None,
            scheduler: str | None = None, val_split: float | None = None,
            keep_checkpoints: "int | str | None" = None, **options: Any) -> SweepDryRun:
    """A quick dry run for previews (the launch panel): every check of :func:`sweep`, and the
    first trial's plan only (``plans`` holds one; ``len()`` is still the number of trials).

    Raises:
        PlanError: as :func:`sweep`.
    """
    inputs = _read_inputs(args, name=name, force=force, env=env, cwd=cwd, config_overlay=config_overlay,
                          scheduler=scheduler, options=options, val_split=val_split)
    return _sweep(inputs, name=name, gpus=gpus, gpus_per_trial=gpus_per_trial, max_parallel=max_parallel,
                  max_trials=max_trials, force=force, dry_run=True, first_only=True, keep=keep_checkpoints)


def _sweep(inputs: "_Inputs", *, name, gpus, gpus_per_trial, max_parallel, max_trials, force, dry_run,
           first_only, keep=None) -> "Sweep | SweepDryRun":
    """Check, then return the dry run, or register the sweep and hand it to its scheduler."""
    sweep_id = sweepstore.new_sweep_id()
    plan, slots, first, extra = _check(inputs, sweep_id, name=name, gpus=gpus, gpus_per_trial=gpus_per_trial,
                                       max_parallel=max_parallel, max_trials=max_trials, force=force,
                                       real=not dry_run, keep=keep)
    sweep_name = name or first.recipe_name or Path(first.recipe).stem
    if dry_run:
        return _dry_run(inputs, sweep_id, sweep_name, plan, slots, first, extra, force, first_only)
    warn_launch(first.warnings)  # at the caller's line; the record keeps them too
    record = SweepRecord(
        id=sweep_id, name=sweep_name, created_at=time.time(), cwd=inputs.cwd, python=sys.executable,
        args=list(plan.words), axes=[{"key": a.key, "texts": list(a.texts), "position": a.position} for a in plan.axes],
        trials=[TrialState(index=t.index, name=t.name, words=list(t.words)) for t in plan.trials],
        extra_overrides=list(extra), config_overlay=inputs.overlay, scheduler=inputs.options.scheduler,
        scheduler_options=dict(inputs.launch_options), slots=[list(g) if g else None for g in slots.gpus],
        gpus_per_trial=slots.gpus_per_trial, max_trials=None if max_trials is None else int(max_trials),
        force=force, warnings=list(dict.fromkeys(first.warnings)), keep_checkpoints=keep)
    return _register(inputs, record)


def _read_inputs(args, *, name, force, env, cwd, config_overlay, scheduler, options, val_split=None) -> _Inputs:
    """Check the argument types and read the words, the cell body and the scheduler's options."""
    if name is not None and (not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS):
        raise PlanError(f"name={name!r}: the sweep's name is a non-empty string of at most {MAX_NAME_CHARS} characters")
    if not isinstance(force, bool):
        raise PlanError(f"force={force!r}: give True or False")
    if isinstance(args, str):
        words = split_words(args)
    elif isinstance(args, (list, tuple)) and all(isinstance(a, (str, Word)) for a in args):
        words = [as_word(a) for a in args]
    else:
        raise PlanError(f"args={args!r}: give the tune run-style words as a string or a list of strings")
    caller_env = dict(os.environ if env is None else env)
    read = schedulers.read_options(scheduler, caller_env, **options)
    overlay, body_axes = (None, [])
    if config_overlay is not None:
        if not isinstance(config_overlay, str):
            raise PlanError("config_overlay is the YAML text of a config mapping")
        from tune_magic.config.cellbody import parse_cell_body

        body = parse_cell_body(config_overlay, sweep=True)  # a sweep: mapping comes out of it
        if body.overrides:
            raise PlanError("config_overlay is the YAML text of a config mapping; give key=value overrides in args")
        overlay, body_axes = body.config_yaml, [(key, list(items)) for key, items in body.sweep]
    inputs = _Inputs(words=words, overlay=overlay, body_axes=body_axes, env=caller_env,
                     cwd=os.path.abspath(os.getcwd() if cwd is None else os.fspath(cwd)), options=read,
                     launch_options={k: v for k, v in options.items() if v is not None})
    if val_split is not None:
        from tune_magic.job.validation import fraction_of

        inputs.words = inputs.words + _val_split_words(inputs, fraction_of(val_split))
    return inputs


def _val_split_words(inputs: _Inputs, fraction: float) -> list[Word]:
    """``--val-split F`` as two more words of every trial (:func:`tune_magic.launch`'s ``val_split``),
    read from the first trial's config; typed as quoted words, so their commas make no axis."""
    from tune_magic.job.validation import val_split_words

    plan = plan_sweep(inputs.words, body_axes=inputs.body_axes, max_trials=None)
    first = launch(plan.args(0), cwd=inputs.cwd, env=inputs.env, dry_run=True, config_overlay=inputs.overlay,
                   scheduler=inputs.options.scheduler, **inputs.launch_options)
    return [Word(w, frozenset(range(w.index("=") + 1, len(w)))) for w in val_split_words(first, fraction)]


def _check(inputs: _Inputs, sweep_id: str, *, name, gpus, gpus_per_trial, max_parallel, max_trials, force, real,
           keep=None):
    """Everything refused before anything starts; return (trials, slots, first trial's plan, extra overrides)."""
    plan = plan_sweep(inputs.words, body_axes=inputs.body_axes, max_trials=max_trials)
    parsed = tokenise(plan.args(0))
    check_sweep_rendezvous(parsed.torchrun, inputs.env)
    slots = _slots(len(plan), parsed.torchrun.get("nproc_per_node") or inputs.env.get("PET_NPROC_PER_NODE"),
                   gpus=gpus, gpus_per_trial=gpus_per_trial, max_parallel=max_parallel, env=inputs.env,
                   scheduler=schedulers.get(inputs.options.scheduler), checking=real)
    first = _trial_plan(inputs, plan, 0, slots, (), force, keep)
    extra: tuple[str, ...] = ()
    if _uses_wandb(first) and not any(w.split("=", 1)[0].lstrip("+") == "metric_logger.group" for w in plan.words):
        extra = (_group_override(name or sweep_id),)
        first = _trial_plan(inputs, plan, 0, slots, extra, force, keep)
    validation, cfg = validation_of(first)
    disk = sweep_disk_warning(first, cfg, keep, len(plan), refuse=real)
    if disk:
        first = replace(first, warnings=[*first.warnings, disk])
    check_axis_items(first.config, [(a.key, a.texts) for a in plan.axes])
    if real:
        refused = [w for w in first.warnings if w.startswith("a launch here would refuse this: ")]
        if refused:
            raise PlanError(refused[0].split(": ", 1)[1] + "; nothing was started")
        missing = resolve_dirs(first, cwd=inputs.cwd).missing_inputs
        if missing:
            raise PlanError(missing_inputs_error(first, missing, "every trial"))
        if validation is not None:
            from tune_magic.job.validation import check_dataset_val

            check_dataset_val(first, cfg, cwd=inputs.cwd, env=inputs.env)
    return plan, slots, first, extra


def _slots(n_trials: int, nproc, *, gpus, gpus_per_trial, max_parallel, env, scheduler, checking: bool) -> Slots:
    """The slots: the pool is ``gpus``, else every GPU visible here when the scheduler runs jobs on
    this machine (cut to a multiple of the GPUs per trial), else none; without a pool and without
    ``max_parallel``, the scheduler's default (:meth:`~tune_magic.schedulers.base.Scheduler.default_max_parallel`).
    With ``checking``, explicit ids must be GPUs this process may use."""
    from tune_magic import gpus as gpu_mod

    local = scheduler.runs_on_this_machine
    implicit = gpus is None or (isinstance(gpus, str) and gpus.strip() in ("", "auto"))
    if implicit:
        pool = [g.typed for g in gpu_mod.visibility(env).gpus] if local else []
        if pool:
            per = int(gpus_per_trial) if str(gpus_per_trial or "").strip().isdigit() and int(gpus_per_trial) > 0 else (
                int(nproc) if str(nproc or "").isdigit() and int(nproc) > 0 else 1)
            pool = pool[:len(pool) - len(pool) % per] or pool
    else:
        pool = parse_gpu_spec(gpus) or []
    if max_parallel is None and not pool:
        max_parallel = scheduler.default_max_parallel(n_trials)
    slots = plan_slots(n_trials=n_trials, pool=pool or None, gpus_per_trial=gpus_per_trial,
                       max_parallel=max_parallel, nproc_per_node=nproc)
    if pool and not implicit and checking and local:
        gpu_mod.resolve_gpus(pool, len(pool), {}, env, force=True)  # ids this process may use, or GpuError
    return slots


def _trial_plan(inputs: _Inputs, plan: SweepPlan, index: int, slots: Slots, extra: Sequence[str],
                force: bool, keep=None) -> LaunchPlan:
    """Trial ``index``'s plan as a launch would build it (in slot ``index % max_parallel``)."""
    gpus = slots.gpus[index % slots.max_parallel]
    return launch(plan.args(index) + list(extra), name=plan.trials[index].name, gpus=list(gpus) if gpus else None,
                  cwd=inputs.cwd, force=force, env=inputs.env, dry_run=True, config_overlay=inputs.overlay,
                  scheduler=inputs.options.scheduler, keep_checkpoints=keep, **inputs.launch_options)


def _uses_wandb(plan: LaunchPlan) -> bool:
    """Whether the plan's config (with its overrides) logs to Weights & Biases."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from tune_magic.config.tuneparse import recipe_config

    try:  # metric_logger=...WandBLogger (torchtune's component shorthand) counts too
        cfg = recipe_config(plan.config, plan.overrides)
        component = OmegaConf.select(cfg, "metric_logger._component_", default=None)
    except (OmegaConfBaseException, yaml.YAMLError, OSError, ValueError):
        return False
    return isinstance(component, str) and component.rsplit(".", 1)[-1] == WANDB_LOGGER


def _group_override(group: str) -> str:
    """``metric_logger.group=<group>``, YAML-quoted when the recipe would not read it as typed."""
    from tune_magic.config.overrides import yaml_quoted
    from tune_magic.config.launchwords import check_override

    word = f"metric_logger.group={group}"
    try:
        return check_override(word)
    except PlanError:
        return yaml_quoted("metric_logger.group", group)


def _dry_run(inputs: _Inputs, sweep_id: str, name: str, plan: SweepPlan, slots: Slots, first: LaunchPlan,
             extra: Sequence[str], force: bool, first_only: bool) -> SweepDryRun:
    rest = () if first_only else range(1, len(plan))
    plans = [first] + [_trial_plan(inputs, plan, i, slots, extra, force) for i in rest]
    notes = list(dict.fromkeys(w for p in plans for w in p.warnings))
    if slots.unused:
        notes.append(f"GPU {','.join(map(str, slots.unused))} of the pool stay unused (--max-parallel "
                     f"{slots.max_parallel})")
    sweep_engine = schedulers.get(inputs.options.scheduler).sweep_engine
    engine = None if first_only or sweep_engine is None else sweep_engine.sweep_dry_run(
        sweepstore.sweeps_root(inputs.env) / sweep_id, plans, slots.max_parallel, inputs.options, inputs.cwd,
        inputs.env)
    return SweepDryRun(id=sweep_id, name=name, plan=plan, plans=tuple(plans), slots=slots,
                       extra_overrides=tuple(extra), warnings=tuple(notes), engine_job=engine)


def _register(inputs: _Inputs, record: SweepRecord) -> Sweep:
    """Stage the sweep's directory, rename it into place holding its process lock, and hand it to
    its scheduler (which starts the sweep process by default, inheriting the lock)."""
    try:
        root = sweepstore.sweeps_root(inputs.env, create=True)
        jobstore.jobs_root(inputs.env)  # the trials' jobs go there: it must take them too
        jobstore.collect_staging(root)
        stage, final = jobstore.staging_dir(record.id, root), root / record.id
        stage.mkdir(mode=0o700)
    except OSError as exc:
        raise state_error(exc, root) from None
    lock_fd = None
    try:
        try:
            lock_fd = open_nofollow(stage / sweepstore.RUNNER_LOCK, os.O_RDWR | os.O_CREAT)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            sweepstore.write_env(stage, inputs.env)
            sweepstore.write(stage, record)
            os.rename(stage, final)
        except OSError as exc:
            raise state_error(exc, root) from None
        sched = schedulers.get(record.scheduler)
        submission = SweepSubmission(
            sweep_dir=final, record=record, options=inputs.options, env=inputs.env, lock_fd=lock_fd,
            start_queue=lambda: _start_queue(final, inputs, lock_fd),
            register_trial=lambda index: _register_trial(final, inputs, index))
        try:
            if sched.sweep_engine is None:
                submission.start_queue()  # the sweep process queues the trials
            else:
                sched.sweep_engine.submit_sweep(submission)
        except UserError:
            shutil.rmtree(final, ignore_errors=True)  # the engine refused it as described: nothing runs
            raise
        return Sweep(final)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def _start_queue(final: Path, inputs: _Inputs, lock_fd: int) -> None:
    from tune_magic.sweeping.start import start_runner

    start_runner(final, python=sys.executable, env=inputs.env, cwd=inputs.cwd, lock_fd=lock_fd)


def _register_trial(final: Path, inputs: _Inputs, index: int):
    """Register trial ``index`` as a job of the sweep's scheduler (not submitted: a
    :class:`~tune_magic.job.launch.RegisteredJob`) and mark it started; see
    :class:`~tune_magic.schedulers.base.SweepSubmission`."""
    with sweepstore.locked(final) as record:
        trial = record.trials[index]
        if trial.status != QUEUED:
            raise PlanError(f"trial {index} of sweep {record.id} is {trial.status} already")
        registered = register_trial(
            record.trial_args(index), sweep_trial={"id": record.id, "trial": index, "name": record.name},
            name=trial.name, gpus=None, cwd=record.cwd, force=record.force, env=inputs.env,
            config_overlay=record.config_overlay, scheduler=record.scheduler, keep_checkpoints=record.keep_checkpoints,
            **record.scheduler_options)
        trial.status, trial.job_id, trial.started_at = STARTED, registered.record.id, registered.record.started_at
    return registered
