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
import resource
import subprocess
import time
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
    from tune_magic.plan.configview import resolve_dirs
    from tune_magic.registry.ids import new_job_id

    tune_magic.make_assets()
    home = Path(os.environ["TUNE_MAGIC_HOME"])
    # warm-up: the first plan in a process reads torchrun's flags and torchtune's registry (from the tool
    # cache, or in a subprocess that imports torch when the cache is absent); row 8 reports that cost
    t = perf_counter()
    tune_magic.build_plan(args, job_id=new_job_id(), cwd=REPO)
    first_plan_s = perf_counter() - t
    a_s, b_s, ratios, jobs, ids = [], [], [], [], []
    cpu: dict[str, list[float]] = {"A": [], "B": []}
    fixed: dict[str, list[float]] = {"launch": [], "end": []}

    def children_cpu() -> float:
        """CPU seconds of this process's reaped children and their reaped descendants."""
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    def via_tune_magic() -> float:
        c0 = children_cpu()
        t = perf_counter()
        job = tune_magic.launch(args, cwd=REPO)
        fixed["launch"].append(perf_counter() - t)  # the agent starts this much later than with Popen
        jobs.append(job)
        ids.append(job.id)
        status = job.wait(timeout=900)
        wall = perf_counter() - t
        fixed["end"].append(time.time() - job.record.ended_at)  # supervisor's recorded end -> wait() returns
        # the supervisor is this process's child: reap it now, so its CPU and that of the job it
        # waited for (torchrun agent + workers) count for this run
        try:
            os.waitpid(job.record.supervisor.pid, 0)
        except ChildProcessError:
            pass  # reaped already (subprocess reaps abandoned children on a later Popen)
        cpu["A"].append(children_cpu() - c0)
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
            c0 = children_cpu()
            t = perf_counter()
            proc = subprocess.run(plan.argv, env={**os.environ, **plan.env}, cwd=REPO, stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=900)
            wall = perf_counter() - t
            cpu["B"].append(children_cpu() - c0)
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
    cpu_ratios = [a / b for a, b in zip(cpu["A"], cpu["B"])]
    med_r = median(ratios)
    met = med_r is not None and med_r <= GOAL
    note = (f"{steps} steps per run. Not timed: the first plan in the process ({first_plan_s:.2f} s: it reads "
            f"torchrun's flags and torchtune's registry, from the tool cache or in a subprocess; row 8 reports "
            f"first-launch time). Supervisor-recorded job time (ended_at − started_at) median "
            f"{median([j.ended_at - j.started_at for j in jobs]):.2f} s. CPU time of everything each run started "
            f"(getrusage of reaped children: supervisor + torchrun agent + workers vs agent + workers): A median "
            f"{median(cpu['A']):.2f} s, B {median(cpu['B']):.2f} s, per-pair CPU ratio median {median(cpu_ratios):.4f} "
            f"(spread {min(cpu_ratios):.4f}–{max(cpu_ratios):.4f}). Leftover processes: {len(left)}.")
    f_launch, f_end = median(fixed["launch"]), median(fixed["end"])
    f_total = f_launch + f_end  # the supervisor sees the agent's exit at once (a pidfd)
    note += (f" Fixed costs measured per run: `launch()` returns (and the torchrun agent has started) after "
             f"{f_launch:.3f} s median, where `Popen` takes milliseconds; from the supervisor recording the end to "
             f"`wait()` returning {f_end:.3f} s median (the supervisor sees the agent exit through a pidfd, "
             f"at once); about {f_total:.2f} s in all, {100 * f_total / median(b_s):.1f}% of the direct run's median: the expected "
             f"ratio is about {1 + f_total / median(b_s):.3f}.")
    if met and len(ratios) > 1:
        note += (f" Per-pair ratios spread {min(ratios):.3f}–{max(ratios):.3f}: the job's own run-to-run noise on this "
                 "2-core machine is wider than the 3% goal, so the median meets the goal but the run cannot resolve "
                 "an overhead of a few percent; the fixed costs above are the better estimate.")
    if not met and len(ratios) == 1:
        note += (" Goal missed in this single pair (quick mode): one pair cannot separate a few percent of overhead "
                 "from the job's run-to-run noise on this machine (±10–20%); the full mode runs 7 pairs.")
    elif not met:
        ordered = sorted(ratios)
        q1, q3 = ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]
        of_medians = median(a_s) / median(b_s)
        note += (f" Goal missed by the median of per-pair ratios; the ratio of the medians is {of_medians:.3f}. "
                 f"The pair-to-pair noise (ratios {ordered[0]:.3f}–{ordered[-1]:.3f}, IQR {q1:.3f}–{q3:.3f}) is "
                 "far wider than the 3% goal, so on this shared 2-core machine the run cannot tell a 3% "
                 f"overhead from none. The fixed costs tune_magic adds are small against a {median(b_s):.1f} s job: the "
                 "supervisor's start before torchrun starts (row 1: ~0.12 s warm), and noticing the end "
                 "(the supervisor sees the exit through a pidfd; job.wait() wakes on the record's rename); worker discovery "
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
        data={"steps": steps, "tune_magic_s": a_s, "direct_s": b_s, "ratios": ratios, "cpu_s": cpu,
              "cpu_ratios": cpu_ratios, "fixed_s": fixed, "leftovers": left},
    )]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
