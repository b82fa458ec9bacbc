"""Row 15: ``tune-magic jobs`` with a 200-trial sweep in the registry vs the same listing with 200
plain jobs.

Both registries hold 200 finished one-step jobs cloned from a real finished toy-recipe job (row 9's
``_write_job``: record, logs, metric file, summary as the supervisor leaves them). In the project's
registry they are the trials of one sweep: each record carries its ``sweep`` field, and
``sweeps/<id>/`` holds the sweep's record (200 trials, each started, axis ``start_loss``) and its
process lock, without the ``done`` marker (the costliest case: every listing reads the sweep's record to
see whether its queue needs a process; ``tune-magic jobs`` then prints a SWEEP column). The anchor's
registry has the same 200 jobs without the sweep. Each sample is the console script in a fresh
process, wall time from start to exit (output through a pipe, 201 lines checked). One discarded
warm-up of each, then alternated rounds; medians; goal ≤ 1.5×.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.common import REPO, fmt, leftovers, log, median, ratio, row, row_main, spread
from bench.rows.listing_scale import _template, _write_job

KEY, NUMBER = "sweep_listing", "15"
METRIC = "`tune-magic jobs` with a 200-trial sweep in the registry"
GOAL = 1.5
N = 200
CLI = Path(sys.executable).with_name("tune-magic")
SWEEP_ID = "sweep-20261201-000000-b00001"


def _registry(home: Path, template, *, sweep: bool) -> list[str]:
    """200 finished jobs under ``home/jobs`` (with ``sweep``: the trials of one sweep, and its record)."""
    from tune_magic.logs import summary
    from tune_magic.registry import store as jobstore
    from tune_magic.sweeping import store as sweepstore
    from tune_magic.sweeping.record import STARTED, SweepRecord, TrialState

    root = home / "jobs"
    root.mkdir(parents=True, mode=0o700)
    t0 = time.time() - 86400
    ids = []
    for i in range(N):
        started = t0 + i * 60
        job_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started)) + f"-{i:06x}"
        _write_job(root, template, job_id, started, 1)
        d = root / job_id
        if sweep:
            record = replace(jobstore.read(d), name=f"start_loss={i + 1}",
                             sweep={"id": SWEEP_ID, "trial": i, "name": "bench-200", "slot": i % 4})
            jobstore.write_record(d, record, fsync=False)
        summary.current_summary(d, jobstore.read(d), kept=False, final=True)
        ids.append(job_id)
    if sweep:
        d = home / "sweeps" / SWEEP_ID
        d.mkdir(parents=True, mode=0o700)
        texts = [str(i + 1) for i in range(N)]
        trials = [TrialState(index=i, name=f"start_loss={t}", words=[f"start_loss={t}"], status=STARTED,
                             job_id=ids[i], slot=i % 4, started_at=t0 + i * 60) for i, t in enumerate(texts)]
        sweepstore.write(d, SweepRecord(
            id=SWEEP_ID, name="bench-200", created_at=t0, cwd=str(REPO), args=["toy_recipe.py", "--config", "toy.yaml",
                                                                              "start_loss=" + ",".join(texts)],
            axes=[{"key": "start_loss", "texts": texts, "position": 3}], trials=trials, slots=[None] * 4))
        (d / sweepstore.RUNNER_LOCK).touch(mode=0o600)
    return ids


def _cli(home: Path) -> dict:
    env = {**os.environ, "TUNE_MAGIC_HOME": str(home)}
    env.pop("TUNE_MAGIC_DRY_RUN", None)
    t = time.perf_counter()
    proc = subprocess.run([str(CLI), "jobs"], cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=600)
    s = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"tune-magic jobs exited {proc.returncode}: {proc.stderr[-800:]}")
    return {"s": s, "stdout": proc.stdout}


def run(quick: bool) -> list[dict]:
    rounds = 3 if quick else 9
    base = Path(os.environ["TUNE_MAGIC_HOME"])
    template, template_id = _template(base / "template")
    left = leftovers([template_id], settle_s=0.5)
    homes = {"sweep": base / "sweep", "plain": base / "plain"}
    for kind, home in homes.items():
        _registry(home, template, sweep=kind == "sweep")
    samples: dict[str, list[float]] = {"sweep": [], "plain": []}
    for kind in homes:  # warm-up, discarded
        _cli(homes[kind])
    for i in range(rounds):
        for kind in (("plain", "sweep") if i % 2 == 0 else ("sweep", "plain")):
            got = _cli(homes[kind])
            lines = got["stdout"].splitlines()
            header = lines[0].split()
            trial_rows = sum(1 for line in lines if "bench-200 #" in line)
            if len(lines) != N + 1 or (kind == "sweep") != (header[2] == "SWEEP") or \
                    trial_rows != (N if kind == "sweep" else 0):
                raise RuntimeError(f"tune-magic jobs printed the wrong listing for {kind}:\n{got['stdout'][:1500]}")
            samples[kind].append(got["s"])
        log(f"round {i}: sweep {samples['sweep'][-1]:.3f} s, plain {samples['plain'][-1]:.3f} s")
    if (homes["sweep"] / "sweeps" / SWEEP_ID / "done").exists() or any(
            (homes["sweep"] / "jobs").glob(".staging-*")):
        raise RuntimeError("a listing wrote to the registry")
    med, amed = median(samples["sweep"]), median(samples["plain"])
    r = ratio(med, amed)
    return [row(
        KEY, NUMBER, METRIC,
        project=f"{fmt(med)} median", anchor=f"{fmt(amed)} median (the same 200 jobs, no sweep)",
        ratio_text=f"{r}", goal=f"≤ {GOAL}×", met=r is not None and r <= GOAL,
        how=(f"the console script in a fresh process, wall time from start to exit ({N + 1} lines and the SWEEP "
             f"column checked); 200 finished one-step jobs cloned from a real toy-recipe job, as 200 trials of "
             f"one sweep (its record read by the listing: no `done` marker) vs 200 plain jobs; 1 warm-up, then "
             f"{rounds} alternated rounds"),
        spread_text=f"{spread(samples['sweep'])}; anchor {spread(samples['plain'])}",
        note=f"Leftover processes of the template job: {len(left)}.",
        data={"project_s": samples["sweep"], "anchor_s": samples["plain"]})]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
