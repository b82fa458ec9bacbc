"""The jobs table (``%tune_jobs``, the panel's table): every job, live, in a bounded grid. It only
sets traits: one refresher thread of its own, bound by the rule of the cards
(:mod:`tune_magic.ui.cards`, where :class:`~tune_magic.ui.cards.JobCard` lives; it is importable
from here too, its path in the tutorials before the cards got a module of their own).
"""

from __future__ import annotations

import html
import itertools
import threading
from dataclasses import replace
from typing import Iterable

import ipywidgets as widgets

from tune_magic.registry import store as jobstore
from tune_magic.job import Job, jobs
from tune_magic.job.evaluate import EvaluationFollower, is_evaluated, summary_of_evaluations, val_summary_of
from tune_magic.registry.status import Status
from tune_magic.ui import tablecols
from tune_magic.ui.listing import JobFilter, newest_first
from tune_magic.ui.tablerows import TABLE_ROWS, TABLE_STYLE, TableRows, dir_stamp
from tune_magic.ui.resumeview import can_resume, resume_row
from tune_magic.ui.cards import STATUS_COLOURS, JobCard  # noqa: F401  (JobCard: its earlier path)
from tune_magic.ui.textfmt import cut, escape, table



def _fmt_elapsed(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


#: Seconds between a live table's refreshes: at most one update a second.
TABLE_INTERVAL_S = 1.0
#: Hidden rows a table keeps ready for jobs that appear after it was built: widgets are created on
#: the kernel's own thread only, so the refresher fills these by setting traits.
SPARE_ROWS = 8
#: Longest failure or pending reason shown in a row, in characters (the whole text is the tooltip).
REASON_WIDTH = 160

_COUNTER = itertools.count(1)
# cell text that wraps (a word longer than the column too: a narrow notebook's table gives its room to
# the other columns first), with normal line spacing (a widget line is 28 px); ids wrap at their hyphens
_WRAP = "white-space:normal;overflow-wrap:anywhere;line-height:1.35"
_WRAP_ID = "white-space:normal;line-height:1.35"


class _Row:
    """One row's widgets (a slot of the grid); ``job`` is ``None`` while it is a hidden spare."""

    def __init__(self, table: "JobsTable"):
        def cell(kind: str) -> widgets.HTML:
            # an id wraps at its hyphens, never narrower than its widest part (9 characters)
            w = widgets.HTML(layout=widgets.Layout(display="none", min_width="9.5ch" if kind == "id" else "0"))
            w.add_class(f"tm-cell-{kind}")
            return w

        self.job: Job | None = None
        self.done = False  # ended and shown as ended: never refreshed again
        self.live: bool | None = None  # whether the Stop button is shown
        self.shown: tuple | None = None
        self.extra_shown: dict | None = None  # the optional columns' text as last shown
        self.evals = None  # its checkpoints' evaluations, followed (a job that validates by checkpoints)
        self.val_shown: str | None = None  # the val loss cell's text as last shown ("": none)
        self.cells = {kind: cell(kind) for kind in JobsTable.CELLS}
        self.button = widgets.Button(description="Stop", button_style="danger", layout=widgets.Layout(width="70px"))
        self.button.on_click(lambda _b: table._stop(self))
        self.resume_button = widgets.Button(description="Resume", button_style="info",
                                            layout=widgets.Layout(width="auto", min_width="70px"))
        self.resume_button.on_click(lambda _b: resume_row(self))
        self.stop_cell = widgets.Box(layout=widgets.Layout(display="none"))
        self.stop_cell.add_class("tm-cell-stop")
        # the reason gets a line of its own under the row, so a long one wraps instead of widening the
        # table; grid_area, not grid_column: the frontend removes the grid-area shorthand after setting
        # grid-column (ipywidgets 8.1), which clears it
        self.reason = widgets.HTML(layout=widgets.Layout(display="none", grid_area="auto / 2 / auto / -1",
                                                         min_width="0"))
        self.reason.add_class("tm-cell-reason")

    def widgets(self) -> list[widgets.Widget]:
        return [*self.cells.values(), self.stop_cell, self.reason]

    def public(self) -> dict[str, widgets.Widget]:
        return {**self.cells, "stop": self.button, "resume": self.resume_button, "reason": self.reason}


class JobsTable(TableRows, widgets.VBox):
    """The jobs (including those started by earlier kernels and by other processes), newest first,
    kept live.

    Columns: id, name, status, step, last loss, the validation loss (``val loss``, when a job listed
    has one: the best, the latest where it differs, ``evaluating…`` while a checkpoint's evaluation
    is queued or running), elapsed, started, the scheduler (when jobs of more
    than one are listed), the engine's id with the nodes under it (when a job listed has an engine
    id, e.g. ``SLURM ID``; :mod:`tune_magic.ui.tablecols`), a Stop button on the rows of live
    (pending, running) jobs and a Resume button on stopped, failed and unknown ones (its pre-flight
    on the line under the row, then Confirm); a failed row's reason and a pending row's SLURM reason
    (``Resources``, ``Priority``...) show on a line under it, as does what an evaluation job evaluates
    (``validates epoch_2 (step 12) of job ID``). At most ``limit`` rows (the newest jobs)
    are shown; the others wait behind the ``more`` button ("show all (N more)",
    :mod:`tune_magic.ui.tablerows`). ``rows`` maps job id -> that row's widgets (``id``, ``name``,
    ``status``, ``step``, ``loss``, ``val``, ``elapsed``, ``started``, ``scheduler``, ``engine`` (the nodes
    under the engine's id), ``reason`` HTML, ``stop`` and ``resume`` Buttons); ``summaries`` maps job
    id -> ``(name, status label, step, loss, elapsed seconds, reason)`` as last shown; ``jobs`` lists
    the jobs shown, in row order.

    One named daemon thread per table (``tune_magic-jobs-table-N``) refreshes it every
    :data:`TABLE_INTERVAL_S` seconds: rows of jobs not yet ended are re-read from each job's record
    and summary (:meth:`Job.summary`: never its whole log; a job whose checkpoints are evaluated,
    also once ended while an evaluation is to come: their result files, a ``stat`` a look while
    unchanged, :class:`~tune_magic.job.evaluate.EvaluationFollower`), and a table of all jobs adds the rows of
    jobs that appeared since (one ``stat`` of the registry a second while nothing changes) and hides
    those removed. A filtered table keeps its filter: a row whose job no longer matches (a
    ``--running`` table's job that ended) leaves, and the newest matching job behind "show all"
    takes its place. The thread only sets widget traits; it never prints.

    Args:
        listed: the jobs to show (default: every job, and jobs launched later appear too).
        live: start the refresher thread (default True).
        limit: most rows shown before "show all" (``None``: every job).
        filter: which jobs to list (:class:`tune_magic.ui.listing.JobFilter`; its ``last`` is the
            limit), also among the jobs found later.
    """

    #: Every cell of a row, in order: the fixed columns with the validation loss after the loss, then
    #: the optional ones.
    CELLS = ("id", "name", "status", "step", "loss", "val", "elapsed", *tablecols.TABLE_KINDS)
    COLUMNS = (*CELLS, "")

    def __init__(self, listed: Iterable[Job] | None = None, *, live: bool = True, limit: int | None = TABLE_ROWS,
                 filter: JobFilter | None = None):
        self._discover = listed is None
        self._root = jobstore.jobs_root(create=False) if self._discover else None
        self._root_stamp: tuple | None = None
        self._lock = threading.RLock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._slots: list[_Row] = []
        # ids of rows hidden while shown: removed from the registry, or no longer listed by the
        # filter (a --running table's job that ended)
        self._gone: set[str] = set()
        self._filter = replace(filter, last=None) if filter is not None else None
        self.limit = filter.last if filter is not None and filter.last else limit
        self._hidden: list[Job] = []  # jobs behind "show all", newest first
        self._waiting: list[Job] = []  # live jobs the filter may come to list (--failed)
        self._cols, self._cols_applied = tablecols.Columns(), False
        self.jobs: list[Job] = []
        self.rows: dict[str, dict[str, widgets.Widget]] = {}
        self.summaries: dict[str, tuple] = {}
        if self._discover:
            self._root_stamp = dir_stamp(self._root)
            from tune_magic.sweeping.sweep import revive_sweeps

            revive_sweeps()  # the table shows sweeps' trials: a sweep whose process died goes on
        listed = newest_first(jobs() if listed is None else listed)
        self._known = {j.id for j in listed}  # every job looked at (shown, hidden, or not listed)
        if self._filter is not None:
            self._waiting = [j for j in listed if not self._filter.matches(j) and self._filter.may_match_later(j)]
            listed = self._filter.select(listed)
        header = []
        for c in self.COLUMNS:
            h = widgets.HTML(f"<b>{'val loss' if c == 'val' else c}</b>")
            h.add_class("tm-cell-head")
            header.append(h)
        self._header = header
        self._heads = dict(zip(self.COLUMNS, header))
        # id and name: auto, so they wrap (ids at their hyphens) rather than widen a narrow notebook
        self.grid = widgets.GridBox(layout=widgets.Layout(justify_content="flex-start", grid_gap="2px 6px",
                                                          align_items="center", max_width="100%"))
        self.grid.add_class("tm-jobs-grid")
        self.more = widgets.Button(icon="list", layout=widgets.Layout(display="none", width="auto"))
        self.more.add_class("tm-show-all")
        self.more.on_click(lambda _b: self.show_all())
        self.note = widgets.HTML(layout=widgets.Layout(display="none"))
        cut_at = len(listed) if self.limit is None else self.limit
        for job in listed[:cut_at]:
            self._fill(self._new_slot(), job)
        self._hidden = listed[cut_at:]
        self._top_up()
        if not listed and self._filter is not None and self._filter.narrows:
            self.note.value = f"<span class='tm-hint'>no {html.escape(self._filter.describe())} (yet)</span>"
            self.note.layout.display = None
        self._rearrange()
        style = widgets.HTML(TABLE_STYLE, layout=widgets.Layout(display="none"))  # its CSS applies all the same
        super().__init__(children=[style, self.grid, self.more, self.note], layout=widgets.Layout(max_width="100%"))
        self.add_class("tune-magic-jobs")
        if live:
            self.start()

    # -- rows ---------------------------------------------------------------------------------
    def _new_slot(self) -> _Row:
        row = _Row(self)
        self._slots.append(row)
        return row

    def _top_up(self) -> None:
        """Keep :data:`SPARE_ROWS` hidden rows ready (creates widgets: the kernel's thread only)."""
        spare = sum(1 for r in self._slots if r.job is None)
        for _ in range(SPARE_ROWS - spare):
            self._new_slot()

    def _fill(self, row: _Row, job: Job) -> None:
        """Give ``row`` to ``job`` and show it (sets traits only)."""
        row.job = job
        self._known.add(job.id)
        self.rows[job.id] = row.public()
        row.cells["id"].value = f"<div style='{_WRAP_ID}'><code class='tm-job-id'>{html.escape(job.id)}</code></div>"
        for w in row.widgets()[:-1]:
            w.layout.display = None
        self._show_columns(row)
        self._show(row)

    def add(self, job: Job) -> None:
        """Show ``job`` now (the panel calls this for its own launches); no-op if shown already.
        Call from the kernel's thread: it may create widgets for spare rows."""
        with self._lock:
            if job.id not in self.rows:
                # its own Job object: the refresher thread must not share one with the caller's code
                self._place(Job(job.dir), create=True)
            self._top_up()
            self._rearrange()

    @staticmethod
    def _values(job: Job, s) -> tuple:
        """(name, status label, step, loss, elapsed s, reason) of ``job`` from its record and summary
        ``s``; a sweep's trial is named ``<its values> · sweep <sweep name> #<trial>``; an evaluation
        of a checkpoint says which one, after its reason (:func:`tune_magic.ui.tablecols.evaluates_text`)."""
        r = job.record
        state = r.state
        reason = ""
        if state is Status.FAILED:
            reason = r.error or s.error or (f"exit code {r.returncode}" if r.returncode is not None else "")
        elif state is Status.PENDING:
            reason = r.pending_reason or ""
        elif state in (Status.UNKNOWN, Status.STOPPED):  # a stop's reason: who stopped it, when not the user
            reason = r.error or ""
        name = r.name if not r.sweep else f"{r.name} · sweep {r.sweep.get('name') or r.sweep['id']} #{r.sweep['trial']}"
        note = job.engine_note if not state.is_terminal else None  # e.g. the engine is not answering
        if note:
            reason = f"{reason} ({note})" if reason else note
        what = tablecols.evaluates_text(r)
        if what:
            reason = f"{reason} · {what}" if reason else what
        return (name, state.label, s.step, s.loss, job.elapsed_s, reason)

    def _val(self, row: _Row, s) -> str:
        """The val loss cell's text (:func:`tune_magic.ui.tablecols.val_text`): from the summary ``s``,
        or the evaluations of the job's checkpoints, followed (a ``stat`` a look while unchanged)."""
        job = row.job
        if row.evals is None and is_evaluated(job.record):
            row.evals = EvaluationFollower(job)
        if row.evals is not None:
            row.evals.poll()
            return tablecols.val_text(summary_of_evaluations(row.evals.evaluations))
        return tablecols.val_text(val_summary_of(job, summary=s))

    def _show_val(self, row: _Row, s) -> None:
        """Set the val loss cell when its text changed (the column appears with the first one)."""
        val = self._val(row, s)
        if val != row.val_shown:
            row.cells["val"].value = f"<span class='tm-val' style='{_WRAP}'>{html.escape(val)}</span>" if val else ""
            row.val_shown = val
            if val and not self._cols.val:
                self._update_columns()  # its first validation loss came after the row was shown

    def _show_extra(self, row: _Row) -> None:
        """Set the optional columns' cells when their text changed."""
        extra = tablecols.values(row.job)
        if extra != row.extra_shown:
            for kind in tablecols.TABLE_KINDS:  # the nodes under the engine's id, small, wrapping after commas
                nodes = (f"<div class='tm-nodes' style='font-size:11px;color:#555;{_WRAP}'>"
                         f"{html.escape(cut(extra['nodes']).replace(',', ', '))}</div>" if kind == "engine" else "")
                row.cells[kind].value = (f"<span class='tm-{kind}' style='{_WRAP}'>{html.escape(cut(extra[kind]))}"
                                         f"</span>{nodes}")
            if extra["engine"] and not self._cols.engine:
                self._update_columns()  # its engine id came after the row was shown
            row.extra_shown = extra

    def _show(self, row: _Row) -> None:
        """Re-read ``row``'s job and set the traits that changed."""
        job = row.job
        s = job.summary()  # refreshes the record first
        values = self._values(job, s)
        name, label, step, loss, elapsed, reason = values
        state = job.record.state
        self.summaries[job.id] = values
        self._show_val(row, s)
        self._show_extra(row)
        # an ended job's row is never read again, once no evaluation of its checkpoints is to come
        done = state.is_terminal and (row.evals is None or not row.evals.open)
        if values == row.shown:
            row.done = done
            return
        old = row.shown or (None,) * 6
        c = row.cells
        if name != old[0]:  # a long name wraps (the table never widens past its notebook)
            c["name"].value = (f"<div title='{html.escape(escape(name))}' style='{_WRAP}'>"
                               f"{html.escape(cut(name))}</div>")
        if label != old[1]:
            colour = STATUS_COLOURS.get(state.value, "#000")
            c["status"].value = f"<span class='tm-status' style='color:{colour}'>{html.escape(label)}</span>"
        if step != old[2]:
            c["step"].value = "" if step is None else f"<span class='tm-step'>{step}</span>"
        if loss != old[3]:
            c["loss"].value = "" if loss is None else f"<span class='tm-loss'>{loss:.5g}</span>"
        if int(elapsed) != int(old[4] or 0) or old[4] is None:
            c["elapsed"].value = _fmt_elapsed(elapsed)
        if reason != old[5]:
            if reason:
                kind, why = {Status.FAILED: ("error", "failed:"), Status.STOPPED: ("stopped", "stopped:"),
                             Status.UNKNOWN: ("error", "")}.get(state, ("note", ""))
                if state is Status.PENDING and job.record.pending_reason:
                    kind, why = "pending", "waiting for"
                colour = STATUS_COLOURS.get(state.value, "#000")
                if reason == tablecols.evaluates_text(job.record):  # only what it evaluates: a quiet note
                    kind, colour = "evaluates", "#7f7f7f"
                row.reason.value = (f"<div class='tm-reason tm-reason-{kind}' title='{html.escape(escape(reason))}' "
                                    f"style='color:{colour};{_WRAP}'>{why} "
                                    f"{html.escape(cut(reason, REASON_WIDTH))}</div>")
            row.reason.layout.display = None if reason else "none"
        live = state.is_live
        if live != row.live:
            row.live = live
            row.button.disabled = not live
            row.button.description = "Stop"
            row.stop_cell.children = (row.button,) if live else (row.resume_button,) if can_resume(job.record) else ()
        row.shown = values
        row.done = done

    # -- refreshing ---------------------------------------------------------------------------
    def refresh_once(self) -> None:
        """Find new and removed jobs (a table of all jobs) and re-read the rows of jobs not ended.
        Sets traits only; what the thread runs each :data:`TABLE_INTERVAL_S` seconds."""
        with self._lock:
            if self._discover:
                self._find_new()
            if self._waiting:
                self._recheck_waiting()
            left = False
            for row in self._slots:
                if row.job is not None and not row.done and row.job.id not in self._gone:
                    try:
                        self._show(row)
                        if self._filter is not None and not self._filter.matches(row.job):
                            self._leave(row)
                            left = True
                    except Exception:  # noqa: BLE001 - one unreadable job must not stop the others
                        continue
            if left:
                self._refill()

    def _run(self) -> None:
        while not self._stop_event.wait(TABLE_INTERVAL_S):
            try:
                self.refresh_once()
            except Exception:  # noqa: BLE001 - the refresher never dies and never prints
                pass

    def start(self) -> "JobsTable":
        """Start the refresher thread (``tune_magic-jobs-table-N``, daemon); return self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"tune_magic-jobs-table-{next(_COUNTER)}",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 2.0) -> None:
        """Stop refreshing (the jobs keep running)."""
        self._stop_event.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def close(self, timeout: float | None = 2.0) -> None:
        """Stop refreshing (waiting up to ``timeout`` seconds, ``None``: until the refresh under way
        has ended) and close the widgets."""
        if hasattr(self, "_stop_event"):
            self.stop(timeout)
        for w in getattr(self, "_header", []) + [w for r in getattr(self, "_slots", []) for w in r.widgets()]:
            w.close()
        super().close()

    def _stop(self, row: _Row) -> None:
        job = row.job
        if job is None:
            return
        row.button.disabled = True
        row.button.description = "Stopping…"
        # stop() waits up to its grace period; the refresher shows the outcome
        threading.Thread(target=job.stop, name=f"tune_magic-stop-{job.id}", daemon=True).start()

    # -- text ---------------------------------------------------------------------------------
    def text(self) -> str:
        """The table as plain text: one line per job, newest first (name and reason escaped and
        cut), and how many more jobs "show all" would list."""
        with self._lock:
            kinds, val = self._cols.kinds(), self._cols.val
            rows = [(*self.FIXED[:5], *(["val loss"] if val else []), self.FIXED[5], *map(self._cols.heading, kinds),
                     "reason")]
            items = [(r.job.id, self.summaries.get(r.job.id), r.extra_shown or {}, r.val_shown or "")
                     for r in self._shown_rows()]
            hidden = len(self._hidden)
        for job_id, values, extra, val_shown in items:
            if values is None:
                continue
            name, status, step, loss, elapsed, reason = values
            rows.append((job_id, cut(name), status, "" if step is None else str(step),
                         "" if loss is None else f"{loss:.5g}", *([val_shown] if val else []), _fmt_elapsed(elapsed),
                         *(cut(extra.get(k, "")) for k in kinds), cut(reason, REASON_WIDTH)))
        more = [f"({hidden} more: show all)"] if hidden else []
        return "\n".join(table(rows) + more)

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text()
        return bundle
