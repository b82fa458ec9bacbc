"""Row 13: a local sweep's makespan vs the same torchrun commands run by ``xargs -P K``, and the gap
between a trial's end and the next trial's start in its slot.

16 trials (quick: 6) of the test-only stand-in recipe under torchrun (``--nproc_per_node 1
toy_recipe.py --config toy.yaml start_loss=1,2,...`` with ``steps=8 step_s=0.25``, quick ``steps=4``:
about 2 s of steps after torch's start-up), ``--max-parallel 4``:

- 13a, project: ``tune_magic.sweep(...)`` called, then ``Sweep.wait()``; the makespan is from the
  call to the wait's return (every trial ended and recorded). Anchor: the same 16 commands, each
  exactly as the sweep's dry run builds it (``plan.command_line()``: its environment, the kernel's
  Python, torchrun's options, the recipe and every override, its own ``output_dir``), run by ``xargs
  -P 4 -d '\\n' -I CMD sh -c CMD`` from a file, output to a log per command; the makespan is xargs'
  wall time. Medians of 3 alternated runs (quick: 1 each); goal ≤ 1.1×.
- 13b: in each sweep run, for every trial that took a slot another trial had held, the time from
  the previous trial's end (its command's exit, as the exit wrapper wrote it in ``exit_code``) to
  the start of the next trial's process in that slot (the torchrun agent's create time, from its
  record); median of all such gaps, goal ≤ 0.5 s.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from time import perf_counter

from bench.common import (REPO, TOY_CONFIG, TOY_RECIPE, alternated, fmt, leftovers, log, median, ratio, row, row_main,
                          spread)

KEY, NUMBER = "sweep_makespan", "13"
METRIC = "Local sweep, 16 trials of the stand-in recipe at --max-parallel 4: makespan"
GOAL_RATIO, GOAL_GAP_S = 1.1, 0.5
K = 4


def _args(n: int, steps: int = 8) -> str:
    losses = ",".join(str(i + 1) for i in range(n))
    return f"--nproc_per_node 1 {TOY_RECIPE} --config {TOY_CONFIG} start_loss={losses} steps={steps} step_s=0.25"


def _sweep_run(n: int, steps: int) -> dict:
    import tune_magic

    t = perf_counter()
    sweep = tune_magic.sweep(_args(n, steps), max_parallel=K, cwd=REPO, name="bench-makespan")
    counts = sweep.wait(timeout=900)
    makespan = perf_counter() - t
    if counts != {"succeeded": n}:
        raise RuntimeError(f"sweep {sweep.id}: {counts}")
    from tune_magic.registry import store as jobstore

    by_slot: dict[int, list] = {}
    for trial in sweep.record.trials:
        job = tune_magic.get_job(trial.job_id)
        exited = jobstore.read_exit_code(job.dir)  # the exit wrapper's time of the command's exit
        # (agent start, exit, its end recorded, its registration)
        by_slot.setdefault(trial.slot, []).append((job.record.agent.create_time, exited.ended_at, job.ended_at,
                                                   job.started_at))
    gaps, parts = [], []
    for runs in by_slot.values():
        runs.sort()
        for prev, nxt in zip(runs, runs[1:]):
            gaps.append(nxt[0] - prev[1])
            parts.append((prev[2] - prev[1], nxt[3] - prev[2], nxt[0] - nxt[3]))
    return {"s": makespan, "gaps": gaps, "parts": parts, "id": sweep.id,
            "jobs": [t.job_id for t in sweep.record.trials]}


def _xargs_run(n: int, steps: int, work: Path) -> dict:
    import tune_magic

    dry = tune_magic.sweep(_args(n, steps), max_parallel=K, cwd=REPO, dry_run=True)
    lines = []
    for i, plan in enumerate(dry.plans):
        log_path = work / f"xargs-{dry.id}-{i}.log"
        lines.append(f"cd {shlex.quote(str(REPO))} && {plan.command_line()} > {shlex.quote(str(log_path))} 2>&1")
    commands = work / f"commands-{dry.id}.txt"
    commands.write_text("\n".join(lines) + "\n")
    t = perf_counter()
    proc = subprocess.run(["xargs", "-P", str(K), "-d", "\n", "-I", "CMD", "sh", "-c", "CMD"],
                          stdin=open(commands), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900)
    makespan = perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"xargs exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    done = sum(1 for i in range(n) if "toy recipe done" in (work / f"xargs-{dry.id}-{i}.log").read_text())
    if done != n:
        raise RuntimeError(f"only {done} of {n} anchor commands finished; see {work}")
    return {"s": makespan, "ids": [p.job_id for p in dry.plans]}


def run(quick: bool) -> list[dict]:
    n, rounds, steps = (6, 1, 4) if quick else (16, 3, 8)
    work = Path(tempfile.mkdtemp(prefix="bench_sweep_", dir=os.environ["TUNE_MAGIC_HOME"]))
    ids: list[str] = []
    _sweep_run(2, 1)  # warm-up, discarded: the first plan reads the tool cache, compiles .pyc

    def sweep_sample(i: int) -> dict:
        got = _sweep_run(n, steps)
        ids.extend(got["jobs"] + [got["id"]])
        log(f"round {i} sweep: {got['s']:.2f} s, gaps median {fmt(median(got['gaps']))}")
        return got

    def xargs_sample(i: int) -> dict:
        got = _xargs_run(n, steps, work)
        ids.extend(got["ids"])
        log(f"round {i} xargs -P {K}: {got['s']:.2f} s")
        return got

    project, anchor = alternated(rounds, sweep_sample, xargs_sample)
    left = leftovers(ids)
    p_s, a_s = [x["s"] for x in project], [x["s"] for x in anchor]
    gaps = [g for x in project for g in x["gaps"]]
    parts = [p for x in project for p in x["parts"]]
    split = ", ".join(f"{what} {fmt(median([p[i] for p in parts]))}" for i, what in enumerate(
        ("exit to the end recorded by its supervisor", "that to the next trial's registration by the sweep process",
         "registration to the next torchrun agent's start (the launch's own start-up)")))
    load = [round(x, 2) for x in os.getloadavg()]
    r = ratio(median(p_s), median(a_s))
    how = (f"{n} trials, `--nproc_per_node 1` toy recipe, steps={steps} step_s=0.25, `--max-parallel {K}`; "
           f"{rounds} alternated run{'s' if rounds > 1 else ''} of each (the anchor first in even rounds) after "
           "a two-trial one-step warm-up sweep")
    return [
        row(KEY, NUMBER + "a", f"Local sweep, {n} trials of the stand-in recipe at --max-parallel {K}: makespan",
            project=f"{fmt(median(p_s), digits=2)} median (`sweep()` to `wait()` returning)",
            anchor=f"{fmt(median(a_s), digits=2)} median (the same {n} torchrun commands by `xargs -P {K}`)",
            ratio_text=f"{r}", goal=f"≤ {GOAL_RATIO}×", met=r is not None and r <= GOAL_RATIO, how=how,
            spread_text=f"{spread(p_s, digits=2)}; anchor {spread(a_s, digits=2)}",
            note=f"Leftover processes: {len(left)}.", data={"project_s": p_s, "anchor_s": a_s}),
        row(KEY, NUMBER + "b", "Local sweep: a trial's end to the next trial's start in its slot",
            project=f"{fmt(median(gaps))} median", anchor="—", ratio_text="—", goal=f"≤ {GOAL_GAP_S} s",
            met=median(gaps) is not None and median(gaps) <= GOAL_GAP_S,
            how=("a trial's exit (the exit wrapper's time in its `exit_code`) to the create time of the next "
                 "trial's torchrun agent in the same slot, from the job records of 13a's sweep runs"),
            spread_text=spread(gaps), data={"gaps_s": [round(g, 4) for g in gaps]},
            note=(f"Medians of the parts: {split}. The path: the trial's supervisor records its end (the record "
                  "replaced); the sweep process, woken by that (file-change notification), registers the next trial "
                  "and hands it to the local scheduler in a thread, whose supervisor starts torchrun. On 2 shared "
                  f"cores the running trials compete with each step; load average at the row's end {load}.")),
    ]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
