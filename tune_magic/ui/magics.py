"""IPython magics: ``%%tune_run``, ``%tune_run``, ``%tune_resume``, ``%tune_jobs``, ``%tune_logs``, ``%tune_stop``,
``%tune_panel``, ``%tune_generate`` (``%%tune_generate``), ``%tune_compare``.

Thin by design: parse (own options with :mod:`tune_magic.plan.options`, the rest with
``magic_arguments``), call the public API (:func:`tune_magic.launch`, :func:`tune_magic.jobs`, ...),
display the result. User mistakes (:class:`tune_magic.UserError`) become ``UsageError``; anything
else is a bug and keeps its traceback. ``-h``/``--help`` on every magic shows its help.
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

from tune_magic.plan import options as launchopts
from tune_magic.config.cellbody import expand_fields, parse_cell_body
from tune_magic.config.shellwords import split_words, tail_words
from tune_magic.errors import UserError, launch_warnings_shown_here


def _split_line(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"cannot split the line ({exc}); close every quote") from None


def _parse(magic, line: str):
    """Parse ``line`` with ``magic``'s magic_arguments parser (errors are UsageError)."""
    return magic.parser.parse_args(_split_line(line))


def _wants_help(line: str) -> bool:
    try:
        tokens = shlex.split(line)
    except ValueError:
        return False
    return any(t in ("-h", "--help") for t in tokens)


def empty_cell_to_line(lines: list[str]) -> list[str]:
    """IPython input transformer: a ``%%tune_run ARGS`` cell with nothing under it becomes the
    line magic ``%tune_run ARGS`` (IPython refuses an empty cell body before the magic runs)."""
    if not lines:
        return lines
    first = lines[0].lstrip()
    if first.startswith("%%tune_run") and (len(first) == len("%%tune_run") or first[len("%%tune_run")].isspace()) \
            and all(not line.strip() for line in lines[1:]):
        return [first[1:] if first.endswith("\n") else first[1:] + "\n"]
    return lines


def _launch_arguments(func):
    """``magic_arguments`` for ``%%tune_run``: the generic own options, then every scheduler's
    (declared once in its package), then the ``tune run`` words. Only for help: the words are split
    by :func:`tune_magic.plan.options.split_own`, so nothing reaches torchrun by accident."""
    from tune_magic import schedulers

    rows = [(None, launchopts.generic(f)) for f in launchopts.RUN if f != "--help"]
    rows += [(name, o) for name, opts in schedulers.options() for o in opts]
    decorators = []
    for scheduler, opt in rows:
        shown = f"{scheduler}: {opt.help}" if scheduler else opt.help
        kwargs = {"action": "store_true"} if opt.kind == "switch" else (
            {"action": "append", "metavar": "VALUE"} if opt.kind == "words" else {})
        decorators.append(argument(opt.flag, help=shown.replace("%", "%%"), **kwargs))
    decorators.append(argument("args", nargs=argparse.REMAINDER,
                               help="[torchrun options] RECIPE [--config CONFIG] [key=value ...], the same words as "
                                    "`tune run`"))
    for decorate in reversed(decorators):
        func = decorate(func)
    return magic_arguments()(func)


def _filter_arguments(func):
    """``magic_arguments`` of ``%tune_jobs``: the listing filter's options
    (:data:`tune_magic.ui.listing.ARGUMENTS`, the same as ``tune-magic jobs``)."""
    from tune_magic.ui.listing import ARGUMENTS

    for flags, kwargs in reversed(ARGUMENTS):
        func = argument(*flags, **kwargs)(func)
    return func


