"""``tune-magic`` (also ``python -m tune_magic``): the command-line twin of the notebook magics.

Subcommands call the same public API as the magics. Bad input exits 2 with one paragraph on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Callable, Iterator, Sequence

from tune_magic.plan import options as launchopts
from tune_magic.errors import UserError, launch_warnings_shown_here
from tune_magic.ui.clifiles import (  # noqa: F401  (CliError and CHUNK_BYTES are part of the CLI's API)
    CHUNK_BYTES, ENV_ERRNOS, CliError, check_job_log, os_error_paragraph, os_reason, read_from, whole_log, write_chunks,
)
from tune_magic.ui.textfmt import NAME_WIDTH, PATH_WIDTH, cell, escape, print_warnings, table

EXIT_USAGE = 2


def _cmd(argv: Sequence[str]) -> int:
    from tune_magic import schedulers
    from tune_magic.job.launch import launch, launch_options, scheduler_values

    usage = ("tune-magic cmd [--json] [--gpus G] [--job-id ID] [--scheduler NAME] [SCHEDULER OPTIONS] "
             "[TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value ...]")
    own, rest = launchopts.split_own(argv, launch_options(launchopts.CMD), "tune-magic cmd")
    if own.get("help"):
        print("Print the exact command a tune run-style line launches (nothing is started).\n")
        print(launchopts.help_text(launchopts.CMD, usage, schedulers.options()))
        return 0
    if own.get("sweep"):
        from tune_magic.ui.sweepcli import cmd_sweep

        return cmd_sweep(own, rest)
    launchopts.check_sweep_options(own)
    plan = launch(rest, gpus=own.get("gpus"), dry_run=True, scheduler=own.get("scheduler"),
                  job_id=own.get("job_id"), **scheduler_values(own))
    if own.get("job_id") is None:
        print(f"tune-magic cmd: built for the new id {plan.job_id}; tune-magic run picks its own id",
              file=sys.stderr)
    if own.get("json"):
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(plan.command_line())
        if getattr(plan, "batch_script", None):
            print("\n" + plan.batch_script, end="")
    for warning in plan.warnings:  # what a launch would warn about (the card shows them)
        print(f"tune-magic cmd: warning: {escape(warning)}", file=sys.stderr)
    return 0


def _ls(argv: Sequence[str]) -> int:
    from tune_magic.config import catalog

    parser = argparse.ArgumentParser(prog="tune-magic ls", description="List recipes and configs, like tune ls.")
    parser.add_argument("--json", action="store_true", help="print a JSON list of recipes with their configs")
    ns = parser.parse_args(argv)
    recipes = catalog.recipes()
    rows: list[tuple[str, str]] = []
    data = []
    for r in recipes:
        extra = catalog.shipped_configs_for(r.name) if r.source == catalog.TORCHTUNE else ()
        names = list(r.configs) + list(extra)
        data.append({"name": r.name, "source": r.source, "path": str(r.path),
                     "supports_distributed": r.supports_distributed, "configs": names})
        label = r.name if r.source == catalog.TORCHTUNE else f"{r.name} (tune_magic)"
        shown = [c if c not in extra else f"{c} (tune_magic)" for c in names] or [""]
        rows += [(label if i == 0 else "", c) for i, c in enumerate(shown)]
    if ns.json:
        print(json.dumps(data, indent=2))
        return 0
    width = max(len(a) for a, _ in rows) + 3
    print(f"{'RECIPE':<{width}}CONFIG")
    for a, b in rows:
        print(f"{a:<{width}}{b}".rstrip())
    return 0


def _assets(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tune-magic assets",
        description="Write the tiny offline model, tokenizer and dataset (default: $TUNE_MAGIC_HOME/assets).",
    )
    parser.add_argument("dir", nargs="?", help="target directory")
    parser.add_argument("--seed", type=_seed, default=0, help="random seed, a whole number >= 0 (default 0)")
    parser.add_argument("--force", action="store_true", help="rewrite even if the assets exist")
    ns = parser.parse_args(argv)
    from tune_magic.assets import make_assets
    from tune_magic.paths import assets_dir

    if ns.dir is not None and not ns.dir.strip():
        raise CliError(f"the directory {ns.dir!r} is an empty path, not a directory; give one (tune-magic assets DIR) "
                       "or leave it out for $TUNE_MAGIC_HOME/assets")
    try:
        paths = make_assets(ns.dir, seed=ns.seed, force=ns.force)
    except ValueError as exc:  # a seed or directory that slipped past the checks above
        raise CliError(str(exc)) from None
    except FileExistsError as exc:  # a non-empty directory that is not ours: never replaced
        raise CliError(f"{exc}; give an empty or new directory: tune-magic assets DIR") from None
    except OSError as exc:
        target = ns.dir or assets_dir()
        raise CliError(f"cannot write the assets to {target}: {os_reason(exc)}; give a writable directory "
                       "(tune-magic assets DIR) or point TUNE_MAGIC_HOME at one") from None
    print(paths.root)
    return 0


def _seed(text: str) -> int:
    """argparse type of ``--seed``: a whole number >= 0 (what :func:`tune_magic.assets.make_assets` takes)."""
    if not re.fullmatch(r"[0-9]+", text.strip(), re.ASCII):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0, e.g. --seed 0")
    return int(text)


#: The job a command is following right now (what Ctrl-C leaves running).
_FOLLOWING: dict[str, str] = {}


def _stream_log(job, out=None, poll_s: float = 0.2) -> None:
    """Copy the job's log to ``out`` (stdout) as it grows, until the job ends."""
    _FOLLOWING["job"] = job.id  # left set if Ctrl-C ends it: main() says the job runs on
    write_chunks(whole_log(job, follow=True, poll_s=poll_s), out)
    _FOLLOWING.pop("job", None)


