"""Resume a stopped, failed or ``unknown`` job from its last checkpoint, as a new job linked to it.

:func:`resume` is ``tune_magic.resume``, ``Job.resume``, ``%tune_resume``, ``tune-magic resume`` and
the Resume buttons of a card and of a jobs-table row. What it does, in order:

1. Refusals from the job's record and its scheduler: a job that succeeded (its training finished),
   one still pending or running, one whose scheduler says something of it may still run (for an
   ``unknown`` job: its engine has not confirmed that nothing of it runs), a job resumed already
   (resume the newer one), and a live job writing to the same ``output_dir`` — each would make two
   runs share one ``output_dir`` and corrupt its checkpoints.
2. The pre-flight (:func:`tune_magic.checkpoints.preflight.preflight`) on the job's ``output_dir`` with its
   recipe, config and overrides plus the extra ones: what it found (the checkpoint ``epoch_K/``,
   the epochs done), what is lost (the steps after the checkpoint, counted), the exact overrides
   it adds, the case (exact, continues, steps restart, async checkpoint) and its consequences. It
   refuses when there is nothing to resume from; a job that died before its first checkpoint can
   start again with the same settings instead (``fresh=True``).
3. The launch (:func:`tune_magic.job.launch.launch`) of the same recipe, config, torchrun options and
   overrides — the ``output_dir=`` override kept, its value the job's ``output_dir`` as resolved at
   its launch, so the launcher adds no per-job folder and the resumed run continues in the same
   ``output_dir`` whatever the environment now — with the pre-flight's overrides and the
   extra ones, on the same scheduler with the same options and GPUs unless others are given. The
   new record says ``resumed_from`` (the old job's id) and ``resume_point`` (where), written with
   the record at its registration.
4. The link: the old record gains ``resumed_by``.

Steps 1-4 run under an exclusive ``flock`` on the old job (``resume.lock`` in its directory), so of
two resumes of one job at once exactly one starts: the other then finds the first one's new job and
is refused. A process killed during a resume leaves either no new job (the launcher's staging is
collected) or a registered one: one killed between steps 3 and 4 leaves a new job whose
``resumed_from`` holds the link, and the next listing writes the old record's ``resumed_by``
(:func:`tune_magic.checkpoints.lineage.link_resumes`). The steps are fault-injection points
(:data:`tune_magic.faultpoints.RESUME_STEPS`).

For the batch script of a scheduler that restarts a job itself (a requeue), and for the local
supervisor's ``--max-resumes``, the pre-flight and :func:`tune_magic.checkpoints.relaunch.relaunch_argv`
are the entry points (no new job there: another attempt of the same one,
:mod:`tune_magic.registry.attempts`).
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tune_magic import faultpoints, schedulers
from tune_magic.errors import NothingToResume, PlanError, StateDirError
from tune_magic.job import Job, get_job, jobs
from tune_magic.job.clashes import same_or_nested
from tune_magic.job.launch import dry_run_requested, launch
from tune_magic.plan.model import LaunchPlan
from tune_magic.checkpoints.relaunch import given_torchrun_options, original_overrides
from tune_magic.checkpoints.preflight import ResumePreflight, preflight
from tune_magic.config.launchwords import check_override, split_args
from tune_magic.registry import store as jobstore
from tune_magic.registry.status import Status

#: The lock file, in the resumed job's directory, held while it is being resumed.
RESUME_LOCK = "resume.lock"
#: Keys a resume sets itself (an extra override of one of them is refused).
RESUME_KEYS = ("resume_from_checkpoint", "checkpointer.adapter_checkpoint", "checkpointer.recipe_checkpoint",
               "checkpointer.checkpoint_files")
#: Keys that place the run: a resume continues in the job's own output_dir.
PLACE_KEYS = ("output_dir", "checkpointer.output_dir")


@dataclass(frozen=True)
class ResumePlan:
    """What a resume will launch, before it does. Made by :func:`plan_resume`; a dry run of
    :func:`resume` returns it with ``launch_plan``.

    Attributes:
        job_id: the job resumed.
        output_dir: its ``output_dir``, where the resumed run continues.
        preflight: what the pre-flight found (:class:`~tune_magic.checkpoints.preflight.ResumePreflight`), or
            ``None`` for a fresh start.
        fresh: start again from the beginning (the job saved no checkpoint).
        args: the ``tune run`` words launched.
        config_overlay: the config's text when the job's config lived in its own directory (a
            cell body's YAML): the new job keeps its own copy; else ``None``.
        extra: the overrides added for the resumed run (``key=value`` / ``~key``), as given.
        launch_options: the other arguments of :func:`tune_magic.launch` (``name``, ``gpus``,
            ``cwd``, ``scheduler`` and its options, ``max_resumes``, ``config_overlay``).
        record_fields: what the new record says of its origin (``resumed_from``, ``resume_point``).
        launch_plan: for a dry run, the :class:`~tune_magic.plan.model.LaunchPlan`; else ``None``.
    """

    job_id: str
    output_dir: str
    preflight: ResumePreflight | None
    fresh: bool
    args: list[str]
    config_overlay: str | None
    extra: tuple[str, ...]
    launch_options: dict[str, Any] = field(default_factory=dict)
    record_fields: dict[str, Any] = field(default_factory=dict)
    launch_plan: LaunchPlan | None = None

    def summary(self) -> str:
        """A few plain lines: the pre-flight's summary (or the fresh start), the extra overrides,
        where it runs, and for a dry run the command."""
        if self.preflight is not None:
            lines = [self.preflight.summary().replace("Resume ", f"Resume job {self.job_id}: ", 1)]
        else:
            lines = [f"Start job {self.job_id} again from the beginning: it saved no checkpoint, so nothing is "
                     f"lost but the time it ran\n  output_dir: {self.output_dir}"]
        if self.extra:
            lines.append(f"  your overrides: {' '.join(self.extra)}")
        opts = self.launch_options
        given = {k: v for k, v in opts.items() if k not in ("name", "cwd", "config_overlay", "scheduler")
                 and v not in (None, [], (), {})}
        shown = ", ".join(f"{k}={v}" for k, v in given.items())
        lines.append(f"  runs as: {opts.get('name')!r} on scheduler {opts.get('scheduler')}" + (f" ({shown})" if shown else ""))
        if self.launch_plan is not None:
            lines.append(f"  command: {self.launch_plan.command_line()}")
        return "\n".join(lines)


def _the_job(job: "Job | str") -> Job:
    """The :class:`Job` for ``job`` (a Job, or a job id), freshly read."""
    if isinstance(job, Job):
        return Job(job.dir).refresh()
    if not isinstance(job, str):
        raise PlanError(f"job={job!r}: give a job id (tune-magic jobs lists them) or a Job")
    return get_job(job)


def _refuse_by_status(job: Job) -> None:
    """Refuse a job whose status or live processes make a resume unsafe or pointless.

    Raises:
        NothingToResume: the job succeeded.
        PlanError: damaged, live, something of it may still run, no output_dir.
    """
    r = job.record
    if job.damaged:
        raise PlanError(f"job {job.id}'s record is damaged, so its recipe, config and output_dir are unknown; "
                        "nothing can be resumed from it")
    state = r.state
    if state is Status.SUCCEEDED:
        raise NothingToResume(f"job {job.id} succeeded: its training finished, so there is nothing to resume. To "
                              f"train longer, start a new run from its weights (in {r.output_dir})")
    if state.is_live:
        raise PlanError(f"job {job.id} is {state.value}: a resume continues a job that has ended (stopped, failed or "
                        f"outcome unknown). Stop it first (tune-magic stop {job.id}), then resume it")
    if schedulers.get_or_missing(r.scheduler).has_live_parts(job.dir, r):
        if state is Status.UNKNOWN:
            raise PlanError(f"job {job.id}'s outcome is unknown and its scheduler has not confirmed that nothing of it "
                            "runs: a run of it may still write to its output_dir, and two runs in one output_dir "
                            f"would corrupt its checkpoints. Stop it first (tune-magic stop {job.id} ends whatever is "
                            "left), then resume it")
        raise PlanError(f"job {job.id} is {state.value}, but a process of it still runs and may write to its "
                        f"output_dir; stop it first (tune-magic stop {job.id}), then resume it")
    if not r.output_dir or not r.recipe:
        raise PlanError(f"job {job.id} has no recorded output_dir or recipe (its config sets none), so there is no "
                        "checkpoint to find; start a new run")


def _refuse_resumed_or_shared(job: Job, listed: Sequence[Job]) -> None:
    """Refuse a job resumed already (name the newer job), and one whose output_dir a live job uses.

    Raises:
        PlanError: saying which job and what to do.
    """
    newer = [j for j in listed if j.record.resumed_from == job.id]
    if job.record.resumed_by and not newer:
        newer = [j for j in listed if j.id == job.record.resumed_by]
    if newer:
        n = newer[0]
        raise PlanError(f"job {job.id} was resumed already, by job {n.id} ({n.record.state.label}); resume that one "
                        f"instead (tune-magic resume {n.id}), which continues from the newest checkpoint")
    out = job.record.output_dir
    for other in listed:
        r = other.record
        if other.id != job.id and r.state.is_live and r.output_dir and same_or_nested(out, r.output_dir):
            raise PlanError(f"job {other.id} ({r.state.label}) writes to {r.output_dir}, which shares the output_dir "
                            f"{out} this resume would continue in: two runs there would corrupt its checkpoints. Wait "
                            f"for it to end or stop it (tune-magic stop {other.id}), then resume")


def _extra(overrides: "str | Sequence[str]", fresh: bool) -> tuple[str, ...]:
    """The extra overrides, each checked (``key=value`` / ``~key``).

    Raises:
        PlanError: a malformed one, one that moves the run (``output_dir``), or one of the keys the
            resume sets itself.
    """
    words = split_args(overrides) if isinstance(overrides, str) else list(overrides)
    for word in words:
        if not isinstance(word, str):
            raise PlanError(f"overrides: {word!r} is not a key=value string")
        check_override(word)
        key = word.lstrip("+~").split("=", 1)[0]
        if key in PLACE_KEYS:
            raise PlanError(f"override {word!r}: a resume continues in the job's own {key}, where its checkpoints "
                            "are; leave it out (to start elsewhere, launch a new run)")
        if key in RESUME_KEYS and not fresh:
            raise PlanError(f"override {word!r}: the resume sets {key} itself (from the checkpoint the pre-flight "
                            "finds); leave it out")
    return tuple(words)


def _config(job: Job) -> tuple[str | None, str | None]:
    """``(--config path, overlay text)``: a config kept in the job's own directory (a cell body's
    YAML) is handed on as text, so the new job keeps its own copy."""
    config = job.record.config
    if config and Path(config).parent == job.dir:
        try:
            return None, Path(config).read_text()
        except OSError as exc:
            raise PlanError(f"cannot read job {job.id}'s config {config} ({exc.strerror or exc}); nothing to resume "
                            "with") from None
    return config, None


def _fresh_allowed(job: Job, original: list[str], extra: tuple[str, ...]) -> None:
    """A fresh start only when there is nothing to resume from (nothing saved, or the output_dir gone).

    Raises:
        PlanError: the job has a checkpoint to resume from, or its training finished.
    """
    r = job.record
    if not Path(r.cwd, r.output_dir).is_dir():
        return
    try:
        preflight(r.recipe, r.output_dir, config=r.config, overrides=[*original, *extra], recipe_name=r.recipe_name,
                  cwd=r.cwd)
    except NothingToResume as exc:
        if exc.fresh_start:
            return
        raise
    except PlanError:
        return  # nothing it can resume from: starting over loses nothing resumable
    raise PlanError(f"job {job.id} saved a checkpoint to resume from; a fresh start would train over it. Resume "
                    f"it instead (tune-magic resume {job.id})")


def plan_resume(job: "Job | str", overrides: "str | Sequence[str]" = (), *, fresh: bool = False,
                name: str | None = None, gpus: Any = None, scheduler: str | None = None,
                max_resumes: int | None = None, listed: Sequence[Job] | None = None, **options: Any) -> ResumePlan:
    """Check that ``job`` can be resumed and say how: the refusals and the pre-flight, nothing
    started, nothing locked (see :func:`resume` for the arguments).

    Raises:
        NothingToResume: nothing to resume from (``fresh_start`` True when a fresh start is
            possible), or training finished / the job succeeded.
        PlanError: any other refusal (see the module docstring); JobNotFound: no such job.
    """
    job = _the_job(job)
    _refuse_by_status(job)
    _refuse_resumed_or_shared(job, jobs() if listed is None else listed)
    extra = _extra(overrides, fresh)
    r = job.record
    original = original_overrides(r.argv, r.config, r.overrides)
    config, overlay = _config(job)
    pre = None
    if fresh:
        _fresh_allowed(job, original, extra)
        launched = [*original, *extra]
        point: dict[str, Any] = {"fresh": True, "step": 0}
    else:
        try:
            pre = preflight(r.recipe, r.output_dir, config=r.config, overrides=[*original, *extra],
                            recipe_name=r.recipe_name, progress=job.summary().progress, log_path=r.log_path, cwd=r.cwd)
        except NothingToResume as exc:
            if exc.fresh_start:
                raise NothingToResume(f"{exc} (tune-magic resume {job.id} --fresh, or job.resume(fresh=True))",
                                      fresh_start=True) from None
            raise
        launched = pre.resumed_overrides([*original, *extra])
        point = {"checkpoint": f"{pre.checkpoint.name}/", "epoch": pre.epoch, "step": pre.resume_step,
                 "first_step": pre.first_step, "case": pre.case, "lost_steps": pre.lost_steps}
    # the job's own folder, resolved when it launched: the same place whatever the environment now
    launched = [f"output_dir={r.output_dir}" if o.startswith("output_dir=") else o for o in launched]
    torchrun = given_torchrun_options(r.argv, r.recipe, r.torchrun_options, rendezvous=r.rendezvous, job_dir=job.dir)
    args = [*torchrun, r.recipe_name or r.recipe, *(["--config", config] if config else []), *launched]
    same = scheduler is None or scheduler == r.scheduler
    opts = {**(r.scheduler_options if same else {}), **{k: v for k, v in options.items() if v is not None}}
    launch_options = dict(name=name or r.name, gpus=gpus if gpus is not None else (r.gpus if same else None), cwd=r.cwd,
                          scheduler=scheduler or r.scheduler,
                          max_resumes=max_resumes if max_resumes is not None else r.max_resumes,
                          keep_checkpoints=r.keep_checkpoints, config_overlay=overlay, **opts)
    return ResumePlan(job.id, r.output_dir, pre, fresh, args, overlay, extra, launch_options,
                      {"resumed_from": job.id, "resume_point": point})


def resume(job: "Job | str", overrides: "str | Sequence[str]" = (), *, fresh: bool = False,
           dry_run: bool | None = None, name: str | None = None, gpus: Any = None, scheduler: str | None = None,
           max_resumes: int | None = None, env: Mapping[str, str] | None = None,
           on_plan: Callable[[ResumePlan], None] | None = None, **options: Any) -> "Job | ResumePlan":
    """Resume a stopped, failed or ``unknown`` job from its last checkpoint, as a new job in the same
    ``output_dir`` linked to it (see the module docstring for the steps and refusals).

    Args:
        job: the job (a :class:`~tune_magic.job.Job`, or its id).
        overrides: extra ``key=value`` / ``~key`` overrides for the resumed run (a list, or one
            string of words), e.g. ``["epochs=5"]``; never ``output_dir`` or the keys the resume
            sets itself.
        fresh: the job saved no checkpoint: start it again from the beginning with the same
            settings (refused when there is a checkpoint to resume from).
        dry_run: return the :class:`ResumePlan` with the launch plan, start nothing, take no lock
            (default: ``TUNE_MAGIC_DRY_RUN``).
        name, gpus, scheduler, max_resumes, options: as for :func:`tune_magic.launch`; each not
            given is the old job's (its name, GPUs, scheduler and that scheduler's options).
        env: the caller's environment (default ``os.environ``).
        on_plan: called with the :class:`ResumePlan` right before the launch, under the lock (the
            magic and the CLI print its summary there).

    Returns:
        The new :class:`~tune_magic.job.Job` (``record.resumed_from`` is the old job's id), or the
        :class:`ResumePlan` for a dry run.

    Raises:
        NothingToResume: nothing to resume from, or nothing left to do (see :func:`plan_resume`).
        PlanError: a refusal (the message says why and what to do); nothing was started.
        JobNotFound: no such job. StateDirError: the registry cannot take the new job.
        JobStartError: the scheduler did not start the new job (its record says why).
    """
    caller_env = dict(os.environ if env is None else env)
    kwargs = dict(fresh=fresh, name=name, gpus=gpus, scheduler=scheduler, max_resumes=max_resumes, **options)
    job = _the_job(job)
    if dry_run_requested(caller_env) if dry_run is None else dry_run:
        plan = plan_resume(job, overrides, **kwargs)
        return replace(plan, launch_plan=launch(plan.args, dry_run=True, env=caller_env, **plan.launch_options))
    with ExitStack() as held:
        try:
            held.enter_context(jobstore.flocked(job.dir / RESUME_LOCK))
        except OSError as exc:
            raise StateDirError(f"cannot lock job {job.id} for its resume ({exc.strerror or exc}); the registry must "
                                "be writable to launch a job. Nothing was started") from None
        faultpoints.reached("resume-locked")
        plan = plan_resume(job.id, overrides, **kwargs)  # read again under the lock
        if on_plan is not None:
            on_plan(plan)
        new = launch(plan.args, env=caller_env, record_fields=plan.record_fields, **plan.launch_options)
        try:
            jobstore.update(job.dir, resumed_by=new.id)
        except (OSError, jobstore.CorruptRecord, StateDirError):
            pass  # the new record's resumed_from holds the link; the next listing writes this side
        faultpoints.reached("resume-linked")
        return new
