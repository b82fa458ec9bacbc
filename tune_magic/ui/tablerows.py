"""Which jobs a live jobs table shows, in which order, and which of its optional columns.

:class:`TableRows` is the part of :class:`tune_magic.ui.views.JobsTable` that keeps a table bounded
in a long-lived notebook: rows are newest first; at most ``limit`` rows are shown (default
:data:`TABLE_ROWS`, ``%tune_jobs --last N``) and the older jobs wait behind a "show all (N more)"
button; a job found later takes the top row, and when no row is free the oldest row shown is
given to it (its job goes behind "show all"), so the refresher thread never needs a new widget.
It also shows the listing's optional columns (:mod:`tune_magic.ui.tablecols`) once a job needs
them. Every method sets widget traits only, except :meth:`TableRows.show_all`, which creates rows
(a button's click runs on the kernel's thread).
"""

from __future__ import annotations

import html
import os
import time
from pathlib import Path

from tune_magic.job import Job
from tune_magic.ui import tablecols
from tune_magic.ui.listing import newest_first

#: Rows a live jobs table shows before "show all" (the newest jobs).
TABLE_ROWS = 20
#: The table's type sizes: a little smaller than the notebook's, so that its eleven columns (with the
#: scheduler and the engine's id) fit a narrow notebook (an 800 px window) without running over.
TABLE_STYLE = ("<style>.tm-jobs-grid .widget-html-content {font-size: 12px}"
               " .tm-jobs-grid .tm-cell-head .widget-html-content {font-size: 11px}"
               " .tm-jobs-grid code.tm-job-id {font-size: 11px}</style>")
#: A registry changed less than this many seconds ago is listed again even when its stamp did not
#: change (two changes within one filesystem timestamp tick leave one stamp).
ROOT_SETTLE_S = 2.0


def _age(row) -> tuple:
    return (row.job.started_at, row.job.id)


