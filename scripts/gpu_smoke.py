"""The seed scenario in small, on a GPU machine: run through ``scripts/gpu-smoke`` (it prepares Python).

GPU mode (default):

1. two concurrent jobs of torchtune's built-in ``lora_finetune_distributed`` with the shipped
   ``tiny/builtin_lora`` config, one process each, both on GPU 0 (``--force`` to share it), nccl;
2. the project's ``lora_finetune`` recipe with 2 processes on nccl (GPUs 0,1) when two GPUs are
   visible, else with 1 process on GPU 0 (NCCL refuses two ranks on one GPU).

CPU mode (``--cpu``; what can run here): the same two phases with the project's recipe only
(torchtune's built-in distributed recipe hard-codes nccl, so it is only imported), on gloo: two
concurrent 1-process jobs, then one 2-process job.

``--dry-run`` prints each job's launch plan and starts nothing.

Prints each job's status, rendezvous port and last loss; exits 1 on any failure (a job not
``succeeded``, no loss logged, no port recorded, or the two concurrent jobs on one port), 0 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

#: Seconds one phase's jobs may take before they are stopped and counted as failed.
PHASE_TIMEOUT_S = 150.0
#: Steps per job: enough for a falling loss, short enough for the device call's 420 s.
GPU_STEPS = 20
CPU_STEPS = 5


@dataclass
class Spec:
    """One job to launch: ``args`` as ``%tune_run`` takes them, and the GPU ids (None: none)."""

    name: str
    args: str
    gpus: list[int] | None = None
    env: dict[str, str] = field(default_factory=dict)


def phases(cpu: bool, n_gpus: int) -> list[list[Spec]]:
    """The jobs of each phase; the jobs of one phase run at the same time."""
    if cpu:
        lora = f"lora_finetune --config tiny/lora max_steps_per_epoch={CPU_STEPS}"
        return [
            [Spec("project-lora-a", f"--nproc_per_node 1 {lora}"), Spec("project-lora-b", f"--nproc_per_node 1 {lora}")],
            [Spec("project-lora-gloo-2p", f"--nproc_per_node 2 {lora}")],
        ]
    # NCCL_DEBUG=INFO makes NCCL say that it ran ("NCCL INFO" lines), read back for the nccl column
    nccl = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"}
    builtin = f"lora_finetune_distributed --config tiny/builtin_lora max_steps_per_epoch={GPU_STEPS}"
    lora = f"lora_finetune --config tiny/lora device=cuda dtype=bf16 max_steps_per_epoch={GPU_STEPS}"
    second = (Spec("project-lora-nccl-2p", lora, [0, 1], nccl) if n_gpus >= 2
              else Spec("project-lora-nccl-1p", lora, [0], nccl))
    return [[Spec("builtin-lora-a", builtin, [0], nccl), Spec("builtin-lora-b", builtin, [0], nccl)], [second]]


def header(cpu: bool, dry_run: bool = False) -> list[str]:
    """Date, host, Python, torch (version only: CUDA is never initialised here) and GPUs."""
    import torch

    from tune_magic import gpus

    lines = [f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
             f"python: {platform.python_version()} ({sys.executable})",
             f"torch: {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})",
             f"mode: {'cpu (gloo, project recipe only)' if cpu else 'gpu (nccl)'}" + (" (dry run)" if dry_run else "")]
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        lines += [f"gpu: {line}" for line in out.splitlines()] or ["gpu: nvidia-smi listed none"]
    visible = gpus.visibility()
    lines.append(f"visible to jobs: {visible.describe()}")
    return lines


def import_builtin_recipe() -> str | None:
    """Import torchtune's ``lora_finetune_distributed`` in a fresh process, without running it
    (``--cpu``: it needs CUDA to run, but a missing package shows at import). ``None`` when it imports,
    else what went wrong."""
    from tune_magic.config import catalog

    path = catalog.find_recipe("lora_finetune_distributed").path
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('builtin_recipe', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); assert callable(m.recipe_main)")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    if proc.returncode == 0:
        return None
    return f"torchtune's {path.name} does not import: " + (proc.stderr.strip().splitlines() or ["?"])[-1]


def run_phase(specs: list[Spec], cwd: Path, timeout_s: float) -> list:
    """Launch every job of a phase, then wait for all; a job still running at the deadline is stopped."""
    from tune_magic import launch

    jobs = [launch(s.args, name=s.name, gpus=s.gpus, force=True, cwd=cwd, env={**os.environ, **s.env})
            for s in specs]
    deadline = time.monotonic() + timeout_s
    for job in jobs:
        try:
            job.wait(timeout=max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            print(f"job {job.id} ({job.name}) still running after {timeout_s:.0f} s: stopping it", flush=True)
            job.stop(grace_s=5)
    return jobs


def nccl_seen(job) -> str:
    """``yes`` when the job's log has NCCL's own INFO lines, else ``no``."""
    try:
        return "yes" if "NCCL INFO" in Path(job.log_path).read_text(errors="replace") else "no"
    except OSError:
        return "?"


def check(phase_jobs: list[list]) -> list[str]:
    """Every failure of the run, as sentences (empty: all passed)."""
    from tune_magic.ui.demo import final_loss

    failures = []
    for jobs in phase_jobs:
        for job in jobs:
            if job.status != "succeeded":
                failures.append(f"{job.name} ({job.id}) ended {job.status}: {job.error or 'no error recorded'}")
            if final_loss(job)[1] is None:
                failures.append(f"{job.name} ({job.id}) logged no loss")
            if not job.rendezvous_endpoint:
                failures.append(f"{job.name} ({job.id}) recorded no rendezvous endpoint")
        ports = [j.rendezvous_endpoint for j in jobs if j.rendezvous_endpoint]
        if len(ports) != len(set(ports)):
            failures.append(f"concurrent jobs shared a rendezvous endpoint: {ports}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the project's recipe on gloo only (no GPU needed)")
    parser.add_argument("--dry-run", action="store_true", help="print the launch plans; start nothing")
    parser.add_argument("--gpus-for-plans", type=int, default=2, metavar="N",
                        help="with --dry-run: plan as if N GPUs were visible (default 2)")
    parser.add_argument("--timeout", type=float, default=PHASE_TIMEOUT_S, help="seconds per phase (default %(default)s)")
    ns = parser.parse_args(argv)

    from tune_magic import launch, make_assets

    from tune_magic import gpus
    from tune_magic.ui.demo import summary
    from tune_magic.paths import home

    print("\n".join(header(ns.cpu, ns.dry_run)), flush=True)
    n_gpus = ns.gpus_for_plans if ns.dry_run else len(gpus.visible_gpus())
    if not ns.cpu and not ns.dry_run and n_gpus == 0:
        print("gpu-smoke: FAILED: no GPU is visible (see above); run on a GPU machine, or pass --cpu", file=sys.stderr)
        return 1
    cwd = home() / "gpu-smoke" / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    cwd.mkdir(parents=True, exist_ok=True)
    plan = phases(ns.cpu, n_gpus)
    if ns.dry_run:
        for number, specs in enumerate(plan, 1):
            for s in specs:
                p = launch(s.args, name=s.name, gpus=s.gpus, cwd=cwd, dry_run=True, env={**os.environ, **s.env})
                print(f"\n# phase {number}, {s.name}: rendezvous={p.rendezvous}, nproc_per_node={p.nproc_per_node}, "
                      f"gpus={s.gpus}\n{p.command_line()}")
        return 0

    started = time.monotonic()
    assets = make_assets()
    print(f"assets: {assets.root} ({time.monotonic() - started:.1f} s)", flush=True)
    failures = []
    if ns.cpu:
        problem = import_builtin_recipe()
        print(f"torchtune's lora_finetune_distributed imports: {'no: ' + problem if problem else 'yes'}", flush=True)
        failures += [problem] if problem else []
    done = []
    for number, specs in enumerate(plan, 1):
        print(f"\nphase {number}: " + ", ".join(f"{s.name} on GPUs {s.gpus}" if s.gpus else s.name for s in specs),
              flush=True)
        jobs = run_phase(specs, cwd, ns.timeout)
        done.append(jobs)
        print(summary(jobs))
        for job in jobs:
            env = job.record.env
            print(f"  {job.name}: CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '(unset)')}"
                  + ("" if ns.cpu else f", NCCL ran: {nccl_seen(job)}"), flush=True)
    failures += check(done)
    for jobs in done:
        for job in jobs:
            if job.status != "succeeded":
                print(f"\n--- last lines of {job.name} ({job.log_path}) ---\n" + "\n".join(job.tail(25)))
    print(f"\ngpu-smoke: {'FAILED' if failures else 'passed'} in {time.monotonic() - started:.0f} s "
          f"({sum(map(len, done))} jobs; TUNE_MAGIC_HOME={home()})")
    for f in failures:
        print(f"  - {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
