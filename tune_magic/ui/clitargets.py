"""The ``tune-magic`` commands on existing jobs and sweeps: ``jobs``, ``sweeps``, ``logs``, ``stop``,
``rm``, ``metrics`` and ``generate``. Each takes a job or a sweep the same way (:mod:`tune_magic.ui.targets`: a
sweep's id or name, else a job's id or name); :mod:`tune_magic.ui.cli` dispatches to them, same
rules: the public API underneath, bad input exits 2 with one paragraph, values escaped and cut in
tables (``--json`` keeps them whole).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable, Iterator, Sequence

from tune_magic.errors import UserError
from tune_magic.job import Job
from tune_magic.ui.clifiles import CHUNK_BYTES, FOLLOWING, CliError, check_job_log, whole_log, write_chunks
from tune_magic.ui.targets import counts_text, find, is_sweep
from tune_magic.ui.textfmt import NAME_WIDTH, PATH_WIDTH, cell, escape, table

EXIT_USAGE = 2


def end_line(job) -> str:
    """One line saying how a job ended: status, last step and loss, its validation loss (the best,
    the latest where it differs), the reason on failure."""
    from tune_magic.job.evaluate import val_summary_of
    from tune_magic.ui.tablecols import val_text

    s = job.summary()
    parts = [f"job {job.id} {job.status.label}"]
    if s.step is not None:
        parts.append(f"step {s.step}" + (f" loss {s.loss:.6g}" if s.loss is not None else ""))
    val = val_text(val_summary_of(job, summary=s), 6)
    if val:
        parts.append(f"val loss {val}")
    if job.status in ("failed", "stopped") and job.error:
        parts.append(escape(job.error))
    elif job.status == "stopped":  # a user's stop, whatever the engine said of the job's end
        parts.append(escape(job.record.error) if job.record.error else "stopped by the user")
    elif job.status == "succeeded" and job.record.error:  # "the stop arrived after training ended"
        parts.append(escape(job.record.error))
    elif job.record.returncode is not None and job.status != "succeeded":
        parts.append(f"exit code {job.record.returncode}")
    return " · ".join(parts)


def _job_arg(parser: argparse.ArgumentParser, argv: Sequence[str], *, sweeps: bool = False):
    """Parse ``argv`` with a JOB argument; return (namespace, the Job), or the Sweep it names when
    ``sweeps`` (:func:`tune_magic.ui.targets.find`)."""
    from tune_magic.job import get_job

    parser.add_argument("job", help="job id, or the name of one job (tune-magic jobs lists them)"
                        + (", or a sweep's id or name" if sweeps else ""))
    ns = parser.parse_args(argv)
    return ns, find(ns.job) if sweeps else get_job(ns.job)


def _listed(command: str) -> list:
    """Every job; each damaged record is reported as one line on stderr and skipped."""
    from tune_magic.job import jobs

    skipped: list = []
    listed = jobs(skipped=skipped)
    for s in skipped:
        print(f"tune-magic {command}: skipped {escape(str(s.path))}: {escape(str(s.reason))}", file=sys.stderr)
    return listed


# -- jobs, sweeps ------------------------------------------------------------------------------------


def jobs_command(argv: Sequence[str]) -> int:
    from tune_magic.ui import tablecols
    from tune_magic.ui.listing import JobFilter, add_arguments

    parser = argparse.ArgumentParser(prog="tune-magic jobs", description="List jobs, running and finished.")
    parser.add_argument("--json", action="store_true", help="print a JSON list of job records")
    add_arguments(parser)
    parser.add_argument("--sweep", metavar="S", help="the trials of sweep S (id or name), queued ones too")
    ns = parser.parse_args(argv)
    if ns.sweep is not None:
        return _sweep_jobs(ns.sweep, ns.json)
    from tune_magic.sweeping.sweep import revive_sweeps

    revive_sweeps()  # a sweep whose process died with trials queued goes on (never two processes)
    listed = JobFilter.from_args(ns).select(_listed("jobs"))
    from tune_magic.job.evaluate import val_summary_of

    summaries = [j.summary() for j in listed]  # the small summary file, never the log
    vals = [val_summary_of(j, summary=s) for j, s in zip(listed, summaries)]  # or the evaluations' result files
    if ns.json:
        print(json.dumps([_job_json(j, v) for j, v in zip(listed, vals)], indent=2))
        return 0
    # every value can hold anything a user typed or a hand-edited record holds: escape and cut (--json keeps it)
    from tune_magic.checkpoints.lineage import mark

    cols = tablecols.columns_for(listed, val=any(v is not None for v in vals))
    rows = [("ID", "NAME", "STATUS", "STEP", "LOSS", *(["VAL LOSS"] if cols.val else []), "ELAPSED",
             *map(cols.title, cols.kinds()), "ENDPOINT", "OUTPUT_DIR", "REASON", "RESUME")]
    now = time.time()
    for j, s, v in zip(listed, summaries, vals):
        extra = tablecols.values(j, now)
        rows.append((cell(j.id), cell(j.name), cell(j.record.state.label), "-" if s.step is None else str(s.step),
                     "-" if s.loss is None else f"{s.loss:.4g}",
                     *([tablecols.val_text(v, 4) or "-"] if cols.val else []), f"{j.elapsed_s:.0f}s",
                     *(cell(extra[k], NAME_WIDTH) for k in cols.kinds()),
                     cell(j.record.rendezvous_endpoint, NAME_WIDTH), cell(j.output_dir, PATH_WIDTH, keep="end"),
                     _reason(j),
                     cell(mark(j.record), 2 * PATH_WIDTH, empty="")))
    if any(j.record.sweep for j in listed):  # trials of sweeps: which sweep, which trial
        sweep = [cell(f"{(j.record.sweep or {}).get('name') or j.record.sweep['id']} #{j.record.sweep['trial']}")
                 if j.record.sweep else "-" for j in listed]
        rows = [(*r[:2], head, *r[2:]) for r, head in zip(rows, ["SWEEP", *sweep])]
    for line in table(rows):  # aligned in terminal columns: 实验 and emoji take two
        print(line)
    return 0


def _reason(job) -> str:
    """The REASON cell: why a job failed or who stopped it, else the engine's note on a job not
    ended (e.g. "SLURM not answering since 14:05"); then what an evaluation job evaluates
    (``validates epoch_2 (step 12) of job ID``)."""
    from tune_magic.ui.tablecols import evaluates_text

    r = job.record
    note = None if r.state.is_terminal else job.engine_note
    why = r.error if r.state in ("failed", "stopped") else note
    text = " · ".join(t for t in (why, evaluates_text(r)) if t)
    return cell(text, PATH_WIDTH) if text else ""


def _job_json(job, val=None) -> dict:
    """A job's ``tune-magic jobs --json`` object; ``val``: its
    :class:`~tune_magic.checkpoints.validation.ValSummary` (``val_loss``: the latest, ``best_val_loss``:
    the lowest, each with its step; non-finite values as strings), or ``None``."""
    r = job.record
    return {"id": r.id, "name": r.name, "status": r.status, "returncode": r.returncode, "error": r.error,
            "output_dir": r.output_dir, "log_path": r.log_path, "rendezvous_endpoint": r.rendezvous_endpoint,
            "pid": job.pid, "gpus": r.gpus, "physical_gpus": r.physical_gpus, "argv": r.argv, "env": r.env, "cwd": r.cwd,
            "started_at": r.started_at, "ended_at": r.ended_at, "workers": job.workers,
            "scheduler": job.scheduler, "engine_id": job.engine_id, "engine_id_label": job.engine_id_label,
            "num_nodes": job.num_nodes, "overrides": job.overrides,
            "nodes": job.nodes, "pending_reason": r.pending_reason, "scheduler_options": r.scheduler_options,
            "resumed_from": r.resumed_from, "resumed_by": r.resumed_by, "resume_point": r.resume_point,
            "attempts": r.attempts, "max_resumes": r.max_resumes, "sweep": r.sweep,
            "engine_note": job.engine_note, "validation": r.validation, "evaluates": r.evaluates,
            "val_loss": _finite(val.latest) if val else None, "val_step": val.latest_step if val else None,
            "best_val_loss": _finite(val.best) if val else None, "best_val_step": val.best_step if val else None,
            "val_pending": val.pending if val else 0}


def _sweep_jobs(spec: str, as_json: bool) -> int:
    """``tune-magic jobs --sweep S``: the sweep's trials, queued ones included, in trial order."""
    from tune_magic.sweeping.sweep import get_sweep
    from tune_magic.ui.snapshot import table_text
    from tune_magic.ui.watch import SweepWatcher

    sweep = get_sweep(spec)
    snap = SweepWatcher(sweep).poll_once()
    if as_json:
        print(json.dumps({"id": snap.sweep_id, "name": snap.name, "status": snap.status, "best": snap.best,
                          "ranked_by": snap.ranked_by, "ranking": snap.ranking, "ranking_note": snap.ranking_note,
                          "trials": [{"index": r.index, "name": r.name, "values": dict(r.texts), "status": r.status,
                                      "job_id": r.job_id, "step": r.step, "loss": _finite(r.loss),
                                      "best_loss": _finite(r.best_loss), "best_val_loss": _finite(r.best_val_loss),
                                      "val_pending": r.val_pending, "best_checkpoint": r.best_checkpoint,
                                      "elapsed_s": round(r.elapsed_s, 3),
                                      "note": r.note} for r in snap.rows]}, indent=2))
        return 0
    print(table_text(snap))
    return 0