def _generation_arguments(func):
    """``magic_arguments`` of ``%tune_generate`` and ``%tune_compare``: the target, the generation
    options (as ``tune-magic generate``'s), the prompt (the rest of the line; only for help: the line
    is split by :func:`tune_magic.ui.generation.split_prompt_line`)."""
    checkpoint = "best" if func.__name__ == "tune_compare" else "last"
    rows = [
        (("--checkpoint",), {"default": checkpoint, "help": f"last, best (lowest validation loss), epoch_N, base (the "
                                                          f"untrained model) or a path to an epoch_N folder "
                                                          f"({checkpoint})"}),
        (("--max-new-tokens",), {"type": int, "default": 64, "help": "at most this many new tokens (64)"}),
        (("--temperature",), {"type": float, "default": 0.0, "help": "0 is greedy, exactly (0); > 0 samples"}),
        (("--top-k",), {"type": int, "default": None, "help": "sample among the k most likely tokens"}),
        (("--seed",), {"type": int, "default": 0, "help": "seeds the sampling (0)"}),
        (("prompt",), {"nargs": argparse.REMAINDER, "help": "the prompt: the rest of the line as typed, or the cell "
                                                            "body"}),
    ]
    what = "a sweep's id or name, a job's id or name" if checkpoint == "best" else "job id or the name of one job"
    for flags, kwargs in reversed(rows):
        func = argument(*flags, **kwargs)(func)
    return magic_arguments()(argument("job", help=what)(func))


def _generation_words(magic, line: str, ns_user: dict):
    """(parsed options, or ``None`` when they ask for help; the prompt on the line or ``None``) of a
    generation magic's line (``{name}`` in the job and the options expands from the namespace)."""
    from tune_magic.ui.generation import split_prompt_line

    try:
        job, words, prompt = split_prompt_line(line)
        if "-h" in words or "--help" in words:
            return None, prompt
        words = [expand_fields(w, ns_user) for w in words + ([job] if job is not None else [])]
    except UserError as exc:
        raise UsageError(str(exc)) from None
    return magic.parser.parse_args(words), prompt  # the options, then the job: the prompt is not among them


def _one_prompt(prompt: str | None, cell: str | None, magic: str) -> str:
    body = cell.strip() if cell is not None and cell.strip() else None
    if prompt is not None and body is not None:
        raise UsageError(f"give the prompt on the line or as the cell body, not both ({magic} JOB [OPTIONS] PROMPT)")
    if prompt is None and body is None:
        raise UsageError(f"give a prompt: {magic} JOB [OPTIONS] PROMPT, or the prompt as the cell body")
    return prompt if prompt is not None else body


def _check_generation(ns, prompt: str) -> None:
    """Every word of a generation magic checked before a job is looked up or anything starts."""
    from tune_magic.job.generate import GenOptions, check_checkpoint_name, check_prompt

    try:
        check_prompt(prompt)
        GenOptions.checked(ns.max_new_tokens, ns.temperature, ns.top_k, ns.seed)
        check_checkpoint_name(ns.checkpoint)
    except UserError as exc:
        raise UsageError(str(exc)) from None


