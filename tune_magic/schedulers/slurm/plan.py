"""The per-node command of a SLURM job (one torchrun agent per node), from the same words as a
local launch: the plan says what to run, this module where and on how many nodes. Pure.
"""

from __future__ import annotations

import sys

from tune_magic.errors import PlanError
from tune_magic.plan.build import RunSpec
from tune_magic.plan.model import LaunchPlan
from tune_magic.plan.torchrun import check_endpoint, check_nproc, parse_nnodes, rank_log_dir, truthy

#: torchrun options the SLURM scheduler sets on each node itself: refused under SLURM.
_SLURM_REFUSED = ("node_rank", "master_addr", "master_port", "local_addr", "standalone")


#: torchrun options the SLURM scheduler takes from the user and places itself.
_SLURM_PLACED = ("nnodes", "nproc_per_node", "rdzv_endpoint", "rdzv_backend", "rdzv_id", "rdzv_conf")

#: The scheduler's own torchrun options whose value the batch script fills in on each node, and
#: the variable that value comes from (the plan shows it as ``${VARIABLE}``).
PLACEHOLDERS = {"--nnodes": "SLURM_JOB_NUM_NODES", "--rdzv-endpoint": "TUNE_MAGIC_RDZV_ENDPOINT",
                "--rdzv-id": "SLURM_JOB_ID"}
# the torchrun options :func:`place` writes first, in pairs, before any word of the user's
_OWN_PAIRS = 5
_TORCHRUN_START = 3  # argv: python, -m, torch.distributed.run, <torchrun options>...


def placeholder_positions(plan: LaunchPlan) -> dict[int, str]:
    """``{argv index: variable}`` of the words of ``plan.argv`` that :func:`place` wrote as
    placeholders for the batch script to fill in. Found by position among the scheduler's own
    leading torchrun options, never by their text: a user's word that looks the same (an override
    ``tag=${SLURM_JOB_ID}``, a path) is not one and reaches the recipe exactly as typed."""
    out: dict[int, str] = {}
    if plan.scheduler != "slurm" or plan.rendezvous == "standalone":
        return out
    for k in range(_OWN_PAIRS):
        i = _TORCHRUN_START + 2 * k
        if i + 1 >= len(plan.argv):
            break
        var = PLACEHOLDERS.get(plan.argv[i])
        if var is not None and plan.argv[i + 1] == f"${{{var}}}" and not (
                var == "TUNE_MAGIC_RDZV_ENDPOINT" and plan.rendezvous == "user"):
            out[i + 1] = var
    return out


