"""Resume in the widgets: the Resume control of a job's card, the Resume button of a jobs-table row,
and the card chart's lineage marks (earlier runs' points dimmed, a marker where a run resumed).

Resuming is two clicks, so that the pre-flight is seen before anything starts: Resume shows what
the pre-flight found and what will happen (:meth:`tune_magic.job.resume.ResumePlan.summary`, from a dry
run: nothing locked, nothing started), then "Resume now" (or "Start again" for a job that saved no
checkpoint) launches it through :func:`tune_magic.resume`, which checks everything again. A refusal
shows its reason in place of the summary. Clicks run on the kernel's thread (comm messages), where
widgets may be created: the card shows the new job's card inside its own. Called from the watcher
thread, :meth:`ResumeControl.show_for` only sets traits.
"""

from __future__ import annotations

import html
from typing import Callable

import ipywidgets as widgets

from tune_magic.errors import NothingToResume, UserError
from tune_magic.registry.record import JobRecord
from tune_magic.registry.status import Status

#: Statuses a job may be resumed from (the Resume buttons show on them).
RESUMABLE = (Status.STOPPED, Status.FAILED, Status.UNKNOWN)
#: Opacity of the earlier runs' points on a card's chart.
EARLIER_OPACITY = 0.3
_PRE = "font-size:11px;margin:0;white-space:pre-wrap;overflow-wrap:anywhere;word-break:break-word"
_WRAP = "white-space:normal;overflow-wrap:anywhere;word-break:break-word;line-height:1.35;min-width:0"


def can_resume(record: JobRecord) -> bool:
    """Whether a Resume button is offered for ``record``: ended (stopped, failed) or of unknown
    outcome, and not resumed already."""
    return record.state in RESUMABLE and not record.resumed_by


class ResumeFlow:
    """The two steps of a resume from a button: :meth:`preview`, then :meth:`confirm`.

    Attributes:
        job: the job to resume.
        fresh: the preview found nothing to resume from and offers a fresh start.
        plan: the previewed :class:`tune_magic.job.resume.ResumePlan`, or ``None``.
        new: the job the confirmed resume started, or ``None``.
    """

    def __init__(self, job) -> None:
        self.job = job
        self.fresh = False
        self.plan = None
        self.new = None

    def preview(self, *, compact: bool = False) -> tuple[str, str | None]:
        """Run the pre-flight (a dry run). Returns ``(html, confirm label)``: the summary and
        "Resume now" / "Start again", or the refusal and ``None`` (nothing to confirm). ``compact``:
        lines that wrap anywhere and no command line (a table row's narrow line)."""
        from tune_magic.job.resume import resume

        self.plan, self.fresh = None, False
        try:
            self.plan = resume(self.job, dry_run=True)
        except NothingToResume as exc:
            if not exc.fresh_start:
                return _refused(exc), None
            self.fresh = True
            try:
                self.plan = resume(self.job, dry_run=True, fresh=True)
            except UserError as again:
                return _refused(again), None
        except UserError as exc:
            return _refused(exc), None
        label = "Start again" if self.fresh else "Resume now"
        lines = self.plan.summary().splitlines()
        if compact:
            shown = "<br>".join(html.escape(line) for line in lines if not line.startswith("  command: "))
            return f"<div class='tm-resume-plan' style='font-size:11px;{_WRAP}'>{shown}</div>", label
        return f"<pre class='tm-resume-plan' style='{_PRE}'>{html.escape(chr(10).join(lines))}</pre>", label

    def confirm(self) -> str:
        """Resume for real (every check again); return the html saying what happened."""
        from tune_magic.job.resume import resume

        try:
            self.new = resume(self.job, fresh=self.fresh)
        except UserError as exc:
            return _refused(exc)
        return (f"<span class='tm-resumed' style='color:#2ca02c'>resumed as job <code>{html.escape(self.new.id)}"
                "</code></span>")


def _refused(exc: Exception) -> str:
    return (f"<div class='tm-resume-refused' style='color:#d62728;{_WRAP}'>"
            f"cannot resume: {html.escape(str(exc))}</div>")


