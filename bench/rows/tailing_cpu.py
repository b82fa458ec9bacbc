"""Row 4: CPU of the watching (kernel) process while 4 live job cards follow 4 jobs.

Busy: 4 toy jobs (2 processes each) that each write about 200 lines/s to their combined log
(``lines_per_step=20``, ``step_s=0.1``; plus a progress redraw and a DiskLogger line per step).
Idle: 4 toy jobs sleeping in their first step (they write nothing). Each phase: 4
:class:`tune_magic.ui.cards.JobCard` live in this process, in turns: notified cards (the default:
file-change notification, polling at least once a second) and today's polling cards
(``notify=False``: a poll every 0.25 s, backing off to 1 s while nothing changes), never both at
once, in the order notified, polling, polling, notified (half a window each, after a 3 s warm-up),
on the same 4 jobs. Measured: this process's CPU time (user + system, all threads, so the
notifier's thread counts; ``time.process_time``, nanoseconds). The anchor is the polling cards; 4 ``tail -n 0 -F``
processes, one per job on the same two files (combined log + DiskLogger file), output to
``/dev/null``, are reported beside, and so are the jobs' supervisors (tune_magic's per-job cost
outside the kernel).

No Jupyter frontend is connected: widget state changes are serialised but go nowhere, so a real
kernel also pays for sending comm messages (not measured here).
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import psutil

from bench.common import (REPO, cpu_s, leftovers, log, row, row_main, stop_all, toy_args)

KEY, NUMBER = "tailing_cpu", "4"
METRIC = "Tailing cost: CPU of the watching process, 4 live cards"
GOAL_BUSY, GOAL_IDLE = 5.0, 1.0  # % of one core
GOAL_RATIO = 1.0  # notified cards / polling cards
_POLLS = [0]


def _count_polls() -> None:
    """Count every card poll in this process (JobWatcher.poll_once), to report polls/s."""
    from tune_magic.ui.watch import JobWatcher

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


def _thread_cpu(threads) -> float:
    """CPU seconds of live threads of this process (their own CPU clocks, nanoseconds)."""
    total = 0.0
    for t in threads:
        try:
            total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, TypeError):  # ended meanwhile
            pass
    return total


def _measure(cards, jobs, tail_ps, window_s: float) -> dict:
    """CPU of this process, of the cards' watcher threads and of the notifier's thread, of the
    ``tail -F`` processes and of the jobs' supervisors over ``window_s`` seconds, and the cards'
    polls meanwhile. This process's clocks (``time.process_time``, the threads' CPU clocks) count
    nanoseconds, not psutil's 10 ms ticks: an idle window holds a few ms of CPU."""
    sups = [psutil.Process(j.record.supervisor.pid) for j in jobs]
    watchers = [c.watcher._thread for c in cards]
    notifiers = [t for t in threading.enumerate() if t.name == "tune_magic-notify"]
    polls0, woken0 = _POLLS[0], sum(c.watcher.woken for c in cards)
    t0, s0 = [cpu_s(p) for p in tail_ps], [cpu_s(p) for p in sups]
    w0, n0 = _thread_cpu(watchers), _thread_cpu(notifiers)
    c0 = time.process_time()  # last: the reads above stay out of the window
    wall0 = time.perf_counter()
    time.sleep(window_s)
    c1 = time.process_time()  # first
    wall = time.perf_counter() - wall0
    w1, n1 = _thread_cpu(watchers), _thread_cpu(notifiers)
    t1, s1 = [cpu_s(p) for p in tail_ps], [cpu_s(p) for p in sups]
    return {"wall": wall, "kernel": c1 - c0, "watchers": w1 - w0, "notifier": n1 - n0,
            "tail": sum(b - a for a, b in zip(t0, t1)), "supervisors": sum(b - a for a, b in zip(s0, s1)),
            "polls": _POLLS[0] - polls0, "woken": sum(c.watcher.woken for c in cards) - woken0}


