"""Where a whole run is: epoch of epochs, global step of all steps, steps in this epoch, ETA,
throughput, and whether a checkpoint is being saved. Pure text processing (no files, no widgets).

Formats read (torchtune 0.6.1, tqdm 4.x):

* the recipes' tqdm bar, described ``{epoch}|{global step}|Loss: {loss}``, in tqdm's default
  format ``1|13|Loss: 2.31:  65%|██████▌   | 13/20 [00:10<00:05,  1.30it/s]`` (``s/it`` below one
  step a second, ``?it/s`` before the first); the ``13/20`` counter is this epoch's steps of the
  epoch's steps (``max_steps_per_epoch`` or the data loader's length, whichever is smaller);
* the checkpoint log lines: ``Saving checkpoint. This may take some time. Retrieving full model
  state dict...`` then ``Saving checkpoint took 1.23 secs`` (``lora_finetune_distributed`` and
  the ``*_distributed`` recipes, and torchtune's checkpoint client: also ``Saving checkpoint
  asynchronously...``); ``Starting checkpoint save...`` then ``Checkpoint saved in 1.23 seconds.``
  (``lora_finetune_single_device``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

# the description, then tqdm's "pct%|bar| n/total [elapsed<remaining, rate]" (the bracket is optional:
# a redraw cut short by a later write still gives the counters)
_BAR_RE = re.compile(
    r"(?<![\w.|])(?P<epoch>\d+)\|(?P<step>\d+)\|Loss: [^\s:]+:\s*\d{1,3}%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)"
    r"(?:\s*\[[^\]<,]*(?:<[^\],]*)?,\s*(?:(?P<rate>[\d.]+)(?P<unit>it/s|s/it)|\?it/s))?"
)
# a torchtune description alone (a bar without counters, e.g. tqdm without a total)
_DESC_RE = re.compile(r"(?<![\w.|])(?P<epoch>\d+)\|(?P<step>\d+)\|Loss: ")
# a step: torchtune's bar description or a "Step N | ..." metric line (StdoutLogger)
_STEP_LINE_RE = re.compile(r"(?<![\w.|])\d+\|(?P<bar>\d+)\|Loss: |(?:^|\s|\])Step (?P<metric>\d+) \|")

#: Substrings of a log line that starts saving a checkpoint (see the module docstring).
SAVE_STARTS = ("Saving checkpoint", "Starting checkpoint save")
#: Substrings of a log line that ends saving one (checked before :data:`SAVE_STARTS`).
SAVE_ENDS = ("Saving checkpoint took", "Checkpoint saved in")
#: :func:`checkpoint_state` values.
SAVING, SAVED = "saving", "saved"
#: :func:`checkpoint_state`'s answer when the lines decide nothing.
UNDECIDED = "undecided"


@dataclass(frozen=True)
class Bar:
    """One parsed torchtune progress bar.

    Attributes:
        epoch: 1-based epoch.
        step: global step (steps since the run began, all epochs).
        n: steps done in this epoch (tqdm's counter), or ``None`` when the bar has no counter.
        total: steps in this epoch (tqdm's total), or ``None``.
        rate: steps per second as tqdm measured it over this epoch, or ``None`` (``?it/s``).
    """

    epoch: int
    step: int
    n: int | None = None
    total: int | None = None
    rate: float | None = None


def parse_bar(text: str | None) -> Bar | None:
    """Parse the latest progress text (see the module docstring); ``None`` when it is not a
    torchtune bar."""
    if not text or "Loss: " not in text:
        return None
    m = _BAR_RE.search(text)
    if m is None:
        d = _DESC_RE.search(text)
        return Bar(int(d["epoch"]), int(d["step"])) if d else None
    rate = None
    if m["rate"]:
        try:
            value = float(m["rate"])
        except ValueError:
            value = 0.0
        if value > 0:
            rate = value if m["unit"] == "it/s" else 1.0 / value
    total = int(m["total"])
    return Bar(int(m["epoch"]), int(m["step"]), int(m["n"]), total if total > 0 else None, rate)


def _line_step(line: str) -> int | None:
    """The global step a bar redraw (``1|12|Loss: ...``) or a metric line (``Step 12 | ...``) is at."""
    m = _STEP_LINE_RE.search(line)
    if m is None:
        return None
    return int(m["bar"] or m["metric"])


def checkpoint_state(lines: Sequence[str]) -> str | None:
    """Whether the job is saving a checkpoint, from the last log lines (oldest first).

    The latest save line decides: its end line gives :data:`SAVED`, its start line :data:`SAVING`,
    unless a bar redraw or a metric line after it is at a later step than the save (training went
    on: ``None``). The save's step is that of the bar on its line (torchtune's log line is glued to
    the open bar) or of the nearest one before it. A redraw at the same step (tqdm redraws the bar
    once more when it closes, after the last save) or a bar without torchtune's description (the
    next epoch's ``0/20``, before its first step) does not end it.

    Returns:
        ``"saving"``, ``"saved"``, ``None``, or :data:`UNDECIDED` when no save line is among them.
    """
    if not any("heckpoint" in line for line in lines):
        return UNDECIDED
    later: int | None = None  # the highest step after the current line
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if "heckpoint" in line:
            state = SAVED if any(e in line for e in SAVE_ENDS) else SAVING if any(s in line for s in SAVE_STARTS) else None
            if state is not None:
                if later is None:
                    return state
                at = next((s for s in map(_line_step, (lines[j] for j in range(i, -1, -1))) if s is not None), None)
                return state if at is not None and later <= at else None
        step = _line_step(line)
        if step is not None and (later is None or step > later):
            later = step
    return UNDECIDED


def finished_and_saved(lines: Sequence[str], epochs: int | None) -> bool:
    """Whether a log's last lines (oldest first) show the run's last planned step and the
    checkpoint save that follows it: the latest progress bar is at its epoch's last step
    (``n == total``) in epoch ``epochs``, and :func:`checkpoint_state` says :data:`SAVED`.

    ``False`` when ``epochs`` is not known, or no bar with counters is among the lines: a run is
    never taken for finished on a guess (the outcome rule then calls a stopped run ``stopped``).
    """
    if not epochs:
        return False
    bar = next((b for b in map(parse_bar, reversed(lines)) if b is not None and b.total is not None), None)
    return bar is not None and bar.epoch == epochs and bar.n == bar.total and checkpoint_state(lines) == SAVED


@dataclass(frozen=True)
class RunProgress:
    """Where the whole run is.

    Attributes:
        epoch: 1-based current epoch, or ``None`` before the first bar.
        epochs: epochs the run has (the config's ``epochs``), or ``None`` when unknown.
        step: the latest global step (bar or metric file, whichever is ahead), or ``None``.
        total_steps: ``epochs * epoch_steps`` when both are known, else ``None``.
        epoch_step: steps done in this epoch, or ``None``.
        epoch_steps: steps per epoch (tqdm's total, else the config's ``max_steps_per_epoch``).
        rate: steps per second (tqdm's, else as observed by the caller), or ``None``.
        eta_s: seconds until the last step of the run (of this epoch when ``epochs`` is unknown;
            checkpoint saves not counted), or ``None``.
        throughput: the metric file's ``tokens_per_second_per_gpu`` at its latest step, or ``None``.
        checkpoint: ``"saving"``, ``"saved"`` or ``None`` (see :func:`checkpoint_state`).
    """

    epoch: int | None = None
    epochs: int | None = None
    step: int | None = None
    total_steps: int | None = None
    epoch_step: int | None = None
    epoch_steps: int | None = None
    rate: float | None = None
    eta_s: float | None = None
    throughput: float | None = None
    checkpoint: str | None = None

    @property
    def eta_is_run(self) -> bool:
        """Whether :attr:`eta_s` is the whole run's (else this epoch's)."""
        return self.epochs is not None


def run_progress(bar: Bar | None, *, epochs: int | None = None, max_steps_per_epoch: int | None = None,
                 metric_step: int | None = None, observed_rate: float | None = None,
                 throughput: float | None = None, checkpoint: str | None = None) -> RunProgress:
    """Combine the latest bar with what the config says and what the metric file gave.

    Args:
        bar: :func:`parse_bar` of the latest progress text, or ``None``.
        epochs: the config's ``epochs`` (None: unknown).
        max_steps_per_epoch: the config's ``max_steps_per_epoch`` (None: unknown or unset), used
            for steps per epoch only while no bar gave its total.
        metric_step: the latest step of the metric file (it may be ahead of the last bar read).
        observed_rate: steps per second measured by the caller, used when the bar has no rate.
        throughput: tokens per second per GPU, as logged.
        checkpoint: :func:`checkpoint_state`'s answer (``UNDECIDED`` is taken as ``None``).
    """
    epochs = epochs if epochs and epochs > 0 else None
    epoch_steps = bar.total if bar and bar.total else (max_steps_per_epoch or None)
    step = max((s for s in (bar and bar.step, metric_step) if s is not None), default=None)
    epoch = bar.epoch if bar else None
    epoch_step = bar.n if bar else None
    rate = bar.rate if bar and bar.rate else observed_rate
    total = epochs * epoch_steps if epochs and epoch_steps else None
    eta = None
    if rate and rate > 0 and epoch_steps and epoch is not None and epoch_step is not None:
        left = max(epoch_steps - epoch_step, 0) + (max(epochs - epoch, 0) * epoch_steps if epochs else 0)
        eta = left / rate
    return RunProgress(epoch=epoch, epochs=epochs, step=step, total_steps=total, epoch_step=epoch_step,
                       epoch_steps=epoch_steps, rate=rate, eta_s=eta, throughput=throughput,
                       checkpoint=None if checkpoint == UNDECIDED else checkpoint)


def fmt_duration(seconds: float) -> str:
    """``"m:ss"``, ``"h:mm:ss"`` from an hour, ``"Nd h:mm:ss"`` from a day (seconds, floored)."""
    m, s = divmod(int(max(seconds, 0)), 60)
    h, m = divmod(m, 60)
    d, h = divmod(h, 24)
    if d:
        return f"{d}d {h}:{m:02d}:{s:02d}"
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def fmt_rate(value: float) -> str:
    """A throughput figure: thousands separated from 100 up, three significant digits below."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
