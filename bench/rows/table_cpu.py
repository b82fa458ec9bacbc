"""Row 11: CPU of the watching (kernel) process for a live 200-row jobs table with one running job,
against one live job card following that same running job, measured in the same run.

The registry: one real finished job of the test-only toy recipe (one process, 1 step), 198
finished jobs cloned from it (row 9's ``listing_scale._write_job``: record, exit code, combined
log, DiskLogger metric file, and the summary the supervisor leaves; every 25th failed or stopped),
and one real running toy job (2 processes under torchrun, 1,000,000 steps of 0.1 s, 20 log lines
a step: about 200 lines/s), whose supervisor keeps its summary current.

Windows alternate card, table, card, table (``--quick``: 3 s each; full: 20 s), after a 4 s
warm-up each: during a card window one :class:`tune_magic.ui.cards.JobCard` (its watcher thread
polls every 0.25 s, as in a notebook) is the only live view; during a table window one
:class:`tune_magic.ui.views.JobsTable` of all 200 jobs (its refresher thread, once a second) is:
the table after "show all" (``limit=None``), the most it ever shows; ``%tune_jobs`` shows the newest
20 until then, whose build and tick are reported too.
Measured: this process's CPU time (all threads; ``time.process_time``) over each window;
the figures are the sums over both windows of each kind. Also reported: building the table
(``JobsTable()``, 200 rows) and the refresher's CPU per tick. No Jupyter frontend is connected:
trait changes are serialised but go nowhere (as in row 4). Goal: table ≤ 1× card.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.common import REPO, leftovers, log, row, row_main, stop_all, toy_args

KEY, NUMBER = "table_cpu", "11"
METRIC = "Live jobs table: CPU of the watching process, 200 rows with one running job, vs one live card"
GOAL = 1.0
N_JOBS = 200
TOY_RECIPE = REPO / "tests" / "recipes" / "toy_recipe.py"
TOY_CONFIG = REPO / "tests" / "recipes" / "toy.yaml"


def _registry(home: Path) -> tuple[list[str], object]:
    """The finished jobs (one real, the rest cloned from it) in ``home``'s registry; their ids."""
    import tune_magic
    from bench.rows.listing_scale import _write_job
    from tune_magic.registry import store as jobstore
    from tune_magic.logs import summary

    template = tune_magic.launch(f"{TOY_RECIPE} --config {TOY_CONFIG} steps=1 step_s=0", cwd=REPO, name="template")
    status = template.wait(timeout=120)
    if status != "succeeded":
        raise RuntimeError(f"template job {template.id} {status}: {template.tail(20)}")
    root = home / "jobs"
    ids = [template.id]
    t0 = time.time() - 86400
    for i in range(N_JOBS - 2):
        started = t0 + i * 300
        job_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started)) + f"-b{i:05x}"
        status = "failed" if i % 25 == 3 else "stopped" if i % 25 == 7 else "succeeded"
        _write_job(root, template.record, job_id, started, 1 + i % 7, status=status,
                   error="rank 0 (pid 4242) failed: RuntimeError: toy" if status == "failed" else None)
        summary.current_summary(root / job_id, jobstore.read(root / job_id), kept=False, final=True)
        ids.append(job_id)
    return ids, template


def _window(seconds: float) -> tuple[float, float]:
    """(CPU seconds of this process, all threads; wall seconds) over ``seconds`` of sleep.
    ``time.process_time`` (CLOCK_PROCESS_CPUTIME_ID): nanoseconds, where psutil's are clock ticks."""
    c0, w0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    return time.process_time() - c0, time.perf_counter() - w0


