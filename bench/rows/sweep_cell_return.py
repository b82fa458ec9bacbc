"""Row 14: how long a 64-trial ``%%tune_run --sweep`` cell takes to give control back, vs a single launch.

An in-process IPython shell (``IPython.testing.globalipapp``) with ``%load_ext tune_magic`` runs
``%%tune_run --sweep --max-parallel 2 --nproc_per_node 1 toy_recipe.py --config toy.yaml`` with the
body ``start_loss=range(1,9)`` / ``seed=range(0,8)`` (8 x 8 = 64 trials): a real sweep (checked,
registered, its sweep process started, its card displayed); the time is from ``run_cell_magic``
being called to it returning. The sweep is stopped as soon as control returns, and the next sample
waits until its processes are gone. Anchor, measured in the same process and alternated with it:
the single launch ``%%tune_run --nproc_per_node 1 toy_recipe.py --config toy.yaml start_loss=1``
(row 1's measure: its job is stopped at once). Goals: the sweep cell ≤ 0.5 s (median) and ≤ 2×
the single launch's median.
"""

from __future__ import annotations

import io
import time
from contextlib import redirect_stdout
from time import perf_counter

from bench.common import (TOY_CONFIG, TOY_RECIPE, fmt, leftovers, log, median, processes_mentioning, ratio, row,
                          row_main, spread)

KEY, NUMBER = "sweep_cell_return", "14"
METRIC = "64-trial `%%tune_run --sweep` cell return time"
GOAL_S, GOAL_RATIO = 0.5, 2.0
LINE = f"--nproc_per_node 1 {TOY_RECIPE} --config {TOY_CONFIG}"


def _settle(ids: list[str], timeout: float = 30.0) -> None:
    """Wait until no process of these sweeps or jobs is left (a stopped sweep's trials exit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(processes_mentioning(i) for i in ids):
        time.sleep(0.1)


def run(quick: bool) -> list[dict]:
    rounds = 2 if quick else 7
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    ip.run_line_magic("load_ext", "tune_magic")
    sweep_s, launch_s, ids, counts = [], [], [], []

    def sweep_cell() -> float:
        with redirect_stdout(io.StringIO()):  # the terminal shell prints the card's text form
            t = perf_counter()
            sweep = ip.run_cell_magic("tune_run", f"--sweep --max-parallel 2 --name bench-64 {LINE}",
                                      "start_loss=range(1,9)\nseed=range(0,8)\n")
            dt = perf_counter() - t
        counts.append(len(sweep.record.trials))
        ids.append(sweep.id)
        sweep.stop(grace_s=2)
        _settle([sweep.id] + [t.job_id for t in sweep.record.trials if t.job_id])
        return dt

    def launch_cell() -> float:
        with redirect_stdout(io.StringIO()):
            t = perf_counter()
            job = ip.run_cell_magic("tune_run", f"--name bench-one {LINE}", "start_loss=1\n")
            dt = perf_counter() - t
        ids.append(job.id)
        job.stop(grace_s=2)
        _settle([job.id])
        return dt

    first_sweep, first_launch = sweep_cell(), launch_cell()  # warm-ups (imports), reported apart
    log(f"warm-up: sweep cell {first_sweep:.3f} s, launch cell {first_launch:.3f} s")
    for i in range(rounds):
        for kind in (("launch", "sweep") if i % 2 == 0 else ("sweep", "launch")):
            if kind == "sweep":
                sweep_s.append(sweep_cell())
            else:
                launch_s.append(launch_cell())
        log(f"round {i}: sweep cell {sweep_s[-1]:.3f} s, launch cell {launch_s[-1]:.3f} s")
    if set(counts) != {64}:
        raise RuntimeError(f"the sweeps had {counts} trials, not 64")
    left = leftovers(ids)
    med, amed = median(sweep_s), median(launch_s)
    r = ratio(med, amed)
    met = med is not None and med <= GOAL_S and r is not None and r <= GOAL_RATIO
    return [row(
        KEY, NUMBER, METRIC,
        project=f"{fmt(med)} median (warm-up {fmt(first_sweep)})",
        anchor=f"{fmt(amed)} median (a single `%%tune_run` launch, card included)",
        ratio_text=f"{r}", goal=f"≤ {GOAL_S} s and ≤ {GOAL_RATIO}×", met=met,
        how=(f"in-process IPython shell, `run_cell_magic('tune_run', '--sweep ...')` of 8 x 8 = 64 toy-recipe "
             f"trials (checked, registered, sweep process started, card shown) vs one launch; {rounds} alternated "
             "rounds after one warm-up of each; each sweep stopped (and its processes gone) before the next sample"),
        spread_text=f"{spread(sweep_s)}; anchor {spread(launch_s)}",
        note=(f"The sweep cell plans the first trial as a launch would and checks every item against the config, "
              f"but starts no job itself: the sweep process does, after the cell returned. Leftover processes: "
              f"{len(left)}."),
        data={"sweep_s": sweep_s, "launch_s": launch_s, "warmup": [first_sweep, first_launch]})]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