def _run(argv: Sequence[str]) -> int:
    from tune_magic import schedulers
    from tune_magic.job.launch import launch, launch_options, scheduler_values

    usage = ("tune-magic run [--name N] [--gpus G] [--force] [--wait] [--max-resumes N] [--scheduler NAME] "
             "[SCHEDULER OPTIONS] [TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value ...]")
    allowed = tuple(f for f in launchopts.RUN if f != "--dry-run")
    own, rest = launchopts.split_own(argv, launch_options(allowed), "tune-magic run")
    if own.get("help"):
        print("Launch a tune run-style job in the background and print its id.\n")
        print(launchopts.help_text(allowed, usage, schedulers.options()))
        return 0
    if own.get("sweep"):
        from tune_magic.ui.sweepcli import run_sweep

        return run_sweep(own, rest)
    launchopts.check_sweep_options(own)
    result = launch(rest, name=own.get("name"), gpus=own.get("gpus"), force=bool(own.get("force")),
                    scheduler=own.get("scheduler"), max_resumes=own.get("max_resumes"), **scheduler_values(own))
    if not hasattr(result, "id"):  # TUNE_MAGIC_DRY_RUN=1: a plan, nothing started
        print(result.command_line())
        print_warnings("run", result.warnings)
        return 0
    print_warnings("run", result.record.warnings)
    print(result.id, flush=True)
    return _follow_to_end(result) if own.get("wait") else 0


def _follow_to_end(job) -> int:
    """``--wait``: stream the job's log until it ends, print how it ended; return the exit status
    (0 when it succeeded, else its exit code, or 1)."""
    _stream_log(job)
    print(end_line(job), flush=True)
    code = job.returncode
    if job.status == "succeeded":
        return 0
    return 1 if code is None or code == 0 else (code if 0 < code < 256 else 128 + abs(code))


def _resume(argv: Sequence[str]) -> int:
    from tune_magic import schedulers
    from tune_magic.job.launch import launch_options, scheduler_values
    from tune_magic.job.resume import resume

    usage = ("tune-magic resume JOB [--dry-run] [--fresh] [--name N] [--gpus G] [--wait] [--max-resumes N] "
             "[--scheduler NAME] [SCHEDULER OPTIONS] [key=value ...]")
    job_id, own, extra = launchopts.split_job_words(argv, launch_options(launchopts.RESUME), "tune-magic resume")
    if own.get("help"):
        print("Resume a stopped, failed or unknown job from its last checkpoint, as a new job in the same "
              "output_dir.\nThe pre-flight prints what it found, what is lost and the overrides it adds; "
              "--dry-run starts nothing.\n")
        print(launchopts.help_text(launchopts.RESUME, usage, schedulers.options()))
        return 0
    if job_id is None:
        raise CliError("give the job to resume: tune-magic resume JOB (tune-magic jobs lists them)")
    result = resume(job_id, extra, fresh=bool(own.get("fresh")), dry_run=True if own.get("dry_run") else None,
                    name=own.get("name"), gpus=own.get("gpus"), scheduler=own.get("scheduler"),
                    max_resumes=own.get("max_resumes"), on_plan=lambda plan: print(plan.summary(), flush=True),
                    **scheduler_values(own))
    if not hasattr(result, "id"):  # a dry run: the plan, nothing started
        print(result.summary())
        return 0
    print_warnings("resume", result.record.warnings)
    print(result.id, flush=True)
    return _follow_to_end(result) if own.get("wait") else 0


