"""The scheduler seam: what every engine that runs jobs provides. Pure interface, no I/O.

Compare torchx's ``Scheduler`` (``submit_dryrun`` / ``schedule`` / ``describe`` / ``cancel`` /
``log_iter``) and submitit's Executor/Job split. What to run is decided once, by the command builder
(:func:`tune_magic.plan.build.describe_run`); a scheduler decides where and how: it places the run
on its nodes, starts it, tells what became of it, stops it and says where its output is.

Contract:

0. ``options`` declares the scheduler's own launch options once (:class:`tune_magic.plan.options.Option`
   rows); the magics, the CLI, ``launch(**options)``, the panel and the record derive from them.
   :meth:`check_options` checks them together once each has been read.
1. ``place`` turns the run into the command each node runs (:class:`~tune_magic.plan.model.LaunchPlan`);
   ``prepare`` is pure apart from reading the environment and returns what a dry run shows (e.g.
   the job script and the command that submits it); neither starts or submits anything.
2. ``submit`` starts the job whose record is already registered (so a launcher killed at any point
   never leaves a running job missing from the listings) and fills in what it learns.
3. ``describe`` settles a record from outside evidence (an exit file, a dead supervisor, the
   engine's queue) and returns the fields that changed, or ``{}``; it is cheap and rate-limited by
   the scheduler, since every card and listing calls it. A terminal status is never changed. The
   end itself is decided by :func:`tune_magic.registry.outcome.decide` from that evidence.
4. ``cancel`` ends every part of the job that is still alive, whatever its recorded status.
5. ``has_live_parts`` says whether anything of the job may still run (``rm`` refuses such a job).
6. ``status_note`` says when the shown status is only the last known one (the engine does not
   answer); ``queued_s`` is the time a requeued job waited, which elapsed time leaves out.
7. ``migrate`` moves the scheduler's fields of records written by earlier releases into its own
   part of the record (``record.backend``); nothing outside the scheduler reads that part.
7. ``relaunches_from_checkpoint``: the scheduler honours a launch's ``max_resumes`` (a job that fails
   after saving a checkpoint is started again from it, as the same job, recording each attempt in
   ``record.attempts``: :mod:`tune_magic.registry.attempts`); launches asking it of another
   scheduler are refused.
8. ``interactive_command`` turns a command to run once, where a job ran, with its stdin and
   stdout connected to the caller (generation from the job's checkpoint), into the command that
   runs it there: on this machine the command itself; an engine with nodes of its own wraps it
   in a one-task job of the job's allocation options.
9. Sweeps are an optional capability. A scheduler without one (``sweep_engine = None``) has its
   sweeps run by the sweep process (:mod:`tune_magic.sweeping.runner`), which queues the trials
   and launches each as a job through :meth:`submit` as slots free up. A scheduler that runs a
   whole sweep as one engine job (a job array) sets ``sweep_engine`` to a :class:`SweepEngine`: it
   registers every trial (``register_trial``) and submits them together, ends that engine job when
   the sweep is stopped (each trial's job is stopped through :meth:`cancel` too), and shows it in a
   sweep's dry run. ``default_max_parallel`` says how many trials run at once when neither the
   user nor a GPU pool says.

Schedulers are found by name through :mod:`tune_magic.schedulers` (the built-in ones, and any
package's entry points in the group ``tune_magic.schedulers``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from tune_magic.registry.status import Status

if TYPE_CHECKING:  # pragma: no cover
    from tune_magic.plan.build import RunSpec
    from tune_magic.plan.model import LaunchPlan
    from tune_magic.plan.options import Option
    from tune_magic.registry.record import JobRecord
    from tune_magic.sweeping.record import SweepRecord


@dataclass(frozen=True)
class SchedulerOptions:
    """A launch's choice of scheduler and that scheduler's own options, each read and checked.

    Attributes:
        scheduler: the scheduler's name (``"local"``, ``"slurm"``, ...).
        values: option name -> value, only for the options given (see ``Scheduler.options``).
    """

    scheduler: str = "local"
    values: Mapping[str, Any] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        """The value of option ``name``, or ``default`` when it was not given."""
        value = self.values.get(name)
        return default if value is None else value

    def given(self) -> dict[str, Any]:
        """The options given (name -> value)."""
        return {k: v for k, v in self.values.items() if v not in (None, (), [])}


@dataclass(frozen=True)
class SweepSubmission:
    """A registered sweep handed to its scheduler (:meth:`Scheduler.submit_sweep`).

    Attributes:
        sweep_dir: the sweep's directory (``$TUNE_MAGIC_HOME/sweeps/<id>``).
        record: its record (:class:`~tune_magic.sweeping.record.SweepRecord`): the trials in
            order (``record.trial_args(i)``: trial i's launch words), the slots (``record.slots``:
            how many trials run at once, and each one's GPUs), the cell body, the options.
        options: this scheduler's options, read and checked.
        env: the caller's environment.
        lock_fd: the sweep's process lock (``supervisor.lock``), held by the caller; a process
            that should count as the sweep's live supervisor inherits it.
        start_queue: starts the local sweep process (the default :meth:`Scheduler.submit_sweep`),
            which inherits ``lock_fd``.
        register_trial: ``index -> RegisteredJob`` (:class:`tune_magic.job.launch.RegisteredJob`:
            ``dir``, ``record``, ``plan``): registers trial ``index`` as a job of this scheduler,
            checked and planned as a launch is (its record carries the ``sweep`` field; status
            ``initial_status``), marks it started in the sweep record, and submits nothing; call its
            ``submit()`` (through :meth:`Scheduler.submit`), or its ``release()`` once the engine
            took the job by other means.
    """

    sweep_dir: Path
    record: "SweepRecord"
    options: SchedulerOptions
    env: Mapping[str, str]
    lock_fd: int | None
    start_queue: Callable[[], None]
    register_trial: Callable[[int], tuple]


class SweepEngine(ABC):
    """The optional capability of a scheduler that runs a whole sweep as ONE engine job (e.g. a
    job array), queueing its trials itself (contract item 9). A scheduler leaves it out by keeping
    ``Scheduler.sweep_engine = None``: its sweeps are then run by the sweep process, trial by trial."""

    @abstractmethod
    def submit_sweep(self, sweep: SweepSubmission) -> None:
        """Run a registered sweep: register every trial (``sweep.register_trial``) and submit them
        as one engine job. ``sweep.start_queue()`` hands a sweep back to the sweep process instead.

        Raises:
            JobStartError: the engine did not take the sweep.
            PlanError: the engine refused it as described; nothing is left running.
        """

    def sweep_dry_run(self, sweep_dir: Path, plans: "list[LaunchPlan]", max_parallel: int, options: SchedulerOptions,
                      cwd: str, env: Mapping[str, str]) -> str | None:
        """What a sweep's dry run shows of the engine job it would submit (e.g. the job array's
        submit command and script), or ``None``. ``plans`` are the trials' plans in order;
        ``sweep_dir`` is where the sweep's directory would be.

        Raises:
            PlanError: the sweep could not be submitted as described.
        """
        return None

    def cancel_sweep(self, sweep_dir: Path, record: "SweepRecord", grace_s: float) -> None:
        """End the engine job of a stopped sweep (each trial's job is stopped on its own too).
        Default: nothing."""


class Scheduler(ABC):
    """One engine that runs jobs. See the module docstring for the contract."""

    #: The name users type (``--scheduler NAME``) and records keep.
    name: str = ""
    #: The scheduler's own launch options (``Option`` rows), declared once.
    options: tuple["Option", ...] = ()
    #: The status a job has when registered (``pending`` for engines with a queue).
    initial_status: Status = Status.RUNNING
    #: What the engine's own id of a job is called (a column title), when it has one.
    engine_id_label: str | None = None
    #: A sentence added when another scheduler's option is given to this one.
    foreign_option_hint: str = ""
    #: Whether the scheduler relaunches a failed job from its last checkpoint (``max_resumes``;
    #: contract item 7).
    relaunches_from_checkpoint: bool = False
    #: Whether the job's processes start on this machine: it places them on this machine's GPUs
    #: (``--gpus``, ``CUDA_VISIBLE_DEVICES``, a sweep's GPU pool), the rendezvous endpoint is
    #: chosen here, and there is no submit script to preview. Callers ask this, never the name.
    runs_on_this_machine: bool = False
    #: The optional capability of running a whole sweep as one engine job (contract item 9), or
    #: ``None``: the sweep process queues the trials and starts each through :meth:`submit`.
    sweep_engine: SweepEngine | None = None
    #: Lines of the engine's own that a card's display tail collapses (e.g. SLURM's cancel
    #: messages): :class:`tune_magic.logs.cardtail.TailRule` rows.
    tail_rules: tuple = ()

    def available(self, env: Mapping[str, str]) -> str | None:
        """``None`` when jobs can be sent to this scheduler from here, else why not (one line,
        naming the fix). The panel offers only available schedulers; a launch still tries."""
        return None

    def status_note(self, env: Mapping[str, str]) -> str | None:
        """For a scheduler that is :meth:`available`: ``None`` when it answers from here, else one
        line on why a job sent to it may not start (e.g. its controller does not answer); the
        panel shows it next to the choice. It may ask the engine (a few seconds at most)."""
        return None

    def check_options(self, values: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
        """Check the options together (each was read by its row already); return them.

        Raises:
            PlanError: a combination this scheduler cannot honour.
        """
        return values

    def place(self, spec: "RunSpec", options: SchedulerOptions) -> "LaunchPlan":
        """The command for ``spec`` on this scheduler's nodes. Default: this one machine.

        Raises:
            PlanError: a run this scheduler cannot place as described.
        """
        from tune_magic.plan.build import place_here

        return place_here(spec)

    @abstractmethod
    def prepare(self, plan: "LaunchPlan", options: SchedulerOptions, env: Mapping[str, str],
                job_dir: Path) -> dict[str, Any]:
        """Validate ``options`` for ``plan``; return plan fields to set (``{}`` if none), e.g. the
        job script and submit command a dry run shows. ``job_dir`` is where the job's directory
        is (or would be, for a dry run).

        Raises:
            PlanError: an option this scheduler cannot honour; the message names the fix.
        """

    @abstractmethod
    def submit(self, job_dir: Path, record: "JobRecord", plan: "LaunchPlan", options: SchedulerOptions,
               env: Mapping[str, str], lock_fd: int | None) -> None:
        """Start the registered job (``plan`` as :meth:`prepare` completed it). ``lock_fd`` is the
        launcher's held ``supervisor.lock``.

        Raises:
            JobStartError: the engine did not start the job (the record says why).
            PlanError: the engine refused the job as the user described it (e.g. an unknown
                partition); nothing is left running.
        """

    @abstractmethod
    def describe(self, job_dir: Path, record: "JobRecord") -> dict[str, Any]:
        """Return record fields to change given outside evidence (``{}`` when nothing changed)."""

    @abstractmethod
    def cancel(self, job_dir: Path, record: "JobRecord | None", grace_s: float) -> None:
        """End every live part of the job: a polite signal, ``grace_s`` seconds, then a hard one."""

    @abstractmethod
    def has_live_parts(self, job_dir: Path, record: "JobRecord | None") -> bool:
        """Whether anything of the job may still run (``record`` is ``None`` when it is damaged)."""

    def keeps_summary(self, job_dir: Path, record: "JobRecord") -> bool:
        """Whether a process of this scheduler keeps the job's summary current (else the first
        reader catches it up from its offsets)."""
        return False

    def settle_after_cancel(self, job_dir: Path, record: "JobRecord") -> dict[str, Any]:
        """Fields to record when ``cancel`` ended a job that nobody else will record."""
        return {}

    def settle_after_end(self, record: "JobRecord", timeout_s: float = 5.0) -> None:
        """Called when a job is seen ended: let the scheduler's own process for it (a supervisor)
        finish exiting, for at most ``timeout_s`` seconds, and reap it if this process started it,
        so no zombie is left behind. Default: nothing (the engine has no such process here)."""

    def migrate(self, record: "JobRecord") -> None:
        """Move this scheduler's fields of a record written by an earlier release (found in
        ``record.extra``) into ``record.backend`` / ``record.scheduler_options``, in place."""

    def default_max_parallel(self, n_trials: int) -> int | None:
        """How many of a sweep's ``n_trials`` trials run at once when neither ``--max-parallel`` nor
        a GPU pool says: ``None`` for the slot rule of :func:`tune_magic.sweeping.slots.plan_slots`
        (one at a time without GPUs), the default; an engine with a queue of its own returns
        ``n_trials``, leaving it to that queue."""
        return None

    def engine_id(self, record: "JobRecord") -> str | None:
        """The engine's own id of the job (e.g. SLURM's job id), else ``None``."""
        return None

    def nodes(self, record: "JobRecord") -> list[str]:
        """Host names the job runs on (``[]`` while it waits)."""
        return list(record.nodes)

    def job_note(self, record: "JobRecord") -> str | None:
        """One line about how sure the shown status is, for cards, tables and ``jobs --json``
        (e.g. ``"SLURM not answering since 14:05"`` while the engine does not answer and the last
        known status is shown), else ``None``. Cheap: it asks the engine nothing."""
        return None

    def interactive_command(self, record: "JobRecord", argv: list[str],
                            env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
        """The command and environment that run ``argv`` once where ``record``'s job ran: one
        process (one task), its stdin and stdout those of the caller's process, its stderr too
        (contract item 8). Pure: nothing is started.

        Default: ``argv`` and ``env`` unchanged, for a scheduler whose jobs run on this machine
        (:attr:`runs_on_this_machine`); an engine with nodes of its own overrides it.

        Args:
            record: the job's record (its allocation options, the engine's settings it used).
            argv: the command (``argv[0]`` a program on the job's nodes, e.g. this Python).
            env: the environment it should run with.

        Raises:
            UserError: this scheduler cannot run a command where its jobs ran (the message says why).
        """
        if not self.runs_on_this_machine:
            from tune_magic.errors import UserError

            raise UserError(f"scheduler {self.name!r} cannot run a command where its jobs ran (it has no "
                            "interactive_command); copy the checkpoint to this machine and run recipes/generate_text.py on it "
                            "(docs/generation.md)")
        return list(argv), dict(env)

    def queued_s(self, record: "JobRecord") -> float:
        """Seconds the job spent back in the engine's queue after it had started (a requeue),
        which its elapsed time does not count. Default 0."""
        return 0.0