class ResumeControl(widgets.VBox):
    """A card's Resume control, shown for a stopped, failed or ``unknown`` job not resumed yet.

    Public child widgets (stable names): ``resume_button`` ("Resume": shows the pre-flight),
    ``confirm_button`` ("Resume now", or "Start again"), ``cancel_button``, ``preview`` (HTML: the
    pre-flight's summary, a refusal, or the new job's id) and ``resumed`` (a Box holding the new
    job's card). ``flow`` is the :class:`ResumeFlow`.

    Args:
        job: the job the card shows.
        card: makes the new job's card (``JobCard``).
    """

    def __init__(self, job, card: Callable) -> None:
        self.flow = ResumeFlow(job)
        self._card = card
        self.resume_button = widgets.Button(description="Resume", button_style="info", icon="repeat",
                                            tooltip=f"Resume job {job.id} from its last checkpoint")
        self.confirm_button = widgets.Button(description="Resume now", button_style="success",
                                             layout=widgets.Layout(display="none"))
        self.cancel_button = widgets.Button(description="Cancel", layout=widgets.Layout(display="none"))
        self.preview = widgets.HTML(layout=widgets.Layout(display="none", min_width="0"))
        self.resumed = widgets.Box(layout=widgets.Layout(display="none", min_width="0"))
        self.resume_button.on_click(self._on_resume)
        self.confirm_button.on_click(self._on_confirm)
        self.cancel_button.on_click(self._on_cancel)
        super().__init__(children=[widgets.HBox([self.resume_button, self.confirm_button, self.cancel_button]),
                                   self.preview, self.resumed], layout=widgets.Layout(display="none", min_width="0"))
        self.add_class("tm-resume")

    def show_for(self, record: JobRecord) -> None:
        """Show the control while ``record`` can be resumed (or a resume from it is under way
        here); traits only."""
        shown = can_resume(record) or self.flow.plan is not None or self.flow.new is not None
        want = None if shown else "none"
        if self.layout.display != want:
            self.layout.display = want

    def _on_resume(self, _button=None) -> None:
        text, label = self.flow.preview()
        self.preview.value = text
        self.preview.layout.display = None
        self.confirm_button.description = label or "Resume now"
        self.confirm_button.layout.display = None if label else "none"
        self.cancel_button.layout.display = None if label else "none"

    def _on_confirm(self, _button=None) -> None:
        self.confirm_button.disabled = self.resume_button.disabled = True
        self.preview.value += self.flow.confirm()
        if self.flow.new is None:
            self.confirm_button.disabled = self.resume_button.disabled = False
            return
        self.confirm_button.layout.display = self.cancel_button.layout.display = "none"
        self.resume_button.layout.display = "none"
        self.resumed.children = (self._card(self.flow.new),)
        self.resumed.layout.display = None

    def _on_cancel(self, _button=None) -> None:
        self.flow.plan = None
        self.preview.layout.display = "none"
        self.confirm_button.layout.display = self.cancel_button.layout.display = "none"


def resume_row(row) -> None:
    """A jobs-table row's Resume button was clicked: the first click shows the pre-flight on the
    row's reason line and turns the button into "Confirm" ("Start again" for a fresh start); the
    second resumes. ``row`` has ``job``, ``resume_button`` and ``reason`` (views' ``_Row``)."""
    button = row.resume_button
    flow = getattr(row, "resume_flow", None)
    if button.description == "Resume" or flow is None:
        row.resume_flow = flow = ResumeFlow(row.job)
        text, label = flow.preview(compact=True)
        button.description = label and ("Confirm" if label == "Resume now" else label) or "Resume"
    else:
        button.disabled = True
        text = flow.confirm()
        button.description = "Resumed" if flow.new is not None else "Resume"
        button.disabled = flow.new is not None
    row.reason.value = f"<div class='tm-reason tm-reason-resume'>{text}</div>"
    row.reason.layout.display = None


def lineage_marks(figure, line):
    """Add to a card's loss chart the earlier runs' points (dimmed, under this job's) and the
    markers where a run resumed (dashed vertical lines over the whole height); return
    ``(earlier, markers)``, the two bqplot ``Lines`` marks. ``line`` is the job's own loss mark."""
    import bqplot

    scales = line.scales
    earlier = bqplot.Lines(x=[], y=[], scales=scales, colors=list(line.colors), opacities=[EARLIER_OPACITY],
                           marker="circle", marker_size=16, display_legend=False)
    markers = bqplot.Lines(x=[], y=[], scales={"x": scales["x"], "y": bqplot.LinearScale(min=0.0, max=1.0)},
                           colors=["#7f7f7f"], line_style="dashed")
    figure.marks = [earlier, *figure.marks, markers]
    return earlier, markers


def show_lineage(earlier, markers, snap) -> None:
    """Set the lineage marks from a :class:`tune_magic.ui.watch.JobSnapshot` (traits only)."""
    if list(earlier.x) != list(snap.earlier_steps):
        earlier.x, earlier.y = list(snap.earlier_steps), list(snap.earlier_losses)
    wanted = [[float(s), float(s)] for s in snap.resumed_at]
    if marker_steps(markers) != wanted:
        markers.x, markers.y = wanted, [[0.0, 1.0] for _ in wanted]


def marker_steps(markers) -> list[list[float]]:
    """The markers' ``[[x, x], ...]`` (bqplot keeps a single line's 2-D array as 1-D)."""
    import numpy as np

    return np.asarray(markers.x, dtype=float).reshape(-1, 2).tolist()
