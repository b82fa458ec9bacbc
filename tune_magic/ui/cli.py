"""``tune-magic`` (also ``python -m tune_magic``): the command-line twin of the notebook magics.

Subcommands call the same public API as the magics. Bad input exits 2 with one paragraph on stderr.
Here: the front door (``main``, the command table, help) and the commands that start something
(``run``, ``cmd``, ``resume``: a job, or a sweep with ``--sweep``) or write the assets; the
commands on existing jobs and sweeps are :mod:`tune_magic.ui.clitargets`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any, Callable, Mapping, Sequence

from tune_magic.plan import options as launchopts
from tune_magic.errors import PlanError, UserError, launch_warnings_shown_here
from tune_magic.ui.clifiles import (  # noqa: F401  (CliError, CHUNK_BYTES and read_from are part of the CLI's API)
    CHUNK_BYTES, ENV_ERRNOS, FOLLOWING, CliError, check_job_log, os_error_paragraph, os_reason, read_from, whole_log,
    write_chunks,
)
from tune_magic.ui.clitargets import (EXIT_USAGE, checkpoints_command, end_line, export_command, generate_command,
                                      jobs_command, logs_command, metrics_command, rm_command, stop_command,
                                      sweeps_command)
from tune_magic.ui.textfmt import escape, print_warnings



def _cmd(argv: Sequence[str]) -> int:
    from tune_magic import schedulers
    from tune_magic.job.launch import launch, launch_options, scheduler_values

    usage = ("tune-magic cmd [--json] [--gpus G] [--job-id ID] [--val-split F] [--keep-checkpoints N|best] "
             "[--scheduler NAME] [SCHEDULER OPTIONS] [TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value ...]")
    own, rest = launchopts.split_own(argv, launch_options(launchopts.CMD), "tune-magic cmd")
    if own.get("help"):
        print("Print the exact command a tune run-style line launches (nothing is started).\n")
        print(launchopts.help_text(launchopts.CMD, usage, schedulers.options()))
        return 0
    if own.get("sweep"):
        return _cmd_sweep(own, rest)
    launchopts.check_sweep_options(own)
    plan = launch(rest, gpus=own.get("gpus"), dry_run=True, scheduler=own.get("scheduler"),
                  job_id=own.get("job_id"), val_split=own.get("val_split"), keep_checkpoints=own.get("keep_checkpoints"), **scheduler_values(own))
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


def _stream_log(job, out=None, poll_s: float = 0.2) -> None:
    """Copy the job's log to ``out`` (stdout) as it grows, until the job ends."""
    FOLLOWING["job"] = job.id  # left set if Ctrl-C ends it: main() says the job runs on
    write_chunks(whole_log(job, follow=True, poll_s=poll_s), out)
    FOLLOWING.pop("job", None)


def _run(argv: Sequence[str]) -> int:
    from tune_magic import schedulers
    from tune_magic.job.launch import launch, launch_options, scheduler_values

    usage = ("tune-magic run [--name N] [--gpus G] [--force] [--wait] [--max-resumes N] [--val-split F] "
             "[--keep-checkpoints N|best] [--scheduler NAME] [SCHEDULER OPTIONS] [TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value ...]")
    allowed = tuple(f for f in launchopts.RUN if f != "--dry-run")
    if "--dry-run" in argv:  # the magic's and resume's option; the CLI's dry run is a command of its own
        raise PlanError("tune-magic run has no --dry-run: tune-magic cmd with the same words prints what it would "
                        "run and starts nothing (or set TUNE_MAGIC_DRY_RUN=1)")
    own, rest = launchopts.split_own(argv, launch_options(allowed), "tune-magic run")
    if own.get("help"):
        print("Launch a tune run-style job in the background and print its id.\n")
        print(launchopts.help_text(allowed, usage, schedulers.options()))
        return 0
    if own.get("sweep"):
        return _run_sweep(own, rest)
    launchopts.check_sweep_options(own)
    result = launch(rest, name=own.get("name"), gpus=own.get("gpus"), force=bool(own.get("force")),
                    scheduler=own.get("scheduler"), max_resumes=own.get("max_resumes"), val_split=own.get("val_split"), keep_checkpoints=own.get("keep_checkpoints"),
                    **scheduler_values(own))
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
    _follow_evaluations(job)
    print(end_line(job), flush=True)
    code = job.returncode
    if job.status == "succeeded":
        return 0
    return 1 if code is None or code == 0 else (code if 0 < code < 256 else 128 + abs(code))