def _finite(value: float | None):
    return value if value is None or value == value and abs(value) != float("inf") else str(value)


def sweeps_command(argv: Sequence[str]) -> int:
    """``tune-magic sweeps [--json]``: every sweep with its trials' statuses and its best trial so far
    (by validation loss or final loss, said in the cell; a ranking note on stderr)."""
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
    rows = [("ID", "NAME", "STATUS", "TRIALS", "AT ONCE", "BEST", "STATUSES")]
    data = []
    for s in listed:
        counts = s.counts()
        ranking = s.ranking()  # from each trial's summary file and evaluations: never a whole log
        best = _best_json(ranking)
        data.append({"id": s.id, "name": s.name, "status": s.status, "trials": len(s.record.trials),
                     "max_parallel": s.max_parallel, "counts": counts, "axes": s.keys,
                     "best": best, "ranked_by": ranking.measure, "ranking": ranking.label,
                     "ranking_note": ranking.note, "created_at": s.record.created_at, "note": s.note})
        rows.append((cell(s.id), cell(s.name), s.status, str(len(s.record.trials)), str(s.max_parallel),
                     _best_cell(ranking), ", ".join(f"{n} {k}" for k, n in counts.items())))
        if ranking.note and not ns.json:
            print(f"tune-magic sweeps: {s.id}: {ranking.note}", file=sys.stderr)
    if ns.json:
        print(json.dumps(data, indent=2, allow_nan=False, default=str))
        return 0
    for line in table(rows):
        print(line)
    return 0


