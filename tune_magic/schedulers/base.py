"""The scheduler seam: what every engine that runs jobs provides. Pure interface, no I/O.

Compare torchx's ``Scheduler`` (``submit_dryrun`` / ``schedule`` / ``describe`` / ``cancel`` /
``log_iter``) and submitit's Executor/Job split. What to run is decided once, by the command
builder (:func:`tune_magic.build_plan`); a scheduler decides where and how: it starts the plan,
tells what became of it, stops it and says where its output is.

Contract:

1. ``prepare`` is pure apart from reading the environment: it validates the scheduler's own
   options and returns what a dry run shows; it never starts or submits anything.
2. ``submit`` starts the job whose record is already registered (so a launcher killed at any point
   never leaves a running job missing from the listings) and fills in what it learns.
3. ``describe`` settles a record from outside evidence (an exit file, a dead supervisor, squeue)
   and returns the fields that changed, or ``{}``; it is cheap and rate-limited by the scheduler,
   since every card and listing calls it. A terminal status is never changed.
4. ``cancel`` ends every part of the job that is still alive, whatever its recorded status.
5. ``has_live_parts`` says whether anything of the job may still run (``rm`` refuses such a job).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from tune_magic.errors import PlanError

if TYPE_CHECKING:  # pragma: no cover
    from tune_magic.plan.build import LaunchPlan
    from tune_magic.registry.store import JobRecord

#: Environment variable naming the default scheduler.
SCHEDULER_ENV = "TUNE_MAGIC_SCHEDULER"


@dataclass(frozen=True)
class SchedulerOptions:
    """A launch's own options for where it runs (``--scheduler``, ``--nodes``, ...).

    Attributes:
        scheduler: ``"local"`` or ``"slurm"``.
        nodes: nodes for the job (SLURM), or ``None``.
        gpus_per_node, cpus_per_node: resources per node (SLURM), or ``None``.
        partition, time_limit, account: sbatch's ``--partition``, ``--time``, ``--account``.
        sbatch: extra sbatch options, each one word as typed (``--sbatch=--qos=high``).
    """

    scheduler: str = "local"
    nodes: int | None = None
    gpus_per_node: int | None = None
    cpus_per_node: int | None = None
    partition: str | None = None
    time_limit: str | None = None
    account: str | None = None
    sbatch: tuple[str, ...] = field(default_factory=tuple)

    def given(self) -> dict[str, Any]:
        """The options set besides ``scheduler`` (name -> value)."""
        return {k: v for k, v in asdict(self).items() if k != "scheduler" and v not in (None, (), [])}


def default_scheduler(env: Mapping[str, str]) -> str:
    """The scheduler used when none is given: ``$TUNE_MAGIC_SCHEDULER`` or ``local``."""
    return (env.get(SCHEDULER_ENV) or "local").strip() or "local"


def check_scheduler_name(name: Any, source: str = "--scheduler") -> str:
    """Return ``name`` if it names a scheduler.

    Raises:
        PlanError: anything else; ``nccl``/``gloo`` get a word on the difference.
    """
    from tune_magic.schedulers import names

    if isinstance(name, str) and name in names():
        return name
    if isinstance(name, str) and name.lower() in ("nccl", "gloo", "mpi", "ucc", "xccl", "c10d", "static", "etcd"):
        raise PlanError(f"{source} {name!r}: a scheduler is where the job runs ({' or '.join(names())}); "
                        f"{name} is a communication or rendezvous backend, which the recipe's config and torchrun's "
                        "--rdzv-backend choose")
    raise PlanError(f"{source} {name!r} is not a scheduler; use {' or '.join(names())}")


class Scheduler(ABC):
    """One engine that runs jobs. See the module docstring for the contract."""

    #: The name users type (``--scheduler NAME``) and records keep.
    name: str = ""

    @abstractmethod
    def prepare(self, plan: "LaunchPlan", options: SchedulerOptions, env: Mapping[str, str],
                job_dir: Path) -> dict[str, Any]:
        """Validate ``options`` for ``plan``; return plan fields to set (``{}`` if none), e.g. the
        batch script and submit command a dry run shows. ``job_dir`` is where the job's directory
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
    def cancel(self, job_dir: Path, record: "JobRecord", grace_s: float) -> None:
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
