"""Row 17: a sweep on SLURM (one job array) vs a hand-written ``sbatch --array`` script running the
same commands, on the two-node test cluster (tests/slurmcluster.py, started by this row).

8 trials (quick: 3) of the test-only stand-in recipe (``--nproc_per_node 1 toy_recipe.py --config
toy.yaml start_loss=1,...,8 steps=4 step_s=0.5``), ``--max-parallel 2``, one CPU per task:

- project: ``tune_magic.sweep(..., scheduler="slurm", max_parallel=2, cpus_per_node=1)`` called,
  then ``Sweep.wait()``; the makespan is from the call to the wait's return (every trial ended
  and recorded).
- anchor: a hand-written array script, ``#SBATCH --array=0-7%2``, ``--cpus-per-task=1``, whose task
  ``i`` runs ``srun`` with trial ``i``'s torchrun command (exactly as the sweep's local dry run builds
  it: ``plan.command_line()``, with its own ``output_dir``), then a time stamp; the makespan is from
  sbatch's start to the last task's stamp (``sbatch --wait`` is not used: it polls the controller
  at growing intervals, which would count against the anchor).

Medians of 3 alternated runs (quick: 1 each); goal ≤ 1.1×.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from time import perf_counter

from bench.common import REPO, TOY_CONFIG, TOY_RECIPE, alternated, fmt, leftovers, log, median, ratio, row, row_main, spread

KEY, NUMBER = "sweep_slurm", "17"
METRIC = "SLURM sweep, 8 trials %2 on the test cluster: makespan"
GOAL_RATIO = 1.1
K = 2


def _args(n: int, steps: int) -> str:
    losses = ",".join(str(i + 1) for i in range(n))
    return f"--nproc_per_node 1 {TOY_RECIPE} --config {TOY_CONFIG} start_loss={losses} steps={steps} step_s=0.5"


def _sweep_run(n: int, steps: int) -> dict:
    import tune_magic

    t = perf_counter()
    sweep = tune_magic.sweep(_args(n, steps), scheduler="slurm", max_parallel=K, cpus_per_node=1, cwd=REPO,
                             name="bench-slurm")
    counts = sweep.wait(timeout=900)
    makespan = perf_counter() - t
    if counts != {"succeeded": n}:
        raise RuntimeError(f"sweep {sweep.id}: {counts}")
    return {"s": makespan, "id": sweep.id, "jobs": [t.job_id for t in sweep.record.trials]}


def _anchor_run(n: int, steps: int, work: Path, env: dict) -> dict:
    import tune_magic

    dry = tune_magic.sweep(_args(n, steps), max_parallel=K, cwd=REPO, dry_run=True, scheduler="local")
    ends = work / f"ends-{dry.id}"
    ends.mkdir()
    cases = "".join(f"  {i}) srun --nodes=1 --ntasks=1 --cpus-per-task=1 env {plan.command_line()} ;;\n"
                    for i, plan in enumerate(dry.plans))
    script = work / f"array-{dry.id}.sh"
    script.write_text(f"""#!/bin/bash
