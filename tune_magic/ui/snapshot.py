"""What a view shows of a job or a sweep at one moment (:class:`JobSnapshot`,
:class:`SweepSnapshot`), their plain-text forms, and the short form of torchtune's progress line
(:func:`progress_summary`). Pure: built by the watchers of :mod:`tune_magic.ui.watch` from what
they read; cards, tables, ``--wait`` and the CLI only read them.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from tune_magic.checkpoints.validation import ValSummary
from tune_magic.job.evaluate import summary_of_evaluations
from tune_magic.logs.progress import SAVED, SAVING, RunProgress, fmt_duration, fmt_rate
from tune_magic.registry.status import Status
from tune_magic.gpus import gpus_label
from tune_magic.sweeping.grid import short_keys
from tune_magic.sweeping.results import BY_FINAL_LOSS, BY_VAL_LOSS, MEASURE_WORDS
from tune_magic.ui.cardlines import engine_id_text, overrides_text
from tune_magic.ui.textfmt import cut, table

#: Metric plotted by the views.
LOSS = "loss"
#: Metric shown as throughput when the recipe logs it (torchtune 0.6.1 recipes: tokens per second per GPU).
THROUGHPUT = "tokens_per_second_per_gpu"
#: Log lines read per shown line: repeated warnings and bar redraws are collapsed from these.
READ_PER_SHOWN = 4

# tqdm's bar after torchtune's description: "40%|####      | 2/5 [00:00<00:01,  3.87it/s]"
_BAR = re.compile(r"(\d+%)\|[^|]*\|\s*(\d+/\d+)\s*(\[[^\]]*\])?")


def progress_summary(text: str | None) -> str:
    """Shorten a torchtune progress line to tqdm's counters: ``"2/5 40% [00:00<00:01, 3.87it/s]"``.

    The description (``epoch|step|Loss: ...``) is dropped because views show step and loss from the
    metric file, and whatever a later log write appended to the same line is cut off. Text that is
    not a tqdm bar is returned as is, at most 200 characters.
    """
    if not text:
        return ""
    m = _BAR.search(text)
    if m is None:
        return text[:200]
    return " ".join(part for part in (m[2], m[1], m[3]) if part)


def val_fields(in_loop: dict[int, float], evaluations: tuple, max_points: int) -> dict:
    """A :class:`JobSnapshot`'s validation fields (``val_steps``, ``val_losses``, ``val``,
    ``evaluations``) from the ``val_loss`` points a recipe logged in its loop (step -> value) and
    its checkpoints' evaluations (:class:`tune_magic.job.evaluate.Evaluation`); the chart's
    series thinned evenly to ``max_points`` (>= 2), the latest kept."""
    points = dict(in_loop)
    points.update((e.step, e.val_loss) for e in evaluations if e.val_loss is not None)
    steps = sorted(points)
    counts = summary_of_evaluations(evaluations)
    val = ValSummary.of_points([(s, points[s]) for s in steps], pending=counts.pending, failed=counts.failed)
    if len(steps) > max_points:
        steps = [steps[i * (len(steps) - 1) // (max_points - 1)] for i in range(max_points)]
    return dict(val_steps=tuple(steps), val_losses=tuple(points[s] for s in steps),
                val=val if points or evaluations else None, evaluations=tuple(evaluations))


@dataclass(frozen=True)
class CheckpointRow:
    """One checkpoint as a card lists it (``Job.checkpoints``, :mod:`tune_magic.job.checkpoints`).

    Attributes:
        name: ``epoch_N``.
        path: its folder.
        step: the global step it was saved at, when known.
        bytes_on_disk: what it takes (bytes; 0 once pruned).
        kind: ``full``, ``lora_merged``, ``adapter_only``, or ``None`` (nothing there yet).
        val_loss: its validation loss, when evaluated.
        best: the lowest validation loss among the kept ones.
        complete: every file there and whole.
        resume: a resume would load it.
        pruned_bytes: the bytes retention freed removing it, or ``None`` (kept).
        live: its job still runs (an incomplete folder is then being written; once the job ended,
            it is one whose save did not finish).
    """

    name: str
    path: str
    step: int | None = None
    bytes_on_disk: int = 0
    kind: str | None = None
    val_loss: float | None = None
    best: bool = False
    complete: bool = True
    resume: bool = False
    pruned_bytes: int | None = None
    live: bool = True

    def text(self) -> str:
        """``epoch_2 · step 12 · 753.7 KB · val 3.1625 ◆ best · /runs/x/epoch_2``, as one line."""
        from tune_magic.checkpoints.layout import size_text

        bits = [self.name] + ([f"step {self.step}"] if self.step is not None else [])
        if self.pruned_bytes is not None:
            bits.append(f"pruned (freed {size_text(self.pruned_bytes)})")
        else:
            bits.append(size_text(self.bytes_on_disk) if self.complete else
                        "being written" if self.live else "incomplete: its save did not finish")
        if self.val_loss is not None:
            bits.append(f"val {self.val_loss:.5g}" + (" ◆ best" if self.best else ""))
        if self.resume and self.pruned_bytes is None:
            bits.append("resume needs it")
        return " · ".join(bits) + ("" if self.pruned_bytes is not None else f" · {self.path}")


def checkpoint_rows(checkpoints, *, live: bool = True) -> tuple[CheckpointRow, ...]:
    """The card's rows of a job's :class:`~tune_magic.checkpoints.catalog.Checkpoint` list, the best by
    validation loss among the kept complete ones marked; ``live``: the job still runs."""
    from tune_magic.checkpoints.catalog import best_kept

    best = best_kept(checkpoints)
    return tuple(CheckpointRow(c.name, str(c.path), c.step, c.bytes_on_disk, c.kind, c.val_loss,
                               best is not None and c.epoch == best.epoch, c.complete, c.needed_by_resume,
                               None if c.pruned is None else c.pruned.bytes_freed, live) for c in checkpoints)


def evaluation_note(e) -> str | None:
    """What a card, ``--wait`` and the CLI say of an evaluation of a checkpoint
    (:class:`tune_magic.job.evaluate.Evaluation`) that ended without a value (it never makes the job
    failed): ``evaluation of epoch_1 failed: <reason>; tune-magic logs <id> --error``; ``None`` for
    one with its value, one still to end, or one whose job was removed."""
    if e.val_loss is not None or e.status in ("pending", "running", "removed"):
        return None
    if e.job_id is None:
        return f"evaluation of epoch_{e.epoch} could not start: {e.error or 'no reason recorded'}"
    if e.status == "failed":
        return f"evaluation of epoch_{e.epoch} failed: {e.error or 'see its log'}; tune-magic logs {e.job_id} --error"
    why = f": {e.error}" if e.error else ""  # stopped, outcome unknown, or succeeded without writing its value
    return f"evaluation of epoch_{e.epoch} {status_label(e.status)} without a value{why}; tune-magic logs {e.job_id}"


def status_label(status: str) -> str:
    """A status as listings show it (``unknown`` -> ``"outcome unknown"``; any other text as is)."""
    try:
        return Status(status).label
    except ValueError:
        return str(status)


@dataclass(frozen=True)
class JobSnapshot:
    """What a view shows of a job at one moment.

    Attributes:
        job_id, name: the job's id and name.
        status: a :class:`~tune_magic.Status` value (``pending``, ``running``, ``unknown``,
            ``succeeded``, ``failed``, ``stopped``); :attr:`label` is what to show.
        elapsed_s: seconds since launch (the whole run once ended).
        gpus: GPU ids as typed (relative to the kernel's CUDA_VISIBLE_DEVICES) or ``None``.
        physical_gpus: the same GPUs as nvidia-smi indices (MIG ids as strings), or ``None``.
        endpoint: real rendezvous ``host:port`` once known.
        output_dir: the job's output directory.
        progress: the latest progress-bar line (``1|12|Loss: 2.31: 60%|...| 12/20 [00:10<00:06, ...]``).
        tail: the last lines of the log as a card shows them (:func:`tune_magic.logs.cardtail.display_tail`:
            bar redraws and repeated warnings collapsed; at most the watcher's ``tail_lines``, plus as
            many of each per-rank file, prefixed ``[rank N stream] ``, for jobs run with
            ``--redirects``/``--tee``). The log on disk keeps every line.
        steps, losses: the loss curve (possibly thinned to ``max_points`` for charts).
        step, loss: the latest step with a loss, and that loss.
        error: the failing rank and message for a failed job (the record's ``error``).
        returncode: exit code once ended.
        run: where the whole run is (:class:`tune_magic.logs.progress.RunProgress`: epoch of epochs,
            steps, ETA, throughput, checkpoint saving).
        run_at_s: :attr:`elapsed_s` when :attr:`run` was last read (its ETA counts down from there).
        traceback: a failed job's whole traceback (:meth:`Job.failure`), or ``None``.
        pending_reason: why a pending job waits (SLURM's reason), or ``None``.
        nodes: host names the job runs on, for jobs on several nodes or on a SLURM allocation
            (``()`` otherwise, and while pending).
        num_nodes: nodes the job asked for.
        warnings: the record's launch warnings (e.g. SLURM's "no --cpus-per-node: ...").
        log_lost_at: unix seconds since which the log is kept, when the job's directory was
            deleted while it ran (the log before is gone), else ``None``.
        earlier_steps, earlier_losses: the loss curve of the jobs this one resumed (its lineage,
            :mod:`tune_magic.checkpoints.lineage`: steps continuing into this job's), drawn dimmed.
        resumed_at: global steps where a run of the lineage, or an attempt of this job, resumed
            (the chart's markers).
        lineage_notes: where this job resumed from, its attempts, the job that resumed it
            (:func:`tune_magic.checkpoints.lineage.notes`).
        overrides: the overrides the job ran with, as the card shows them
            (:func:`tune_magic.ui.cardlines.shown_overrides`).
        engine_id, engine_id_label: the engine's own id of the job (SLURM's job id) and what it is
            called (``"SLURM ID"``), or ``None``.
        engine_note: the scheduler's note on how sure the status is (``Job.engine_note``, e.g.
            "SLURM not answering since 14:05": the status shown is the last known one), or ``None``.
        val_steps, val_losses: the validation losses (``val_loss``, mean cross-entropy per label
            token, :mod:`tune_magic.checkpoints.validation`) by step: those the recipe logged in its
            loop and those of its checkpoints' evaluations (possibly thinned for charts).
        val: their latest and best (:class:`~tune_magic.checkpoints.validation.ValSummary`, with
            the evaluations queued or running and failed), or ``None`` when the job has none.
        evaluations: the evaluations of its checkpoints (:class:`tune_magic.job.evaluate.Evaluation`,
            by epoch), for a job that validates by checkpoints.
        checkpoints: the checkpoints it saved (:class:`CheckpointRow`, by epoch), pruned ones included.
    """

    job_id: str
    name: str
    status: str
    elapsed_s: float
    gpus: tuple[int, ...] | None
    physical_gpus: tuple[int | str, ...] | None
    endpoint: str | None
    output_dir: str | None
    progress: str | None
    tail: tuple[str, ...]
    steps: tuple[int, ...]
    losses: tuple[float, ...]
    step: int | None
    loss: float | None
    error: str | None
    returncode: int | None
    run: RunProgress = RunProgress()
    run_at_s: float = 0.0
    traceback: str | None = None
    pending_reason: str | None = None
    nodes: tuple[str, ...] = ()
    num_nodes: int = 1
    warnings: tuple[str, ...] = ()
    log_lost_at: float | None = None
    earlier_steps: tuple[int, ...] = ()
    earlier_losses: tuple[float, ...] = ()
    resumed_at: tuple[int, ...] = ()
    lineage_notes: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    engine_id: str | None = None
    engine_id_label: str | None = None
    engine_note: str | None = None
    val_steps: tuple[int, ...] = ()
    val_losses: tuple[float, ...] = ()
    val: ValSummary | None = None
    evaluations: tuple = ()
    checkpoints: tuple = ()

    @property
    def label(self) -> str:
        """The status as listings show it (``unknown`` -> ``"outcome unknown"``)."""
        return status_label(self.status)

    @property
    def eta_s(self) -> float | None:
        """Seconds left (:attr:`RunProgress.eta_s` counted down since it was read), or ``None``."""
        if self.run.eta_s is None:
            return None
        return max(self.run.eta_s - max(self.elapsed_s - self.run_at_s, 0.0), 0.0)

    def progress_parts(self) -> list[tuple[str, str, str]]:
        """The progress line as ``(css class, text, suffix)`` parts, in order; views join them
        with `` · `` (the HTML card puts ``text`` in a span of that class, ``suffix`` after it)."""
        parts: list[tuple[str, str, str]] = []
        state = Status(self.status) if self.status in Status._value2member_map_ else None
        live = state is not None and state.is_live
        run = self.run
        if state is Status.PENDING:
            reason = f": {self.pending_reason}" if self.pending_reason else ""
            parts.append(("tm-pending", f"waiting in the queue{reason}", ""))
        elif live and run.checkpoint == SAVING:
            parts.append(("tm-saving", "saving checkpoint…", ""))
        elif live and run.checkpoint == SAVED:
            parts.append(("tm-saving", "checkpoint saved", ""))
        elif state is Status.RUNNING and self.step is None and run.step is None:
            parts.append(("tm-waiting", "waiting for the first step", ""))
        if run.epoch is not None:
            parts.append(("tm-epoch", f"epoch {run.epoch}", f"/{run.epochs}" if run.epochs else ""))
        if self.step is not None:
            parts.append(("tm-step", f"step {self.step}", f"/{run.total_steps}" if run.total_steps else ""))
            parts.append(("tm-loss", f"loss {self.loss:.5g}", ""))
        elif run.step is not None:
            parts.append(("tm-step", f"step {run.step}", f"/{run.total_steps}" if run.total_steps else ""))
        parts += self.val_parts()
        if run.epoch_step is not None and run.epoch_steps:
            parts.append(("tm-epoch-steps", f"{run.epoch_step}/{run.epoch_steps} this epoch", ""))
        elif run.epoch is None and self.progress:
            bar = progress_summary(self.progress)  # some other bar (not torchtune's): its counters
            if bar:
                parts.append(("tm-bar", bar, ""))
        elapsed = fmt_duration(self.elapsed_s)
        parts.append(("tm-elapsed", f"{elapsed} elapsed" if live or state is Status.UNKNOWN else f"took {elapsed}", ""))
        eta = self.eta_s
        if state is Status.RUNNING and eta is not None and run.checkpoint is None:
            parts.append(("tm-eta", f"ETA {fmt_duration(eta)}" if run.eta_is_run else f"epoch ends in {fmt_duration(eta)}",
                          ""))
        if run.throughput is not None:
            parts.append(("tm-throughput", f"{fmt_rate(run.throughput)} tokens/s/GPU", ""))
        # (one whose value is written is done for the reader, however long its process takes to exit)
        running = [e for e in self.evaluations if e.status in ("pending", "running") and e.val_loss is None]
        if running:
            parts.append(("tm-evaluating", "evaluating " + ", ".join(f"epoch_{e.epoch} (job {e.job_id})"
                                                                     for e in running), ""))
        return parts

    def val_parts(self) -> list[tuple[str, str, str]]:
        """The progress line's validation parts: ``val loss 3.1625`` (the latest), then
        ``best 3.1034 (step 8)`` where the best is another step's (:meth:`progress_parts`' form)."""
        v = self.val
        if v is None or v.latest is None:
            return []
        parts = [("tm-val", f"val loss {v.latest:.5g}", "")]
        if v.best is not None and v.best_step != v.latest_step:
            parts.append(("tm-val-best", f"best {v.best:.5g} (step {v.best_step})", ""))
        return parts

    def val_text(self, most: int = 12) -> str:
        """The validation losses as one line: ``val_loss by step: 4: 5.5648 · 8: 3.6122`` (the last
        ``most`` points, ``…`` before them when there are more), or ``""`` with none."""
        if not self.val_steps:
            return ""
        shown = [f"{s}: {v:.5g}" for s, v in zip(self.val_steps[-most:], self.val_losses[-most:])]
        return "val_loss by step: " + ("… " if len(self.val_steps) > most else "") + " · ".join(shown)

    def progress_text(self) -> str:
        """The progress line as plain text."""
        return " · ".join(text + suffix for _, text, suffix in self.progress_parts())

    def placement(self) -> list[str]:
        """Where the job runs, for plain text: one line with the engine's id of it, its GPUs,
        rendezvous endpoint and output_dir (those known), or no line when none is."""
        details = [engine_id_text(self.engine_id_label, self.engine_id) or None,
                   gpus_label(self.gpus, self.physical_gpus) or None,
                   f"rendezvous {self.endpoint}" if self.endpoint else None,
                   f"output_dir {self.output_dir}" if self.output_dir else None]
        return ["  ".join(d for d in details if d)] if any(details) else []

    def notes(self) -> list[str]:
        """Small notes about the job: the engine's note (it does not answer), where it runs
        (several nodes), launch warnings, a lost log."""
        out = [self.engine_note] if self.engine_note else []
        if self.nodes:
            out.append(("nodes " if len(self.nodes) > 1 else "node ") + ", ".join(self.nodes))
        if self.log_lost_at is not None:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.log_lost_at))
            out.append(f"the job's directory was deleted while it ran and recreated at {when}: "
                       "the log before that time is gone")
        out += list(self.lineage_notes)
        out += self.evaluation_notes()
        out += [f"warning: {w}" for w in self.warnings]
        return out

    def evaluation_notes(self) -> list[str]:
        """A line for each evaluation of a checkpoint that ended without a value (:func:`evaluation_note`)."""
        return [n for n in map(evaluation_note, self.evaluations) if n]

    def summary(self) -> str:
        """A plain-text rendering (terminals, nbconvert, ``--wait``)."""
        lines = [f"job {self.job_id} ({self.name}): {self.label}, {self.elapsed_s:.0f} s"]
        if self.error:  # a job that succeeded has a note at most ("the stop arrived after training ended")
            lines.append(f"{'note' if self.status == 'succeeded' else 'error'}: {self.error}")
        lines += self.placement()
        lines += [overrides_text(self.overrides)] if self.overrides else []
        lines += self.notes()
        if self.step is not None:
            lines.append(f"step {self.step} loss {self.loss:.6g}  {progress_summary(self.progress)}".rstrip())
        val = " · ".join(text + suffix for _, text, suffix in self.val_parts())
        lines += [f"{val} · {self.val_text()}"] if val else []
        lines += [f"checkpoint {c.text()}" for c in self.checkpoints]
        return "\n".join(lines)

    def news(self, before: "JobSnapshot | None") -> list[str]:
        """Lines for what is new since ``before`` (``--wait``'s stream), in step order: one per loss
        point after its last step (``step 8 | loss 3.2061``), one per validation loss after its last
        one (``step 8 | val_loss 3.1625``), and each evaluation that ended without a value."""
        shown = before.step if before is not None and before.step is not None else -1
        lines = [(step, 0, f"step {step} | loss {loss:.6g}") for step, loss in zip(self.steps, self.losses)
                 if step > shown]
        val_shown = before.val_steps[-1] if before is not None and before.val_steps else -1
        lines += [(step, 1, f"step {step} | val_loss {v:.6g}") for step, v in zip(self.val_steps, self.val_losses)
                  if step > val_shown]
        noted = set(before.evaluation_notes()) if before is not None else set()
        return [text for _, _, text in sorted(lines)] + [n for n in self.evaluation_notes() if n not in noted]


#: Marks the best trial in text tables.
BEST_MARK = "*"


@dataclass(frozen=True)
class TrialRow:
    """One trial of a sweep as views show it.

    Attributes:
        index, name: the trial's index and label (its values).
        texts: ``{axis key: item as typed}``.
        status: its job's status label once started; ``queued``, ``cancelled``, ``not started`` before.
        job_id: its job's id once started.
        step, loss: its latest step with a loss, and that loss.
        best_loss: its lowest loss so far (``nan`` ignored).
        elapsed_s: seconds since its job started (its whole run once ended); 0 before.
        note: why it waits or could not start, or its failure reason.
        steps, losses: its loss curve (thinned for the chart).
        validates: its job validates (:attr:`tune_magic.sweeping.results.TrialResult.validates`).
        best_val_loss: its lowest finite validation loss, or ``None``.
        val_pending: evaluations of its checkpoints still to finish.
        best_checkpoint: the name (``epoch_N``) of its kept checkpoint with the lowest validation
            loss, the one ``checkpoint="best"`` loads, or ``None`` while none has one.
    """

    index: int
    name: str
    texts: tuple[tuple[str, str], ...]
    status: str
    job_id: str | None = None
    step: int | None = None
    loss: float | None = None
    best_loss: float | None = None
    elapsed_s: float = 0.0
    note: str | None = None
    steps: tuple[int, ...] = ()
    losses: tuple[float, ...] = ()
    validates: bool = False
    best_val_loss: float | None = None
    val_pending: int = 0
    best_checkpoint: str | None = None


@dataclass(frozen=True)
class SweepSnapshot:
    """What a view shows of a sweep at one moment.

    Attributes:
        sweep_id, name: the sweep's id and name.
        status: ``running``, ``finished`` or ``stopped``.
        keys: the axis keys, in trial order.
        max_parallel: trials at once; ``slots``: each slot's GPUs (``None``: no GPUs).
        rows: every trial, in order.
        best: the index of the best trial so far (:func:`tune_magic.sweeping.results.rank`), or ``None``.
        ranked_by: the measure it is best by, ``val_loss`` or ``final_loss``.
        ranking_note: why trials that validate are ranked by final loss
            (:attr:`tune_magic.sweeping.results.Ranking.note`), or ``None``.
    """

    sweep_id: str
    name: str
    status: str
    keys: tuple[str, ...]
    max_parallel: int
    slots: tuple
    rows: tuple[TrialRow, ...]
    best: int | None
    ranked_by: str = BY_FINAL_LOSS
    ranking_note: str | None = None

    @property
    def ranking(self) -> str:
        """``"best by val_loss"`` or ``"best by final loss"``."""
        return f"best by {MEASURE_WORDS[self.ranked_by]}"

    @property
    def validates(self) -> bool:
        """Whether a trial validates (the views then show each trial's best validation loss)."""
        return any(r.validates or r.best_val_loss is not None for r in self.rows)

    @property
    def has_checkpoints(self) -> bool:
        """Whether a trial has a best checkpoint (the views then show each trial's)."""
        return any(r.best_checkpoint for r in self.rows)

    def counts(self) -> dict[str, int]:
        """``{status: trials}``, in the order statuses first appear."""
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def summary(self) -> str:
        """A plain-text rendering: :func:`table_text`."""
        return table_text(self)

    def news(self, before: "SweepSnapshot | None") -> list[str]:
        """Lines for what is new since ``before`` (``--wait``'s stream): one per trial that started
        or ended (:func:`line_of`)."""
        was = {r.index: r.status for r in (before.rows if before is not None else ())}
        return [line_of(r) for r in self.rows if r.status != "queued" and was.get(r.index) != r.status]


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


def val_text(row: TrialRow) -> str:
    """A trial's best validation loss as tables show it: the value, ``pending`` while its
    evaluations run and it has none, else ``-``."""
    if row.best_val_loss is not None:
        return _num(row.best_val_loss)
    return "pending" if row.val_pending else "-"


def table_rows(snap: SweepSnapshot) -> list[tuple[str, ...]]:
    """The trial table: a header row, then one row per trial (the best one marked
    :data:`BEST_MARK` in the first column); a ``BEST VAL_LOSS`` column when the trials validate, and
    a ``BEST CHECKPOINT`` column when one has a best checkpoint."""
    short = short_keys(list(snap.keys))
    val, ckpt = snap.validates, snap.has_checkpoints
    rows: list[tuple[str, ...]] = [("TRIAL", *(short[k].upper() for k in snap.keys), "STATUS", "STEP", "LOSS",
                                    "BEST LOSS", *(("BEST VAL_LOSS",) if val else ()),
                                    *(("BEST CHECKPOINT",) if ckpt else ()), "ELAPSED", "JOB")]
    for r in snap.rows:
        texts = dict(r.texts)
        mark = BEST_MARK if snap.best == r.index else ""
        rows.append((f"{r.index}{mark}", *(cut(texts.get(k, ""), 24) for k in snap.keys), r.status,
                     "-" if r.step is None else str(r.step), _num(r.loss), _num(r.best_loss),
                     *((val_text(r),) if val else ()), *((r.best_checkpoint or "-",) if ckpt else ()), fmt_duration(r.elapsed_s) if r.job_id else "-", r.job_id or "-"))
    return rows


def best_line(snap: SweepSnapshot) -> str | None:
    """Which trial is best and by what: ``best: trial 1 (lr=1e-3), val_loss 3.1625 (best by
    val_loss: the lowest validation loss)``, then the ranking's note; ``None`` without a best."""
    if snap.best is None:
        return None
    row = snap.rows[snap.best]
    if snap.ranked_by == BY_VAL_LOSS:
        line = (f"best: trial {row.index} ({cut(row.name)}), val_loss {_num(row.best_val_loss)} "
                f"({snap.ranking}: the lowest validation loss)")
    else:
        line = (f"best: trial {row.index} ({cut(row.name)}), final loss {_num(row.loss)} "
                f"({snap.ranking}: the lowest final loss; ties: lowest minimum loss)")
    return line + (f"; {snap.ranking_note}" if snap.ranking_note else "")


def table_text(snap: SweepSnapshot) -> str:
    """The header line, the trial table, and which trial is best and why (:func:`best_line`)."""
    lines = [header_of(snap), *table(table_rows(snap))]
    best = best_line(snap)
    if best is not None:
        lines.append(f"{BEST_MARK} {best}")
    elif snap.ranking_note:
        lines.append(snap.ranking_note)
    return "\n".join(lines)