def _best_json(ranking) -> dict | None:
    """The best trial of a :class:`~tune_magic.sweeping.results.Ranking` for ``--json``: its index,
    final, lowest and best validation loss, and ``ranked_by`` (``val_loss`` or ``final_loss``)."""
    top = ranking.best
    if top is None:
        return None
    return {"trial": top.trial.index, "final_loss": _finite(top.final_loss), "min_loss": _finite(top.min_loss),
            "best_val_loss": _finite(top.best_val_loss), "ranked_by": top.ranked_by}


def _best_cell(ranking) -> str:
    """The BEST cell: ``3.162 val_loss (trial 1)``, ``1.234 final loss (trial 1)``, or ``-``."""
    from tune_magic.sweeping.results import MEASURE_WORDS

    top = ranking.best
    return "-" if top is None else f"{top.value:.4g} {MEASURE_WORDS[ranking.measure]} (trial {top.trial.index})"


# -- logs --------------------------------------------------------------------------------------------


#: What ``tune-magic logs`` can print instead of the whole log: ``dest -> (flag, help, source)``. A
#: source is called as ``source(job, follow=bool)`` and yields the bytes to print in chunks of at most
#: :data:`CHUNK_BYTES`; at most one of these flags is given. The failing rank's traceback
#: (``--error``) plugs in here.
def _error_part(job, follow: bool = False) -> Iterator[bytes]:
    """Why a failed job failed: the one plain line, then the whole traceback (failure.json)."""
    if follow:
        raise CliError("--error and --follow do not go together: the reason exists once the job has failed")
    reason = job.failure()
    if reason is None:
        raise CliError(f"job {job.id} is {job.record.state.label}, not failed: there is no error to show "
                       f"(tune-magic logs {job.id} prints its log)")
    text = reason.line + "\n"
    if reason.traceback and reason.traceback.strip() != reason.line:
        text += "\n" + reason.traceback.rstrip("\n") + "\n"
    data = text.encode("utf-8", "replace")
    for i in range(0, len(data), CHUNK_BYTES):
        yield data[i : i + CHUNK_BYTES]


_LOG_PARTS: dict[str, tuple[str, str, Callable[..., Iterator[bytes]]]] = {
    "error": ("--error", "print why the job failed: its failure line, then the whole traceback", _error_part),
}


