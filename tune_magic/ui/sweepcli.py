"""The sweep commands of ``tune-magic``: ``run --sweep``, ``cmd --sweep``, ``sweeps``, ``jobs --sweep S``,
``stop S`` and ``metrics S`` for a sweep. Called by :mod:`tune_magic.ui.cli`, same rules: the public
API underneath, bad input exits 2 with one paragraph, values escaped and cut in tables.

A sweep is named by its id (``sweep-...``) or by its name when only one sweep has it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Mapping, Sequence

from tune_magic.ui.textfmt import cell, table


def _sweep_kwargs(own: Mapping[str, Any]) -> dict[str, Any]:
    from tune_magic.job.launch import scheduler_values
    from tune_magic.ui.sweepmagic import sweep_options

    return {**sweep_options(own), **scheduler_values(own)}


def run_sweep(own: Mapping[str, Any], rest: Sequence[str]) -> int:
    """``tune-magic run --sweep ...``: start the sweep, print its id (``--wait``: follow it to its
    end; exit 0 when every trial succeeded, else 1)."""
    from tune_magic.sweeping.create import sweep

    from tune_magic.ui.textfmt import print_warnings

    result = sweep(list(rest), **_sweep_kwargs(own))
    if not hasattr(result, "wait"):  # TUNE_MAGIC_DRY_RUN=1
        print(result.text())
        return 0
    print_warnings("run", result.record.warnings)
    print(result.id, flush=True)
    if not own.get("wait"):
        return 0
    from tune_magic.ui.sweeptext import stream_sweep

    snap = stream_sweep(result, lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    return 0 if all(r.status == "succeeded" for r in snap.rows) else 1


def cmd_sweep(own: Mapping[str, Any], rest: Sequence[str]) -> int:
    """``tune-magic cmd --sweep ...``: every trial's command (``--json``: the trials and their plans)."""
    from tune_magic.sweeping.create import sweep

    dry = sweep(list(rest), dry_run=True, **_sweep_kwargs(own))
    if own.get("json"):
        print(json.dumps({"id": dry.id, "name": dry.name, "max_parallel": dry.slots.max_parallel,
                          "slots": [list(g) if g else None for g in dry.slots.gpus],
                          "extra_overrides": list(dry.extra_overrides), "warnings": list(dry.warnings),
                          "trials": [{"index": t.index, "name": t.name, "words": list(t.words), "plan": p.to_dict()}
                                     for t, p in zip(dry.plan.trials, dry.plans)]}, indent=2))
    else:
        print(dry.text())
    return 0


def sweeps_command(argv: Sequence[str]) -> int:
    """``tune-magic sweeps [--json]``: every sweep with its trials' statuses and its best loss so far."""
    from tune_magic.sweeping.sweep import revive_sweeps, sweeps, trial_jobs_of

    parser = argparse.ArgumentParser(prog="tune-magic sweeps", description="List sweeps, running and finished.")
    parser.add_argument("--json", action="store_true", help="print a JSON list of sweeps")
    ns = parser.parse_args(argv)
    skipped: list = []
    revive_sweeps()  # a sweep whose process died with trials queued goes on (never two processes)
    listed = sweeps(skipped=skipped)
    for path in skipped:
        started = len(trial_jobs_of(path.name))
        print(f"tune-magic sweeps: skipped {cell(str(path), 200)}: damaged sweep record ({started} trial(s) started: "
              f"tune-magic jobs lists them, tune-magic stop {path.name} stops them)", file=sys.stderr)
    for s in listed:
        if s.note:
            print(f"tune-magic sweeps: {s.id}: {s.note}", file=sys.stderr)
    rows = [("ID", "NAME", "STATUS", "TRIALS", "AT ONCE", "BEST LOSS", "STATUSES")]
    data = []
    for s in listed:
        counts = s.counts()
        best = _best_summary(s)
        data.append({"id": s.id, "name": s.name, "status": s.status, "trials": len(s.record.trials),
                     "max_parallel": s.max_parallel, "counts": counts, "axes": s.keys,
                     "best": best, "created_at": s.record.created_at, "note": s.note})
        rows.append((cell(s.id), cell(s.name), s.status, str(len(s.record.trials)), str(s.max_parallel),
                     "-" if best is None else f"{best['final_loss']:.4g} (trial {best['trial']})",
                     ", ".join(f"{n} {k}" for k, n in counts.items())))
    if ns.json:
        print(json.dumps(data, indent=2, allow_nan=False, default=str))
        return 0
    for line in table(rows):
        print(line)
    return 0


