"""Row 4: CPU of the watching (kernel) process while 4 live job cards follow 4 jobs.

Busy: 4 toy jobs (2 processes each) that each write about 200 lines/s to their combined log
(``lines_per_step=20``, ``step_s=0.1``; plus a progress redraw and a DiskLogger line per step).
Idle: 4 toy jobs sleeping in their first step (they write nothing). Each phase: 4
:class:`tune_magic.views.JobCard` live in this process (their watcher threads poll every 0.25 s,
as in a notebook), after a warm-up this process's CPU time (user + system, all threads;
``psutil``) is measured over a fixed window. The anchor is 4 ``tail -n 0 -F`` processes, one per
job, on the same two files each (combined log + DiskLogger file), output to ``/dev/null``, measured
over the same window. The jobs' supervisors' CPU over the window is reported beside (tune_magic's
per-job cost outside the kernel).

No Jupyter frontend is connected: widget state changes are serialised but go nowhere, so a real
kernel also pays for sending comm messages (not measured here).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil

from bench.common import (REPO, cpu_s, leftovers, log, row, row_main, stop_all, toy_args)

KEY, NUMBER = "tailing_cpu", "4"
METRIC = "Tailing cost: CPU of the watching process, 4 live cards"
GOAL_BUSY, GOAL_IDLE = 5.0, 1.0
_POLLS = [0]


def _count_polls() -> None:
    """Count every card poll in this process (JobWatcher.poll_once), to report polls/s."""
    from tune_magic.watch import JobWatcher

    real = JobWatcher.poll_once
    if getattr(real, "_bench_counted", False):
        return

    def poll_once(self):
        _POLLS[0] += 1
        return real(self)

    poll_once._bench_counted = True
    JobWatcher.poll_once = poll_once


def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)


def phase(busy: bool, window_s: float, jobs_all: list, goal: float) -> dict:
    import tune_magic
    from tune_magic.views import JobCard

    args = (toy_args("steps=1000000", "step_s=0.1", "lines_per_step=20") if busy
            else toy_args("steps=1", "step_s=3600"))
    jobs = [tune_magic.launch(args, cwd=REPO, name=f"{'busy' if busy else 'idle'}{i}") for i in range(4)]
    jobs_all += jobs
    cards = [JobCard(job) for job in jobs]
    tails = []
    try:
        def started():
            return all(c.watcher.follower.metrics_path is not None and c.watcher.follower.metrics_path.exists()
                       and (not busy or (c.snapshot is not None and (c.snapshot.step or 0) >= 3)) for c in cards)

        _wait(started, 240, "4 jobs to start writing")
        for job, card in zip(jobs, cards):
            tails.append(subprocess.Popen(["tail", "-n", "0", "-F", job.log_path, str(card.watcher.follower.metrics_path)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(4.0)  # warm-up: steady state (an idle card backs off its polling)
        me = psutil.Process()
        tail_ps = [psutil.Process(t.pid) for t in tails]
        sups = [psutil.Process(j.record.supervisor.pid) for j in jobs]
        watcher_tids = {c.watcher._thread.native_id for c in cards}
        logs = [Path(j.log_path) for j in jobs]

        def watcher_cpu():
            return sum(t.user_time + t.system_time for t in me.threads() if t.id in watcher_tids)

        size0 = [p.stat().st_size for p in logs]
        polls0 = _POLLS[0]
        c0, w0, t0 = cpu_s(me), watcher_cpu(), [cpu_s(p) for p in tail_ps]
        s0 = [cpu_s(p) for p in sups]
        wall0 = time.perf_counter()
        time.sleep(window_s)
        wall = time.perf_counter() - wall0
        c1, w1, t1 = cpu_s(me), watcher_cpu(), [cpu_s(p) for p in tail_ps]
        s1 = [cpu_s(p) for p in sups]
        size1 = [p.stat().st_size for p in logs]
        polls1 = _POLLS[0]
        statuses = [j.status for j in jobs]
        for c in cards:
            c.close()
        prof = profile_polls(jobs[0], 0.25 if busy else 0.05) if 100 * (c1 - c0) / wall >= goal else None
    finally:
        for t in tails:
            t.terminate()
            t.wait()
        for c in cards:
            c.close()
        stop_all(jobs)
    lines = []
    for p, a, b in zip(logs, size0, size1):
        with open(p, "rb") as f:
            f.seek(a)
            lines.append(f.read(b - a).count(b"\n"))
    return {
        "busy": busy, "window_s": wall, "statuses_during": statuses,
        "kernel_cpu_pct": 100 * (c1 - c0) / wall,
        "watcher_threads_cpu_pct": 100 * (w1 - w0) / wall,
        "tail_cpu_pct_total": 100 * sum(b - a for a, b in zip(t0, t1)) / wall,
        "supervisors_cpu_pct_total": 100 * sum(b - a for a, b in zip(s0, s1)) / wall,
        "lines_per_s_per_job": [n / wall for n in lines],
        "bytes_per_s_per_job": [(b - a) / wall for a, b in zip(size0, size1)],
        "job_ids": [j.id for j in jobs],
        "polls_per_s": (polls1 - polls0) / wall,
        "profile": prof,
    }


def profile_polls(job, spacing_s: float, n: int = 40) -> dict:
    """Where one card's poll spends its time: cProfile over ``n`` polls of a non-watching card, and the
    process CPU per poll without the profiler (no other card live meanwhile)."""
    import cProfile
    import pstats

    from tune_magic.views import JobCard

    card = JobCard(job, watch=False)
    try:
        c0 = time.process_time()
        for _ in range(n):
            card.watcher.poll_once()
            time.sleep(spacing_s)
        cpu_ms = 1000 * (time.process_time() - c0) / n
        pr = cProfile.Profile()
        for _ in range(n):
            pr.enable()
            card.watcher.poll_once()
            pr.disable()
            time.sleep(spacing_s)
    finally:
        card.close()
    stats = pstats.Stats(pr).stats  # (file, line, func) -> (cc, nc, tt, ct, callers)

    def cum(file_end: str, func: str) -> float:
        return sum(v[3] for k, v in stats.items() if k[0].endswith(file_end) and k[2] == func)

    total = cum("watch.py", "_poll") or 1e-9
    parts = {"job.status (record re-read + liveness check)": cum("jobctl.py", "refresh"),
             "follower.poll (read + parse new bytes)": cum("follow.py", "poll") + cum("follow.py", "finish"),
             "card.update (set widget traits)": cum("views.py", "update")}
    return {"cpu_ms_per_poll": round(cpu_ms, 3), "polls": n,
            "share": {k: round(v / total, 3) for k, v in parts.items()},
            "record_read_share": round(cum("jobstore.py", "read") / total, 3),
            "psutil_alive_share": round(cum("jobctl.py", "_alive") / total, 3)}


def run(quick: bool) -> list[dict]:
    window = 8.0 if quick else 20.0
    _count_polls()
    jobs: list = []
    try:
        busy = phase(True, window, jobs, GOAL_BUSY)
        log(f"busy: {busy}")
        idle = phase(False, window, jobs, GOAL_IDLE)
        log(f"idle: {idle}")
    finally:
        stop_all(jobs)
    left = leftovers([j.id for j in jobs])
    rows = []
    for p, goal, n in ((busy, GOAL_BUSY, "a"), (idle, GOAL_IDLE, "b")):
        cpu, tail = p["kernel_cpu_pct"], p["tail_cpu_pct_total"]
        met = cpu < goal
        rate = sum(p["lines_per_s_per_job"]) / 4
        what = f"4 jobs × {rate:.0f} lines/s each" if p["busy"] else "4 idle jobs (writing nothing)"
        note = (f"Measured {what} ({sum(p['bytes_per_s_per_job']) / 4 / 1024:.1f} KiB/s each). Of the kernel's CPU, "
                f"the 4 watcher threads: {p['watcher_threads_cpu_pct']:.2f}% of a core. The 4 jobs' supervisors "
                f"(outside the kernel) used {p['supervisors_cpu_pct_total']:.2f}% of a core together. "
                f"Leftover processes: {len(left)}.")
        if p["polls_per_s"]:
            note += (f" The 4 cards polled {p['polls_per_s']:.1f} times/s together "
                     f"({1000 * p['kernel_cpu_pct'] / 100 / p['polls_per_s']:.2f} ms of CPU per poll).")
        if not met and p["profile"]:
            pr = p["profile"]
            split = ", ".join(f"{k} {v:.0%}" for k, v in pr["share"].items())
            note += (f" Goal missed. Cause (cProfile of one card's polls after the window): a poll costs "
                     f"{pr['cpu_ms_per_poll']:.2f} ms of CPU; {split}; of which reading and validating record.json "
                     f"{pr['record_read_share']:.0%} and the psutil liveness check {pr['psutil_alive_share']:.0%}. "
                     "The cost is per poll, not per line, so it is set by how often the cards poll.")
        rows.append(row(
            KEY, NUMBER + n, f"{METRIC}, {'busy: 4 × 200 lines/s' if p['busy'] else 'idle jobs'}",
            project=f"{cpu:.2f}% of one core", anchor=f"{tail:.2f}% (4 × `tail -F`, together)",
            ratio_text=f"{cpu / tail:.1f}" if tail > 0 else "∞ (tail used no measurable CPU)",
            goal=f"< {goal:g}% of one core", met=met,
            how=f"`psutil` CPU time delta of this process over a {p['window_s']:.1f} s window after warm-up, "
                "4 `JobCard`s live (0.25 s poll), no frontend connected",
            spread_text="one window (CPU time is a sum, not a sample)", note=note, data=p))
    return rows


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
