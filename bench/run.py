"""Run tune_magic's benchmarks: every row against a named anchor measured in the same run.

Usage (from the repository root)::

    .venv/bin/python bench/run.py                  # full mode: every row at full size
    .venv/bin/python bench/run.py --quick          # CI: every row at its smallest size (≤ 10 min on 2 cores)
    .venv/bin/python bench/run.py --only 1 3       # some rows (numbers or names)
    .venv/bin/python bench/run.py --write          # full mode, then rewrite BENCHMARKS.md
    .venv/bin/python bench/run.py --json           # print JSON instead of the markdown table

Each row runs in its own process (``python -m bench.rows.NAME``) with its own temporary
``TUNE_MAGIC_HOME``, under a time limit; afterwards any job still running in that home is stopped
and the home removed. Output: the markdown table on stdout (or JSON with ``--json``), the full
results in ``bench/out/results-{quick,full}.json``, each row's log in ``bench/out/<mode>/``.
``--quick`` exits 0 whether or not goals are met and never writes ``BENCHMARKS.md``;
``--write`` (full mode only) also keeps the results in ``bench/results.json`` so that ``--only``
can update some rows of ``BENCHMARKS.md`` and keep the others.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import machine, machine_line, markdown_table  # noqa: E402

# key, module, numbers, full-mode time limit (s), quick-mode time limit (s)
ROWS = [
    ("cell_return", "bench.rows.cell_return", "1", 600, 120),
    ("launch_overhead", "bench.rows.launch_overhead", "2", 1200, 150),
    ("latency", "bench.rows.latency", "3", 600, 120),
    ("tailing_cpu", "bench.rows.tailing_cpu", "4", 600, 150),
    ("parse_follow", "bench.rows.parse_follow", "5", 900, 150),
    ("concurrency", "bench.rows.concurrency", "6", 1200, 150),
    ("demo_recipe", "bench.rows.demo_recipe", "7", 1200, 300),
    ("first_launch", "bench.rows.first_launch", "8", 600, 120),
    ("listing_scale", "bench.rows.listing_scale", "9", 600, 120),
    ("concurrent_launch", "bench.rows.concurrent_launch", "10", 600, 120),
    ("table_cpu", "bench.rows.table_cpu", "11", 600, 150),
    ("resume_preflight", "bench.rows.resume_preflight", "12", 300, 60),
    ("sweep_makespan", "bench.rows.sweep_makespan", "13", 1200, 150),
    ("sweep_cell_return", "bench.rows.sweep_cell_return", "14", 600, 90),
    ("sweep_listing", "bench.rows.sweep_listing", "15", 600, 90),
    ("stop_all", "bench.rows.stop_all", "16", 600, 120),
    ("sweep_slurm", "bench.rows.sweep_slurm", "17", 900, 240),
    ("eval_checkpoint", "bench.rows.eval_checkpoint", "18", 900, 180),
    ("val_card", "bench.rows.val_card", "19", 900, 180),
    ("val_in_loop", "bench.rows.val_in_loop", "20", 900, 180),
    ("prune_wait", "bench.rows.prune_wait", "21", 900, 180),
    ("generation", "bench.rows.generation", "22", 900, 180),
]
QUICK_BUDGET_S = 600
OUT = REPO / "bench" / "out"
RESULTS = REPO / "bench" / "results.json"
BENCHMARKS = REPO / "BENCHMARKS.md"


def _select(only: list[str] | None) -> list[tuple]:
    if not only:
        return ROWS
    chosen = []
    for want in only:
        match = [r for r in ROWS if want in (r[0], r[2])]
        if not match:
            names = ", ".join(f"{r[2]}={r[0]}" for r in ROWS)
            raise SystemExit(f"run.py: error: unknown row {want!r}; rows: {names}")
        chosen += [r for r in match if r not in chosen]
    return sorted(chosen, key=ROWS.index)


def _cleanup(home: Path) -> list[str]:
    """Stop jobs a killed row left running in ``home``; return what was found."""
    found = []
    jobs_dir = home / "jobs"
    if not jobs_dir.is_dir():
        return found
    from bench.common import leftovers
    from tune_magic import job as jobctl
    from tune_magic.registry import store as jobstore

    from tune_magic.sweeping.sweep import stop_running_sweeps

    found += [f"sweep {sweep_id} still running: {counts}" for sweep_id, counts in stop_running_sweeps(3)]
    for record in jobstore.list_records(jobs_dir):
        job = jobctl.Job(jobs_dir / record.id, record)
        if job.status == "running":
            found.append(f"job {record.id} still running: {job.stop(grace_s=3)}")
    found += leftovers([r.id for r in jobstore.list_records(jobs_dir)], settle_s=0.5)
    return found


def run_row(key: str, module: str, number: str, quick: bool, limit_s: float) -> dict:
    mode = "quick" if quick else "full"
    (OUT / mode).mkdir(parents=True, exist_ok=True)
    out_json = OUT / mode / f"{key}.json"
    out_json.unlink(missing_ok=True)
    log_path = OUT / mode / f"{key}.log"
    home = Path(tempfile.mkdtemp(prefix=f"tune_magic_bench_{key}_"))
    env = {**os.environ, "TUNE_MAGIC_HOME": str(home)}
    env.pop("TUNE_MAGIC_DRY_RUN", None)
    cmd = [sys.executable, "-m", module, "--out", str(out_json)] + (["--quick"] if quick else [])
    t0 = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=logf,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=max(limit_s, 1))
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # the row's own process group (its jobs live in other sessions)
            proc.wait()
    seconds = time.perf_counter() - t0
    os.environ["TUNE_MAGIC_HOME"] = str(home)
    try:
        cleanup = _cleanup(home)
    finally:
        os.environ.pop("TUNE_MAGIC_HOME", None)
    shutil.rmtree(home, ignore_errors=True)
    if out_json.exists() and not timed_out:
        result = json.loads(out_json.read_text())
    else:
        why = f"timed out after {limit_s:.0f} s" if timed_out else f"exited {proc.returncode} without a result"
        result = {"rows": [{"key": key, "number": number, "metric": key, "project": "error", "anchor": "—",
                            "ratio": "—", "goal": "—", "met": False, "how": "—", "spread": "—",
                            "note": f"{why}; see {log_path.relative_to(REPO)}", "data": {}}]}
    result["seconds"] = round(seconds, 1)
    if cleanup:
        for r in result["rows"]:
            r["note"] = (r.get("note", "") + f" Cleanup after the row: {cleanup}").strip()
    return result


def render(rows: list[dict], mach: dict, seconds: dict, cold: dict | None) -> str:
    missed = [r for r in rows if r["met"] is False]
    parts = [
        "# Benchmarks",
        "",
        "Written by `.venv/bin/python bench/run.py --write` (full mode); do not edit by hand. "
        "`bench/run.py --quick` (CI) runs every row at its smallest size and never writes this file.",
        "",
        f"**Machine**: {machine_line(mach)}. Absolute times depend on the machine (here: 2 cores shared by every "
        "process of every job, no GPU); each row's anchor is measured in the same run, so the ratios are the "
        "comparable figures.",
        "",
        markdown_table(rows),
        "",
        f"Time per row (s): {', '.join(f'{k} {v:.0f}' for k, v in seconds.items())}; total {sum(seconds.values()):.0f} s.",
        "",
        "## Goals missed and why" if missed else "## Goals",
        "",
    ]
    if missed:
        for r in missed:
            parts.append(f"- **{r['number']}** {r['metric']}: {r['project']} vs goal {r['goal']}. {r['note']}")
    else:
        parts.append("Every row with a goal met it.")
    parts += ["", "## Notes per row", ""]
    for r in rows:
        later = (f"Measured in a later `--only` run, on {machine_line(r['machine'])}. "
                 if r.get("machine") and r["machine"] != mach else "")
        if later or r.get("note"):
            parts.append(f"- **{r['number']}** {later}{r.get('note', '')}".rstrip())
    if cold:
        parts += ["", "## Cold demo (measured by hand)", "",
                  f"`bench/cold_demo.py` on {cold['date']}: a copy of the working tree without `.venv`, "
                  f"`scripts/demo` there: {cold['wall_s']:.0f} s in all, of which `setup-venv` (create the venv, "
                  f"pip install the pinned dependencies) {cold['setup_s']:.0f} s and the demo itself "
                  f"{cold['demo_s']:.0f} s. {cold.get('note', '')}".rstrip()]
    parts += ["", "## How to run", "",
              "```bash",
              ".venv/bin/python bench/run.py --quick      # every row, smallest sizes, ≤ 10 min on 2 cores",
              ".venv/bin/python bench/run.py --write      # full sizes; rewrites this file",
              ".venv/bin/python bench/run.py --only 3 4   # some rows (numbers or names)",
              "```", "",
              "Each row is a module under `bench/rows/` (its docstring says exactly what is timed), run in its own "
              "process with its own `TUNE_MAGIC_HOME`; every job a row starts is stopped and checked for leftover "
              "processes. Raw numbers: `bench/results.json`.", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="every row at its smallest size (CI); never writes BENCHMARKS.md")
    ap.add_argument("--only", nargs="+", metavar="ROW", help="rows to run, by number (1-22) or name")
    ap.add_argument("--write", action="store_true", help="rewrite BENCHMARKS.md (full mode only)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of a markdown table")
    ap.add_argument("--render", action="store_true",
                    help="run nothing: rewrite BENCHMARKS.md from bench/results.json (e.g. after bench/cold_demo.py)")
    args = ap.parse_args(argv)
    if args.write and args.quick:
        ap.error("--write needs full mode: --quick results never go into BENCHMARKS.md")
    if args.render:
        if args.quick or not RESULTS.exists():
            ap.error("--render rewrites BENCHMARKS.md from bench/results.json (written by a full --write run)")
        _write_benchmarks(json.loads(RESULTS.read_text()))
        return 0
    selected = _select(args.only)
    lock = _exclusive()  # noqa: F841  (held until exit: runs on one machine never overlap)
    mach = machine()
    start = time.perf_counter()
    rows, seconds = [], {}
    print(f"bench: {len(selected)} row(s), {'quick' if args.quick else 'full'} mode, {mach['usable_cpus']} cores",
          file=sys.stderr, flush=True)
    for key, module, number, full_limit, quick_limit in selected:
        limit = full_limit
        if args.quick:  # keep the whole quick run within its budget
            left = QUICK_BUDGET_S - (time.perf_counter() - start)
            limit = min(quick_limit, max(left, 1))
        result = run_row(key, module, number, args.quick, limit)
        seconds[key] = result["seconds"]
        rows += result["rows"]
        for r in result["rows"]:
            met = {True: "met", False: "MISSED", None: "no goal"}[r["met"]]
            print(f"  {r['number']:<3} {key:<16} {result['seconds']:6.1f} s  {met:<8} {r['project']}",
                  file=sys.stderr, flush=True)
    total = time.perf_counter() - start
    mach["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    payload = {"mode": "quick" if args.quick else "full", "machine": mach, "seconds": seconds,
               "total_s": round(total, 1), "rows": rows}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"results-{payload['mode']}.json").write_text(json.dumps(payload, indent=1, default=str))
    if args.json:
        print(json.dumps(payload, indent=1, default=str))
    else:
        print(f"Machine: {machine_line(mach)}; absolute times are machine-dependent.\n")
        print(markdown_table(rows))
        print(f"\nTotal {total:.0f} s ({payload['mode']} mode).")
    if args.write:
        merged = payload
        if args.only and RESULTS.exists():  # keep the rows not run this time
            old = json.loads(RESULTS.read_text())
            ran = {r["key"] for r in rows}
            keep = [r for r in old.get("rows", []) if r["key"] not in ran]
            for r in rows:  # the header's machine stays the full run's; these rows say their own
                r["machine"] = mach
            merged = {**old, "rows": sorted(keep + rows, key=_order), "seconds": {**old.get("seconds", {}), **seconds}}
        RESULTS.write_text(json.dumps(merged, indent=1, default=str) + "\n")
        _write_benchmarks(merged)
    return 0


def _write_benchmarks(results: dict) -> None:
    BENCHMARKS.write_text(rendered(results))
    print(f"wrote {BENCHMARKS.relative_to(REPO)} from {RESULTS.relative_to(REPO)}", file=sys.stderr)


def rendered(results: dict) -> str:
    """BENCHMARKS.md's text from ``results`` (bench/results.json's content) and bench/cold_demo.json."""
    cold_file = REPO / "bench" / "cold_demo.json"
    cold = json.loads(cold_file.read_text()) if cold_file.exists() else None
    if cold:  # the cold demo is measured by hand, maybe after the row ran: show it as row 7a's anchor
        for r in results["rows"]:
            if r["number"] == "7a" and r["data"].get("wall_s"):
                r["anchor"] = (f"cold {cold['wall_s']:.0f} s (fresh venv, measured by hand with bench/cold_demo.py "
                               f"on {cold['date']}; venv set-up {cold['setup_s']:.0f} s)")
                r["ratio"] = f"warm/cold {r['data']['wall_s'] / cold['wall_s']:.2f}"
    return render(results["rows"], results["machine"], results["seconds"], cold)


def _exclusive():
    """Hold an exclusive lock so that two benchmark runs never overlap (they would skew each other's
    times and share bench/out/); a second run waits for the first. Returns the open lock file."""
    import fcntl

    OUT.mkdir(parents=True, exist_ok=True)
    f = open(OUT / ".run.lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        print(f"bench: another bench/run.py is running ({f.read().strip() or 'pid unknown'}); waiting for it",
              file=sys.stderr, flush=True)
        fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}, started {time.strftime('%H:%M:%S')}\n")
    f.flush()
    return f


def _order(r: dict) -> tuple:
    num = r["number"]
    return (int("".join(c for c in num if c.isdigit()) or 0), num)


if __name__ == "__main__":
    sys.exit(main())
