"""Row 9: listings with 200 jobs, one of them a finished 1,000,000-step job, vs the same listings
with 200 one-step jobs (9a) or an empty registry (9b).

The registries are made by writing job directories directly, cloned from a real finished job of
the test-only toy recipe launched first in this run (its ``record.json``, ``procs.json``,
``exit_code`` and empty lock files, with the id, paths and times changed), so each holds exactly
what a supervisor leaves. Each job has its combined ``output.log`` (the ``Writing logs to`` line,
the tqdm bar, ``toy recipe done``) and a DiskLogger metric file (``Step N | loss:... lr:...
tokens_per_second_per_gpu:...``, torchtune 0.6.1's format). The 1,000,000-step job's log redraws
the bar once per step in torchtune's full form (``1|N|Loss: L:  P%|███  | N/T [mm:ss<mm:ss, r it/s]``,
about 100 bytes) and its metric file has 1,000,000 lines (about 190 MB together). Each job's
``summary.json`` is what the supervisor writes at the end (``summary.current_summary(...,
final=True)`` run once); the figures are taken with those summaries present, except 9c.

- 9a: in a fresh ``python -c`` process, after the imports, ``tune_magic.jobs()`` then building the
  ``%tune_jobs`` table (``tune_magic.ui.views.JobsTable``), timed with ``perf_counter``. Anchor: the
  same with 200 one-step jobs. Goal ≤ 3×.
- 9b: ``tune-magic jobs`` (the console script, a fresh process: wall time from start to exit,
  output read through a pipe) on the 200-job registry. Anchor: ``tune-magic jobs`` on an empty
  registry. Goal ≤ 1.5×.
- 9c (reported, no goal): 9a's measure with every ``summary.json`` removed before each sample (the
  first reader of jobs that no supervisor summarised reads their logs once and writes summaries)
  vs the same on the one-step registry with its summaries removed.
Rounds alternate anchor and project after one discarded warm-up of each; medians of N.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

from bench.common import REPO, fmt, leftovers, log, median, ratio, row, row_main, spread

KEY, NUMBER = "listing_scale", "9"
METRIC = "Listings with 200 jobs, one a finished 1,000,000-step job"
GOAL_TABLE, GOAL_CLI = 3.0, 1.5
N_JOBS, BIG_STEPS = 200, 1_000_000
TOY_RECIPE = REPO / "tests" / "recipes" / "toy_recipe.py"
TOY_CONFIG = REPO / "tests" / "recipes" / "toy.yaml"
CLI = Path(sys.executable).with_name("tune-magic")

TABLE = textwrap.dedent("""
    import json, sys, time
    import tune_magic
    from tune_magic.ui.views import JobsTable
    t = time.perf_counter()
    listed = tune_magic.jobs()
    table = JobsTable(listed, limit=None)  # every row, as after "show all" (the default shows the newest 20)
    s = time.perf_counter() - t
    big = table.summaries.get(sys.argv[1]) if len(sys.argv) > 1 else None
    print(json.dumps({"s": s, "rows": len(table.rows), "big": big and [big[2], big[3]]}))
""")


def _bar(step: int, total: int, loss: float) -> str:
    """torchtune 0.6.1's tqdm line after ``set_description`` (one redraw per step)."""
    pct = step * 100 // total
    filled = pct // 10
    el, left = step // 100, (total - step) // 100
    return (f"\r1|{step}|Loss: {loss}: {pct:3d}%|{'█' * filled}{' ' * (10 - filled)}| {step}/{total} "
            f"[{el // 60:02d}:{el % 60:02d}<{left // 60:02d}:{left % 60:02d}, 100.00it/s]")


