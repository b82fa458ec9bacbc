"""Row 16: ``tune-magic stop --all`` stops N running jobs together, in at most 2× the time one
``tune-magic stop ID`` takes for one job (the anchor, same row run).

The jobs: the test-only toy recipe, one process each (no torchrun), ``steps=100000 step_s=0.2``,
launched with ``tune_magic.launch()`` and stopped once each has logged a step.
- 16a: each job takes its time to end, as a real one does (a rank in a collective, a recipe
  cleaning up: the issue measured 68 s for 30 stops one after another, 2.3 s each): the recipe
  ignores SIGTERM (``ignore_sigterm=true``), so each stop waits its grace period (``--grace 2``)
  and then kills it. Goal: ≤ 2×.
- 16b (full mode only): the recipe exits at once on SIGTERM: what is left is each stop's own
  CPU and that of each job's supervisor recording its end, on the machine's cores. Reported.
Each sample times the console script in a fresh process from start to exit: ``tune-magic stop
--grace G ID`` for one job (the anchor), ``tune-magic stop --grace G --all`` for N jobs (full: 30,
quick: 10). Checked after each sample: every job's status is ``stopped`` and no process
mentioning a job id is left. ``tune_magic.stop_jobs()`` (what ``--all`` and ``%tune_stop --all``
call) stops them from one thread each.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from bench.common import TOY_CONFIG, TOY_RECIPE, fmt, leftovers, log, median, ratio, row, row_main, spread

KEY, NUMBER = "stop_all", "16"
METRIC = "`tune-magic stop --all` of N running jobs"
GOAL = 2.0
CLI = Path(sys.executable).with_name("tune-magic")
ARGS = [str(TOY_RECIPE), "--config", str(TOY_CONFIG), "steps=100000", "step_s=0.2"]
GRACE = "2"


def _start(n: int, slow: bool) -> list:
    import tune_magic

    args = ARGS + (["ignore_sigterm=true"] if slow else [])
    jobs = [tune_magic.launch(args, name=f"stop-bench-{i}") for i in range(n)]
    deadline = time.monotonic() + 60 + 10 * n
    for job in jobs:
        while job.summary().step is None:
            if time.monotonic() > deadline or not job.status.is_live:
                raise RuntimeError(f"job {job.id} did not log a step ({job.status}): {job.tail(10)}")
            time.sleep(0.2)
    return jobs


def _timed_stop(args: list[str], jobs: list) -> float:
    t0 = time.perf_counter()
    r = subprocess.run([str(CLI), "stop", "--grace", GRACE, *args], capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"tune-magic stop {' '.join(args)} exited {r.returncode}: {r.stderr[-2000:]}")
    wrong = [(j.id, str(j.status)) for j in jobs if j.status != "stopped"]
    left = leftovers([j.id for j in jobs])
    if wrong or left:
        raise RuntimeError(f"after the stop: not stopped {wrong}; processes left {left}")
    return took


def _measure(n_jobs: int, rounds: int, slow: bool) -> tuple[list[float], list[float]]:
    one, many = [], []
    for k in range(rounds):
        (job,) = _start(1, slow)
        one.append(_timed_stop([job.id], [job]))
        jobs = _start(n_jobs, slow)
        many.append(_timed_stop(["--all"], jobs))
        log(f"{'slow' if slow else 'fast'} round {k + 1}: one stop {one[-1]:.2f} s, stop --all of {n_jobs} "
            f"jobs {many[-1]:.2f} s")
    return one, many


def run(quick: bool) -> list[dict]:
    n_jobs, rounds = (10, 1) if quick else (30, 3)
    rows = []
    for suffix, slow in (("a", True), ("b", False)):
        if quick and not slow:
            break
        one, many = _measure(n_jobs, rounds, slow)
        r = ratio(median(many), median(one))
        kind = ("each ignoring SIGTERM, so each stop waits its 2 s grace" if slow
                else "each exiting at once on SIGTERM")
        rows.append(row(
            KEY, NUMBER + suffix, f"`tune-magic stop --all` of {n_jobs} running jobs, {kind}",
            project=f"{fmt(median(many))} median",
            anchor=f"{fmt(median(one))} median (`tune-magic stop ID`, one such job)",
            ratio_text=f"{r}", goal=f"≤ {GOAL}×" if slow else "reported",
            met=(r is not None and r <= GOAL) if slow else None,
            how=(f"the console script in a fresh process, start to exit, `--grace {GRACE}`; {n_jobs} one-process toy "
                 f"jobs each past its first step; every job `stopped` and no process left, checked after each "
                 f"sample; {rounds} round{'s' if rounds > 1 else ''}, the anchor first in each"),
            spread_text=f"{spread(many)}; anchor {spread(one)}",
            note=("Stops run together (tune_magic.stop_jobs: one thread per job); before, one after another "
                  f"({n_jobs}× one stop)." if slow else
                  "Bounded by CPU: each job's exit and its supervisor's final write share the machine's cores."),
            data={"project_s": [round(x, 3) for x in many], "anchor_s": [round(x, 3) for x in one],
                  "jobs": n_jobs}))
    return rows


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