def _cards(jobs, notify: bool) -> list:
    from tune_magic.ui.cards import JobCard

    return [JobCard(job, notify=notify) for job in jobs]


def phase(busy: bool, window_s: float, jobs_all: list) -> dict:
    """4 jobs; 4 notified cards and 4 polling cards (never live at once) measured in turns
    A B B A (``window_s / 2`` each), so a drift in the jobs' load weighs on both alike."""
    import tune_magic

    args = (toy_args("steps=1000000", "step_s=0.1", "lines_per_step=20") if busy
            else toy_args("steps=1", "step_s=3600"))
    jobs = [tune_magic.launch(args, cwd=REPO, name=f"{'busy' if busy else 'idle'}{i}") for i in range(4)]
    jobs_all += jobs
    tails, live = [], []
    totals = {mode: {"wall": 0.0, "kernel": 0.0, "watchers": 0.0, "notifier": 0.0, "tail": 0.0, "supervisors": 0.0,
                     "polls": 0, "woken": 0} for mode in ("notify", "poll")}
    trusting = []
    try:
        cards = _cards(jobs, notify=False)
        live += cards

        def started():
            return all(c.watcher.follower.metrics_path is not None and c.watcher.follower.metrics_path.exists()
                       and (not busy or (c.snapshot is not None and (c.snapshot.step or 0) >= 3)) for c in cards)

        _wait(started, 240, "4 jobs to start writing")
        for job, card in zip(jobs, cards):
            tails.append(subprocess.Popen(["tail", "-n", "0", "-F", job.log_path, str(card.watcher.follower.metrics_path)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        tail_ps = [psutil.Process(t.pid) for t in tails]
        logs = [Path(j.log_path) for j in jobs]
        size0 = [p.stat().st_size for p in logs]
        wall0 = time.perf_counter()
        for c in cards:
            c.close()
        for mode in ("notify", "poll", "poll", "notify"):
            cards = _cards(jobs, notify=mode == "notify")
            live += cards
            time.sleep(3.0)  # warm-up: steady state (an idle polling card backs off; a busy notified one spaces its polls)
            m = _measure(cards, jobs, tail_ps, window_s / 2)
            if mode == "notify":
                trusting.append([c.watcher.trusting_notifications for c in cards])
            for k, v in m.items():
                totals[mode][k] += v
            for c in cards:
                c.close()
        wall_all = time.perf_counter() - wall0
        size1 = [p.stat().st_size for p in logs]
        statuses = [j.status for j in jobs]
        prof = profile_polls(jobs[0], 0.25 if busy else 0.05)
    finally:
        for t in tails:
            t.terminate()
            t.wait()
        for c in live:
            c.close()
        stop_all(jobs)
    out = {"busy": busy, "statuses_during": statuses, "job_ids": [j.id for j in jobs],
           "lines_per_s_per_job": [], "bytes_per_s_per_job": [(b - a) / wall_all for a, b in zip(size0, size1)],
           "notified_cards_trusting_notifications": trusting, "profile": prof}
    for p, a, b in zip(logs, size0, size1):
        with open(p, "rb") as f:
            f.seek(a)
            out["lines_per_s_per_job"].append(f.read(b - a).count(b"\n") / wall_all)
    for mode, t in totals.items():
        wall = t["wall"]
        out[mode] = {"window_s": wall, "kernel_cpu_pct": 100 * t["kernel"] / wall,
                     "watcher_threads_cpu_pct": 100 * t["watchers"] / wall, "notifier_thread_cpu_pct": 100 * t["notifier"] / wall,
                     "tail_cpu_pct_total": 100 * t["tail"] / wall,
                     "supervisors_cpu_pct_total": 100 * t["supervisors"] / wall, "polls_per_s": t["polls"] / wall,
                     "woken_per_s": t["woken"] / wall}
    return out


def profile_polls(job, spacing_s: float, n: int = 40) -> dict:
    """Where one card's poll spends its time: cProfile over ``n`` polls of a non-watching card, and the
    process CPU per poll without the profiler (no other card live meanwhile)."""
    import cProfile
    import pstats

    from tune_magic.ui.cards import JobCard

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
    window = 3.0 if quick else 20.0
    _count_polls()
    jobs: list = []
    try:
        busy = phase(True, window, jobs)
        log(f"busy: {busy}")
        idle = phase(False, window, jobs)
        log(f"idle: {idle}")
    finally:
        stop_all(jobs)
    left = leftovers([j.id for j in jobs])
    rows = []
    for p, goal, n in ((busy, GOAL_BUSY, "a"), (idle, GOAL_IDLE, "b")):
        new, old = p["notify"], p["poll"]
        cpu, anchor, tail = new["kernel_cpu_pct"], old["kernel_cpu_pct"], new["tail_cpu_pct_total"]
        r = cpu / anchor if anchor > 0 else None
        met = r is not None and r <= GOAL_RATIO and cpu < goal
        rate = sum(p["lines_per_s_per_job"]) / 4
        what = f"4 jobs × {rate:.0f} lines/s each" if p["busy"] else "4 idle jobs (writing nothing)"
        note = (f"Measured {what} ({sum(p['bytes_per_s_per_job']) / 4 / 1024:.1f} KiB/s each). "
                f"Notified cards: {new['polls_per_s']:.1f} polls/s together, {new['woken_per_s']:.1f} of them woken by a "
                f"notification; watcher threads {new['watcher_threads_cpu_pct']:.2f}% of a core, the notifier's thread "
                f"{new['notifier_thread_cpu_pct']:.2f}%. Polling cards: {old['polls_per_s']:.1f} polls/s, watcher threads "
                f"{old['watcher_threads_cpu_pct']:.2f}%. 4 × `tail -F` on the same files: {tail:.2f}% of a core "
                f"(ratio {cpu / tail:.1f} for the notified cards). " if tail > 0 else
                f"Measured {what}. Notified cards: {new['polls_per_s']:.1f} polls/s together, {new['woken_per_s']:.1f} "
                f"woken by a notification; watcher threads {new['watcher_threads_cpu_pct']:.3f}% of a core, the "
                f"notifier's thread {new['notifier_thread_cpu_pct']:.3f}%. Polling cards: {old['polls_per_s']:.1f} "
                f"polls/s, watcher threads {old['watcher_threads_cpu_pct']:.3f}%. 4 × `tail -F` used no measurable CPU. ")
        note += (f"Notified cards trusting notifications (per turn): {p['notified_cards_trusting_notifications']}. "
                 f"The 4 jobs' supervisors (outside the kernel) used {new['supervisors_cpu_pct_total']:.2f}% of a core "
                 f"together. Leftover processes: {len(left)}.")
        pr = p["profile"]
        if pr:
            split = ", ".join(f"{k} {v:.0%}" for k, v in pr["share"].items())
            note += (f" One notified card's poll (cProfile after the windows): {pr['cpu_ms_per_poll']:.2f} ms of CPU; "
                     f"{split}.")
        rows.append(row(
            KEY, NUMBER + n, f"{METRIC}, {'busy: 4 × 200 lines/s' if p['busy'] else 'idle jobs'}",
            project=f"{cpu:.2f}% of one core (notified cards)",
            anchor=f"{anchor:.2f}% (today's polling cards, `notify=False`, same jobs)",
            ratio_text=f"{r:.2f}" if r is not None else "—",
            goal=f"≤ {GOAL_RATIO:g}× the polling cards, < {goal:g}% of one core", met=met,
            how=f"CPU time of this process (`time.process_time`), 4 `JobCard`s live, turns notified/polling/polling/notified "
                f"of {new['window_s'] / 2:.1f} s each after a 3 s warm-up (same 4 jobs), no frontend connected",
            spread_text="two windows per mode (CPU time is a sum, not a sample)", note=note, data=p))
    return rows


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