def _write_job(root: Path, template, job_id: str, started: float, steps: int, *, status: str = "succeeded",
               error: str | None = None) -> None:
    """One finished job's directory and metric file, as its supervisor and the recipe leave them."""
    from tune_magic.registry import store as jobstore

    home = root.parent
    d = root / job_id
    d.mkdir(mode=0o700)
    out_dir = home / "runs" / "toy" / job_id
    (out_dir / "logs").mkdir(parents=True)
    metric = out_dir / "logs" / f"log_{int(started)}.txt"
    chunk = 100_000
    with open(metric, "w") as f:
        for lo in range(1, steps + 1, chunk):
            f.write("".join(f"Step {i} | loss:{10.0 / i} lr:0.001 tokens_per_second_per_gpu:{1000.0 + i % 7} \n"
                            for i in range(lo, min(lo + chunk, steps + 1))))
    with open(d / jobstore.OUTPUT_LOG, "w") as f:
        f.write(f"INFO:torchtune.utils._logging:Writing logs to {metric}\n")
        for lo in range(1, steps + 1, chunk):
            f.write("".join(_bar(i, steps, 10.0 / i) for i in range(lo, min(lo + chunk, steps + 1))))
        f.write("\ntoy recipe done\n")
    ended = started + 1 + steps / 100
    code = {"succeeded": 0, "failed": 1, "stopped": -15}[status]
    argv = [a if not a.startswith("output_dir=") else f"output_dir={out_dir}" for a in template.argv]
    record = replace(template, id=job_id, argv=argv, log_path=str(d / jobstore.OUTPUT_LOG), started_at=started,
                     ended_at=ended, output_dir=str(out_dir), status=status, returncode=code, error=error,
                     stop_requested=status == "stopped", env={**template.env, "TUNE_MAGIC_HOME": str(home)})
    jobstore.write_record(d, record, fsync=False)
    for name in (jobstore.LOCK, jobstore.SUPERVISOR_LOCK, jobstore.SUPERVISOR_LOG):
        (d / name).touch(mode=0o600)
    (d / jobstore.EXIT_CODE).write_text(json.dumps({"returncode": code, "ended_at": ended}).ljust(128))
    procs = {k: {"pid": 2 ** 22 + k_i, "create_time": started, "rank": None}
             for k_i, k in enumerate(("supervisor", "agent"))}
    (d / jobstore.PROCS).write_text(json.dumps({**procs, "workers": []}))


def build_registry(home: Path, template, *, big: bool) -> dict:
    """``home/jobs`` with N_JOBS finished jobs (the middle one a BIG_STEPS one when ``big``) and
    their summaries as the supervisor leaves them. Returns ids and the summaries' bytes."""
    from tune_magic.registry import store as jobstore
    from tune_magic.logs import summary

    root = home / "jobs"
    root.mkdir(parents=True, mode=0o700)
    t0 = time.time() - 86400
    ids, big_id = [], None
    for i in range(N_JOBS):
        started = t0 + i * 300
        job_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started)) + f"-{i:06x}"
        is_big = big and i == N_JOBS // 2
        status = "failed" if i % 25 == 3 else "stopped" if i % 25 == 7 else "succeeded"
        _write_job(root, template, job_id, started, BIG_STEPS if is_big else 1, status=status,
                   error="rank 0 (pid 4242) failed: RuntimeError: toy" if status == "failed" else None)
        ids.append(job_id)
        if is_big:
            big_id = job_id
    summaries = {}
    for job_id in ids:
        d = root / job_id
        s = summary.current_summary(d, jobstore.read(d), kept=False, final=True)
        summaries[job_id] = (d / summary.SUMMARY).read_bytes()
        if job_id == big_id:
            assert s.step == BIG_STEPS and s.loss == 10.0 / BIG_STEPS, (s.step, s.loss)
    size = sum(f.stat().st_size for f in home.rglob("*") if f.is_file())
    return {"ids": ids, "big_id": big_id, "summaries": summaries, "bytes": size}


def _set_summaries(home: Path, reg: dict, present: bool) -> None:
    for job_id, data in reg["summaries"].items():
        path = home / "jobs" / job_id / "summary.json"
        if present:
            path.write_bytes(data)
        else:
            path.unlink(missing_ok=True)