def run(quick: bool) -> list[dict]:
    import tune_magic
    from tune_magic.ui import views

    window = 3.0 if quick else 20.0
    warmup = 4.0
    home = Path(os.environ["TUNE_MAGIC_HOME"])
    ids, template = _registry(home)
    running = tune_magic.launch(toy_args("steps=1000000", "step_s=0.1", "lines_per_step=20"), cwd=REPO,
                                name="running")
    ids.append(running.id)
    result: dict = {"card": [], "table": []}
    try:
        deadline = time.monotonic() + 240
        while (running.summary().step or 0) < 3:
            if time.monotonic() > deadline or running.status != "running":
                raise RuntimeError(f"the running job did not start logging steps: {running.tail(20)}")
            time.sleep(0.5)
        assert len(tune_magic.jobs()) == N_JOBS
        # the table's per-tick CPU, with no other view live (reported, not the goal)
        t = time.perf_counter()
        default = views.JobsTable(live=False)  # what %tune_jobs shows first: the newest rows
        result["default_build_s"] = time.perf_counter() - t
        assert len(default.rows) == views.TABLE_ROWS and default.jobs[0].id == running.id, len(default.rows)
        c0 = time.thread_time()
        default.refresh_once()
        result["default_tick_cpu_ms"] = 1000 * (time.thread_time() - c0)
        default.close()
        t = time.perf_counter()
        table = views.JobsTable(live=False, limit=None)
        result["build_s"] = time.perf_counter() - t
        assert len(table.rows) == N_JOBS, len(table.rows)
        ticks = []
        for _ in range(5):
            c0 = time.thread_time()
            table.refresh_once()
            ticks.append(time.thread_time() - c0)
            time.sleep(1.0)
        result["tick_cpu_ms"] = sorted(1000 * x for x in ticks)
        step_seen = table.summaries[running.id][2]
        table.close()
        for kind in ("card", "table", "card", "table"):
            view = views.JobCard(running) if kind == "card" else views.JobsTable(limit=None)
            time.sleep(warmup)
            cpu, wall = _window(window)
            if kind == "table":
                shown = view.summaries[running.id]
                result.setdefault("table_steps_shown", []).append(shown[2])
            else:
                result.setdefault("card_steps_shown", []).append(view.snapshot.step if view.snapshot else None)
            view.close()
            result[kind].append({"cpu_s": cpu, "wall_s": wall})
            log(f"{kind}: {100 * cpu / wall:.2f}% of a core over {wall:.1f} s")
        result["status_during"] = running.status
        result["step_seen_by_first_table"] = step_seen
    finally:
        stop_all([running])
    left = leftovers([running.id, template.id])
    card_pct = 100 * sum(w["cpu_s"] for w in result["card"]) / sum(w["wall_s"] for w in result["card"])
    table_pct = 100 * sum(w["cpu_s"] for w in result["table"]) / sum(w["wall_s"] for w in result["table"])
    ratio = table_pct / card_pct if card_pct > 0 else float("inf")
    result.update(card_pct=card_pct, table_pct=table_pct, ratio=ratio, leftovers=left)
    per = [100 * w["cpu_s"] / w["wall_s"] for w in result["table"]], [100 * w["cpu_s"] / w["wall_s"] for w in result["card"]]
    note = (f"Building the 200-row table (after 'show all') took {result['build_s']:.2f} s, the default one of the "
            f"newest {views.TABLE_ROWS} rows {result['default_build_s']:.2f} s (its tick "
            f"{result['default_tick_cpu_ms']:.2f} ms); neither in the windows. A refresh tick "
            f"(re-reading the one running row from its record and summary file, a stat of the registry) costs "
            f"{result['tick_cpu_ms'][len(result['tick_cpu_ms']) // 2]:.2f} ms of CPU (median of 5). The running job "
            f"wrote about 200 lines/s; the table showed steps {result.get('table_steps_shown')}, the card "
            f"{result.get('card_steps_shown')} at the end of their windows. Leftover processes: {len(left)}.")
    return [row(
        KEY, NUMBER, METRIC,
        project=f"{table_pct:.2f}% of one core (table)",
        anchor=f"{card_pct:.2f}% (one `JobCard` on the running job)",
        ratio_text=f"{ratio:.2f}", goal=f"table ≤ {GOAL:g}× card", met=ratio <= GOAL,
        how=f"`time.process_time()` (all threads) of this process over 2 × {window:.0f} s windows per view, alternated card/table "
            "after a 4 s warm-up each, no frontend connected",
        spread_text=f"table windows {', '.join(f'{x:.2f}%' for x in per[0])}; card windows "
                    f"{', '.join(f'{x:.2f}%' for x in per[1])}",
        note=note, data=result)]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
