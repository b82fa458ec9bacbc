"""Row 1: how long a ``%%tune_run`` cell takes to give control back, vs ``subprocess.run`` of the job.

An in-process IPython shell (``IPython.testing.globalipapp``) with ``%load_ext tune_magic`` runs
``%%tune_run --nproc_per_node 2 toy_recipe.py --config toy.yaml steps=5`` (real torchrun launches,
not dry runs); the time is from ``run_cell_magic`` being called to it returning (the cell's
display of the card included). Each job is stopped as soon as control returns. The first launch
(imports of the job machinery, ipywidgets, bqplot) is reported apart. The anchor runs the same
job's command (``build_plan(...).argv``) with ``subprocess.run``, which blocks until the job ends.
"""

from __future__ import annotations

import io
import os
import subprocess
import time
from contextlib import redirect_stdout
from time import perf_counter

from bench.common import (REPO, fmt, leftovers, log, median, ratio, row, row_main, spread, stop_all,
                          toy_args)

KEY, NUMBER, METRIC = "cell_return", "1", "`%%tune_run` cell return time (cell start to control back)"
GOAL_S = 0.2


def run(quick: bool) -> list[dict]:
    n_launch = 5 if quick else 20
    n_anchor = 1 if quick else 3
    args = toy_args("steps=5")  # toy defaults: step_s=0.2

    from IPython.testing.globalipapp import start_ipython

    import tune_magic.job as jobctl
    import tune_magic.job.launch as L
    from tune_magic import build_plan
    from tune_magic.registry.ids import new_job_id

    ip = start_ipython()
    ip.run_line_magic("load_ext", "tune_magic")

    # time launch() inside the magic apart from the rest (card, display): the magic looks it up per call
    real_launch = L.launch
    launch_s: list[float] = []

    def timed_launch(*a, **kw):
        t = perf_counter()
        try:
            return real_launch(*a, **kw)
        finally:
            launch_s.append(perf_counter() - t)

    L.launch = timed_launch
    jobs, cell_s, stop_s = [], [], []

    def one(i: int) -> float:
        sink = io.StringIO()  # the terminal shell prints the card's text form; keep the log readable
        with redirect_stdout(sink):
            t = perf_counter()
            job = ip.run_cell_magic("tune_run", f"--name cell{i} {args}", "# bench: toy defaults\n")
            dt = perf_counter() - t
        jobs.append(job)
        t = perf_counter()
        job.stop(grace_s=5)
        stop_s.append(perf_counter() - t)
        return dt

    try:
        first = one(0)
        first_launch = launch_s[0]
        log(f"first launch: cell {first:.3f} s (launch() {first_launch:.3f} s)")
        for i in range(1, n_launch + 1):
            cell_s.append(one(i))
            log(f"launch {i}: cell {cell_s[-1]:.3f} s (launch() {launch_s[-1]:.3f} s), stop {stop_s[-1]:.2f} s")
    finally:
        L.launch = real_launch
        stop_all(jobs)
    statuses = [j.status for j in jobs]
    warm_launch = launch_s[1:]
    rest = [c - l for c, l in zip(cell_s, warm_launch)]

    # anchor: the same job, run to completion by subprocess.run
    anchor_s, anchor_ids = [], []
    for i in range(n_anchor):
        job_id = new_job_id()
        anchor_ids.append(job_id)
        plan = build_plan(args, job_id=job_id, cwd=REPO)
        logfile = os.path.join(os.environ["TUNE_MAGIC_HOME"], f"anchor_{job_id}.log")
        with open(logfile, "wb") as out:
            t = perf_counter()
            proc = subprocess.run(plan.argv, env={**os.environ, **plan.env}, cwd=REPO, stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=300)
            anchor_s.append(perf_counter() - t)
        log(f"anchor {i}: subprocess.run {anchor_s[-1]:.2f} s, exit {proc.returncode}")
        if proc.returncode != 0:
            raise RuntimeError(f"anchor run exited {proc.returncode}; see {logfile}")

    left = leftovers([j.id for j in jobs] + anchor_ids)
    med, amed = median(cell_s), median(anchor_s)
    met = med is not None and med < GOAL_S
    note = (f"first launch (imports) {first:.3f} s, of which launch() {first_launch:.3f} s. Warm: launch() "
            f"(supervisor start until it records the torchrun pid) median {fmt(median(warm_launch))}, card + "
            f"display median {fmt(median(rest))}; stop() after return median {fmt(median(stop_s), digits=2)}. "
            f"Final statuses: {sorted(set(statuses))}. Leftover processes: {len(left)}.")
    if not met:
        note += " Goal missed: see the launch()/card split above."
    return [row(
        KEY, NUMBER, METRIC,
        project=f"{fmt(med)} median (first launch {fmt(first)})",
        anchor=f"{fmt(amed, digits=2)} (`subprocess.run`, blocks for the whole 5-step job)",
        ratio_text=f"{ratio(med, amed, 4)} (lower is better)",
        goal=f"< {GOAL_S} s", met=met,
        how=(f"in-process IPython shell, `run_cell_magic('tune_run', ...)`, toy recipe 2 processes, "
             f"{n_launch} warm launches after 1 warm-up, each stopped at once; anchor {n_anchor}×"),
        spread_text=f"{spread(cell_s)}; anchor {spread(anchor_s, digits=2)}",
        note=note,
        data={"cell_s": cell_s, "first_cell_s": first, "launch_s": launch_s, "stop_s": stop_s,
              "anchor_s": anchor_s, "statuses": statuses, "leftovers": left},
    )]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