def _env(home: Path) -> dict:
    env = {**os.environ, "TUNE_MAGIC_HOME": str(home)}
    env.pop("TUNE_MAGIC_DRY_RUN", None)
    return env


def _table(home: Path, big_id: str | None) -> dict:
    proc = subprocess.run([sys.executable, "-c", TABLE, *([big_id] if big_id else [])], cwd=REPO, env=_env(home),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"table child exited {proc.returncode}: {proc.stderr[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cli(home: Path) -> dict:
    t = time.perf_counter()
    proc = subprocess.run([str(CLI), "jobs"], cwd=REPO, env=_env(home), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=600)
    s = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"tune-magic jobs exited {proc.returncode}: {proc.stderr[-800:]}")
    return {"s": s, "lines": len(proc.stdout.splitlines()), "stdout": proc.stdout}


def _template(home: Path):
    """A real finished job of the toy recipe (one process, 1 step): the record to clone."""
    os.environ["TUNE_MAGIC_HOME"] = str(home)
    import tune_magic

    job = tune_magic.launch(f"{TOY_RECIPE} --config {TOY_CONFIG} steps=1 step_s=0", cwd=REPO)
    status = job.wait(timeout=120)
    if status != "succeeded":
        raise RuntimeError(f"template job {job.id} {status}: {job.tail(20)}")
    return job.record, job.id