def end_line(job) -> str:
    """One line saying how a job ended: status, last step and loss, the reason on failure."""
    s = job.summary()
    parts = [f"job {job.id} {job.status.label}"]
    if s.step is not None:
        parts.append(f"step {s.step}" + (f" loss {s.loss:.6g}" if s.loss is not None else ""))
    if job.status in ("failed", "stopped") and job.error:
        parts.append(escape(job.error))
    elif job.status == "stopped":  # a user's stop, whatever the engine said of the job's end
        parts.append(escape(job.record.error) if job.record.error else "stopped by the user")
    elif job.status == "succeeded" and job.record.error:  # "the stop arrived after training ended"
        parts.append(escape(job.record.error))
    elif job.record.returncode is not None and job.status != "succeeded":
        parts.append(f"exit code {job.record.returncode}")
    return " · ".join(parts)


def _job_arg(parser: argparse.ArgumentParser, argv: Sequence[str]):
    from tune_magic.job import get_job

    parser.add_argument("job", help="job id, or the name of one job (tune-magic jobs lists them)")
    ns = parser.parse_args(argv)
    return ns, get_job(ns.job)


def _listed(command: str) -> list:
    """Every job; each damaged record is reported as one line on stderr and skipped."""
    from tune_magic.job import jobs

    skipped: list = []
    listed = jobs(skipped=skipped)
    for s in skipped:
        print(f"tune-magic {command}: skipped {escape(str(s.path))}: {escape(str(s.reason))}", file=sys.stderr)
    return listed