def place(spec: RunSpec, *, nodes: int | None, gpus_per_node: int | None) -> LaunchPlan:
    """The per-node command of a SLURM job (one torchrun agent per node) for ``spec``.

    On one node without an endpoint of the user's the agent runs ``--standalone`` inside the
    allocation; otherwise every node runs ``--nnodes ${SLURM_JOB_NUM_NODES} --rdzv-endpoint
    ${TUNE_MAGIC_RDZV_ENDPOINT} --rdzv-id ${SLURM_JOB_ID}``, placeholders the batch script fills in
    (the head is the batch host, see :mod:`.script`; which words they are:
    :func:`placeholder_positions`), or the user's endpoint unchanged.

    Raises:
        PlanError: ``--gpus`` (SLURM allocates GPUs), a torchrun option the scheduler sets per node,
            an elastic ``--nnodes`` range or one that disagrees with ``--nodes``, a one-device
            recipe on several processes.
    """
    _refuse_set_per_node(spec)
    nodes = _node_count(spec, nodes)
    endpoint, warnings = _user_rendezvous(spec)
    nproc, nproc_src = spec.given("nproc_per_node")
    if nproc is not None:
        check_nproc(nproc, nproc_src)
    else:
        nproc = str(gpus_per_node) if gpus_per_node else "1"
    if spec.supports_distributed is False and (nodes > 1 or nproc not in ("1",)):
        raise PlanError(f"recipe {spec.recipe_name} runs on one device and cannot use {nodes} node(s) x {nproc} processes; "
                        "use a *_distributed recipe")
    keep = [t for dest, group in spec.parsed.groups if dest not in _SLURM_REFUSED + _SLURM_PLACED for t in group]
    added_log_dir, rank_logs = rank_log_dir(spec.parsed.torchrun, spec.env, spec.job_dir, spec.cwd)
    keep += added_log_dir
    if nodes == 1 and endpoint is None:
        torchrun_args = ["--standalone", "--nproc_per_node", nproc, *keep]
        rendezvous = "standalone"
    else:
        backend = spec.given("rdzv_backend")[0] or "c10d"
        # the first _OWN_PAIRS pairs are the scheduler's own (placeholder_positions reads them)
        torchrun_args = ["--nnodes", "${SLURM_JOB_NUM_NODES}", "--nproc_per_node", nproc, "--rdzv-backend", backend,
                         "--rdzv-endpoint", endpoint or "${TUNE_MAGIC_RDZV_ENDPOINT}", "--rdzv-id", "${SLURM_JOB_ID}",
                         *keep]
        rendezvous = "user" if endpoint is not None else "scheduler"
    return LaunchPlan(argv=[sys.executable, "-m", "torch.distributed.run", *torchrun_args, *spec.recipe_args],
                      distributed=True, rendezvous=rendezvous, endpoint=endpoint, nproc_per_node=nproc,
                      nnodes=str(nodes), torchrun_args=torchrun_args, rank_log_dir=rank_logs, scheduler="slurm",
                      rdzv_conf=spec.given("rdzv_conf")[0],
                      **{**spec.common, "warnings": [*spec.common.get("warnings", ()), *warnings]})


def _refuse_set_per_node(spec: RunSpec) -> None:
    """Refuse ``--gpus`` and the torchrun options the scheduler sets on each node itself."""
    if spec.gpu_ids is not None:
        raise PlanError("--gpus picks GPUs of this machine; under --scheduler slurm SLURM allocates them: "
                        "give --gpus-per-node G instead")
    for dest in _SLURM_REFUSED:
        value, src = spec.given(dest)
        if value is not None and (dest != "standalone" or truthy(value)):
            fix = f"unset {src}" if src.startswith("PET_") else f"drop {src}"
            raise PlanError(f"{src} is set per node by the SLURM scheduler (head address, a free port, each node's "
                            f"address); {fix}, or use --scheduler local")


def _node_count(spec: RunSpec, nodes: int | None) -> int:
    """The number of nodes: ``--nodes``, or torchrun's ``--nnodes`` (a fixed count), else 1."""
    nnodes, nnodes_src = spec.given("nnodes")
    if nnodes is not None:
        lo, hi = parse_nnodes(nnodes, nnodes_src)
        if lo != hi:
            raise PlanError(f"{nnodes_src} {nnodes}: an elastic range is not supported under SLURM, which allocates "
                            "a fixed number of nodes; give --nodes N")
        if nodes is not None and nodes != lo:
            raise PlanError(f"{nnodes_src} {nnodes} and --nodes {nodes} differ; give one of them (they mean the same)")
        nodes = lo
    return nodes or 1


def _user_rendezvous(spec: RunSpec) -> tuple[str | None, list[str]]:
    """The user's own rendezvous endpoint (checked), or ``None``; and what to warn about it and
    about a ``--rdzv-id`` of theirs, which the job id replaces."""
    warnings = []
    endpoint, endpoint_src = spec.given("rdzv_endpoint")
    if endpoint is not None:
        check_endpoint(endpoint, endpoint_src)
        warnings.append(f"every node must reach your rendezvous endpoint {endpoint} ({endpoint_src}); it goes "
                        "unchanged to every node (leave it out and the scheduler uses the head node and a free port)")
    rdzv_id, id_src = spec.given("rdzv_id")
    if rdzv_id is not None:
        warnings.append(f"{id_src} {rdzv_id} is replaced by the SLURM job id ($SLURM_JOB_ID): one id per job")
    return endpoint, warnings