@magics_class
class TuneMagics(Magics):
    """tune_magic's magics (registered by ``%load_ext tune_magic``)."""

    @no_var_expand
    @_launch_arguments
    @line_cell_magic("tune_run")
    def tune_run(self, line: str, cell: str | None = None):
        """Launch a torchtune recipe in the background and show a live card; return the Job.

        The cell body is either a YAML config (merged over --config when both are given, saved in
        the job's directory) or key=value override lines (a value may contain spaces); # comments
        are allowed. {name} in the line and in override lines expands from the notebook namespace;
        ${...} is left for OmegaConf. Without an endpoint of your own, torchrun gets --standalone
        (an OS-chosen port), so jobs side by side never collide. --scheduler NAME sends the job to
        another scheduler (e.g. slurm: one batch job on --nodes nodes), with that scheduler's options.
        --sweep runs a grid of trials (every comma list or range(...) value is an axis, a YAML body
        may hold a sweep: mapping), at most --max-parallel at a time, each a job; the cell returns
        the Sweep and shows its card.
        """
        from tune_magic.job.launch import launch, launch_options, scheduler_values

        tokens = _split_line(line)
        try:
            tokens = [expand_fields(t, self.shell.user_ns) for t in tokens]
            own, rest = launchopts.split_own(tokens, launch_options(launchopts.RUN), "%%tune_run")
            if own.get("help"):
                print(self.tune_run.__doc__)
                return None
            if own.get("sweep"):  # a grid of trials: the line is split again, keeping its quotes
                with launch_warnings_shown_here():  # _sweep_cell prints them, once
                    return self._sweep_cell(line, cell, own.get("wait"))
            launchopts.check_sweep_options(own)
            body = parse_cell_body(cell)
            overrides = [expand_fields(t, self.shell.user_ns) for t in body.overrides]
            with launch_warnings_shown_here():  # the card (a dry run: stderr) shows them, once
                result = launch(rest + overrides, name=own.get("name"), gpus=own.get("gpus"),
                                force=bool(own.get("force")), cwd=os.getcwd(),
                                dry_run=True if own.get("dry_run") else None, config_overlay=body.config_yaml,
                                scheduler=own.get("scheduler"), max_resumes=own.get("max_resumes"),
                                val_split=own.get("val_split"), keep_checkpoints=own.get("keep_checkpoints"),
                                **scheduler_values(own))
        except UserError as exc:
            raise UsageError(str(exc)) from None
        if not hasattr(result, "id"):  # a LaunchPlan: dry run
            print(result.command_line())
            script = getattr(result, "batch_script", None)
            if script:
                print("\n" + script)
            for warning in result.warnings:  # what a launch would warn about (the card shows them)
                print(f"warning: {warning}", file=sys.stderr)
            return result
        return self._show(result, bool(own.get("wait")))

    @no_var_expand
    @line_magic("tune_resume")
    def tune_resume(self, line: str):
        """Resume a stopped, failed or unknown job from its last checkpoint, as a new job in the same
        output_dir linked to it; print the pre-flight, show the new job's card and return the Job.

        %tune_resume JOB [--dry-run] [--fresh] [--name N] [--gpus G] [--wait] [--max-resumes N]
        [--scheduler NAME] [scheduler options] [key=value ...]

        The pre-flight says what it found (the checkpoint epoch_K/, the epochs done), what is lost
        (the steps after the checkpoint), the overrides it adds and how exact the resume is; extra
        key=value overrides are added and shown. It refuses, saying why and what to do, a job that
        succeeded or still runs, one resumed already, one with nothing to resume from (--fresh then
        starts it again with the same settings), and one whose output_dir a live job uses.
        --dry-run prints the pre-flight and the command and starts nothing.
        """
        from tune_magic.job.launch import launch_options, scheduler_values
        from tune_magic.job.resume import resume

        try:
            tokens = [expand_fields(t, self.shell.user_ns) for t in _split_line(line)]
            job_id, own, extra = launchopts.split_job_words(tokens, launch_options(launchopts.RESUME), "%tune_resume")
            if own.get("help"):
                print(self.tune_resume.__doc__)
                return None
            if job_id is None:
                raise UsageError("give the job to resume: %tune_resume JOB (%tune_jobs lists them)")
            with launch_warnings_shown_here():  # the new job's card shows them
                result = resume(job_id, extra, fresh=bool(own.get("fresh")),
                                dry_run=True if own.get("dry_run") else None, name=own.get("name"),
                                gpus=own.get("gpus"), scheduler=own.get("scheduler"),
                                max_resumes=own.get("max_resumes"), on_plan=lambda plan: print(plan.summary()),
                                **scheduler_values(own))
        except UserError as exc:
            raise UsageError(str(exc)) from None
        if not hasattr(result, "id"):  # a dry run: the plan, nothing started
            print(result.summary())
            return result
        return self._show(result, bool(own.get("wait")))

    def _sweep_cell(self, line: str, cell: str | None, wait: bool):
        """A ``%%tune_run --sweep`` cell: the line split again keeping where the shell quotes were
        (``tag="a,b"`` is one value, ``lr=1e-4,3e-4`` an axis), and so are the body's override lines;
        a YAML body may hold a ``sweep:`` mapping. Returns the Sweep after showing its card, or the
        dry run (:class:`~tune_magic.sweeping.create.SweepDryRun`) after printing every trial's command."""
        from tune_magic.job.launch import launch_options, scheduler_values
        from tune_magic.sweeping.create import sweep

        namespace = self.shell.user_ns
        words = [expand_fields(w, namespace) for w in split_words(line)]
        own, rest = launchopts.split_own([w.text for w in words], launch_options(launchopts.RUN), "%%tune_run")
        body = parse_cell_body(cell, sweep=True)
        args = tail_words(words, rest) + [expand_fields(w, namespace) for w in body.words]
        overlay = cell if body.config_yaml is not None or body.sweep else None
        result = sweep(args, cwd=os.getcwd(), dry_run=True if own.get("dry_run") else None, config_overlay=overlay,
                       **launchopts.sweep_kwargs(own), **scheduler_values(own))
        if not hasattr(result, "wait"):  # a dry run
            print(result.text())
            return result
        for warning in result.record.warnings:  # once, as plain lines (the sweep card does not repeat them)
            print(f"warning: {warning}", file=sys.stderr)
        return self._show(result, wait)

    def _show(self, target, wait: bool):
        """Show a launched job or sweep: stream it as text with ``--wait``, else display its live card."""
        from tune_magic.ui.targets import card

        if wait:
            from tune_magic.ui.watch import stream_text

            goes = "sweep {} goes on" if hasattr(target, "trials") else "job {} keeps running"
            try:
                stream_text(target, lambda s: (sys.stdout.write(s), sys.stdout.flush()))
            except KeyboardInterrupt:
                print(f"\nstopped following; {goes.format(target.id)} (%tune_stop {target.id} stops it)")
            return target
        display(card(target))
        return target

    @magic_arguments()
    @_filter_arguments
    @line_magic("tune_jobs")
    def tune_jobs(self, line: str = ""):
        """Show the jobs (also those started by earlier kernels), newest first, with status, step, last
        loss, elapsed time, start time and a Stop button per live job; the newest 20 (or --last N),
        the rest behind "show all". --running, --failed and --name GLOB narrow the list."""
        if _wants_help(line):
            print(self.tune_jobs.__doc__)
            return None
        from tune_magic.ui.listing import JobFilter
        from tune_magic.ui.views import JobsTable

        wanted = JobFilter.from_args(_parse(self.tune_jobs, line))
        display(JobsTable(filter=wanted))
        return None

    @no_var_expand
    @_generation_arguments
    @line_cell_magic("tune_generate")
    def tune_generate(self, line: str, cell: str | None = None):
        """Generate text from one of a job's checkpoints, with the job's own config, tokenizer and
        prompt template; show the text as it arrives and return it (a str).

        %tune_generate JOB [--checkpoint C] [--max-new-tokens N] [--temperature T] [--top-k K]
        [--seed S] PROMPT, or %%tune_generate JOB [OPTIONS] with the prompt as the cell body.

        The prompt is the rest of the line as typed (one quoted word: without its quotes; -- before
        a prompt that starts with --). The first prompt for a checkpoint starts a process where the
        job ran that keeps the model loaded; later prompts of this kernel reuse it (it ends after
        300 s without one, or at exit; tune_magic.close_generators() ends it now).
        """
        from tune_magic.job import get_job
        from tune_magic.ui.generation import TextShower
        from tune_magic.ui.targets import is_sweep

        ns, prompt = _generation_words(self.tune_generate, line, self.shell.user_ns)
        if ns is None:
            print(self.tune_generate.__doc__)
            return None
        prompt = _one_prompt(prompt, cell, "%tune_generate")
        _check_generation(ns, prompt)
        if is_sweep(ns.job):
            raise UsageError(f"{ns.job} is a sweep: generate from one of its trials (%tune_generate TRIAL_JOB ...; "
                             f"%tune_jobs lists them), or compare every trial: %tune_compare {ns.job} PROMPT "
                             "(tune_magic.compare(sweep, prompt))")
        show = TextShower()
        try:
            text = get_job(ns.job).generate(prompt, checkpoint=ns.checkpoint, max_new_tokens=ns.max_new_tokens,
                                            temperature=ns.temperature, top_k=ns.top_k, seed=ns.seed, on_text=show)
        except UserError as exc:
            raise UsageError(str(exc)) from None
        show.finish(text)
        return text

    @no_var_expand
    @_generation_arguments
    @line_magic("tune_compare")
    def tune_compare(self, line: str):
        """Answer one prompt with every trial of a sweep (or one job), each from its --checkpoint
        (best: lowest validation loss); show the answers side by side as they come and return the
        pandas DataFrame (tune_magic.compare's: job_id, name, the sweep's axis values, checkpoint,
        val_loss, text, error).

        %tune_compare SWEEP [--checkpoint C] [--max-new-tokens N] [--temperature T] [--top-k K]
        [--seed S] PROMPT
        """
        import ipywidgets as widgets

        from tune_magic.sweeping.compare import compare
        from tune_magic.ui.generation import compare_html

        ns, prompt = _generation_words(self.tune_compare, line, self.shell.user_ns)
        if ns is None:
            print(self.tune_compare.__doc__)
            return None
        prompt = _one_prompt(prompt, None, "%tune_compare")
        _check_generation(ns, prompt)
        view = widgets.HTML()
        rows: list[dict] = []

        def on_row(row: dict) -> None:  # called in this thread, between generations
            rows.append(row)
            view.value = compare_html(rows, list(row))

        display(view)
        try:
            return compare(ns.job, prompt, ns.checkpoint, max_new_tokens=ns.max_new_tokens,
                           temperature=ns.temperature, top_k=ns.top_k, seed=ns.seed, on_row=on_row)
        except UserError as exc:
            raise UsageError(str(exc)) from None

    @magic_arguments()
    @line_magic("tune_panel")
    def tune_panel(self, line: str = ""):
        """Show the launch panel (recipe/config pickers, command preview, Launch, jobs, loss comparison)."""
        if _wants_help(line):
            print(self.tune_panel.__doc__)
            return None
        _parse(self.tune_panel, line)
        from tune_magic.ui.panel import Panel

        return Panel()

    @magic_arguments()
    @argument("job", help="job id or the name of one job (%%tune_jobs lists them), or a sweep's id or name: its card")
    @line_magic("tune_logs")
    def tune_logs(self, line: str):
        """Show a job's (or a sweep's) live card again (e.g. after a kernel restart)."""
        if _wants_help(line):
            print(self.tune_logs.__doc__)
            return None
        from tune_magic.ui.targets import card, find

        ns = _parse(self.tune_logs, line)
        try:
            target = find(ns.job)
        except UserError as exc:
            raise UsageError(str(exc)) from None
        display(card(target))
        return target

    @magic_arguments()
    @argument("job", nargs="?", help="job id or the name of one job, or a sweep's id or name: every trial of the sweep")
    @argument("--all", action="store_true", help="stop every live job (running or pending)")
    @argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL (10)")
    @line_magic("tune_stop")
    def tune_stop(self, line: str):
        """Stop a job (SIGTERM to torchrun, then SIGKILL to what is left; a queued job is
        cancelled), or every live job."""
        if _wants_help(line):
            print(self.tune_stop.__doc__)
            return None
        from tune_magic.job import damaged_live_jobs, get_job, jobs
        from tune_magic.job.stopping import stop_jobs
        from tune_magic.ui.targets import counts_text, find, is_sweep

        ns = _parse(self.tune_stop, line)
        if bool(ns.job) == ns.all:
            raise UsageError("give a job id or --all, not both" if ns.all else "give a job id or --all")
        if not 0 <= ns.grace < float("inf"):
            raise UsageError(f"--grace {ns.grace}: give the seconds between SIGTERM and SIGKILL, a number >= 0")
        try:
            if ns.job and is_sweep(ns.job):  # a sweep: every trial; queued ones never start
                sweep = find(ns.job)
                print(f"{sweep.id} {counts_text(sweep.stop(grace_s=ns.grace))}")
                return
            if ns.all:  # sweeps first: their queued trials never start
                from tune_magic.sweeping.sweep import stop_running_sweeps

                for sweep_id, counts in stop_running_sweeps(ns.grace):
                    print(f"{sweep_id} {counts_text(counts)}")
            targets = ([j for j in jobs() if j.status.is_live] + damaged_live_jobs()) if ns.all else [get_job(ns.job)]
        except UserError as exc:
            raise UsageError(str(exc)) from None
        for job_id, status in stop_jobs(targets, grace_s=ns.grace).items():
            print(f"{job_id} {status}")


def register(ipython) -> None:
    """Register :class:`TuneMagics` with ``ipython``, and the transformer that lets a
    ``%%tune_run ARGS`` cell with an empty body run as ``%tune_run ARGS``."""
    ipython.register_magics(TuneMagics)
    cleanup = ipython.input_transformers_cleanup
    if not any(getattr(t, "__name__", "") == empty_cell_to_line.__name__ for t in cleanup):
        cleanup.append(empty_cell_to_line)
