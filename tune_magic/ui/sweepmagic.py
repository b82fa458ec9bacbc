"""``%%tune_run --sweep``: the cell of a sweep. Thin: parse, call :func:`tune_magic.sweep`, display.

The line is split again keeping where the shell quotes were (``tag="a,b"`` is one value, ``lr=1e-4,3e-4``
an axis), and so are override lines of the body; a YAML body may hold a ``sweep:`` mapping. The cell
returns the :class:`~tune_magic.sweeping.sweep.Sweep` at once and shows its card; ``--dry-run``
prints every trial's command and returns the :class:`~tune_magic.sweeping.create.SweepDryRun`;
``--wait`` streams one line per trial and the final table (nbconvert, papermill).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping

from tune_magic.plan import options as launchopts
from tune_magic.config.cellbody import expand_fields, parse_cell_body
from tune_magic.config.shellwords import split_words, tail_words


def sweep_options(own: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :func:`tune_magic.sweep` among own options split off a line (the
    generic ones; the caller adds the scheduler's)."""
    return {"name": own.get("name"), "gpus": own.get("gpus"), "force": bool(own.get("force")),
            "max_parallel": own.get("max_parallel"), "gpus_per_trial": own.get("gpus_per_trial"),
            "max_trials": own.get("max_trials"), "scheduler": own.get("scheduler")}


def sweep_cell(line: str, cell: str | None, namespace: Mapping[str, Any]):
    """Run a ``%%tune_run --sweep`` cell; return the Sweep (or the dry run), after showing it.

    Raises:
        UserError: anything the sweep refuses (the magic turns it into a UsageError).
    """
    from IPython.core.display_functions import display

    from tune_magic.job.launch import launch_options, scheduler_values
    from tune_magic.sweeping.create import sweep

    words = [expand_fields(w, namespace) for w in split_words(line)]
    own, rest = launchopts.split_own([w.text for w in words], launch_options(launchopts.RUN), "%%tune_run")
    body = parse_cell_body(cell, sweep=True)
    args = tail_words(words, rest) + [expand_fields(w, namespace) for w in body.words]
    overlay = cell if body.config_yaml is not None or body.sweep else None
    result = sweep(args, cwd=os.getcwd(), dry_run=True if own.get("dry_run") else None, config_overlay=overlay,
                   **sweep_options(own), **scheduler_values(own))
    if not hasattr(result, "wait"):  # a dry run
        print(result.text())
        return result
    for warning in result.record.warnings:  # once, as plain lines (the sweep card does not repeat them)
        print(f"warning: {warning}", file=sys.stderr)
    if own.get("wait"):
        from tune_magic.ui.sweeptext import stream_sweep

        try:
            stream_sweep(result, lambda s: (sys.stdout.write(s), sys.stdout.flush()))
        except KeyboardInterrupt:
            print(f"\nstopped following; sweep {result.id} goes on (%tune_stop {result.id} stops it)")
        return result
    from tune_magic.ui.sweepcard import SweepCard

    display(SweepCard(result))
    return result
