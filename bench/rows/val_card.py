"""Row 19: a checkpoint's validation loss on the card after its evaluation wrote it (issue 28).

Set-up: torchtune 0.6.1's ``full_finetune_single_device`` trains the tiny model for a few epochs
with ``--val-split 0.1``, so each ``epoch_N/`` it saves is evaluated by an evaluation job of its own
(``recipes/validate_checkpoint.py``), which writes ``val_loss.json`` (a temporary file, then a
rename) when it is done.

Write time: the result file's ``st_mtime`` (the temporary file's last write, just before the
rename), read once the file exists. Arrival times are taken with ``time.time()`` in this process:

* this project: a :class:`tune_magic.ui.cards.JobCard` as ``%%tune_run`` shows it (its own watcher
  thread), observed with traitlets ``observe`` on ``card.val_line`` ``y``: when ``y`` changes,
  every validation step newly in ``card.val_line.x`` has arrived;
* anchor (the floor, what any reader could do): a thread in this process that ``stat``\\ s each
  expected result file every 10 ms and notes when it appears.

Goal: the card's worst point ≤ 1 s after the write (the issue's bound); the ratio is the card's
median over the anchor's.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from bench.common import REPO, log, median, row, row_main, spread

KEY, NUMBER = "val_card", "19"
METRIC = "A checkpoint's validation loss on the card after its evaluation wrote it (worst point)"
GOAL_S = 1.0
RESULT = "val_loss.json"


def one_job(epochs: int, home: Path) -> dict:
    import tune_magic
    from tune_magic.ui.cards import JobCard

    job = tune_magic.launch(f"full_finetune_single_device --config tiny/builtin_full_single epochs={epochs} "
                            f"max_steps_per_epoch=2 output_dir={home / f'run-{time.time_ns()}'}",
                            val_split=0.1, cwd=REPO)
    card = JobCard(job)  # as %%tune_run shows it: its watcher thread started, default intervals
    arrival: dict[int, float] = {}

    def on_y(_change):
        t = time.time()
        for s in list(card.val_line.x):
            arrival.setdefault(int(s), t)

    card.val_line.observe(on_y, names="y")
    results = [Path(f"{job.output_dir}-val-epoch_{e}") / RESULT for e in range(epochs)]
    seen: dict[int, float] = {}
    done = threading.Event()

    def watch_files():  # the anchor: a 10 ms stat loop on each expected result file
        while not done.is_set() and len(seen) < epochs:
            for e, p in enumerate(results):
                if e not in seen and p.exists():
                    seen[e] = time.time()
            time.sleep(0.01)

    watcher = threading.Thread(target=watch_files, daemon=True)
    watcher.start()
    try:
        evaluations = job.wait_evaluations(600)
        deadline = time.monotonic() + 10
        while len(arrival) < epochs and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        done.set()
        watcher.join(5)
        card.close()
    assert job.status == "succeeded", job.tail(20)
    assert [e.status for e in evaluations] == ["succeeded"] * epochs, [(e.status, e.error) for e in evaluations]
    steps = {e.epoch: e.step for e in evaluations}
    written = {e: os.stat(p).st_mtime for e, p in enumerate(results)}
    card_lat = [arrival[steps[e]] - written[e] for e in range(epochs) if steps[e] in arrival]
    floor_lat = [seen[e] - written[e] for e in range(epochs) if e in seen]
    return {"job": job.id, "card": card_lat, "floor": floor_lat,
            "missing_on_card": [steps[e] for e in range(epochs) if steps[e] not in arrival],
            "values": [e.val_loss for e in evaluations]}


def run(quick: bool) -> list[dict]:
    import tune_magic

    tune_magic.make_assets()
    home = Path(os.environ["TUNE_MAGIC_HOME"])
    runs = [(2,)] if quick else [(3,), (3,)]
    results = []
    for (epochs,) in runs:
        log(f"training {epochs} epochs with checkpoint evaluations")
        results.append(one_job(epochs, home))
    card = [x for r in results for x in r["card"]]
    floor = [x for r in results for x in r["floor"]]
    missing = [s for r in results for s in r["missing_on_card"]]
    worst = max(card) if card else None
    met = worst is not None and worst <= GOAL_S and not missing
    r = median(card) / median(floor) if card and floor and median(floor) > 0 else None
    return [row(KEY, NUMBER, METRIC,
                f"{worst:.3f} s worst, {median(card):.3f} s median" if card else "no point arrived",
                f"{median(floor):.3f} s median (10 ms stat loop)" if floor else "—",
                f"{r:.1f}" if r is not None else "—", f"≤ {GOAL_S:g} s worst", met,
                f"{len(card)} checkpoint evaluations of tiny full_finetune_single_device jobs "
                f"({', '.join(str(e) for (e,) in runs)} epochs, --val-split 0.1); card observed on val_line.y; "
                f"missing on the card: {missing or 'none'}",
                f"card {spread(card)}; anchor {spread(floor)}", data={"runs": results})]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
