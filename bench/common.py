"""Shared helpers of the benchmark rows: statistics, machine facts, process hygiene, the row format
and the markdown table.

Every row module under ``bench/rows/`` exposes ``run(quick: bool) -> list[dict]`` (one or more
table rows built with :func:`row`) and ends with ``if __name__ == "__main__": row_main(run)``, so
``bench/run.py`` can run each row in its own process with its own ``TUNE_MAGIC_HOME``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TOY_RECIPE = REPO / "tests" / "recipes" / "toy_recipe.py"
TOY_CONFIG = REPO / "tests" / "recipes" / "toy.yaml"
LORA_ARGS = "--nproc_per_node 2 lora_finetune --config tiny/lora"


def toy_args(*overrides: str, nproc: int = 2, torchrun: str = "") -> str:
    """``tune run``-style args for the test-only toy recipe (real torchrun + gloo, no model)."""
    extra = f"{torchrun} " if torchrun else ""
    return f"--nproc_per_node {nproc} {extra}{TOY_RECIPE} --config {TOY_CONFIG} " + " ".join(overrides)


def log(*parts: object) -> None:
    """Progress on stderr (the row's log), with a timestamp."""
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


# -- statistics ----------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def spread(values: Sequence[float], unit: str = "s", digits: int = 3) -> str:
    """``min–max (IQR a–b, n=N)`` of ``values``; the IQR only from 4 values on."""
    if not values:
        return "no samples"
    v = sorted(values)
    text = f"{v[0]:.{digits}f}–{v[-1]:.{digits}f} {unit}".rstrip()
    if len(v) >= 4:
        q = statistics.quantiles(v, n=4)
        text += f" (IQR {q[0]:.{digits}f}–{q[2]:.{digits}f})"
    return f"{text}, n={len(v)}"


def pct(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile (0-100), nearest-rank on sorted values."""
    if not values:
        return None
    v = sorted(values)
    k = min(len(v) - 1, max(0, round(p / 100 * (len(v) - 1))))
    return v[k]


def fmt(x: float | None, unit: str = "s", digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f} {unit}".rstrip()


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    if a is None or not b:
        return None
    return round(a / b, digits)


# -- machine ----------------------------------------------------------------------------------


def machine() -> dict:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        import psutil

        mem_gib = round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:
        pass
    versions = {}
    for pkg in ("torch", "torchtune", "ipython", "ipywidgets", "bqplot"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "cpu_model": model,
        "memory_gib": mem_gib,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        **versions,
    }


# -- processes --------------------------------------------------------------------------------


def processes_mentioning(text: str):
    """Every live, non-zombie process (other than this one) whose command line contains ``text``."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(text in a for a in (p.info["cmdline"] or [])):
                out.append(p)
        except psutil.Error:
            continue
    return [p for p in out if p.pid != os.getpid()]


def leftovers(ids: Iterable[str], settle_s: float = 1.0, kill: bool = True) -> list[str]:
    """Describe processes still alive that mention any of ``ids`` (after ``settle_s``); kill them
    (they were started by this benchmark) unless ``kill`` is False."""
    ids = list(ids)
    time.sleep(settle_s)
    found = []
    for job_id in ids:
        for p in processes_mentioning(job_id):
            try:
                found.append(f"{job_id}: pid {p.pid} {' '.join(p.cmdline())[:160]}")
                if kill:
                    p.kill()
            except Exception:
                continue
    return found


def stop_all(jobs) -> None:
    """Stop every job of ours that still runs."""
    for job in jobs:
        try:
            if job.status == "running":
                job.stop(grace_s=5)
        except Exception as exc:  # keep stopping the others
            log(f"could not stop {job.id}: {exc!r}")


def alternated(rounds: int, project: Callable[[int], dict], anchor: Callable[[int], dict]) -> tuple[list[dict], list[dict]]:
    """Run ``rounds`` rounds of the project and its anchor, the anchor first in even rounds (so a
    drift of the machine's load favours neither); each callable gets the round number and returns
    its sample. Returns (project samples, anchor samples), in order."""
    got: dict[str, list[dict]] = {"project": [], "anchor": []}
    for i in range(rounds):
        for kind in (("anchor", "project") if i % 2 == 0 else ("project", "anchor")):
            got[kind].append((project if kind == "project" else anchor)(i))
    return got["project"], got["anchor"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(proc) -> float:
    """User + system CPU seconds of a psutil.Process (its own threads, not children)."""
    t = proc.cpu_times()
    return t.user + t.system


# -- rows -------------------------------------------------------------------------------------


def row(key: str, number: str, metric: str, project: str, anchor: str, ratio_text: str, goal: str,
        met: bool | None, how: str, spread_text: str, note: str = "", data: dict | None = None) -> dict:
    """One table row. ``met`` is True/False, or None where the row has no goal."""
    return {"key": key, "number": number, "metric": metric, "project": project, "anchor": anchor,
            "ratio": ratio_text, "goal": goal, "met": met, "how": how, "spread": spread_text,
            "note": note, "data": data or {}}


def error_row(key: str, number: str, metric: str, message: str) -> dict:
    return row(key, number, metric, "error", "—", "—", "—", False, "—", "—", note=message)


def row_main(run: Callable[[bool], list[dict]], key: str, number: str, metric: str) -> None:
    """Entry point of a row module: ``python -m bench.rows.X [--quick] [--out FILE]``.

    Writes ``{"rows": [...], "seconds": ...}`` as JSON to ``--out`` (default stdout). A failure
    becomes an error row; the exit status is 0 either way.
    """
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    if not os.environ.get("TUNE_MAGIC_HOME"):
        os.environ["TUNE_MAGIC_HOME"] = tempfile.mkdtemp(prefix="tune_magic_bench_")
    os.chdir(REPO)
    t0 = time.perf_counter()
    try:
        rows = run(args.quick)
    except BaseException as exc:  # report, never crash the table
        traceback.print_exc()
        rows = [error_row(key, number, metric, f"{type(exc).__name__}: {exc}"[:500])]
    result = {"rows": rows, "seconds": round(time.perf_counter() - t0, 1), "quick": args.quick,
              "tune_magic_home": os.environ["TUNE_MAGIC_HOME"]}
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)


# -- table ------------------------------------------------------------------------------------

COLUMNS = ("#", "metric", "this project", "anchor", "ratio", "goal", "met", "how measured", "spread")


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        met = {True: "yes", False: "**no**", None: "n/a"}[r["met"]]
        cells = (r["number"], r["metric"], r["project"], r["anchor"], r["ratio"], r["goal"], met, r["how"], r["spread"])
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def machine_line(m: dict) -> str:
    return (f"{m['usable_cpus']} usable CPU cores ({m['cpu_count']} online; {m['cpu_model'] or 'unknown CPU'}), "
            f"{m['memory_gib']} GiB RAM, no GPU, {m['platform']}, Python {m['python']}, torch {m['torch']}, "
            f"torchtune {m['torchtune']}, IPython {m['ipython']}, ipywidgets {m['ipywidgets']}; "
            f"load average (1, 5, 15 min) at start {m['loadavg']}"
            + (f", at end {m['loadavg_at_end']}" if m.get("loadavg_at_end") else ""))