#SBATCH --array=0-{n - 1}%{K}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --output={work}/anchor-{dry.id}-%a.log
#SBATCH --chdir={REPO}
cd {shlex.quote(str(REPO))}
case "$SLURM_ARRAY_TASK_ID" in
{cases}esac
date +%s.%N > {shlex.quote(str(ends))}/"$SLURM_ARRAY_TASK_ID"
""")
    t = time.time()
    proc = subprocess.run(["sbatch", "--parsable", str(script)], env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch exited {proc.returncode}: {proc.stderr[-500:]}")
    array_id = proc.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 900
    while len(list(ends.iterdir())) < n or _live(array_id, env):  # (the array's end, not the makespan)
        if time.monotonic() > deadline:
            raise RuntimeError(f"anchor array {array_id} still running after 900 s; see {work}")
        time.sleep(0.2)
    # the makespan: submission to the last task's command's end, as the tasks wrote it (SLURM's own
    # clean-up after it is not counted: in the anchor's favour)
    makespan = max(float(f.read_text()) for f in ends.iterdir()) - t
    done = sum(1 for i in range(n) if "toy recipe done" in (work / f"anchor-{dry.id}-{i}.log").read_text())
    if done != n:
        raise RuntimeError(f"only {done} of {n} anchor tasks finished; see {work}")
    return {"s": makespan, "ids": [p.job_id for p in dry.plans]}


def _live(array_id: str, env: dict) -> bool:
    out = subprocess.run(["squeue", "-r", f"--jobs={array_id}", "--noheader", "--format=%T"], env=env,
                         capture_output=True, text=True, timeout=60).stdout.split()
    return any(state in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING") for state in out)


def run(quick: bool) -> list[dict]:
    """Long: starts the test cluster, runs the alternated rounds and stops the cluster in one place."""
    sys.path.insert(0, str(REPO / "tests"))
    import slurmcluster

    n, rounds, steps = (3, 1, 4) if quick else (8, 3, 4)
    cluster = slurmcluster.start_cluster("netns")
    try:
        for key in [k for k in os.environ if k.startswith(slurmcluster.CLIENT_ENV_PREFIXES)]:
            del os.environ[key]
        os.environ.update(SLURM_CONF=cluster.env["SLURM_CONF"], PATH=cluster.env["PATH"])
        work = Path(tempfile.mkdtemp(prefix="bench_slurm_", dir=os.environ["TUNE_MAGIC_HOME"]))
        ids: list[str] = []
        _sweep_run(2, 1)  # warm-up, discarded: the first plan reads the tool cache, compiles .pyc

        def sweep_sample(i: int) -> dict:
            got = _sweep_run(n, steps)
            ids.extend(got["jobs"] + [got["id"]])
            log(f"round {i} sweep (one array): {got['s']:.2f} s")
            return got

        def array_sample(i: int) -> dict:
            got = _anchor_run(n, steps, work, dict(os.environ))
            ids.extend(got["ids"])
            log(f"round {i} hand-written sbatch --array: {got['s']:.2f} s")
            return got

        project, anchor = alternated(rounds, sweep_sample, array_sample)
        cluster.wait_idle(60)
    finally:
        cluster.stop()
    left = leftovers(ids)
    p_s, a_s = [x["s"] for x in project], [x["s"] for x in anchor]
    r = ratio(median(p_s), median(a_s))
    how = (f"{n} trials, `--nproc_per_node 1` toy recipe, steps={steps} step_s=0.5, `--max-parallel {K}` "
           f"(`%{K}`), one CPU a task, on the two-node test cluster (network namespaces, SLURM 22.05); "
           f"{rounds} alternated run{'s' if rounds > 1 else ''} of each (the anchor first in even rounds) after "
           "a two-trial one-step warm-up sweep")
    return [row(KEY, NUMBER, f"SLURM sweep, {n} trials %{K} on the test cluster: makespan",
                project=f"{fmt(median(p_s), digits=2)} median (`sweep(scheduler=\"slurm\")` to `wait()` returning)",
                anchor=(f"{fmt(median(a_s), digits=2)} median (a hand-written `sbatch --array=0-{n - 1}%{K}` script, "
                        "`srun` of the same torchrun commands; to the last task's own end stamp)"),
                ratio_text=f"{r}", goal=f"≤ {GOAL_RATIO}×", met=r is not None and r <= GOAL_RATIO, how=how,
                spread_text=f"{spread(p_s, digits=2)}; anchor {spread(a_s, digits=2)}",
                note=(f"Leftover processes: {len(left)}. Each trial's task runs the trial's own batch script: the "
                      "head's address and a free port (`python -m tune_magic.schedulers.slurm.node head`), then "
                      "`srun` of the per-node helper, which starts torchrun; the exit file; the anchor's tasks "
                      "`srun` torchrun at once."),
                data={"project_s": p_s, "anchor_s": a_s})]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
