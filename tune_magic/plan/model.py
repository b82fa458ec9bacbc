"""The launch plan: everything needed to start one job, and nothing started yet. Pure data."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field

#: Placeholder used in previews built without a job id, where the job id will go.
JOB_ID_PLACEHOLDER = "<job-id>"


#: Placeholder used in plans built without a job directory, where the job's directory will go.
JOB_DIR_PLACEHOLDER = "<job-dir>"


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to launch one job, and nothing launched yet.

    Attributes:
        argv: the full command (``argv[0]`` is the kernel's own interpreter, ``sys.executable``).
            Distributed: ``[python, "-m", "torch.distributed.run", <torchrun options>, <recipe>,
            "--config", <config>, <overrides>]``; one process: ``[python, <recipe>, "--config", ...]``.
        env: variables to add to the caller's environment for this job only
            (``PYTHONUNBUFFERED``, ``PYTHONPATH``, ``TUNE_MAGIC_HOME``, ``CUDA_VISIBLE_DEVICES``).
        recipe: absolute path of the recipe file.
        recipe_name: the registry name when one was used, else ``None``.
        recipe_source: ``"torchtune"``, ``"tune_magic"`` or ``"path"``.
        config: absolute path of the config file.
        config_name: the registry name when one was used, else ``None``.
        distributed: ``True`` when launched through torchrun.
        rendezvous: ``"standalone"`` (OS-chosen port), ``"user"`` (the user's endpoint/master
            address/port, kept as given) or ``None`` for a one-process plan.
        endpoint: the user's endpoint (``host:port``) when they gave one, else ``None``.
        nproc_per_node: processes per node as torchrun will see it (``"2"``, ``"gpu"``), or
            ``None`` for one process.
        nnodes: torchrun's ``--nnodes`` value (``"1"``, ``"2:4"``), ``None`` for one process.
        gpus: GPU ids exposed to the job, or ``None``.
        torchrun_args: the torchrun options part of ``argv``.
        overrides: ``key=value`` / ``~key`` recipe overrides, in order (including an added
            ``output_dir``).
        output_dir: the ``output_dir`` override this plan added (per-job directory), else ``None``.
        job_id: the job id the plan was built for, else ``None``.
        rank_log_dir: torchrun's ``--log-dir`` (the user's, or the ``<job dir>/ranks`` this plan
            added for ``--redirects``/``--tee``), where each rank's stdout/stderr files go; ``None``
            when the workers write to the job's combined log only.
        scheduler: the scheduler that placed the plan (``"local"``: this machine). A scheduler
            that runs jobs on several nodes makes ``argv`` the command each node runs (one torchrun
            agent per node; it may name variables its job script fills in, e.g. SLURM's
            ``${SLURM_JOB_NUM_NODES}``); ``rendezvous`` is then ``"scheduler"`` (an endpoint the
            scheduler picks when the job starts), ``"user"`` or ``"standalone"`` (one node).
        rdzv_conf: the user's ``--rdzv-conf`` where the scheduler merges it on each node with its
            own settings (SLURM's ``is_host``), else ``None``.
        warnings: things a dry run should say (e.g. every node must reach your endpoint).
        batch_script, submit_argv: for a scheduler with job scripts, the script and the command
            that submits it (SLURM: the batch script and the sbatch line; id-dependent paths as for
            ``output_dir``); ``None`` for local plans.
        cwd: the working directory the job runs in (relative paths were resolved from it).
    """

    argv: list[str]
    env: dict[str, str]
    recipe: str
    recipe_name: str | None
    recipe_source: str
    config: str
    config_name: str | None
    distributed: bool
    rendezvous: str | None
    endpoint: str | None
    nproc_per_node: str | None
    nnodes: str | None
    gpus: list[int] | None
    torchrun_args: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    output_dir: str | None = None
    job_id: str | None = None
    rank_log_dir: str | None = None
    scheduler: str = "local"
    rdzv_conf: str | None = None
    warnings: list[str] = field(default_factory=list)
    batch_script: str | None = None
    submit_argv: list[str] | None = None
    cwd: str | None = None

    def __repr__(self) -> str:
        mode = f"torchrun, rendezvous={self.rendezvous}" if self.distributed else "one process"
        return f"<LaunchPlan {self.recipe_name or self.recipe} ({mode}): {self.command_line()}>"

    def command_line(self) -> str:
        """Return one copy-pasteable shell line: ``VAR=value ... <shlex.join(argv)>`` (for a plan
        with a job script, the command that submits it)."""
        if self.submit_argv:
            return shlex.join(self.submit_argv)
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"{prefix} {shlex.join(self.argv)}" if prefix else shlex.join(self.argv)

    def to_dict(self) -> dict:
        """Return a JSON-ready dict of every field."""
        return asdict(self)
