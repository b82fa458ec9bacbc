"""Row 21: pruning adds no wait to the training loop (issue 29).

torchtune 0.6.1's ``lora_finetune_single_device`` on the tiny model, 6 epochs of 4 steps (a
checkpoint saved after each), through ``tune_magic.launch``:

- with ``--keep-checkpoints 1``: the job's keeper removes each older checkpoint as a newer one is
  complete (5 removals), in its own process;
- without: every checkpoint kept (anchor).

The measure is the training job's own duration (its record's ``ended_at - started_at``: the
recipe's process from start to exit), so the keeper's work counts only where it slows the
training down. Goal: the ratio with / without ≤ 1.1 (the machine's noise on 2 shared cores).
Alternated rounds after a warm-up of each; medians.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.common import REPO, alternated, log, median, row, row_main, spread

KEY, NUMBER = "prune_wait", "21"
METRIC = "Training with --keep-checkpoints 1 (5 checkpoints removed meanwhile) vs keeping all: the job's duration"
ARGS = "lora_finetune_single_device --config tiny/builtin_lora_single epochs=6 max_steps_per_epoch=4"
GOAL = 1.1


def _one(keep) -> dict:
    import tune_magic

    job = tune_magic.launch(ARGS, cwd=REPO, keep_checkpoints=keep)
    assert job.wait(600) == "succeeded", job.tail(20)
    r = job.record
    if keep is not None:  # the keeper's removals, checked (they happen while it trains)
        deadline = time.monotonic() + 60
        while not (job.dir / "keeper.done").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        kept = sorted(p.name for p in Path(r.output_dir).glob("epoch_*"))
        assert kept == ["epoch_4", "epoch_5"], kept
    return {"s": r.ended_at - r.started_at}


def run(quick: bool) -> list[dict]:
    import tune_magic

    tune_magic.make_assets()
    rounds = 1 if quick else 5
    if not quick:  # quick mode (CI) reports without a warm-up
        log("warm-up")
        _one(1), _one(None)
    p, a = alternated(rounds, lambda _i: _one(1), lambda _i: _one(None))
    ps, as_ = [x["s"] for x in p], [x["s"] for x in a]
    r = median(ps) / median(as_)
    return [row(KEY, NUMBER, METRIC, f"{median(ps):.2f} s median (keep 1)", f"{median(as_):.2f} s median (keep all)",
                f"{r:.3f}", f"≤ {GOAL}", r <= GOAL,
                f"`{ARGS}` via `tune_magic.launch`, the record's ended_at - started_at; the keeper removes epoch_0..3 "
                f"while it trains (epoch_4 kept: a resume needs it); {rounds} alternated round(s) after a warm-up of "
                "each", f"{spread(ps)}; anchor {spread(as_)}", data={"keep1_s": ps, "all_s": as_})]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