def _best_summary(sweep) -> dict | None:
    """The best trial (:func:`tune_magic.sweeping.results.best`, from each trial's summary file:
    never its whole log), with its final and lowest loss."""
    from tune_magic.sweeping.results import best, results

    top = best(results(sweep.trials))
    return None if top is None else {"trial": top.trial.index, "final_loss": top.final_loss, "min_loss": top.min_loss}


def sweep_jobs(spec: str, as_json: bool) -> int:
    """``tune-magic jobs --sweep S``: the sweep's trials, queued ones included, in trial order."""
    from tune_magic.sweeping.sweep import get_sweep
    from tune_magic.ui.sweeptext import table_text
    from tune_magic.ui.sweepwatch import SweepWatcher

    sweep = get_sweep(spec)
    snap = SweepWatcher(sweep).poll_once()
    if as_json:
        print(json.dumps({"id": snap.sweep_id, "name": snap.name, "status": snap.status, "best": snap.best,
                          "trials": [{"index": r.index, "name": r.name, "values": dict(r.texts), "status": r.status,
                                      "job_id": r.job_id, "step": r.step, "loss": _finite(r.loss),
                                      "best_loss": _finite(r.best_loss), "elapsed_s": round(r.elapsed_s, 3),
                                      "note": r.note} for r in snap.rows]}, indent=2))
        return 0
    print(table_text(snap))
    return 0


def _finite(value: float | None):
    return value if value is None or value == value and abs(value) != float("inf") else str(value)


def stop_sweep(spec: str, grace_s: float) -> int:
    """``tune-magic stop S``: stop every trial of the sweep; queued ones never start."""
    from tune_magic.sweeping.sweep import DamagedSweep, get_sweep, stop_damaged

    try:
        sweep = get_sweep(spec)
    except DamagedSweep as exc:
        counts = stop_damaged(exc.sweep_id, grace_s)
        print(f"{exc.sweep_id} " + (", ".join(f"{n} {k}" for k, n in counts.items()) or "no trial started"))
        print(f"tune-magic stop: sweep {exc.sweep_id}'s record is damaged: its started trials were stopped, and "
              "its queued ones are unknown and never start", file=sys.stderr)
        return 0
    counts = sweep.stop(grace_s=grace_s)
    print(f"{sweep.id} " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return 0


def stop_all_sweeps(grace_s: float) -> None:
    """``tune-magic stop --all``: first every running sweep (its queued trials never start)."""
    from tune_magic.sweeping.sweep import stop_running_sweeps

    for sweep_id, counts in stop_running_sweeps(grace_s):
        print(f"{sweep_id} " + ", ".join(f"{n} {k}" for k, n in counts.items()))


def sweep_metrics(spec: str, fmt: str) -> int:
    """``tune-magic metrics S [--csv | --json]``: every trial's metric points with its columns (trial,
    job id, one per axis, as typed) first."""
    from tune_magic.logs.export import labelled_points_to_csv, labelled_points_to_json
    from tune_magic.sweeping.sweep import get_sweep

    sweep = get_sweep(spec)
    groups = sweep.metric_groups()
    if fmt == "json":
        print(labelled_points_to_json(groups))
    elif fmt == "csv":
        sys.stdout.write(labelled_points_to_csv(["trial", "job_id", *sweep.keys], groups))
    else:
        for labels, points in groups:
            for p in points:
                print(f"{labels['trial']:>5} {p.step:>7} {cell(p.name, 28):<28} {p.value:.6g}")
    return 0


def is_sweep(spec: str | None) -> bool:
    """Whether ``spec`` names a sweep (its id, or the name of one) rather than a job."""
    from tune_magic.sweeping import store as sweepstore

    if not spec:
        return False
    if sweepstore.is_sweep_id(spec):
        return True
    try:
        return any(r.name == spec for r in sweepstore.list_records())
    except Exception:  # noqa: BLE001 - an unreadable sweep registry: it is not a sweep then
        return False


__all__ = ["cmd_sweep", "is_sweep", "run_sweep", "stop_all_sweeps", "stop_sweep", "sweep_jobs", "sweep_metrics",
           "sweeps_command"]