def run(quick: bool) -> list[dict]:
    n_table, n_cli, n_first = (2, 3, 1) if quick else (7, 9, 3)
    base = Path(os.environ["TUNE_MAGIC_HOME"])
    template, template_id = _template(base / "template")
    left = leftovers([template_id], settle_s=0.5)
    homes = {k: base / k for k in ("big", "small", "empty")}
    t = time.perf_counter()
    regs = {k: build_registry(homes[k], template, big=k == "big") for k in ("big", "small")}
    (homes["empty"] / "jobs").mkdir(parents=True, mode=0o700)
    log(f"registries built in {time.perf_counter() - t:.1f} s: big {regs['big']['bytes'] / 1e6:.0f} MB, "
        f"small {regs['small']['bytes'] / 1e6:.1f} MB")
    big_id = regs["big"]["big_id"]

    samples: dict[str, list[dict]] = {k: [] for k in ("table", "table_anchor", "cli", "cli_anchor",
                                                       "first", "first_anchor")}

    def one(kind: str) -> dict:
        if kind == "table":
            got = _table(homes["big"], big_id)
        elif kind == "table_anchor":
            got = _table(homes["small"], None)
        elif kind == "cli":
            got = _cli(homes["big"])
        elif kind == "cli_anchor":
            got = _cli(homes["empty"])
        else:
            home = homes["big" if kind == "first" else "small"]
            reg = regs["big" if kind == "first" else "small"]
            _set_summaries(home, reg, present=False)
            try:
                got = _table(home, big_id if kind == "first" else None)
            finally:
                _set_summaries(home, reg, present=True)  # as the supervisor left them, for the next sample
        return got

    counts = {"table": n_table, "table_anchor": n_table, "cli": n_cli, "cli_anchor": n_cli,
              "first": n_first, "first_anchor": n_first}
    for kind in counts:  # warm-up, discarded (fills the page cache, compiles .pyc)
        got = one(kind)
        log(f"warm-up {kind}: {got['s']:.3f} s")
    for i in range(max(counts.values())):
        for kind, n in counts.items():
            if i < n:
                got = one(kind)
                samples[kind].append(got)
                log(f"round {i} {kind}: {got['s']:.3f} s")

    # every sample showed what it should: a figure for a wrong listing would mean nothing
    for s in samples["table"] + samples["first"]:
        if s["rows"] != N_JOBS or s["big"] != [BIG_STEPS, 10.0 / BIG_STEPS]:
            raise RuntimeError(f"the table is wrong: {s}")
    for s in samples["table_anchor"] + samples["first_anchor"]:
        if s["rows"] != N_JOBS:
            raise RuntimeError(f"the anchor's table is wrong: {s}")
    for kind, lines in (("cli", N_JOBS + 1), ("cli_anchor", 1)):
        for s in samples[kind]:
            out = s.pop("stdout")
            big_line = [l for l in out.splitlines() if l.startswith(big_id)]
            if s["lines"] != lines or (kind == "cli" and big_line[0].split()[3:5] != [str(BIG_STEPS), "1e-05"]):
                raise RuntimeError(f"tune-magic jobs printed {s['lines']} lines, not {lines}:\n{out[:2000]}")

    def med(kind):
        return median([x["s"] for x in samples[kind]])

    def secs(kind):
        return [round(x["s"], 4) for x in samples[kind]]

    common = (f"Registry: {N_JOBS} finished jobs cloned from a real toy-recipe job (statuses: succeeded, "
              f"8 failed, 8 stopped); the big one: {BIG_STEPS:,} steps, log + metric file "
              f"{regs['big']['bytes'] / 1e6:.0f} MB in all. Leftover processes of the template job: {len(left)}.")
    rows = []
    r_table = ratio(med("table"), med("table_anchor"))
    rows.append(row(
        KEY, NUMBER + "a", "`tune_magic.jobs()` + the `%tune_jobs` table (JobsTable), 200 jobs, one of 1,000,000 steps",
        project=f"{fmt(med('table'))} median", anchor=f"{fmt(med('table_anchor'))} median (200 one-step jobs)",
        ratio_text=f"{r_table}", goal=f"≤ {GOAL_TABLE}×", met=r_table is not None and r_table <= GOAL_TABLE,
        how=(f"fresh `python -c` per sample, timed inside it after the imports (`tune_magic`, `views`): "
             f"`jobs()` then `JobsTable(listed, limit=None)` (every row, as after 'show all'); summaries present (as the supervisor leaves them); 1 warm-up, "
             f"then {n_table} alternating rounds"),
        spread_text=f"{spread(secs('table'))}; anchor {spread(secs('table_anchor'))}",
        note=common, data={"project_s": secs("table"), "anchor_s": secs("table_anchor")}))
    r_cli = ratio(med("cli"), med("cli_anchor"))
    rows.append(row(
        KEY, NUMBER + "b", "`tune-magic jobs` with 200 jobs, one of 1,000,000 steps",
        project=f"{fmt(med('cli'))} median", anchor=f"{fmt(med('cli_anchor'))} median (`tune-magic jobs`, empty registry)",
        ratio_text=f"{r_cli}", goal=f"≤ {GOAL_CLI}×", met=r_cli is not None and r_cli <= GOAL_CLI,
        how=(f"the console script in a fresh process, wall time from start to exit (output through a pipe; "
             f"{N_JOBS + 1} lines checked); 1 warm-up, then {n_cli} alternating rounds"),
        spread_text=f"{spread(secs('cli'))}; anchor {spread(secs('cli_anchor'))}",
        data={"project_s": secs("cli"), "anchor_s": secs("cli_anchor")}))
    r_first = ratio(med("first"), med("first_anchor"))
    rows.append(row(
        KEY, NUMBER + "c", "First read: 9a with no summary.json (no supervisor summarised the jobs)",
        project=f"{fmt(med('first'))} median", anchor=f"{fmt(med('first_anchor'))} median (200 one-step jobs, no summaries)",
        ratio_text=f"{r_first}", goal="reported", met=None,
        how=(f"as 9a, every summary.json removed before each sample (the first reader reads each log once and "
             f"writes the summary); 1 warm-up, then {n_first} round{'s' if n_first > 1 else ''}"),
        spread_text=f"{spread(secs('first'))}; anchor {spread(secs('first_anchor'))}",
        note="The next listing after a first read is 9a's case (the first reader wrote the summaries).",
        data={"project_s": secs("first"), "anchor_s": secs("first_anchor")}))
    shutil.rmtree(homes["big"] / "runs", ignore_errors=True)
    return rows


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