def _follow_evaluations(job, poll_s: float = 0.5) -> None:
    """``--wait`` of a job whose checkpoints are evaluated by jobs of their own: once it ended, a line
    per evaluation as it ends (``step 8 | val_loss 3.16``, or why it has none), until none is to come
    (its evaluator started again should it have died)."""
    from tune_magic.job.evaluate import EvaluationFollower, is_evaluated
    from tune_magic.ui.snapshot import evaluation_note

    if not is_evaluated(job.record):
        return
    follower, told = EvaluationFollower(job, revive=True), set()
    FOLLOWING["job"] = job.id
    while True:
        follower.poll()
        for e in follower.evaluations:
            line = f"step {e.step} | val_loss {e.val_loss:.6g}" if e.val_loss is not None else evaluation_note(e)
            if line and e.epoch not in told:
                told.add(e.epoch)
                print(line, flush=True)
        if not follower.open:
            break
        time.sleep(poll_s)
    FOLLOWING.pop("job", None)


def _sweep_kwargs(own: Mapping[str, Any]) -> dict[str, Any]:
    from tune_magic.job.launch import scheduler_values

    return {**launchopts.sweep_kwargs(own), **scheduler_values(own)}


def _run_sweep(own: Mapping[str, Any], rest: Sequence[str]) -> int:
    """``tune-magic run --sweep ...``: start the sweep, print its id (``--wait``: follow it to its
    end; exit 0 when every trial succeeded, else 1)."""
    from tune_magic.sweeping.create import sweep

    result = sweep(list(rest), **_sweep_kwargs(own))
    if not hasattr(result, "wait"):  # TUNE_MAGIC_DRY_RUN=1
        print(result.text())
        return 0
    print_warnings("run", result.record.warnings)
    print(result.id, flush=True)
    if not own.get("wait"):
        return 0
    from tune_magic.ui.watch import stream_text

    FOLLOWING["job"] = result.id
    snap = stream_text(result, lambda s: (sys.stdout.write(s), sys.stdout.flush()), interval_s=1.0)
    FOLLOWING.pop("job", None)
    return 0 if all(r.status == "succeeded" for r in snap.rows) else 1


def _cmd_sweep(own: Mapping[str, Any], rest: Sequence[str]) -> int:
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
    "jobs": (jobs_command, "list jobs (--sweep S: a sweep's trials)"),
    "sweeps": (sweeps_command, "list sweeps"),
    "logs": (logs_command, "print (or follow) a job's log, or a sweep's trials"),
    "stop": (stop_command, "stop a job or a sweep, or --all"),
    "rm": (rm_command, "remove finished jobs"),
    "metrics": (metrics_command, "print a job's or a sweep's metric points (--json, --csv)"),
    "checkpoints": (checkpoints_command, "list a job's checkpoints: step, kind, size, validation loss, pruned"),
    "export": (export_command, "copy one checkpoint with its tokenizer and configs into a new folder"),
    "generate": (generate_command, "generate text from a job's checkpoint (--prompt TEXT)"),
    "demo": (_demo, "run the demo"),
    "help": (_help, "show help for a command: tune-magic help COMMAND"),
}


def _usage() -> str:
    lines = ["usage: tune-magic COMMAND [ARGS...]   (tune-magic help COMMAND, or COMMAND --help)", "",
             "commands:"]
    width = max(map(len, _COMMANDS)) + 1
    lines += [f"  {name:<{width}} {help_}" for name, (_, help_) in _COMMANDS.items()]
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
        following = FOLLOWING.get("job")
        if following is not None:
            from tune_magic.sweeping.store import is_sweep_id

            goes = f"sweep {following} goes on" if is_sweep_id(following) else f"job {following} keeps running"
            print(f"\ntune-magic: stopped following; {goes} (tune-magic stop {following} stops it)", file=sys.stderr)
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
