"""Turn ``tune run``-style arguments into what to run, then into the command for this machine.

Pure: no process is started, no CUDA is touched, nothing is written. The input is what a user types
after ``%%tune_run`` (the same words as ``tune run``, torchtune 0.6.1)::

    [TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value | ~key ...]

:func:`describe_run` reads the words into a :class:`RunSpec` — the recipe, config and overrides, the
torchrun options as given, the job's environment — which says what to run and nothing about where.
A scheduler places it (``Scheduler.place``; torchx's component/scheduler split): :func:`place_here`
is the placement on this one machine (the local scheduler's), where the rendezvous policy applies:
with no rendezvous of the user's own, ``--standalone`` is added so torchrun takes an OS-chosen free
port and concurrent jobs on one node never collide. :func:`tune_magic.build_plan` does both.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from tune_magic.errors import PlanError
from tune_magic.paths import HOME_ENV, home
from tune_magic.config.checks import check_overrides
from tune_magic.plan.model import JOB_ID_PLACEHOLDER, LaunchPlan
from tune_magic.config.resolve import config_output_dir, resolve_config, resolve_recipe
from tune_magic.plan.torchrun import (
    check_nproc, check_torchrun_values, env_value, rank_log_dir, rendezvous_policy, truthy,
)
from tune_magic.gpus import parse_gpu_spec
from tune_magic.config.launchwords import REFUSED_OPTIONS, Parsed, check_job_id, split_args, tokenise


@dataclass(frozen=True)
class RunSpec:
    """What to run, before a scheduler decides where: the words read and resolved.

    Attributes:
        parsed: the words sorted into torchrun options (as given), recipe, config and overrides.
        env: the job's whole environment (``PET_*`` variables in it count like torchrun flags).
        cwd: the directory relative paths were resolved from (the job's working directory).
        recipe_args: ``[recipe file, "--config", config file, *overrides]``: what every process runs.
        recipe_name: the registry name of the recipe, else ``None``.
        supports_distributed: the registry's word (``None`` for custom and tune_magic recipes).
        wants_torchrun: torchrun options were given (flags, ``PET_*``, or several GPUs).
        gpu_ids: GPU ids of this machine the user asked for, or ``None``.
        job_dir: the job's directory, or ``None`` (previews show a placeholder).
        common: the :class:`LaunchPlan` fields every placement shares (env additions, recipe,
            config, overrides, output_dir, job id, cwd).
    """

    parsed: Parsed
    env: Mapping[str, str]
    cwd: Path
    recipe_args: list[str]
    recipe_name: str | None
    supports_distributed: bool | None
    wants_torchrun: bool
    gpu_ids: list[int] | None
    job_dir: str | os.PathLike | None
    common: Mapping[str, Any]

    def given(self, dest: str) -> tuple[str | None, str]:
        """The torchrun option ``dest`` as given (flag first, then its ``PET_*`` variable), and
        how to name it in a message (``--nnodes`` or ``PET_NNODES``)."""
        from tune_magic.config.torchrun_options import lookup

        if dest in self.parsed.torchrun:
            return str(self.parsed.torchrun[dest]), lookup("--" + dest.replace("_", "-")).display
        return env_value(self.env, dest), "PET_" + dest.upper()


def gpus_text(n: int) -> str:
    """``"1 GPU"`` / ``"2 GPUs"``."""
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def describe_run(args: str | Sequence[str], *, env: Mapping[str, str] | None = None,
                 cwd: str | os.PathLike | None = None, gpus: str | Iterable[int] | None = None,
                 job_id: str | None = None, job_dir: str | os.PathLike | None = None) -> RunSpec:
    """Read ``tune run``-style words into a :class:`RunSpec` (see :func:`tune_magic.build_plan`
    for the arguments). The per-job ``output_dir`` is added here: ``<config's output_dir>/<job id>``
    unless the user set one, so concurrent jobs never share a directory.

    Raises:
        PlanError: any bad input (unknown recipe, missing ``--config``, a bad torchrun value, a
            one-device recipe given torchrun options, a config that is not a mapping, ...).
    """
    env = dict(os.environ if env is None else env)
    cwd_path = Path(os.getcwd() if cwd is None else cwd).expanduser().absolute()
    if not cwd_path.is_dir():
        raise PlanError(f"working directory {str(cwd_path)!r} does not exist; pass an existing cwd")
    if job_id is not None:
        check_job_id(job_id)
    gpu_ids = parse_gpu_spec(gpus)
    for dest, why in REFUSED_OPTIONS.items():
        if truthy(env.get("PET_" + dest.upper())):
            raise PlanError(f"PET_{dest.upper()} is set in the environment: {why.split(';')[0]}; unset it")
    parsed = tokenise(split_args(args))
    check_torchrun_values(parsed.torchrun, env)
    recipe_path, recipe_name, recipe_source, supports_distributed = resolve_recipe(parsed.recipe, cwd_path)
    config_path, config_name = resolve_config(parsed.config, cwd_path)
    wants_torchrun = _wants_torchrun(parsed, env, gpu_ids)
    if supports_distributed is False and wants_torchrun:
        given = " ".join(parsed.torchrun_tokens) or (" ".join(_pet_given(env)) or gpus_text(len(gpu_ids or [])))
        raise PlanError(
            f"recipe {recipe_name} runs on one device and does not support torchrun options ({given}); "
            f"drop them, or use a *_distributed recipe"
        )
    base = config_output_dir(config_path)  # also refuses a config that is not a mapping
    checked = check_overrides(config_path, parsed.overrides)  # a typo or a wrong type is refused here
    overrides = list(checked.overrides)
    added_output_dir = None
    if not any(o.split("=", 1)[0] in ("output_dir", "~output_dir") for o in overrides) and base is not None:
        added_output_dir = f"{base.rstrip('/')}/{job_id or JOB_ID_PLACEHOLDER}"
        overrides.append(f"output_dir={added_output_dir}")
    plan_env = _job_env(env, cwd_path, recipe_path if recipe_source == "path" else None, gpu_ids)
    recipe_args = [str(recipe_path), "--config", str(config_path), *overrides]
    common = dict(env=plan_env, recipe=str(recipe_path), recipe_name=recipe_name, recipe_source=recipe_source,
                  config=str(config_path), config_name=config_name, gpus=gpu_ids, overrides=overrides,
                  output_dir=added_output_dir, job_id=job_id, cwd=str(cwd_path), warnings=list(checked.warnings))
    return RunSpec(parsed=parsed, env=env, cwd=cwd_path, recipe_args=recipe_args, recipe_name=recipe_name,
                   supports_distributed=supports_distributed, wants_torchrun=wants_torchrun, gpu_ids=gpu_ids,
                   job_dir=job_dir, common=common)


def _pet_given(env: Mapping[str, str]) -> list[str]:
    """The ``PET_*`` variables of torchrun options set in ``env``: each means torchrun too."""
    from tune_magic.config.torchrun_options import options

    return sorted({o.env_var for o in options().values() if env_value(env, o.dest) is not None})


def _wants_torchrun(parsed: Parsed, env: Mapping[str, str], gpu_ids: list[int] | None) -> bool:
    return bool(parsed.torchrun) or bool(_pet_given(env)) or (gpu_ids is not None and len(gpu_ids) > 1)


def _job_env(env: Mapping[str, str], cwd: Path, recipe_path: Path | None, gpu_ids: list[int] | None) -> dict:
    """The variables the job gets on top of the caller's: unbuffered output, the home, a
    ``PYTHONPATH`` that finds modules next to a custom recipe and in the working directory, and
    ``CUDA_VISIBLE_DEVICES`` for the GPUs asked for."""
    plan_env = {"PYTHONUNBUFFERED": "1", HOME_ENV: str(home(env))}
    path_entries = [str(cwd)]
    if recipe_path is not None:
        path_entries.insert(0, str(recipe_path.parent))
    if env.get("PYTHONPATH"):
        path_entries.append(env["PYTHONPATH"])
    plan_env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path_entries))
    if gpu_ids is not None:
        plan_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
    return plan_env


def place_here(spec: RunSpec) -> LaunchPlan:
    """The command for this one machine: the recipe in one process, or under torchrun with the
    rendezvous policy applied (``--standalone`` unless the user gave a rendezvous), ``--log-dir``
    for redirected rank output, and processes per node from ``--nproc-per-node`` or the GPU list.

    Raises:
        PlanError: a bad rendezvous (see :func:`tune_magic.plan.torchrun.rendezvous_policy`), or
            ``--nproc-per-node`` disagreeing with the GPU list.
    """
    opts, gpu_ids = spec.parsed.torchrun, spec.gpu_ids
    if not (spec.supports_distributed is True or spec.wants_torchrun):
        return LaunchPlan(argv=[sys.executable, *spec.recipe_args], distributed=False, rendezvous=None,
                          endpoint=None, nproc_per_node=None, nnodes=None, torchrun_args=[], **spec.common)
    torchrun_args = list(spec.parsed.torchrun_tokens)
    rendezvous, endpoint = rendezvous_policy(opts, spec.env)
    if rendezvous == "standalone" and "standalone" not in opts:
        torchrun_args.insert(0, "--standalone")
    added_log_dir, rank_logs = rank_log_dir(opts, spec.env, spec.job_dir, spec.cwd)
    torchrun_args += added_log_dir
    nproc, source = spec.given("nproc_per_node")
    if nproc is not None:
        check_nproc(str(nproc), source)
        if gpu_ids is not None and str(nproc).isdigit() and int(nproc) != len(gpu_ids):
            raise PlanError(
                f"{source} {nproc} disagrees with --gpus {','.join(map(str, gpu_ids))} ({gpus_text(len(gpu_ids))}); "
                f"drop {source} (the GPU list sets it) or give {gpus_text(int(nproc))}"
            )
    else:
        nproc = str(len(gpu_ids)) if gpu_ids else "1"
        torchrun_args += ["--nproc_per_node", nproc]
    nnodes = spec.given("nnodes")[0] or "1"
    return LaunchPlan(argv=[sys.executable, "-m", "torch.distributed.run", *torchrun_args, *spec.recipe_args],
                      distributed=True, rendezvous=rendezvous, endpoint=endpoint, nproc_per_node=str(nproc),
                      nnodes=str(nnodes), torchrun_args=torchrun_args, rank_log_dir=rank_logs, **spec.common)
