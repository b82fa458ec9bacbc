"""Row 13: ``tune-magic stop --all`` stops N running jobs together, in at most 2× the time one
``tune-magic stop ID`` takes for one job (the anchor, same row run).

The jobs: the test-only toy recipe, one process each (no torchrun), ``steps=100000 step_s=0.2``,
launched with ``tune_magic.launch()`` and stopped once each has logged a step (the recipe exits on
SIGTERM, as torchtune's do). Each sample times the console script in a fresh process from start to
exit: ``tune-magic stop --grace 10 ID`` for one job (the anchor), ``tune-magic stop --grace 10
--all`` for N jobs (full: 30, quick: 10). Checked after each sample: every job's status is
``stopped`` and no process mentioning a job id is left. Before the fix, stops ran one after
another (30 jobs: 68 s measured by the issue); ``tune_magic.stop_jobs()`` (what ``--all`` and
``%tune_stop --all`` call) stops them from one thread each.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from bench.common import TOY_CONFIG, TOY_RECIPE, fmt, leftovers, log, median, ratio, row, row_main, spread

KEY, NUMBER = "stop_all", "13"
METRIC = "`tune-magic stop --all` of N running jobs"
GOAL = 2.0
CLI = Path(sys.executable).with_name("tune-magic")
ARGS = [str(TOY_RECIPE), "--config", str(TOY_CONFIG), "steps=100000", "step_s=0.2"]


def _start(n: int) -> list:
    import tune_magic

    jobs = [tune_magic.launch(ARGS, name=f"stop-bench-{i}") for i in range(n)]
    deadline = time.monotonic() + 60 + 10 * n
    for job in jobs:
        while job.summary().step is None:
            if time.monotonic() > deadline or not job.status.is_live:
                raise RuntimeError(f"job {job.id} did not log a step ({job.status}): {job.tail(10)}")
            time.sleep(0.2)
    return jobs


def _timed_stop(args: list[str], jobs: list) -> float:
    t0 = time.perf_counter()
    r = subprocess.run([str(CLI), "stop", "--grace", "10", *args], capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"tune-magic stop {' '.join(args)} exited {r.returncode}: {r.stderr[-2000:]}")
    wrong = [(j.id, str(j.status)) for j in jobs if j.status != "stopped"]
    left = leftovers([j.id for j in jobs])
    if wrong or left:
        raise RuntimeError(f"after the stop: not stopped {wrong}; processes left {left}")
    return took


def run(quick: bool) -> list[dict]:
    n_jobs, rounds = (10, 1) if quick else (30, 3)
    one, many = [], []
    for k in range(rounds):
        (job,) = _start(1)
        one.append(_timed_stop([job.id], [job]))
        log(f"round {k + 1}: one stop {one[-1]:.2f} s")
        jobs = _start(n_jobs)
        many.append(_timed_stop(["--all"], jobs))
        log(f"round {k + 1}: stop --all of {n_jobs} jobs {many[-1]:.2f} s")
    r = ratio(median(many), median(one))
    return [row(
        KEY, NUMBER, f"`tune-magic stop --all` of {n_jobs} running jobs",
        project=f"{fmt(median(many))} median", anchor=f"{fmt(median(one))} median (`tune-magic stop ID`, one job)",
        ratio_text=f"{r}", goal=f"≤ {GOAL}×", met=r is not None and r <= GOAL,
        how=(f"the console script in a fresh process, start to exit; {n_jobs} one-process toy jobs each past "
             f"their first step; every job `stopped` and no process left, checked after each sample; "
             f"{rounds} round{'s' if rounds > 1 else ''}, the anchor first in each"),
        spread_text=f"{spread(many)}; anchor {spread(one)}",
        note="Stops run together (tune_magic.stop_jobs: one thread per job); before, one after another.",
        data={"project_s": [round(x, 3) for x in many], "anchor_s": [round(x, 3) for x in one], "jobs": n_jobs})]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
