"""Measure tune_magic's log parser and follower on large generated torchtune logs.

(a) parse: a 1,000,000-line DiskLogger file (``Step N | loss:X lr:Y tokens_per_second_per_gpu:Z ``,
    the torchtune 0.6.1 format) parsed with ``tune_magic.logs.readers.parse_file``, reported in lines/s
    beside ``grep -c 'loss:'`` on the same file in the same run. Two parser figures: points kept
    as columns (``MetricBatch``, the parser's native output) and points materialised as
    ``MetricPoint`` objects. Each side's best of ``--repeat`` runs (the machine may be shared).

(b) follow: a combined job log that is mostly INFO text and tqdm progress redraws (1 GB, or
    100 MB with ``--quick``) covering 100,000 steps, plus the DiskLogger file it names in its
    ``Writing logs to`` line (100,000 lines). A fresh Python process follows both with
    ``JobMetricsFollower`` until caught up; its RSS growth (peak and final, over its RSS after
    imports) is reported beside the RSS of ``tail -n +1 -F`` reading the same combined log.

Usage::

    .venv/bin/python bench/bench_parse.py            # follow 1 GB
    .venv/bin/python bench/bench_parse.py --quick    # follow 100 MB

Prints one JSON object on stdout (rates in lines/s or MB/s, memory in MiB, times in seconds).
Generated files go to a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PARSE_LINES = 1_000_000
FOLLOW_STEPS = 100_000
MiB = 1 << 20


def _write_disklogger(path: Path, lines: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        batch = []
        for step in range(1, lines + 1):
            batch.append(
                f"Step {step} | loss:{rng.uniform(0.5, 3.0):.4f} lr:2e-05 "
                f"tokens_per_second_per_gpu:{rng.uniform(40, 60):.1f} \n"
            )
            if len(batch) == 10_000:
                f.write("".join(batch))
                batch.clear()
        f.write("".join(batch))


def _cpu_s() -> float:
    """CPU seconds of this process and its waited-for children (user + system)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _best(fn, repeat: int) -> tuple[float, float]:
    """Best wall seconds and best CPU seconds of ``repeat`` runs (CPU time barely moves with
    other load on a shared machine; wall time does)."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        c0, t0 = _cpu_s(), time.perf_counter()
        fn()
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, _cpu_s() - c0)
    return wall, cpu


def bench_parse(tmp: Path, repeat: int) -> dict:
    from tune_magic.logs.readers import parse_file

    path = tmp / "log_1732912345.txt"
    _write_disklogger(path, PARSE_LINES)
    counts = {}

    def columns() -> None:
        n = 0

        def count(batch) -> None:
            nonlocal n
            n += len(batch)

        _, stats = parse_file(path, on_batch=count)
        counts["points"], counts["records"], counts["malformed"] = n, stats.records, stats.malformed

    def objects() -> None:
        parse_file(path, on_batch=lambda batch: batch.points())

    def grep() -> None:
        out = subprocess.run(["grep", "-c", "loss:", str(path)], capture_output=True, text=True, check=True)
        counts["grep"] = int(out.stdout)

    t_grep, c_grep = _best(grep, repeat)
    t_cols, c_cols = _best(columns, repeat)
    t_objs, c_objs = _best(objects, repeat)
    if counts["records"] != PARSE_LINES or counts["points"] != 3 * PARSE_LINES or counts["grep"] != PARSE_LINES:
        raise RuntimeError(f"parse bench read the wrong counts: {counts}")
    return {
        "lines": PARSE_LINES,
        "bytes": path.stat().st_size,
        "points": counts["points"],
        "malformed": counts["malformed"],
        "parser_columns_s": round(t_cols, 3),
        "parser_columns_lines_per_s": round(PARSE_LINES / t_cols),
        "parser_columns_lines_per_cpu_s": round(PARSE_LINES / c_cols),
        "parser_metricpoints_s": round(t_objs, 3),
        "parser_metricpoints_lines_per_s": round(PARSE_LINES / t_objs),
        "parser_metricpoints_lines_per_cpu_s": round(PARSE_LINES / c_objs),
        "grep_s": round(t_grep, 3),
        "grep_lines_per_s": round(PARSE_LINES / t_grep),
        "grep_lines_per_cpu_s": round(PARSE_LINES / max(c_grep, 1e-3)),
        "ratio_parser_over_grep": round(t_grep / t_cols, 4),
        "repeat": repeat,
    }


def _write_job_log(log: Path, metrics: Path, target_bytes: int) -> None:
    """A combined log of ~target_bytes: INFO filler and one tqdm redraw per step."""
    per_step = max(target_bytes // FOLLOW_STEPS, 200)
    info = (
        "INFO:torchtune.utils._logging:rank0 data: batch of 4 sequences, 2048 tokens, "
        "packed=False, memory: alloc 12.50 GiB, reserved 14.00 GiB\n"
    )
    filler = info * max(round((per_step - 100) / len(info)), 0)  # ~100 bytes of progress per step
    rng = random.Random(1)
    with open(log, "w") as f, open(metrics, "w") as m:
        f.write(f"INFO:torchtune.utils._logging:Writing logs to {metrics}\n")
        for step in range(1, FOLLOW_STEPS + 1):
            loss = rng.uniform(0.5, 3.0)
            pct = step * 100 // FOLLOW_STEPS
            f.write(
                f"\r1|{step}|Loss: {loss:.5f}: {pct:3d}%|{'#' * (pct // 10):10s}| "
                f"{step}/{FOLLOW_STEPS} [00:11<00:00,  1.12it/s]"
            )
            if filler:
                f.write("\n" + filler)
            m.write(f"Step {step} | loss:{loss:.4f} lr:2e-05 tokens_per_second_per_gpu:57.8 \n")
        f.write("\n")


def _rss_kib() -> tuple[int, int]:
    """(current RSS, peak RSS) of this process, KiB, from /proc (Linux)."""
    cur = peak = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1])
    return cur, peak


def follow_worker(log: str) -> None:
    """Run in a fresh process: follow ``log`` until caught up; print a JSON result."""
    from tune_magic.logs.metricfollow import JobMetricsFollower

    base, _ = _rss_kib()
    t0 = time.perf_counter()
    job = JobMetricsFollower(log)
    polls = points_reported = 0
    while True:
        points_reported += len(job.poll())
        polls += 1
        if job.caught_up and job.metrics_path is not None:
            break
    elapsed = time.perf_counter() - t0
    cur, peak = _rss_kib()
    loss = job.series("loss", max_points=None)
    print(
        json.dumps(
            {
                "seconds": elapsed,
                "polls": polls,
                "points_reported": points_reported,
                "loss_steps": len(loss.steps),
                "metric_names": job.names(),
                "tail_lines": len(job.tail()),
                "rss_after_imports_kib": base,
                "rss_final_kib": cur,
                "rss_peak_kib": peak,
                "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            }
        )
    )


def _proc_status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0])
    return out


def _tail_rss(log: Path, size: int) -> dict:
    """Follow ``log`` with ``tail -n +1 -F`` until it has read ``size`` bytes; its memory."""
    proc = subprocess.Popen(["tail", "-n", "+1", "-F", str(log)], stdout=subprocess.DEVNULL)
    t0 = time.perf_counter()
    try:
        while True:
            with open(f"/proc/{proc.pid}/io") as f:
                rchar = int(next(line for line in f if line.startswith("rchar:")).split()[1])
            if rchar >= size:
                break
            if time.perf_counter() - t0 > 600:
                raise RuntimeError("tail -F did not catch up in 600 s")
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
        time.sleep(0.2)
        status = _proc_status(proc.pid)
    finally:
        proc.terminate()
        proc.wait()
    return {"seconds_approx": round(elapsed, 2), "rss_kib": status["VmRSS"], "rss_peak_kib": status["VmHWM"]}


def bench_follow(tmp: Path, target_bytes: int) -> dict:
    log = tmp / "job.log"
    metrics = tmp / "logs" / "log_1732912345.txt"
    metrics.parent.mkdir()
    _write_job_log(log, metrics, target_bytes)
    size = log.stat().st_size
    out = subprocess.run(
        [sys.executable, __file__, "--_follow-worker", str(log)], capture_output=True, text=True, check=True
    )
    w = json.loads(out.stdout)
    if w["loss_steps"] != FOLLOW_STEPS:
        raise RuntimeError(f"follower saw {w['loss_steps']} loss steps, wanted {FOLLOW_STEPS}")
    tail = _tail_rss(log, size)
    base = w["rss_after_imports_kib"]
    return {
        "combined_log_bytes": size,
        "metric_file_bytes": metrics.stat().st_size,
        "steps": FOLLOW_STEPS,
        "follower_seconds": round(w["seconds"], 2),
        "follower_mb_per_s": round(size / 1e6 / w["seconds"], 1),
        "follower_polls": w["polls"],
        "follower_points_reported": w["points_reported"],
        "follower_metric_names": w["metric_names"],
        "follower_tail_lines": w["tail_lines"],
        "follower_rss_after_imports_mib": round(base / 1024, 1),
        "follower_rss_growth_final_mib": round((w["rss_final_kib"] - base) / 1024, 1),
        "follower_rss_growth_peak_mib": round((w["rss_peak_kib"] - base) / 1024, 1),
        "tail_F_rss_mib": round(tail["rss_kib"] / 1024, 1),
        "tail_F_rss_peak_mib": round(tail["rss_peak_kib"] / 1024, 1),
        "tail_F_seconds_approx": tail["seconds_approx"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="follow a 100 MB log instead of 1 GB")
    ap.add_argument("--repeat", type=int, default=3, help="parse runs per side, best kept (default 3)")
    ap.add_argument("--_follow-worker", dest="follow_worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.follow_worker:
        follow_worker(args.follow_worker)
        return 0
    repeat = max(args.repeat, 1)
    target = (100 if args.quick else 1000) * 1_000_000
    tmp = Path(tempfile.mkdtemp(prefix="tune_magic_bench_"))
    try:
        result = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg": os.getloadavg()},
            "quick": args.quick,
            "parse": bench_parse(tmp, repeat),
            "follow": bench_follow(tmp, target),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
