"""Row 3: loss-to-notebook latency, and crash-to-``failed`` latency.

Write times come from the job itself: the toy recipe's ``write_times_file`` gets ``step,time.time()``
right after each DiskLogger line is written and flushed, and ``crash,time.time()`` right before the
crashing rank raises. Arrival times are taken with ``time.time()`` in this process:

* this project: a :class:`tune_magic.ui.cards.JobCard` as ``%%tune_run`` shows it (its own watcher
  thread, woken by file-change notification, polling at least once a second), observed with
  traitlets ``observe`` on ``card.loss_line`` ``y``: when ``y`` changes, every step newly in
  ``card.loss_line.x`` has arrived;
* anchor: today's polling card (``JobCard(job, notify=False)``: a poll every 0.25 s), live on the
  same job at the same time and observed the same way; the goal is on the 90th percentile;
* reference: ``tail -n +1 -F`` on the same DiskLogger file (started as soon as the file exists),
  its stdout a pipe read line by line in a thread; lines written before tail started are skipped.

Crash (toy ``crash_rank=1``): from the ``crash`` stamp until ``job.status == "failed"`` (polled
every 10 ms) and until the card shows failed (observe on ``card.error``); anchor: the same crashing
job's command run directly with ``subprocess.Popen``, until its ``wait()`` returns.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

from bench.common import (REPO, fmt, leftovers, log, median, pct, ratio, row, row_main, spread, stop_all,
                          toy_args)

KEY, NUMBER = "latency", "3"
METRIC = "Loss-to-notebook latency (metric line written → card trait holds it), p90"
GOAL_S = 0.5  # median, seconds
GOAL_P90_RATIO = 0.3  # notified card's p90 / the polling card's p90
_STEP = re.compile(rb"^Step (\d+) \|")


def _read_times(path: Path) -> dict:
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            what, _, t = line.partition(",")
            out[int(what) if what.isdigit() else what] = float(t)
    return out


def _wait(pred, timeout: float, what: str, interval: float = 0.01) -> float:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(interval)
    return time.time()


def metric_latency(steps: int, step_s: float, home: Path, jobs: list) -> dict:
    import tune_magic
    from tune_magic.ui.cards import JobCard

    times_file = home / f"times_{len(jobs)}.csv"
    job = tune_magic.launch(toy_args(f"steps={steps}", f"step_s={step_s}", f"write_times_file={times_file}"), cwd=REPO)
    jobs.append(job)
    card = JobCard(job)  # as %%tune_run shows it: notified watcher thread started, default interval
    polling = JobCard(job, notify=False)  # the anchor: today's polling card, on the same job
    card_arrival: dict[int, float] = {}
    poll_arrival: dict[int, float] = {}

    def observer(c, arrival):
        def on_y(change):
            t = time.time()
            for s in list(c.loss_line.x):
                arrival.setdefault(int(s), t)
        return on_y

    card.loss_line.observe(observer(card, card_arrival), names="y")
    polling.loss_line.observe(observer(polling, poll_arrival), names="y")
    logs = Path(job.output_dir, "logs")
    _wait(lambda: any(logs.glob("log_*.txt")), 120, "the metric file")
    metric_file = next(logs.glob("log_*.txt"))
    tail = subprocess.Popen(["tail", "-n", "+1", "-F", str(metric_file)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, bufsize=0)
    tail_started = time.time()
    tail_arrival: dict[int, float] = {}

    def read_tail():
        for line in iter(tail.stdout.readline, b""):
            t = time.time()
            m = _STEP.match(line)
            if m:
                tail_arrival.setdefault(int(m[1]), t)

    reader = threading.Thread(target=read_tail, daemon=True)
    reader.start()
    try:
        job.wait(timeout=300)
        _wait(lambda: card.watcher.finished and polling.watcher.finished, 30, "the cards to read the ended job", 0.05)
        _wait(lambda: len(tail_arrival) >= steps, 10, "tail -F to print every step", 0.05)
    finally:
        tail.terminate()
        tail.wait()
        card.close()
        polling.close()
    written = _read_times(times_file)
    card_lat = [card_arrival[s] - written[s] for s in range(1, steps + 1) if s in card_arrival and s in written]
    poll_lat = [poll_arrival[s] - written[s] for s in range(1, steps + 1) if s in poll_arrival and s in written]
    tail_lat = [tail_arrival[s] - written[s] for s in range(1, steps + 1)
                if s in tail_arrival and s in written and written[s] > tail_started]
    return {"job": job.id, "status": job.status, "card": card_lat, "polling": poll_lat, "tail": tail_lat,
            "missing_on_card": [s for s in range(1, steps + 1) if s not in card_arrival],
            "missing_on_polling_card": [s for s in range(1, steps + 1) if s not in poll_arrival],
            "woken": card.watcher.woken, "polls": card.watcher.polls, "polling_polls": polling.watcher.polls,
            "trusting_notifications": card.watcher.trusting_notifications}


def crash_latency(home: Path, jobs: list, i: int) -> dict:
    import tune_magic
    from tune_magic.registry.ids import new_job_id
    from tune_magic.ui.cards import JobCard

    times_file = home / f"crash_{i}.csv"
    args = toy_args("steps=5", "step_s=0.5", "crash_rank=1", f"write_times_file={times_file}")
    job = tune_magic.launch(args, cwd=REPO)
    jobs.append(job)
    card = JobCard(job)
    shown: list[float] = []
    card.error.observe(lambda ch: shown.append(time.time()) if "failed" in ch["new"] and not shown else None,
                       names="value")
    try:
        t_status = _wait(lambda: job.status != "running", 300, "the crash")
        status = job.status
        _wait(lambda: bool(shown), 30, "the card to show failed")
        error = job.error
        ended_at = job.ended_at
    finally:
        card.close()
    crash = _read_times(times_file).get("crash")

    # anchor: the same crashing command, run directly; its parent learns of the end at wait()
    direct_times = home / f"crash_direct_{i}.csv"
    job_id = new_job_id()
    plan = tune_magic.build_plan(args.replace(str(times_file), str(direct_times)), job_id=job_id, cwd=REPO)
    with open(home / f"crash_direct_{i}.log", "wb") as out:
        proc = subprocess.Popen(plan.argv, env={**os.environ, **plan.env}, cwd=REPO, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)
        code = proc.wait(timeout=300)
        t_exit = time.time()
    d_crash = _read_times(direct_times).get("crash")
    return {"job": job.id, "direct_id": job_id, "status": status, "error": error, "direct_exit": code,
            "to_status": t_status - crash if crash else None,
            "to_ended_at": ended_at - crash if crash and ended_at else None, "to_card": shown[0] - crash if crash else None,
            "direct_to_exit": t_exit - d_crash if d_crash else None}


def run(quick: bool) -> list[dict]:
    home = Path(os.environ["TUNE_MAGIC_HOME"])
    steps = 15 if quick else 40
    crash_trials = 1 if quick else 3
    jobs: list = []
    try:
        m = metric_latency(steps, 0.3, home, jobs)
        log(f"metric latency: card median {median(m['card'])} p90 {pct(m['card'], 90)}, polling card median "
            f"{median(m['polling'])} p90 {pct(m['polling'], 90)}, tail median {median(m['tail'])}, "
            f"missing {m['missing_on_card']}")
        crashes = []
        for i in range(crash_trials):
            crashes.append(crash_latency(home, jobs, i))
            log(f"crash {i}: {crashes[-1]}")
    finally:
        stop_all(jobs)
    left = leftovers([j.id for j in jobs] + [c["direct_id"] for c in crashes])
    card, old, tail = m["card"], m["polling"], m["tail"]
    med, tmed = median(card), median(tail)
    p90, old_p90 = pct(card, 90), pct(old, 90)
    r90 = ratio(p90, old_p90, 2)
    met = (r90 is not None and r90 <= GOAL_P90_RATIO and med is not None and med < GOAL_S
           and not m["missing_on_card"])
    to_status = [c["to_status"] for c in crashes if c["to_status"] is not None]
    to_card = [c["to_card"] for c in crashes if c["to_card"] is not None]
    direct = [c["direct_to_exit"] for c in crashes if c["direct_to_exit"] is not None]
    to_ended = [c["to_ended_at"] for c in crashes if c["to_ended_at"] is not None]
    statuses_ok = all(c["status"] == "failed" for c in crashes)
    note = (f"Notified card: median {fmt(med)}, p90 {fmt(p90)}, max {fmt(max(card) if card else None)}; "
            f"{m['woken']} of its {m['polls']} polls woken by a notification (the notifier reads a burst 20 ms after "
            f"its first write); trusting notifications at the end: {m['trusting_notifications']}. Today's polling "
            f"card (0.25 s poll, {m['polling_polls']} polls): median {fmt(median(old))}, p90 {fmt(old_p90)}, max "
            f"{fmt(max(old) if old else None)}. `tail -F` on the same file: median {fmt(tmed, digits=4)}, p90 "
            f"{fmt(pct(tail, 90), digits=4)}. Steps missing on the cards: {m['missing_on_card'] or 'none'} / "
            f"{m['missing_on_polling_card'] or 'none'}. Leftover processes: {len(left)}.")
    crash_note = (f"Crash statuses {[c['status'] for c in crashes]}, errors {sorted({str(c['error']) for c in crashes})}. "
                  "The path: torchrun's agent notices the dead worker (monitor interval), stops the other rank, "
                  "exits; the supervisor's wait (0.2 s poll) records the exit; the card's watcher (woken when the "
                  f"record is replaced) shows it. The supervisor's recorded end time (ended_at) came {fmt(median(to_ended), digits=2)} "
                  f"(median) after the raise. Leftover processes: {len(left)}.")
    return [
        row(KEY, NUMBER + "a", METRIC,
            project=f"{fmt(p90)} p90, {fmt(med)} median (notified card)",
            anchor=f"{fmt(old_p90)} p90, {fmt(median(old))} median (today's polling card, `notify=False`, same job)",
            ratio_text=f"{r90} p90 (lower is better)",
            goal=f"p90 ≤ {GOAL_P90_RATIO:g}× the polling card's; median < {GOAL_S} s", met=met,
            how=f"toy recipe, 2 processes, {steps} steps 0.3 s apart; both cards live on the job at once; `observe` "
                "on `card.loss_line.y`; write times stamped by the recipe",
            spread_text=f"{spread(card)}; polling card {spread(old)}; tail {spread(tail, digits=4)}", note=note,
            data={"metric": m}),
        row(KEY, NUMBER + "b", "Crash-to-`failed` latency (rank 1 raises → status / card)",
            project=f"status {fmt(median(to_status), digits=2)}, card {fmt(median(to_card), digits=2)} (medians)",
            anchor=f"{fmt(median(direct), digits=2)} median (direct `Popen.wait()` returns)",
            ratio_text=f"{ratio(median(to_status), median(direct), 2)} status, {ratio(median(to_card), median(direct), 2)} card",
            goal="— (no goal set; report)", met=None if statuses_ok else False,
            how=f"toy `crash_rank=1` (raises at step 2), {crash_trials} trial(s); status polled every 10 ms",
            spread_text=f"status {spread(to_status, digits=2)}; card {spread(to_card, digits=2)}; anchor {spread(direct, digits=2)}",
            note=crash_note, data={"crashes": crashes}),
    ]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
