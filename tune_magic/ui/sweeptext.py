"""A sweep as plain text: its table of trials and one line per trial. Pure (no widgets).

Shared by the sweep card's text/plain form (terminals, nbconvert), ``--wait`` and the CLI
(``tune-magic jobs --sweep S``). Values are escaped and cut as every listing's are
(:mod:`tune_magic.ui.textfmt`).
"""

from __future__ import annotations

import time
from typing import Callable

from tune_magic.logs.progress import fmt_duration
from tune_magic.sweeping.grid import short_keys
from tune_magic.sweeping.sweep import Sweep
from tune_magic.ui.sweepwatch import SweepSnapshot, SweepWatcher, TrialRow
from tune_magic.ui.textfmt import cut, table

#: Marks the best trial in text tables.
BEST_MARK = "*"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.5g}"


def line_of(row: TrialRow) -> str:
    """One line about a trial: ``trial 2 (lr=3e-4,seed=1): succeeded, step 20, loss 1.2345 (job ID)``."""
    bits = [f"trial {row.index} ({cut(row.name)}): {row.status}"]
    if row.step is not None:
        bits.append(f"step {row.step}, loss {_num(row.loss)}")
    if row.note:
        bits.append(cut(row.note, 160))
    text = ", ".join(bits)
    return text + (f" (job {row.job_id})" if row.job_id else "")


def header_of(snap: SweepSnapshot) -> str:
    """``sweep NAME (ID): STATUS, 4 trials, 2 at a time: 2 running, 1 succeeded, 1 queued``."""
    counts = ", ".join(f"{n} {status}" for status, n in snap.counts().items())
    gpus = [",".join(map(str, s)) for s in snap.slots if s]
    where = f" on GPUs {' | '.join(gpus)}" if gpus else ""
    return (f"sweep {cut(snap.name)} ({snap.sweep_id}): {snap.status}, {len(snap.rows)} trials, "
            f"{snap.max_parallel} at a time{where}: {counts}")


def table_rows(snap: SweepSnapshot) -> list[tuple[str, ...]]:
    """The trial table: a header row, then one row per trial (the best one marked
    :data:`BEST_MARK` in the first column)."""
    short = short_keys(list(snap.keys))
    rows: list[tuple[str, ...]] = [("TRIAL", *(short[k].upper() for k in snap.keys), "STATUS", "STEP", "LOSS",
                                    "BEST LOSS", "ELAPSED", "JOB")]
    for r in snap.rows:
        texts = dict(r.texts)
        mark = BEST_MARK if snap.best == r.index else ""
        rows.append((f"{r.index}{mark}", *(cut(texts.get(k, ""), 24) for k in snap.keys), r.status,
                     "-" if r.step is None else str(r.step), _num(r.loss), _num(r.best_loss),
                     fmt_duration(r.elapsed_s) if r.job_id else "-", r.job_id or "-"))
    return rows


def table_text(snap: SweepSnapshot) -> str:
    """The header line, the trial table, and which trial is best and why."""
    lines = [header_of(snap), *table(table_rows(snap))]
    if snap.best is not None:
        row = snap.rows[snap.best]
        lines.append(f"{BEST_MARK} best: trial {row.index} ({cut(row.name)}), final loss {_num(row.loss)} "
                     f"(lowest final loss; ties: lowest minimum loss)")
    return "\n".join(lines)


def stream_sweep(sweep: Sweep, write: Callable[[str], None], *, interval_s: float = 1.0) -> SweepSnapshot:
    """Follow ``sweep`` in the calling thread, writing one line per trial that starts or ends and a
    final table (``%%tune_run --sweep --wait``, the CLI's ``run --sweep --wait``)."""
    watcher = SweepWatcher(sweep, interval_s=interval_s)
    shown: dict[int, str] = {}
    while True:
        snap = watcher.poll_once()
        for row in snap.rows:
            if shown.get(row.index) != row.status and row.status != "queued":
                write(line_of(row) + "\n")
                shown[row.index] = row.status
        if watcher.done:
            break
        time.sleep(interval_s)
    watcher.stop()
    write(table_text(snap) + "\n")
    return snap