def logs_command(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="tune-magic logs", description="Print a job's log, or a sweep's table of "
                                     "trials (--follow: its trials as they start and end, then the table).")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    part = parser.add_mutually_exclusive_group() if _LOG_PARTS else None  # argparse refuses an empty group
    for dest, (flag, help_, _) in _LOG_PARTS.items():
        part.add_argument(flag, dest=dest, action="store_true", help=help_)
    ns, job = _job_arg(parser, argv, sweeps=True)
    if not isinstance(job, Job):  # a sweep: its table, or its trials as they go (the text of its card)
        if any(getattr(ns, dest) for dest in _LOG_PARTS):
            raise CliError(f"{job.id} is a sweep: tune-magic jobs --sweep {job.id} lists its trials' failures, and "
                           "tune-magic logs JOB --error shows one's traceback")
        return _sweep_log(job, ns.follow)
    source = next((src for dest, (_, _, src) in _LOG_PARTS.items() if getattr(ns, dest)), whole_log)
    if ns.follow:
        FOLLOWING["job"] = job.id
    write_chunks(source(job, follow=ns.follow))
    FOLLOWING.pop("job", None)
    if source is whole_log and not job.status.is_live:
        # how it ended, after its last lines (a stop's lines from torchrun and the engine read like a
        # crash); on stderr: stdout stays the log itself
        sys.stdout.flush()
        print(f"tune-magic logs: {end_line(job)}", file=sys.stderr)
    return 0


def _sweep_log(sweep, follow: bool) -> int:
    """``tune-magic logs SWEEP [--follow]``: the sweep's table, or a line per trial as it starts and
    ends and the table once the sweep ended (:func:`tune_magic.ui.watch.stream_text`)."""
    from tune_magic.ui.watch import SweepWatcher, stream_text

    if not follow:
        print(SweepWatcher(sweep).poll_once().summary())
        return 0
    FOLLOWING["job"] = sweep.id
    stream_text(sweep, lambda s: (sys.stdout.write(s), sys.stdout.flush()), interval_s=1.0)
    FOLLOWING.pop("job", None)
    return 0


# -- stop, rm ----------------------------------------------------------------------------------------


def stop_command(argv: Sequence[str]) -> int:
    from tune_magic.job import damaged_live_jobs, get_job
    from tune_magic.job.stopping import stop_jobs

    parser = argparse.ArgumentParser(prog="tune-magic stop", description="Stop a running job (or all, together), or a sweep.")
    parser.add_argument("job", nargs="?", help="job id or the name of one job, or a sweep's id or name: every trial (queued ones never start)")
    parser.add_argument("--all", action="store_true", help="stop every running job")
    parser.add_argument("--grace", type=_seconds, default=10.0, help="seconds between SIGTERM and SIGKILL (10)")
    ns = parser.parse_args(argv)
    if bool(ns.job) == ns.all:
        raise CliError("give a job id or --all, not both" if ns.all else "give a job id or --all")
    if is_sweep(ns.job):
        return _stop_sweep(ns.job, ns.grace)
    if ns.all:  # sweeps first: their queued trials never start
        from tune_magic.sweeping.sweep import stop_running_sweeps

        for sweep_id, counts in stop_running_sweeps(ns.grace):
            print(f"{sweep_id} {counts_text(counts)}")
    targets = ([j for j in _listed("stop") if j.record.state.is_live] + damaged_live_jobs()) if ns.all else [get_job(ns.job)]
    failed: list = []
    for job_id, status in stop_jobs(targets, grace_s=ns.grace, errors=failed).items():
        print(f"{job_id} {status}")
    for job, exc in failed:  # the others were stopped all the same
        if not isinstance(exc, UserError):
            raise exc
        print(f"tune-magic stop: error: {job.id}: {exc}", file=sys.stderr)
    return EXIT_USAGE if failed else 0