class TableRows:
    """Row placement, "show all" and optional columns of a jobs table (a mixin of ``JobsTable``,
    which provides ``_slots``, ``_gone``, ``rows``, ``summaries``, ``jobs``, ``_hidden``, ``limit``,
    ``_filter``, ``note``, ``_header``, ``_heads`` (column -> its header), ``grid``, ``more``,
    ``_new_slot``, ``_fill`` and ``_top_up``)."""

    #: The fixed columns before the optional ones, and the Stop column after them.
    FIXED = ("id", "name", "status", "step", "loss", "elapsed")

    def _shown_rows(self) -> list:
        """Rows holding a job still in the registry, newest first."""
        return sorted((r for r in self._slots if r.job is not None and r.job.id not in self._gone),
                      key=_age, reverse=True)

    def _order(self) -> list:
        """The grid's widgets: the header, then the rows newest first, then the rest (spares and
        rows of removed jobs, hidden). Sets ``jobs`` to the jobs shown, in row order."""
        shown = self._shown_rows()
        rest = [r for r in self._slots if r not in shown]
        self.jobs = [r.job for r in shown]
        return self._header + [w for r in shown + rest for w in r.widgets()]

    def _hide(self, job) -> None:
        """Put ``job`` behind "show all" (kept newest first)."""
        self._hidden = newest_first([j for j in self._hidden if j.id != job.id] + [job])

    def _release(self, row) -> None:
        """Make ``row`` free for another job (its old job's bookkeeping dropped)."""
        old = row.job.id
        self.rows.pop(old, None)
        self.summaries.pop(old, None)
        self._gone.discard(old)
        row.job, row.done, row.live, row.shown, row.extra_shown = None, False, None, None, None
        row.evals, row.val_shown = None, None

    def _place(self, job, *, create: bool = False) -> bool:
        """Show ``job`` in a free row, or in the oldest row shown when the table is at its limit or
        has no free row (that row's job goes behind "show all"), or put ``job`` itself there when it
        is older than every row shown. ``create``: may make a new row when none is free (the
        kernel's thread only). Returns whether a row now shows ``job``."""
        shown = self._shown_rows()
        free = next((r for r in self._slots if r.job is not None and r.job.id in self._gone), None)
        free = free or next((r for r in self._slots if r.job is None), None)
        full = self.limit is not None and len(shown) >= self.limit
        if full or (free is None and not create):
            if not shown or (job.started_at, job.id) < _age(shown[-1]):
                self._hide(job)
                return False
            free = shown[-1]
            self._hide(free.job)
        if free is None:
            free = self._new_slot()
        elif free.job is not None:
            self._release(free)
        self._hidden = [j for j in self._hidden if j.id != job.id]
        self._fill(free, job)
        return True

    def _find_new(self) -> None:
        """Hide the rows of jobs removed from the registry and place the jobs new in it (one ``stat``
        of the registry while nothing changed)."""
        stamp = dir_stamp(self._root)
        # unchanged since the last look, and not changed so recently that a second change within the
        # same timestamp tick could hide behind the first
        if stamp == self._root_stamp and (stamp is None or time.time() - stamp[1] / 1e9 > ROOT_SETTLE_S):
            return
        self._root_stamp = stamp
        try:
            names = {e.name for e in os.scandir(self._root)
                     if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)}
        except OSError:
            return
        for row in self._slots:
            if row.job is not None and row.job.id not in names and row.job.id not in self._gone:
                self._gone.add(row.job.id)  # removed (tune-magic rm): hide its row
                for w in row.widgets():
                    w.layout.display = "none"
        self._hidden = [j for j in self._hidden if j.id in names]
        found = []
        for name in names - self._known:
            try:
                job = Job(self._root / name)
            except Exception:  # noqa: BLE001 - not a job directory (yet): listed when it becomes one
                continue
            if not job.damaged:
                found.append(job)
        for job in sorted(found, key=lambda j: (j.started_at, j.id)):
            self._known.add(job.id)
            if self._filter is None or self._filter.matches(job):
                self._place(job)
            elif self._filter.may_match_later(job):
                self._waiting.append(job)
        self._rearrange()

    def _recheck_waiting(self) -> None:
        """List the waiting live jobs that now match the filter (e.g. one that failed)."""
        now_listed = [j for j in self._waiting if j.refresh() and self._filter.matches(j)]
        self._waiting = [j for j in self._waiting if j not in now_listed and j.record.state.is_live]
        for job in now_listed:
            self._place(job)
        if now_listed:
            self._rearrange()

    def _still_listed(self, job) -> bool:
        """Whether the filter lists ``job`` as its record now says (an unreadable one: no)."""
        if self._filter is None:
            return True
        try:
            return self._filter.matches(job.refresh())
        except Exception:  # noqa: BLE001 - removed or unreadable: not listed
            return False

    def _leave(self, row) -> None:
        """Hide the row of a job the filter no longer lists (a ``--running`` table's job ended):
        the table keeps its filter; the row is free for another job (sets traits only)."""
        self._gone.add(row.job.id)
        for w in row.widgets():
            w.layout.display = "none"

    def _refill(self) -> None:
        """After rows left: drop the jobs behind "show all" that no longer match, let the newest
        that still do take the free rows, and say so when none is left (sets traits only)."""
        self._hidden = [j for j in self._hidden if self._still_listed(j)]
        while self._hidden and (self.limit is None or len(self._shown_rows()) < self.limit):
            if not self._place(self._hidden[0]):
                break
        if not self._shown_rows() and self._filter.narrows:
            self.note.value = f"<span class='tm-hint'>no {html.escape(self._filter.describe())} (yet)</span>"
            self.note.layout.display = None
        self._rearrange()

    def show_all(self) -> None:
        """Show every job behind "show all" (creates their rows: call from the kernel's thread, as a
        click on the button does); the table has no limit from then on."""
        with self._lock:
            self.limit = None
            hidden, self._hidden = self._hidden, []
            for job in hidden:
                if job.id in self._gone or not job.dir.is_dir() or not self._still_listed(job):
                    continue  # removed, or the filter no longer lists it (a --running table's job ended)
                try:
                    self._fill(self._new_slot(), job)
                except Exception:  # noqa: BLE001 - removed or unreadable meanwhile: the others still shown
                    continue
            self._top_up()
            self._rearrange()

    def _rearrange(self) -> None:
        """Order the grid's rows, fit its columns, and say how many jobs wait behind "show all"."""
        self._update_columns()
        self.grid.children = self._order()
        hidden = len(self._hidden)
        self.more.description = f"show all ({hidden} more)"
        self.more.layout.display = None if hidden else "none"
        if self.jobs and self.note.layout.display is None:
            self.note.layout.display = "none"  # the "no ... jobs (yet)" line of a narrowed table

    # -- optional columns ---------------------------------------------------------------------
    def _update_columns(self) -> None:
        """Show the optional columns the jobs shown need (a table only ever adds columns)."""
        shown = self._shown_rows()
        cols = tablecols.columns_for((r.job for r in shown), val=any(r.val_shown for r in shown)).widened(self._cols)
        if cols == self._cols and self._cols_applied:
            return
        self._cols, self._cols_applied = cols, True
        kinds = cols.table_kinds()
        for kind in tablecols.TABLE_KINDS:
            head = self._heads[kind]
            nodes = "<br><span style='font-weight:normal;font-size:11px'>nodes</span>" if kind == "engine" else ""
            head.value = f"<b>{html.escape(cols.heading(kind))}</b>{nodes}"
            head.layout.display = None if kind in kinds else "none"
        self._heads["val"].layout.display = None if cols.val else "none"
        for row in self._slots:
            if row.job is not None:
                self._show_columns(row)
        self.grid.layout.grid_template_columns = self.template()

    def _show_columns(self, row) -> None:
        """Show ``row``'s cells of the optional columns shown, hide the others."""
        kinds = self._cols.table_kinds() + (["val"] if self._cols.val else [])
        for kind in ("val", *tablecols.TABLE_KINDS):
            want = None if kind in kinds and row.job.id not in self._gone else "none"
            if row.cells[kind].layout.display != want:
                row.cells[kind].layout.display = want

    def template(self) -> str:
        """The grid's ``grid-template-columns``: id and name wrap (``auto``), status to started (the
        val loss among them, when shown) as wide as their content, the scheduler and the engine id
        with its nodes wrap where a narrow notebook needs it, then the Stop (or Resume) button's
        column, as wide as its label."""
        kinds = self._cols.table_kinds()
        wrapping = " auto" * (len(kinds) - 1)  # every optional column after "started"
        fitted = len(self.FIXED) - 2 + 1 + (1 if self._cols.val else 0)
        return f"auto auto repeat({fitted}, max-content){wrapping} minmax(76px, max-content)"


def dir_stamp(path: Path | None) -> tuple | None:
    """(inode, mtime ns) of a directory: changes when an entry is added, removed or renamed."""
    try:
        st = os.stat(path)
    except (OSError, TypeError):
        return None
    return (st.st_ino, st.st_mtime_ns)