def _jobs(argv: Sequence[str]) -> int:
    from tune_magic.ui import tablecols
    from tune_magic.ui.listing import JobFilter, add_arguments

    parser = argparse.ArgumentParser(prog="tune-magic jobs", description="List jobs, running and finished.")
    parser.add_argument("--json", action="store_true", help="print a JSON list of job records")
    add_arguments(parser)
    parser.add_argument("--sweep", metavar="S", help="the trials of sweep S (id or name), queued ones too")
    ns = parser.parse_args(argv)
    if ns.sweep is not None:
        from tune_magic.ui.sweepcli import sweep_jobs

        return sweep_jobs(ns.sweep, ns.json)
    from tune_magic.sweeping.sweep import revive_sweeps

    revive_sweeps()  # a sweep whose process died with trials queued goes on (never two processes)
    listed = JobFilter.from_args(ns).select(_listed("jobs"))
    if ns.json:
        print(json.dumps([_job_json(j) for j in listed], indent=2))
        return 0
    # every value can hold anything a user typed or a hand-edited record holds: escape and cut (--json keeps it)
    from tune_magic.checkpoints.lineage import mark

    cols = tablecols.columns_for(listed)
    rows = [("ID", "NAME", "STATUS", "STEP", "LOSS", "ELAPSED", *map(cols.title, cols.kinds()), "ENDPOINT",
             "OUTPUT_DIR", "REASON", "RESUME")]
    now = time.time()
    for j in listed:
        s = j.summary()  # the small summary file, never the log
        extra = tablecols.values(j, now)
        rows.append((cell(j.id), cell(j.name), cell(j.record.state.label), "-" if s.step is None else str(s.step),
                     "-" if s.loss is None else f"{s.loss:.4g}", f"{j.elapsed_s:.0f}s",
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
    ended (e.g. "SLURM not answering since 14:05")."""
    r = job.record
    if r.state in ("failed", "stopped"):
        return cell(r.error, PATH_WIDTH) if r.error else ""
    note = job.engine_note if not r.state.is_terminal else None
    return cell(note, PATH_WIDTH) if note else ""


def _job_json(job) -> dict:
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
            "engine_note": job.engine_note}


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


def _logs(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="tune-magic logs", description="Print a job's log.")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    part = parser.add_mutually_exclusive_group() if _LOG_PARTS else None  # argparse refuses an empty group
    for dest, (flag, help_, _) in _LOG_PARTS.items():
        part.add_argument(flag, dest=dest, action="store_true", help=help_)
    ns, job = _job_arg(parser, argv)
    source = next((src for dest, (_, _, src) in _LOG_PARTS.items() if getattr(ns, dest)), whole_log)
    if ns.follow:
        _FOLLOWING["job"] = job.id
    write_chunks(source(job, follow=ns.follow))
    _FOLLOWING.pop("job", None)
    if source is whole_log and not job.status.is_live:
        # how it ended, after its last lines (a stop's lines from torchrun and the engine read like a
        # crash); on stderr: stdout stays the log itself
        sys.stdout.flush()
        print(f"tune-magic logs: {end_line(job)}", file=sys.stderr)
    return 0


def _stop(argv: Sequence[str]) -> int:
    from tune_magic.job import damaged_live_jobs, get_job
    from tune_magic.job.stopping import stop_jobs

    parser = argparse.ArgumentParser(prog="tune-magic stop", description="Stop a running job (or all, together), or a sweep.")
    parser.add_argument("job", nargs="?", help="job id or the name of one job, or a sweep's id or name: every trial (queued ones never start)")
    parser.add_argument("--all", action="store_true", help="stop every running job")
    parser.add_argument("--grace", type=_seconds, default=10.0, help="seconds between SIGTERM and SIGKILL (10)")
    ns = parser.parse_args(argv)
    if bool(ns.job) == ns.all:
        raise CliError("give a job id or --all, not both" if ns.all else "give a job id or --all")
    from tune_magic.ui import sweepcli

    if sweepcli.is_sweep(ns.job):
        return sweepcli.stop_sweep(ns.job, ns.grace)
    if ns.all:
        sweepcli.stop_all_sweeps(ns.grace)
    targets = ([j for j in _listed("stop") if j.record.state.is_live] + damaged_live_jobs()) if ns.all else [get_job(ns.job)]
    failed: list = []
    for job_id, status in stop_jobs(targets, grace_s=ns.grace, errors=failed).items():
        print(f"{job_id} {status}")
    for job, exc in failed:  # the others were stopped all the same
        if not isinstance(exc, UserError):
            raise exc
        print(f"tune-magic stop: error: {job.id}: {exc}", file=sys.stderr)
    return EXIT_USAGE if failed else 0


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def _rm(argv: Sequence[str]) -> int:
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


def _metrics(argv: Sequence[str]) -> int:
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
    from tune_magic.ui import sweepcli

    if sweepcli.is_sweep(ns.job):
        return sweepcli.sweep_metrics(ns.job, "json" if ns.json else "csv" if ns.csv else "text")
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


def _sweeps(argv: Sequence[str]) -> int:
    from tune_magic.ui.sweepcli import sweeps_command

    return sweeps_command(argv)


def _demo(argv: Sequence[str]) -> int:
    from tune_magic.ui.demo import main as demo_main

    return demo_main(argv)


def _help(argv: Sequence[str]) -> int:
    if not argv:
        print(_usage())
        return 0
    if argv[0] == "help":
        print("usage: tune-magic help [COMMAND]\n\nShow the help of COMMAND (the same as tune-magic COMMAND --help); "
              f"without one, the list of commands.\n\ncommands: {', '.join(_COMMANDS)}")
        return 0
    if argv[0] not in _COMMANDS:
        raise CliError(f"no command {argv[0]!r}; the commands: {', '.join(_COMMANDS)}")
    return _COMMANDS[argv[0]][0](["--help"])


_COMMANDS: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "cmd": (_cmd, "print the command a tune run-style line launches"),
    "ls": (_ls, "list recipes and configs (torchtune's and tune_magic's)"),
    "assets": (_assets, "write the tiny offline assets"),
    "run": (_run, "launch a job in the background"),
    "resume": (_resume, "resume a stopped or failed job from its last checkpoint"),
    "jobs": (_jobs, "list jobs (--sweep S: a sweep's trials)"),
    "sweeps": (_sweeps, "list sweeps"),
    "logs": (_logs, "print (or follow) a job's log"),
    "stop": (_stop, "stop a job, or --all"),
    "rm": (_rm, "remove finished jobs"),
    "metrics": (_metrics, "print a job's metric points (--json, --csv)"),
    "demo": (_demo, "run the demo"),
    "help": (_help, "show help for a command: tune-magic help COMMAND"),
}


def _usage() -> str:
    lines = ["usage: tune-magic COMMAND [ARGS...]   (tune-magic help COMMAND, or COMMAND --help)", "",
             "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in _COMMANDS.items()]
    lines += ["", "Jobs, their logs and the tiny assets live under $TUNE_MAGIC_HOME (default ~/.cache/tune_magic);",
              "every process that sets the same TUNE_MAGIC_HOME sees the same jobs."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tune-magic``. Returns the exit status (0 ok, 2 bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if not argv:
        print(f"{_usage()}\ntune-magic: error: give a command", file=sys.stderr)
        return EXIT_USAGE
    name, rest = argv[0], argv[1:]
    if name not in _COMMANDS:
        print(f"{_usage()}\ntune-magic: error: unknown command {name!r}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with launch_warnings_shown_here():  # run and resume print them once, as plain lines
            return _COMMANDS[name][0](rest)
    except UserError as exc:  # a user's mistake: one paragraph; anything else is a bug: its traceback
        print(f"tune-magic {name}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # argparse's own usage errors already printed
        return int(exc.code or 0)
    except KeyboardInterrupt:  # Ctrl-C while following (run --wait, logs --follow): the job runs on
        following = _FOLLOWING.get("job")
        if following is not None:
            print(f"\ntune-magic: stopped following; job {following} keeps running "
                  f"(tune-magic stop {following} stops it)", file=sys.stderr)
        else:
            print("\ntune-magic: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a full disk, a read-only home, no permission: the machine's state, not a bug
        if exc.errno not in ENV_ERRNOS:
            raise
        print(f"tune-magic {name}: error: {os_error_paragraph(exc)}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