def _stop_sweep(spec: str, grace_s: float) -> int:
    """``tune-magic stop S``: stop every trial of the sweep; queued ones never start."""
    from tune_magic.sweeping.sweep import DamagedSweep, get_sweep, stop_damaged

    try:
        sweep = get_sweep(spec)
    except DamagedSweep as exc:
        counts = stop_damaged(exc.sweep_id, grace_s)
        print(f"{exc.sweep_id} " + (counts_text(counts) or "no trial started"))
        print(f"tune-magic stop: sweep {exc.sweep_id}'s record is damaged: its started trials were stopped, and "
              "its queued ones are unknown and never start", file=sys.stderr)
        return 0
    counts = sweep.stop(grace_s=grace_s)
    print(f"{sweep.id} {counts_text(counts)}")
    return 0


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def rm_command(argv: Sequence[str]) -> int:
    from tune_magic.job import remove

    parser = argparse.ArgumentParser(prog="tune-magic rm", description="Remove finished jobs' records and logs.")
    parser.add_argument("job", nargs="?", help="job id, or the name of one job")
    parser.add_argument("--finished", action="store_true", help="remove every finished job")
    ns = parser.parse_args(argv)
    if bool(ns.job) == ns.finished:
        raise CliError("give a job id or --finished")
    ids = [j.id for j in _listed("rm") if not j.record.state.is_live] if ns.finished else [ns.job]
    for job_id in ids:
        remove(job_id)
        print(f"removed {job_id}")
    return 0


# -- metrics -----------------------------------------------------------------------------------------


def metrics_command(argv: Sequence[str]) -> int:
    from tune_magic.logs.export import points_to_csv, points_to_json

    parser = argparse.ArgumentParser(
        prog="tune-magic metrics", description="Print a job's (a log file's, or every trial's of a sweep) metric "
        "points.", usage="tune-magic metrics (JOB | SWEEP | --file PATH) [--json | --csv]")
    parser.add_argument("job", nargs="?", help="job id, or a sweep's id or name (trial, job id and axis columns first)")
    parser.add_argument("--file", help="a torchtune log: DiskLogger log_*.txt, log_*.jsonl, or a job's output log")
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="strict JSON (non-finite values as strings)")
    fmt.add_argument("--csv", action="store_true", help="CSV with a header row")
    ns = parser.parse_args(argv)
    if ns.file == "":
        raise CliError("--file '' is an empty path, not a file; give a torchtune log, e.g. --file log_1.txt")
    if bool(ns.job) == bool(ns.file):
        raise CliError("give a job id or --file PATH")
    if is_sweep(ns.job):
        return _sweep_metrics(ns.job, "json" if ns.json else "csv" if ns.csv else "text")
    if ns.file:
        from tune_magic.logs.metricfollow import JobMetricsFollower

        if not os.path.isfile(ns.file):
            what = (" is a directory; give a log file in it (DiskLogger log_*.txt or log_*.jsonl)"
                    if os.path.isdir(ns.file) else
                    " is not a regular file (a FIFO, socket or device); give a log file" if os.path.exists(ns.file)
                    else ": no such file")
            raise CliError(f"--file {ns.file}{what}")
        with JobMetricsFollower(ns.file, max_lines=1) as follower:
            follower.finish()
            points = follower.points()
    else:
        from tune_magic.job import get_job

        job = get_job(ns.job)
        check_job_log(job.log_path)
        points = job.metric_points()
    if ns.json:
        print(points_to_json(points))
    elif ns.csv:
        sys.stdout.write(points_to_csv(points))
    else:
        for p in points:
            print(f"{p.step:>7} {escape(p.name):<28} {p.value:.6g}")
    return 0


def _sweep_metrics(spec: str, fmt: str) -> int:
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


# -- checkpoints, export ------------------------------------------------------------------------


def checkpoints_command(argv: Sequence[str]) -> int:
    """``tune-magic checkpoints JOB [--json]``: the job's checkpoints (``Job.checkpoints``), the best
    by validation loss marked ``*``."""
    from tune_magic.checkpoints.catalog import best_kept
    from tune_magic.checkpoints.layout import size_text

    parser = argparse.ArgumentParser(prog="tune-magic checkpoints", description="List a job's checkpoints "
                                     "(epoch_N/): step, kind, size on disk, validation loss, pruned or kept.")
    parser.add_argument("--json", action="store_true", help="print a JSON list of checkpoints")
    ns, job = _job_arg(parser, argv)
    listed = job.checkpoints()
    best = best_kept(listed)
    if ns.json:
        print(json.dumps([_checkpoint_json(c, best) for c in listed], indent=2))
        return 0
    if not listed:
        r = job.record
        why = (f"it evaluates a checkpoint of job {r.evaluates.get('job')} and saves none of its own" if r.evaluates
               else f"it ended ({r.state.label}) without saving one" if not r.state.is_live
               else "none saved yet (a recipe saves one at each epoch's end)")
        print(f"job {job.id} has no checkpoints: {why}")
        return 0
    rows = [("EPOCH", "STEP", "KIND", "SIZE", "VAL LOSS", "STATE", "PATH")]
    for c in listed:
        state = (f"pruned (freed {size_text(c.pruned.bytes_freed)})" if c.pruned is not None else
                 "incomplete" if not c.complete else "resume needs it" if c.needed_by_resume else "kept")
        rows.append((c.name + (" *" if best is not None and c.epoch == best.epoch else ""),
                     "-" if c.step is None else str(c.step), c.kind or "-",
                     "-" if c.pruned is not None else size_text(c.bytes_on_disk),
                     "-" if c.val_loss is None else f"{c.val_loss:.5g}", state, cell(str(c.path), PATH_WIDTH, keep="end")))
    for line in table(rows):
        print(line)
    if best is not None:
        print(f"* best: {best.name} (lowest validation loss, {best.val_loss:.5g})")
    return 0


