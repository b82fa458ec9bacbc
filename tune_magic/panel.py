"""The launch panel: build a run by clicking, see the exact command, launch, compare runs.

Everything goes through the same public API as the magics (:func:`tune_magic.build_plan` for the
preview, :func:`tune_magic.launch` for Launch), so the preview is exactly what runs (with a
``<job-id>`` placeholder where the launch puts the job's id).
"""

from __future__ import annotations

import html
import os
import threading
from pathlib import Path

import ipywidgets as widgets

from . import catalog
from .cellbody import parse_cell_body
from .command import PlanError, build_plan
from .gpus import visible_gpus
from .jobctl import Job, jobs, launch
from .views import JobsTable
from .watch import JobWatcher

#: How deep recipe/config files are looked for under the working directory.
SCAN_DEPTH = 2
_SKIP_DIRS = {".venv", "venv", "node_modules", "__pycache__", ".git", "site-packages"}
_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def _files_under(root: Path, suffix: str, depth: int = SCAN_DEPTH) -> list[str]:
    """Relative paths of ``*suffix`` files under ``root``, at most ``depth`` folders deep."""
    out: list[str] = []

    def walk(d: Path, level: int) -> None:
        try:
            entries = sorted(d.iterdir())
        except OSError:
            return
        for e in entries:
            if e.name.startswith(".") or e.name in _SKIP_DIRS:
                continue
            if e.is_dir() and level < depth:
                walk(e, level + 1)
            elif e.is_file() and e.suffix == suffix:
                out.append(e.relative_to(root).as_posix())

    walk(root, 0)
    return out


