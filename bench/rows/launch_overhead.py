"""Row 2: wall time of a LoRA job launched through tune_magic vs the same command run directly.

A: ``tune_magic.launch("--nproc_per_node 2 lora_finetune --config tiny/lora max_steps_per_epoch=N")``
then ``job.wait()``; wall = the launch call to the status being final (supervisor, record
keeping, worker discovery and the wait's polling all included).
B: ``subprocess.run(plan.argv, env={**os.environ, **plan.env})`` with ``plan =
tune_magic.build_plan(same args, job_id=...)``, output to a log file as the supervisor does.
Pairs alternate A B, B A, ... so drift in machine load hits both sides alike; the ratio A/B is
taken per pair. Both must train every step (the DiskLogger file has one line per step).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from time import perf_counter

from bench.common import (LORA_ARGS, REPO, leftovers, log, median, row, row_main, spread, stop_all)

KEY, NUMBER, METRIC = "launch_overhead", "2", "Launch overhead: LoRA 2-process job wall time via tune_magic / direct"
GOAL = 1.03


def _metric_lines(output_dir: str) -> int:
    logs = sorted(Path(output_dir, "logs").glob("log_*.txt"))
    return len(logs[-1].read_text().splitlines()) if logs else 0


def run(quick: bool) -> list[dict]:
    steps = 5 if quick else 20
    pairs = 1 if quick else 7
    args = f"{LORA_ARGS} max_steps_per_epoch={steps}"

    import tune_magic
    from tune_magic.configview import resolve_dirs
    from tune_magic.ids import new_job_id

    tune_magic.make_assets()
    home = Path(os.environ["TUNE_MAGIC_HOME"])
    # warm-up: the first plan in a process imports torch (torchrun's flags); row 1 reports that cost
    t = perf_counter()
    tune_magic.build_plan(args, job_id=new_job_id(), cwd=REPO)
    first_plan_s = perf_counter() - t
    a_s, b_s, ratios, jobs, ids = [], [], [], [], []

    def via_tune_magic() -> float:
        t = perf_counter()
        job = tune_magic.launch(args, cwd=REPO)
        jobs.append(job)
        ids.append(job.id)
        status = job.wait(timeout=900)
        wall = perf_counter() - t
        if status != "succeeded" or _metric_lines(job.output_dir) != steps:
            raise RuntimeError(f"tune_magic run {job.id}: {status}, {_metric_lines(job.output_dir)} metric lines; "
                               f"error {job.error}")
        return wall

    def direct() -> float:
        job_id = new_job_id()
        ids.append(job_id)
        plan = tune_magic.build_plan(args, job_id=job_id, cwd=REPO)
        logfile = home / f"direct_{job_id}.log"
        with open(logfile, "wb") as out:
            t = perf_counter()
            proc = subprocess.run(plan.argv, env={**os.environ, **plan.env}, cwd=REPO, stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=900)
            wall = perf_counter() - t
        if proc.returncode != 0 or _metric_lines(resolve_dirs(plan).output_dir) != steps:
            raise RuntimeError(f"direct run {job_id}: exit {proc.returncode}; see {logfile}")
        return wall

    try:
        for p in range(pairs):
            order = ("A", "B") if p % 2 == 0 else ("B", "A")
            got = {}
            for side in order:
                got[side] = via_tune_magic() if side == "A" else direct()
            a_s.append(got["A"])
            b_s.append(got["B"])
            ratios.append(got["A"] / got["B"])
            log(f"pair {p} ({''.join(order)}): tune_magic {got['A']:.2f} s, direct {got['B']:.2f} s, "
                f"ratio {ratios[-1]:.4f}")
    finally:
        stop_all(jobs)
    left = leftovers(ids)
    med_r = median(ratios)
    met = med_r is not None and med_r <= GOAL
    note = (f"{steps} steps per run. Not timed: the first plan in the process ({first_plan_s:.2f} s, it imports torch "
            f"for torchrun's flags; row 1 reports first-launch time). Supervisor-recorded job time (ended_at − started_at) median "
            f"{median([j.ended_at - j.started_at for j in jobs]):.2f} s. Leftover processes: {len(left)}.")
    if not met:
        ordered = sorted(ratios)
        q1, q3 = ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]
        of_medians = median(a_s) / median(b_s)
        note += (f" Goal missed by the median of per-pair ratios; the ratio of the medians is {of_medians:.3f}. "
                 f"The pair-to-pair noise (ratios {ordered[0]:.3f}–{ordered[-1]:.3f}, IQR {q1:.3f}–{q3:.3f}) is "
                 "far wider than the 3% goal, so on this shared 2-core machine the run cannot tell a 3% "
                 "overhead from none. The fixed costs tune_magic adds are small against a ~10 s job: the "
                 "supervisor's start before torchrun starts (row 1: ~0.12 s warm), and noticing the end "
                 "(the supervisor waits in 0.2 s steps, job.wait() re-checks every 0.1 s); worker discovery "
                 "reads /proc only until all workers are found, then every 5 s. A 2-process job on 2 cores "
                 "leaves no idle core, so any of this competes with the workers directly.")
    return [row(
        KEY, NUMBER, METRIC,
        project=f"{median(a_s):.2f} s median (`launch()` + `wait()`)",
        anchor=f"{median(b_s):.2f} s median (`subprocess.run(plan.argv)`)",
        ratio_text=f"{med_r:.4f} (median of per-pair ratios)",
        goal=f"≤ {GOAL}", met=met,
        how=f"LoRA `tiny/lora`, 2 processes, {steps} steps, {pairs} alternated A/B pair(s)",
        spread_text=f"ratios {spread(ratios, unit='', digits=4)}; A {spread(a_s, digits=2)}; B {spread(b_s, digits=2)}",
        note=note,
        data={"steps": steps, "tune_magic_s": a_s, "direct_s": b_s, "ratios": ratios, "leftovers": left},
    )]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