def _checkpoint_json(c, best) -> dict:
    return {"epoch": c.epoch, "name": c.name, "path": str(c.path), "step": c.step, "kind": c.kind,
            "complete": c.complete, "problems": list(c.problems), "files": list(c.files),
            "bytes_on_disk": c.bytes_on_disk, "val_loss": _finite(c.val_loss), "best": best is not None and c is best,
            "needed_by_resume": c.needed_by_resume,
            "pruned": None if c.pruned is None else {"at": c.pruned.at, "bytes_freed": c.pruned.bytes_freed}}


def export_command(argv: Sequence[str]) -> int:
    """``tune-magic export JOB DEST [--checkpoint C]``: ``Job.export``; prints the export's folder."""
    parser = argparse.ArgumentParser(prog="tune-magic export", description="Copy one checkpoint of a job, with its "
                                     "tokenizer and configs, into a new folder (Hugging Face layout where the "
                                     "checkpointer wrote one, and a README saying how to load it).")
    from tune_magic.job import get_job

    parser.add_argument("job", help="job id, or the name of one job (tune-magic jobs lists them)")
    parser.add_argument("dest", help="the export's folder: new, or empty")
    parser.add_argument("--checkpoint", default="best", help="best (lowest validation loss; default), last, or "
                                                             "epoch_N")
    ns = parser.parse_args(argv)
    job = get_job(ns.job)
    if not ns.dest.strip():
        raise CliError("the destination is an empty path; give a folder, e.g. tune-magic export JOB ./exported")
    result = job.export(ns.dest, checkpoint=ns.checkpoint)
    print(result.dest)
    return 0


# -- generate ----------------------------------------------------------------------------------------


def generate_command(argv: Sequence[str]) -> int:
    """``tune-magic generate JOB --prompt TEXT [...]``: print only the generated text (one line
    end after it), from the recipe's one-shot mode where the job ran."""
    from tune_magic.job.generate import GenOptions, check_checkpoint_name, check_prompt, generate_once

    parser = argparse.ArgumentParser(
        prog="tune-magic generate", description="Generate text from one of a job's checkpoints, with the job's own "
        "config, tokenizer and prompt template; print only the text (logs go to <job dir>/generate/).")
    parser.add_argument("job", help="job id, or the name of one job (tune-magic jobs lists them)")
    parser.add_argument("--prompt", required=True, help="the prompt (the user message)")
    parser.add_argument("--checkpoint", default="last", help="last (default), best (lowest validation loss), "
                        "epoch_N, base (the untrained input model) or a path to an epoch_N folder")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="at most this many new tokens (64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy, exactly (default); > 0 samples")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the K most likely tokens only")
    parser.add_argument("--seed", type=int, default=0, help="seeds the sampling (0)")
    ns = parser.parse_args(argv)
    check_prompt(ns.prompt)  # every word is checked before the job is looked up, and before anything starts
    GenOptions.checked(ns.max_new_tokens, ns.temperature, ns.top_k, ns.seed)
    check_checkpoint_name(ns.checkpoint)
    if is_sweep(ns.job):
        raise CliError(f"{ns.job} is a sweep: generate from one of its trials (tune-magic jobs --sweep {ns.job} lists "
                       "their job ids), or compare every trial's answer in Python: tune_magic.compare(sweep, prompt) "
                       "(%tune_compare in a notebook)")
    from tune_magic.job import get_job

    text = generate_once(get_job(ns.job), ns.prompt, checkpoint=ns.checkpoint, max_new_tokens=ns.max_new_tokens,
                         temperature=ns.temperature, top_k=ns.top_k, seed=ns.seed)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return 0