class Panel(widgets.VBox):
    """A form to build and launch a run, the jobs table, and a chart comparing loss curves.

    Public child widgets (stable names): ``recipe``, ``config``, ``nproc``, ``gpus``,
    ``endpoint``, ``name``, ``overrides``, ``command_preview``, ``error``, ``launch_button``,
    ``jobs_table``, ``compare`` (jobs shown in the chart), ``chart``. ``series`` maps job id ->
    list of (step, loss) shown in the chart; ``launched`` lists the jobs launched from this panel.

    Args:
        cwd: working directory for relative paths and launched jobs (default: the current one).
    """

    def __init__(self, cwd: str | os.PathLike | None = None):
        self.cwd = Path(os.getcwd() if cwd is None else cwd).absolute()
        self.series: dict[str, list[tuple[int, float]]] = {}
        self.launched: list[Job] = []
        self._watchers: dict[str, JobWatcher] = {}
        self._lines: dict[str, object] = {}
        self._lock = threading.Lock()

        recipes = [r.name for r in catalog.recipes()] + _files_under(self.cwd, ".py")
        self.recipe = widgets.Combobox(options=recipes, placeholder="recipe name or .py path",
                                       description="recipe", ensure_option=False)
        self.config = widgets.Combobox(options=[], placeholder="config name or .yaml path",
                                       description="config", ensure_option=False)
        self.nproc = widgets.BoundedIntText(value=1, min=1, max=1024, description="nproc/node")
        self.gpus = widgets.SelectMultiple(options=[], description="GPUs", rows=4)
        self.endpoint = widgets.Text(placeholder="blank = automatic (--standalone)", description="endpoint")
        self.name = widgets.Text(placeholder="optional", description="name")
        self.overrides = widgets.Textarea(placeholder="key=value, one a line", description="overrides",
                                          layout=widgets.Layout(width="60%", height="6em"))
        self.command_preview = widgets.Textarea(disabled=True, description="command",
                                                layout=widgets.Layout(width="100%", height="6em"))
        self.error = widgets.HTML()
        self.launch_button = widgets.Button(description="Launch", button_style="success", icon="play", disabled=True)
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh")
        self.compare = widgets.SelectMultiple(options=[], description="compare", rows=5)
        self.chart = self._make_chart()
        self.jobs_table = JobsTable()

        self.refresh_gpus()
        for w in (self.recipe, self.config, self.nproc, self.gpus, self.endpoint, self.overrides):
            w.observe(self._on_change, names="value")
        self.recipe.observe(self._on_recipe, names="value")
        self.launch_button.on_click(self._on_launch)
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.compare.observe(self._on_compare, names="value")
        self._sync_compare_options()

        form = widgets.VBox([self.recipe, self.config, widgets.HBox([self.nproc, self.gpus]), self.endpoint,
                             self.name, self.overrides, self.command_preview, self.error, self.launch_button])
        super().__init__(children=[form, widgets.HTML("<b>Jobs</b>"), self.refresh_button, self.jobs_table,
                                   widgets.HTML("<b>Compare loss curves</b>"), self.compare, self.chart])
        self.add_class("tune-magic-panel")
        self.update_preview()

    # -- form -----------------------------------------------------------------------------------
    def refresh_gpus(self) -> None:
        """List the GPUs this kernel may use (its CUDA_VISIBLE_DEVICES; nvidia-smi, never CUDA),
        each labelled with its physical id, marking those used by live jobs."""
        busy = {}
        for j in jobs():
            if j.record.state.is_live:
                r = j.record
                for g in (r.physical_gpus if r.physical_gpus is not None else r.gpus) or []:
                    busy[str(g)] = j.id
        self.gpus.options = [(f"{g.label} (busy: {busy[str(g.physical)]})" if str(g.physical) in busy else g.label,
                              g.typed) for g in visible_gpus()]

    def _on_recipe(self, change) -> None:
        name = change["new"]
        names: list[str] = []
        try:
            entry = catalog.find_recipe(name)
        except catalog.AmbiguousNameError:
            entry = None
        if entry is not None:
            names = list(entry.configs) + [c for c in catalog.shipped_configs_for(entry.name) if c not in entry.configs]
        self.config.options = names + _files_under(self.cwd, ".yaml")

    def _on_change(self, _change=None) -> None:
        self.update_preview()

    def args(self) -> list[str]:
        """The ``tune run``-style arguments the form describes.

        Raises:
            PlanError: an override line that is not ``key=value``.
        """
        tokens: list[str] = []
        if self.endpoint.value.strip():
            tokens += ["--rdzv-endpoint", self.endpoint.value.strip()]
        if self.nproc.value > 1:  # with GPUs chosen and nproc left at 1, the GPU count sets it
            tokens += ["--nproc_per_node", str(self.nproc.value)]
        tokens.append(self.recipe.value.strip())
        if self.config.value.strip():
            tokens += ["--config", self.config.value.strip()]
        body = parse_cell_body(self.overrides.value)
        if body.config_yaml is not None:
            raise PlanError("overrides must be key=value lines (one a line)")
        return tokens + body.overrides

    def update_preview(self) -> None:
        """Rebuild the command preview; show the builder's error and disable Launch when invalid."""
        if not self.recipe.value.strip():
            self.command_preview.value = ""
            self.error.value = "<span class='tm-hint'>choose a recipe and a config</span>"
            self.launch_button.disabled = True
            return
        try:
            plan = build_plan(self.args(), cwd=self.cwd, gpus=list(self.gpus.value) or None)
        except PlanError as exc:
            self.command_preview.value = ""
            self.error.value = f"<span class='tm-error' style='color:#d62728'>{html.escape(str(exc))}</span>"
            self.launch_button.disabled = True
            return
        self.command_preview.value = plan.command_line()
        self.error.value = ""
        self.launch_button.disabled = False

    # -- launching ------------------------------------------------------------------------------
    def launch(self) -> Job | None:
        """Launch what the form describes (as the Launch button does); return the job, or ``None``
        with the error shown inline."""
        try:
            result = launch(self.args(), name=self.name.value.strip() or None,
                            gpus=list(self.gpus.value) or None, cwd=self.cwd)
        except PlanError as exc:
            self.error.value = f"<span class='tm-error' style='color:#d62728'>{html.escape(str(exc))}</span>"
            return None
        if not isinstance(result, Job):  # TUNE_MAGIC_DRY_RUN=1
            self.error.value = f"<span class='tm-hint'>dry run (TUNE_MAGIC_DRY_RUN=1): nothing started</span>"
            return None
        self.launched.append(result)
        self.refresh()
        self.compare.value = tuple(self.compare.value) + (result.id,)
        return result

    def _on_launch(self, _button=None) -> None:
        self.launch()

    def refresh(self) -> None:
        """Re-read the jobs (table, compare list, GPU list)."""
        table = JobsTable()
        self.children = tuple(table if c is self.jobs_table else c for c in self.children)
        self.jobs_table = table
        self._sync_compare_options()
        self.refresh_gpus()

    def _sync_compare_options(self) -> None:
        selected = self.compare.value
        self.compare.options = [(f"{j.name} {j.id}", j.id) for j in jobs()]
        self.compare.value = tuple(v for v in selected if v in {o[1] for o in self.compare.options})

    # -- the comparison chart --------------------------------------------------------------------
    def _make_chart(self):
        import bqplot

        self._x, self._y = bqplot.LinearScale(), bqplot.LinearScale()
        return bqplot.Figure(
            marks=[], axes=[bqplot.Axis(scale=self._x, label="step"), bqplot.Axis(scale=self._y, side="left", label="loss")],
            legend_location="top-right", layout=widgets.Layout(width="100%", height="300px"),
            fig_margin={"top": 10, "bottom": 40, "left": 60, "right": 10},
        )

    def _on_compare(self, change) -> None:
        import bqplot

        wanted = set(change["new"])
        for job_id in list(self._watchers):
            if job_id not in wanted:
                self._watchers.pop(job_id).stop(timeout=0)
                self._lines.pop(job_id, None)
                self.series.pop(job_id, None)
        for i, job_id in enumerate(sorted(wanted - set(self._watchers))):
            try:
                job = next(j for j in self.launched if j.id == job_id)
            except StopIteration:
                from .jobctl import get_job

                job = get_job(job_id)
            colour = _PALETTE[len(self._lines) % len(_PALETTE)]
            line = bqplot.Lines(x=[], y=[], scales={"x": self._x, "y": self._y}, colors=[colour],
                                labels=[job.name + " " + job.id[-6:]], display_legend=True)
            self._lines[job_id] = line
            self.series[job_id] = []
            self._watchers[job_id] = JobWatcher(job, lambda snap, jid=job_id: self._show(jid, snap), interval_s=0.5,
                                                tail_lines=1).start()
        self.chart.marks = [self._lines[j] for j in sorted(self._lines)]

    def _show(self, job_id: str, snap) -> None:
        """Watcher-thread sink: set the curve's traits and the series (no printing)."""
        line = self._lines.get(job_id)
        if line is None:
            return
        self.series[job_id] = list(zip(snap.steps, snap.losses))
        if snap.steps:
            line.x, line.y = list(snap.steps), list(snap.losses)

    def close(self) -> None:
        """Stop the chart's watchers (jobs keep running) and close the widgets."""
        for w in getattr(self, "_watchers", {}).values():
            w.stop(timeout=0)
        super().close()
