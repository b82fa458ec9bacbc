"""What a new job may not share with the live jobs of this machine: a GPU, an output directory (or
one inside another), a rendezvous port. Checked under the launch lock, so of two launches racing for
one of them exactly one is refused (:func:`tune_magic.job.launch.launch`).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Iterable

from tune_magic.errors import PlanError
from tune_magic.job import Job
from tune_magic.plan.model import LaunchPlan
from tune_magic.registry import store as jobstore
from tune_magic.registry.store import JobRecord
from tune_magic import gpus as gpu_mod

_HOST = socket.gethostname()


def same_or_nested(a: str, b: str) -> bool:
    """Whether directories ``a`` and ``b`` (links resolved) are the same or one holds the other."""
    a, b = Path(os.path.realpath(a)), Path(os.path.realpath(b))
    return a == b or a in b.parents or b in a.parents


def _local_port(endpoint: str | None) -> int | None:
    """The port of ``host:port`` when the host is this machine, else ``None``."""
    import socket

    if not endpoint:
        return None
    host, sep, port = endpoint.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit():
        return None
    mine = {"", "localhost", "0.0.0.0", "::", "::1", socket.gethostname(), socket.getfqdn()}
    return int(port) if host in mine or host.startswith("127.") else None


def check_clashes(resolved, dirs, running: list[Job], *, force: bool, plan: LaunchPlan | None = None) -> None:
    """Refuse a GPU, a directory or a rendezvous port on this machine that a live job uses (unless
    ``force``). Called under the launch lock, so two launches racing for the same GPU or
    ``output_dir``: exactly one is refused."""
    if force:
        return
    port = _local_port(plan.endpoint) if plan is not None and plan.rendezvous == "user" else None
    if port:
        for job in running:
            if _HOST in job.nodes and _local_port(job.record.rendezvous_endpoint) == port:
                raise PlanError(f"port {port} of your rendezvous endpoint is the rendezvous of {job.record.status} job "
                                f"{job.id}: the second job would fail (EADDRINUSE) or join the first one's rendezvous; "
                                "leave the endpoint out (a free port is picked), choose another port, or pass --force")
    if resolved is not None:
        busy = {str(k): v for k, v in busy_gpus(running).items()}
        for typed, physical in zip(resolved.typed, resolved.physical):
            if str(physical) in busy:
                shown = f"GPU {typed}" + (f" (physical {physical})" if str(typed) != str(physical) else "")
                raise gpu_mod.GpuError(f"{shown} is used by running job {busy[str(physical)]}; pick another GPU, stop "
                                       "that job, or pass --force / force=True to share it")
    mine = [x for x in (dirs.output_dir, dirs.metric_log_dir, dirs.checkpoint_dir) if x]
    for job in running:
        theirs = [x for x in (job.output_dir, job.record.metric_log_dir, job.record.checkpoint_dir) if x]
        clash = next(((m, t) for m in mine for t in theirs if same_or_nested(m, t)), None)
        if clash:
            raise PlanError(
                f"{clash[0]} would share {clash[1]} with {job.record.status} job {job.id}; choose another "
                "output_dir=..., stop that job, or pass --force / force=True"
            )


def busy_gpus(running: list[Job]) -> dict[int | str, str]:
    """Physical GPU -> id of the live job using it (records made before ``physical_gpus`` existed
    hold physical ids in ``gpus``)."""
    busy: dict[int | str, str] = {}
    for j in running:
        r = j.record
        for g in (r.physical_gpus if r.physical_gpus is not None else r.gpus) or []:
            busy[g] = j.id
    return busy


def live_jobs(records: Iterable[JobRecord]) -> list[Job]:
    """The jobs of ``records`` that are live (pending or running) once their scheduler was asked."""
    out = []
    for r in records:
        if r.state.is_live:
            job = Job(jobstore.job_dir(r.id), r)
            if job.refresh().record.state.is_live:
                out.append(job)
    return out
