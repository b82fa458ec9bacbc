"""IPython magics: ``%%tune_run``, ``%tune_run``, ``%tune_jobs``, ``%tune_logs``, ``%tune_stop``.

Thin by design: parse with ``magic_arguments``, call the public API (:func:`tune_magic.launch`,
:func:`tune_magic.jobs`, ...), display the result. User mistakes become ``UsageError``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from IPython.core.display_functions import display
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments

from .cellbody import expand_fields, parse_cell_body
from .command import PlanError
from .errors import StateDirError

_OWN_VALUE = {"--name", "--gpus"}
_OWN_SWITCH = {"--force", "--wait", "--dry-run", "-h", "--help"}


def _split_own(tokens: list[str]) -> tuple[list[str], list[str]]:
    """Split the magic's own leading options from the ``tune run`` arguments after them."""
    i = 0
    while i < len(tokens):
        name = tokens[i].split("=", 1)[0]
        if tokens[i] == "--":
            return tokens[:i], tokens[i + 1 :]
        if name in _OWN_VALUE:
            i += 1 if "=" in tokens[i] else 2
        elif tokens[i] in _OWN_SWITCH:
            i += 1
        else:
            break
    return tokens[:i], tokens[i:]


def _split_line(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"cannot split the line ({exc}); close every quote") from None


@magics_class
class TuneMagics(Magics):
    """tune_magic's magics (registered by ``%load_ext tune_magic``)."""

    @no_var_expand
    @magic_arguments()
    @argument("--name", help="free-text job name (default: the recipe name)")
    @argument("--gpus", help="GPU ids for this job, e.g. 0,1 (sets CUDA_VISIBLE_DEVICES for the job only), or auto")
    @argument("--force", action="store_true", help="allow sharing a GPU or output_dir with a running job")
    @argument("--wait", action="store_true", help="block and stream plain text until the job ends (nbconvert/papermill)")
    @argument("--dry-run", action="store_true", help="show the command and return the LaunchPlan; start nothing")
    @argument("args", nargs=argparse.REMAINDER,
              help="[torchrun options] RECIPE [--config CONFIG] [key=value ...], the same words as `tune run`")
    @line_cell_magic("tune_run")
    def tune_run(self, line: str, cell: str | None = None):
        """Launch a torchtune recipe in the background and show a live card; return the Job.

        The cell body is either a YAML config (merged over --config when both are given, saved in
        the job's directory) or key=value override lines; # comments are allowed. {name} in the line
        and in override lines expands from the notebook namespace; ${...} is left for OmegaConf. Without an endpoint of
        your own, torchrun gets --standalone (an OS-chosen port), so jobs side by side never collide.
        """
        from .jobctl import launch

        tokens = _split_line(line)
        try:
            tokens = [expand_fields(t, self.shell.user_ns) for t in tokens]
            own, rest = _split_own(tokens)
            misplaced = [t for t in rest if t.split("=", 1)[0] in _OWN_VALUE | _OWN_SWITCH]
            if misplaced:
                raise PlanError(f"{misplaced[0]} is an option of %%tune_run itself: put it first, before the "
                                "torchrun options and the recipe")
            ns = self.tune_run.parser.parse_args(own)
            body = parse_cell_body(cell)
            overrides = [expand_fields(t, self.shell.user_ns) for t in body.overrides]
            result = launch(rest + overrides, name=ns.name, gpus=ns.gpus, force=ns.force, cwd=os.getcwd(),
                            dry_run=True if ns.dry_run else None, config_overlay=body.config_yaml)
        except (PlanError, LookupError, StateDirError) as exc:
            raise UsageError(str(exc)) from None
        if not hasattr(result, "id"):  # a LaunchPlan: dry run
            print(result.command_line())
            return result
        if ns.wait:
            from .watch import stream_text

            try:
                stream_text(result, lambda s: (sys.stdout.write(s), sys.stdout.flush()))
            except KeyboardInterrupt:
                print(f"\nstopped following; job {result.id} keeps running (%tune_stop {result.id} stops it)")
            return result
        from .views import JobCard

        display(JobCard(result))
        return result

    @line_magic("tune_jobs")
    def tune_jobs(self, line: str = ""):
        """Show all jobs (also those started by earlier kernels) with status, step, last loss, elapsed
        time and a Stop button per running job."""
        from .views import JobsTable

        table = JobsTable()
        display(table)
        return None

    @line_magic("tune_panel")
    def tune_panel(self, line: str = ""):
        """Show the launch panel (recipe/config pickers, command preview, Launch, jobs, loss comparison)."""
        from .panel import Panel

        return Panel()

    @magic_arguments()
    @argument("job", help="job id (%%tune_jobs lists them)")
    @line_magic("tune_logs")
    def tune_logs(self, line: str):
        """Show a job's live card again (e.g. after a kernel restart)."""
        from .jobctl import get_job
        from .views import JobCard

        ns = self.tune_logs.parser.parse_args(_split_line(line))
        try:
            job = get_job(ns.job)
        except (PlanError, LookupError) as exc:
            raise UsageError(str(exc)) from None
        display(JobCard(job))
        return job

    @magic_arguments()
    @argument("job", nargs="?", help="job id")
    @argument("--all", action="store_true", help="stop every running job")
    @argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL (10)")
    @line_magic("tune_stop")
    def tune_stop(self, line: str):
        """Stop a job (SIGTERM to torchrun, then SIGKILL to what is left), or every running job."""
        from .jobctl import damaged_live_jobs, get_job, jobs

        ns = self.tune_stop.parser.parse_args(_split_line(line))
        if bool(ns.job) == ns.all:
            raise UsageError("give a job id or --all, not both" if ns.all else "give a job id or --all")
        if not 0 <= ns.grace < float("inf"):
            raise UsageError(f"--grace {ns.grace}: give the seconds between SIGTERM and SIGKILL, a number >= 0")
        try:
            targets = ([j for j in jobs() if j.status.is_live] + damaged_live_jobs()) if ns.all else [get_job(ns.job)]
        except (PlanError, LookupError) as exc:
            raise UsageError(str(exc)) from None
        for job in targets:
            print(f"{job.id} {job.stop(grace_s=ns.grace)}")


def register(ipython) -> None:
    """Register :class:`TuneMagics` with ``ipython``."""
    ipython.register_magics(TuneMagics)
