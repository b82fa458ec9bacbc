"""The launch panel: build a run by clicking, see the exact command, launch, compare runs.

Everything goes through the same public API as the magics (:func:`tune_magic.build_plan` for the
preview, :func:`tune_magic.launch` for Launch; another scheduler's preview is ``launch(...,
dry_run=True)``), so the preview is exactly what runs (with a ``<job-id>`` placeholder where the
launch puts the job's id). Where another scheduler can be used from here (its ``available()``), the
form offers it, with fields made from the options it declares.
"""

from __future__ import annotations

import html
import os
import threading
from pathlib import Path

import ipywidgets as widgets

from tune_magic.config import catalog
from tune_magic.config.cellbody import parse_cell_body
from tune_magic.plan.model import JOB_ID_PLACEHOLDER
from tune_magic.errors import PlanError
from tune_magic.job.launch import build_plan
from tune_magic.gpus import visibility
from tune_magic.job import Job, jobs
from tune_magic.job.launch import launch
from tune_magic import schedulers
from tune_magic.ui.panelform import (MARGIN, option_rows, option_value, option_widget, val_split_field,
                                     val_split_options, warning_divs, wrap_row)
from tune_magic.ui.textfmt import cut
from tune_magic.ui.charts import int_ticks  # one tick rule for card and comparison chart
from tune_magic.ui.views import JobsTable
from tune_magic.ui.watch import JobWatcher

#: How deep recipe/config files are looked for under the working directory.
SCAN_DEPTH = 2
_SKIP_DIRS = {".venv", "venv", "node_modules", "__pycache__", ".git", "site-packages"}
_WRAP = "white-space:normal;overflow-wrap:anywhere;line-height:1.35"
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
    """A form to build and launch a run, the live jobs table, and a chart comparing loss curves.

    Public child widgets (stable names): ``recipe``, ``config``, ``nproc``, ``gpus`` (where there
    is no GPU: hidden and disabled, with ``gpu_note`` in its place saying so), ``endpoint``, ``name``,
    ``overrides``, ``val_split`` (``--val-split``: the fraction of the training data held out as
    ``dataset_val``, e.g. ``0.1``; blank: none; for a job and a sweep alike), ``command_preview``,
    ``error``, ``launch_button``, ``jobs_table`` (a live :class:`~tune_magic.ui.views.JobsTable`),
    ``compare`` (jobs shown in the chart), ``chart`` (integer step ticks; hidden until a chosen job
    logged a step, ``chart_note`` then says why) with ``legend``; :meth:`comparison` is the chart
    with its legend on its own. ``sweep_switch`` (a Checkbox):
    on, every override whose value is a comma list (or ``range(...)``) is an axis, ``max_parallel``
    (shown then) caps the trials at once, the preview shows the number of trials and the first
    trial's command, and Launch starts the sweep (:func:`tune_magic.sweep`; ``sweeps`` lists the
    sweeps launched here).
    Where another scheduler is available from here (``schedulers_offered`` beyond ``local``) also
    ``scheduler`` (a dropdown) and, shown for the chosen one, ``scheduler_fields[name][option]``:
    one widget per option it declares (counts: 0 is not asked; text: blank is not asked, with the
    scheduler's suggested values, e.g. SLURM's partitions from ``sinfo``; lists: one value a line),
    and ``script_preview`` (its job script; ``command_preview`` then holds the submit command).
    ``series`` maps job id -> list of
    (step, loss) shown in the chart; ``launched`` lists the jobs launched from this panel.

    Args:
        cwd: working directory for relative paths and launched jobs (default: the current one).
    """

    def __init__(self, cwd: str | os.PathLike | None = None):
        self.cwd = Path(os.getcwd() if cwd is None else cwd).absolute()
        self.series: dict[str, list[tuple[int, float]]] = {}
        self.launched: list[Job] = []
        self.sweeps: list = []
        self._watchers: dict[str, JobWatcher] = {}
        self._lines: dict[str, object] = {}
        self._labels: dict[str, str] = {}
        self._lock = threading.Lock()
        self._make_form()
        self._make_scheduler_fields()
        self.refresh_gpus()
        self._connect()
        self._sync_compare_options()
        self._set_ticks()  # no curve yet: the chart hidden, a line saying so
        scheduler_rows = ([wrap_row([self.scheduler, self.scheduler_note]), *self._field_boxes.values()]
                          if len(self.schedulers_offered) > 1 else [])
        self._gpu_row = wrap_row([self.nproc, widgets.VBox([self.gpus, self.gpu_note])])
        form = widgets.VBox([self.recipe, self.config, *scheduler_rows, self._gpu_row, self.endpoint, self.name,
                             self.overrides, self.val_split, wrap_row([self.sweep_switch, self.max_parallel]),
                             self.command_preview, self.script_preview, self.error,
                             self.launch_button], layout=widgets.Layout(width="100%"))
        super().__init__(children=[form, widgets.HTML("<b>Jobs</b>"), self.refresh_button, self.jobs_table,
                                   widgets.HTML("<b>Compare loss curves</b>"), self.compare, self.chart_note, self.legend,
                                   self.chart],
                         layout=widgets.Layout(width="100%", max_width="100%"))
        self.add_class("tune-magic-panel")
        self._show_scheduler_fields()
        self.update_preview()

    def _make_form(self) -> None:
        """The form's, the table's and the chart's widgets (laid out by ``__init__``)."""
        recipes = [r.name for r in catalog.recipes()] + _files_under(self.cwd, ".py")
        wide = dict(width="100%", max_width="34em", margin=MARGIN)
        self.recipe = widgets.Combobox(options=recipes, placeholder="recipe name or .py path",
                                       description="recipe", ensure_option=False, layout=widgets.Layout(**wide))
        self.config = widgets.Combobox(options=[], placeholder="config name or .yaml path",
                                       description="config", ensure_option=False, layout=widgets.Layout(**wide))
        self.nproc = widgets.BoundedIntText(value=1, min=1, max=1024, description="nproc/node",
                                            layout=widgets.Layout(width="12em"))
        self.gpus = widgets.SelectMultiple(options=[], description="GPUs", rows=4,
                                           layout=widgets.Layout(width="100%", max_width="22em", margin=MARGIN))
        self.gpu_note = widgets.HTML(description="GPUs", layout=widgets.Layout(display="none", max_width="100%"))
        self.endpoint = widgets.Text(placeholder="host:port, or blank for --standalone", description="endpoint",
                                     layout=widgets.Layout(**wide))
        self.name = widgets.Text(placeholder="optional", description="name", layout=widgets.Layout(**wide))
        self.val_split = val_split_field()
        self.overrides = widgets.Textarea(placeholder="key=value, one a line", description="overrides",
                                          layout=widgets.Layout(width="100%", max_width="46em", height="6em", margin=MARGIN))
        # as many rows as the command needs (update_preview): a fixed height cut its last line off
        self.command_preview = widgets.Textarea(disabled=True, description="command", rows=3,
                                                layout=widgets.Layout(width="100%", margin=MARGIN))
        self.script_preview = widgets.Textarea(disabled=True, description="script",
                                               layout=widgets.Layout(width="100%", height="18em", display="none", margin=MARGIN))
        self.sweep_switch = widgets.Checkbox(value=False, description="sweep", indent=True,
                                             tooltip="comma lists (and range(...)) become axes: one job per combination")
        self.max_parallel = widgets.BoundedIntText(value=1, min=1, max=1000, description="at once",
                                                   layout=widgets.Layout(width="12em", display="none"))
        self.error = widgets.HTML()
        self.launch_button = widgets.Button(description="Launch", button_style="success", icon="play", disabled=True)
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh")
        self.compare = widgets.SelectMultiple(options=[], description="compare", rows=5,
                                              layout=widgets.Layout(width="100%", margin=MARGIN))
        self.legend = widgets.HTML()
        self.legend.add_class("tm-legend")
        self.chart_note = widgets.HTML()
        self.chart_note.add_class("tm-chart-note")
        self.chart = self._make_chart()
        self.jobs_table = JobsTable()

    def _make_scheduler_fields(self) -> None:
        """The scheduler dropdown and each offered scheduler's option fields (from its option rows)."""
        self.schedulers_offered = [n for n in schedulers.names()
                                   if schedulers.get_or_missing(n).runs_on_this_machine
                                   or schedulers.get_or_missing(n).available(os.environ) is None]
        chosen = schedulers.default_name(os.environ)
        notes = [(n, schedulers.get_or_missing(n).status_note(os.environ)) for n in self.schedulers_offered
                 if not schedulers.get_or_missing(n).runs_on_this_machine]
        # e.g. sbatch on PATH but no SLURM controller answering: offered, and said so next to the choice
        self.scheduler_note = widgets.HTML("".join(
            f"<div class='tm-scheduler-note' style='color:#8c564b;{_WRAP}'>{html.escape(n)}: {html.escape(note)}</div>"
            for n, note in notes if note), layout=widgets.Layout(min_width="0", max_width="40em", margin="0 0 0 1em"))
        self.scheduler = widgets.Dropdown(options=self.schedulers_offered,
                                          value=chosen if chosen in self.schedulers_offered else "local",
                                          description="scheduler", layout=widgets.Layout(width="16em"))
        self.scheduler_fields: dict[str, dict[str, widgets.Widget]] = {}
        self._field_boxes: dict[str, widgets.VBox] = {}
        self._choices_listed: set[str] = set()  # e.g. sinfo is asked when the fields are first shown
        for name, opts in schedulers.options():
            if name in self.schedulers_offered and opts:
                fields = self.scheduler_fields[name] = {o.name: option_widget(o) for o in opts}
                box = self._field_boxes[name] = widgets.VBox(option_rows(opts, fields), layout=widgets.Layout(display="none"))
                box.add_class(f"tm-{name}-fields")

    def _connect(self) -> None:
        """Observe the form's widgets and the buttons."""
        option_widgets = [w for fields in self.scheduler_fields.values() for w in fields.values()]
        for w in (self.recipe, self.config, self.nproc, self.gpus, self.endpoint, self.overrides, self.val_split,
                  self.scheduler, self.sweep_switch, self.max_parallel, *option_widgets):
            w.observe(self._on_change, names="value")
        self.recipe.observe(self._on_recipe, names="value")
        self.launch_button.on_click(self._on_launch)
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.compare.observe(self._on_compare, names="value")

    # -- form -----------------------------------------------------------------------------------
    def refresh_gpus(self) -> None:
        """List the GPUs this kernel may use (its CUDA_VISIBLE_DEVICES; nvidia-smi, never CUDA),
        each labelled with its physical id, marking those used by live jobs; with none, say so
        (``gpu_note``) and disable the list."""
        busy = {}
        for j in jobs():
            if j.record.state.is_live:
                r = j.record
                for g in (r.physical_gpus if r.physical_gpus is not None else r.gpus) or []:
                    busy[str(g)] = j.id
        seen = visibility()
        self.gpus.options = [(f"{g.label} (busy: {busy[str(g.physical)]})" if str(g.physical) in busy else g.label,
                              g.typed) for g in seen.gpus]
        self.gpus.disabled = not seen.gpus
        # with no GPU, a note in the list's place (same label) says so, instead of an empty list
        self.gpus.layout.display = None if seen.gpus else "none"
        if seen.gpus:
            self.gpu_note.value, self.gpu_note.layout.display = "", "none"
        else:
            why = seen.note or ("nvidia-smi lists none" if seen.setting is None
                                else f"CUDA_VISIBLE_DEVICES={seen.setting!r}")
            self.gpu_note.value = (f"<span class='tm-gpu-note' style='color:#7f7f7f;{_WRAP}'>no GPU found "
                                   f"({html.escape(why)}); jobs run on CPUs</span>")
            self.gpu_note.layout.display = None

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

    def _on_change(self, change=None) -> None:
        if change is not None and change.get("owner") is self.scheduler:
            self._show_scheduler_fields()
        self.max_parallel.layout.display = None if self.sweep_switch.value else "none"
        self.update_preview()

    def _elsewhere(self) -> bool:
        """Whether the chosen scheduler runs the job elsewhere than this machine's local scheduler."""
        return not schedulers.get_or_missing(self.scheduler.value).runs_on_this_machine

    def _show_scheduler_fields(self) -> None:
        chosen = self.scheduler.value
        fields = self.scheduler_fields.get(chosen, {})
        if chosen not in self._choices_listed:
            self._choices_listed.add(chosen)
            for opt in dict(schedulers.options()).get(chosen, ()):
                if opt.choices is not None and opt.name in fields:
                    fields[opt.name].options = list(opt.choices(os.environ))
        for name, box in self._field_boxes.items():
            box.layout.display = None if name == chosen else "none"
        self.script_preview.layout.display = None if self._elsewhere() else "none"
        self.endpoint.layout.display = "none" if self._elsewhere() else None  # the scheduler picks the endpoint
        # another scheduler allocates the job's GPUs: the kernel's own GPUs are not the job's
        self._gpu_row.children[1].layout.display = "none" if self._elsewhere() else None

    def args(self) -> list[str]:
        """The ``tune run``-style arguments the form describes.

        Raises:
            PlanError: an override line that is not ``key=value``.
        """
        tokens: list[str] = []
        if self.endpoint.value.strip() and not self._elsewhere():
            tokens += ["--rdzv-endpoint", self.endpoint.value.strip()]
        if self.nproc.value > 1:  # with GPUs chosen and nproc left at 1, the GPU count sets it
            tokens += ["--nproc_per_node", str(self.nproc.value)]
        tokens.append(self.recipe.value.strip())
        if self.config.value.strip():
            tokens += ["--config", self.config.value.strip()]
        body = parse_cell_body(self.overrides.value, sweep=self.sweep_switch.value)
        if body.config_yaml is not None or body.sweep:
            raise PlanError("overrides must be key=value lines (one a line)")
        return tokens + (list(body.words) if self.sweep_switch.value else body.overrides)  # words keep their quotes

    def scheduler_options(self) -> dict:
        """Keyword arguments of :func:`tune_magic.launch` for the chosen scheduler: ``scheduler`` and
        the options filled in (0, blank and unticked: not asked); ``{}`` when that is the scheduler a
        launch uses anyway (:func:`tune_magic.schedulers.default_name`) with no option asked. A
        scheduler that runs the job here (a plug-in built on the local one) still gets its options."""
        opts: dict = {"scheduler": self.scheduler.value}
        for opt in dict(schedulers.options()).get(self.scheduler.value, ()):
            value = option_value(opt, self.scheduler_fields[self.scheduler.value][opt.name])
            if value is not None:
                opts[opt.name] = value
        if len(opts) == 1 and self.scheduler.value == schedulers.default_name(os.environ):
            return {}
        return opts

    def _gpu_choice(self):
        return None if self._elsewhere() else (list(self.gpus.value) or None)

    def update_preview(self) -> None:
        """Rebuild the command preview (for another scheduler: its submit command and job script);
        show the builder's error and disable Launch when invalid."""
        if not self.recipe.value.strip():
            self.command_preview.value = self.script_preview.value = ""
            self.error.value = "<span class='tm-hint'>choose a recipe and a config</span>"
            self.launch_button.disabled = True
            return
        notes: list[str] = []
        try:
            if self.sweep_switch.value:
                notes = self._sweep_preview()
            elif self.scheduler_options() or val_split_options(self.val_split):
                # the chosen scheduler shapes the command, --val-split adds overrides: a dry run builds it
                import warnings

                with warnings.catch_warnings(record=True):
                    warnings.simplefilter("always")
                    plan = launch(self.args(), cwd=self.cwd, dry_run=True, gpus=self._gpu_choice(),
                                  **val_split_options(self.val_split), **self.scheduler_options())
                hide = (lambda text: text.replace(plan.job_id, JOB_ID_PLACEHOLDER))
                self.command_preview.value = hide(plan.command_line())
                self.script_preview.value = hide(plan.batch_script or "")
                notes = [hide(n) for n in plan.warnings]
            else:
                plan = build_plan(self.args(), cwd=self.cwd, gpus=self._gpu_choice())
                self.command_preview.value = plan.command_line()
                self.script_preview.value = ""
            self.command_preview.rows = preview_rows(self.command_preview.value)
        except PlanError as exc:
            self.command_preview.value = self.script_preview.value = ""
            self.error.value = f"<span class='tm-error' style='color:#d62728'>{html.escape(str(exc))}</span>"
            self.launch_button.disabled = True
            return
        self.error.value = warning_divs(notes)
        self.launch_button.disabled = False

    # -- launching ------------------------------------------------------------------------------
    def _sweep_options(self) -> dict:
        return dict(gpus=self._gpu_choice(), max_parallel=self.max_parallel.value, cwd=self.cwd,
                    **val_split_options(self.val_split), **self.scheduler_options())

    def _sweep_preview(self) -> list[str]:
        """The sweep's preview: the number of trials, the axes, the first trial's command."""
        import warnings

        from tune_magic.sweeping.create import preview

        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            dry = preview(self.args(), **self._sweep_options())
        first = dry.plans[0]
        grid = " x ".join(f"{len(a)} {a.key}" for a in dry.plan.axes)
        self.command_preview.value = (f"# {len(dry)} trials ({grid}), {dry.slots.max_parallel} at a time; trial 0: "
                                      f"{dry.plan.trials[0].name}\n" + first.command_line().replace(
                                          first.job_id or JOB_ID_PLACEHOLDER, JOB_ID_PLACEHOLDER))
        self.script_preview.value = first.batch_script or ""
        return list(dry.warnings)

    def launch(self):
        """Launch what the form describes (as the Launch button does); return the job (with the
        sweep switch on: the :class:`~tune_magic.sweeping.sweep.Sweep`), or ``None`` with the
        error shown inline. The job's row appears in the jobs table at once (a sweep's trials
        as they start)."""
        if self.sweep_switch.value:
            return self._launch_sweep()
        import warnings

        try:
            # a button's callback has no cell to print warnings in: the record's (every warning of the
            # launch, the scheduler's too) replace the preview's, naming the job's real paths
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                result = launch(self.args(), name=self.name.value.strip() or None, gpus=self._gpu_choice(),
                                cwd=self.cwd, **val_split_options(self.val_split), **self.scheduler_options())
        except PlanError as exc:
            self.error.value = f"<span class='tm-error' style='color:#d62728'>{html.escape(str(exc))}</span>"
            return None
        if not isinstance(result, Job):  # TUNE_MAGIC_DRY_RUN=1
            self.error.value = "<span class='tm-hint'>dry run (TUNE_MAGIC_DRY_RUN=1): nothing started</span>"
            return None
        self.error.value = warning_divs(result.record.warnings)
        self.launched.append(result)
        self.jobs_table.add(result)
        self._sync_compare_options()
        self.refresh_gpus()
        self.compare.value = tuple(self.compare.value) + (result.id,)
        return result

    def _launch_sweep(self):
        from tune_magic.sweeping.create import sweep

        try:
            result = sweep(self.args(), name=self.name.value.strip() or None, **self._sweep_options())
        except PlanError as exc:
            self.error.value = f"<span class='tm-error' style='color:#d62728'>{html.escape(str(exc))}</span>"
            return None
        if not hasattr(result, "wait"):  # TUNE_MAGIC_DRY_RUN=1
            self.error.value = "<span class='tm-hint'>dry run (TUNE_MAGIC_DRY_RUN=1): nothing started</span>"
            return None
        self.sweeps.append(result)
        self.error.value = (f"<span class='tm-hint'>sweep <code>{html.escape(result.id)}</code>: "
                            f"{len(result.record.trials)} trials, {result.max_parallel} at a time (%tune_logs "
                            f"{html.escape(result.id)} shows its card)</span>")
        return result

    def _on_launch(self, _button=None) -> None:
        self.launch()

    def refresh(self) -> None:
        """Re-read the jobs (a new table, the compare list, the GPU list)."""
        table = JobsTable()
        old, self.jobs_table = self.jobs_table, table
        self.children = tuple(table if c is old else c for c in self.children)
        old.close()
        self._sync_compare_options()
        self.refresh_gpus()

    def _sync_compare_options(self) -> None:
        selected = self.compare.value
        self.compare.options = [(f"{cut(j.name)}  {j.id}", j.id) for j in jobs()]
        self.compare.value = tuple(v for v in selected if v in {o[1] for o in self.compare.options})

    # -- the comparison chart --------------------------------------------------------------------
    def _make_chart(self):
        import bqplot

        self._x, self._y = bqplot.LinearScale(), bqplot.LinearScale()
        self._x_axis = bqplot.Axis(scale=self._x, label="step", tick_format="d", tick_values=[])
        # the legend is an HTML line above the chart (legend), never drawn over the curves
        return bqplot.Figure(
            marks=[], axes=[self._x_axis, bqplot.Axis(scale=self._y, side="left", label="loss")],
            layout=widgets.Layout(width="100%", height="300px", margin=MARGIN), padding_y=0.05,
            fig_margin={"top": 10, "bottom": 40, "left": 60, "right": 20},
        )

    def comparison(self) -> widgets.VBox:
        """The comparison chart as a notebook shows it apart from the panel: the line saying why it
        is empty, the legend (which curve is which job) above the plot, and the chart."""
        return widgets.VBox([self.chart_note, self.legend, self.chart], layout=widgets.Layout(width="100%"))

    def _on_compare(self, change) -> None:
        import bqplot

        wanted = set(change["new"])
        for job_id in list(self._watchers):
            if job_id not in wanted:
                self._watchers.pop(job_id).stop(timeout=0)
                self._lines.pop(job_id, None)
                self._labels.pop(job_id, None)
                self.series.pop(job_id, None)
        ended = []
        for job_id in sorted(wanted - set(self._watchers)):
            try:
                job = next(j for j in self.launched if j.id == job_id)
            except StopIteration:
                from tune_magic.job import get_job

                job = get_job(job_id)
            used = {line.colors[0] for line in self._lines.values()}
            colour = next((c for c in _PALETTE if c not in used), _PALETTE[len(self._lines) % len(_PALETTE)])
            line = bqplot.Lines(x=[], y=[], scales={"x": self._x, "y": self._y}, colors=[colour], marker="circle",
                                marker_size=12, display_legend=False)
            self._lines[job_id] = line
            self._labels[job_id] = f"{cut(job.name)} {job.id[-6:]}"
            self.series[job_id] = []
            watcher = JobWatcher(job, lambda snap, jid=job_id: self._show(jid, snap), interval_s=0.5, tail_lines=1)
            self._watchers[job_id] = watcher
            if job.status.is_live:
                watcher.start()
            else:
                # an ended job's curve is final: read once here, so the chart a cell returns (and
                # what a notebook run headless keeps) already holds it; no thread to outlive the cell
                ended.append(watcher)
        self.chart.marks = [self._lines[j] for j in sorted(self._lines)]
        self.legend.value = "".join(
            f"<span class='tm-legend-item' style='margin-right:1.2em;white-space:nowrap'>"
            f"<span style='display:inline-block;width:1.6em;height:3px;vertical-align:middle;"
            f"background:{self._lines[j].colors[0]}'></span> {html.escape(self._labels[j])}</span>"
            for j in sorted(self._lines))
        for watcher in ended:
            watcher.poll_once()
        self._set_ticks()

    def _show(self, job_id: str, snap) -> None:
        """Watcher-thread sink: set the curve's traits, the axis ticks and the series (no printing)."""
        line = self._lines.get(job_id)
        if line is None:
            return
        self.series[job_id] = list(zip(snap.steps, snap.losses))
        if snap.steps:
            line.x, line.y = list(snap.steps), list(snap.losses)
            self._set_ticks()

    def _set_ticks(self) -> None:
        """Integer steps on the x axis, each label once, over the steps of every curve shown; with no
        point yet, the chart is hidden (never an empty 0..1 grid) and a line says why."""
        with self._lock:
            steps = [s for pts in list(self.series.values()) for s, _ in pts[:1] + pts[-1:]]
            if not steps:
                self.chart.layout.display = "none"
                self.chart_note.value = ("<span class='tm-hint' style='color:#7f7f7f'>"
                                         + ("waiting for the first step of the jobs chosen" if self._lines else
                                            "choose jobs above to compare their loss curves") + "</span>")
                return
            self.chart.layout.display = None
            self.chart_note.value = ""
            lo, hi = min(steps), max(steps)
            hi = max(hi, lo + 1)  # one point: still a unit-wide axis, not a 0..1 grid of fractions
            ticks = int_ticks(lo, hi)
            if (self._x.min, self._x.max) != (lo, hi):
                self._x.min, self._x.max = float(lo), float(hi)
            if list(self._x_axis.tick_values) != ticks:
                self._x_axis.tick_values = ticks

    def close(self, timeout: float | None = 2.0) -> None:
        """Stop the chart's watchers and the table's refresher (jobs keep running); close the widgets.

        Args:
            timeout: seconds to wait for the table's refresh under way to end; the chart's
                watchers are not waited for. ``None``: wait for both, so nothing writes to a job's
                directory afterwards."""
        for w in getattr(self, "_watchers", {}).values():
            w.stop(timeout=None if timeout is None else 0)
        table = getattr(self, "jobs_table", None)
        if table is not None:
            table.close(timeout)
        super().close()


#: Characters a row of the command preview is taken to hold (a narrow notebook's, so that a wider
#: one shows a spare row rather than a narrow one a cut line).
PREVIEW_ROW_CHARS = 56


def _wrapped_rows(line: str, width: int) -> int:
    """Rows ``line`` takes in a box ``width`` characters wide that wraps at spaces, as a browser
    wraps a textarea (a word longer than a row is broken across rows)."""
    rows, used = 1, 0
    for word in line.split(" "):
        if used and used + 1 + len(word) > width:
            rows, used = rows + 1, 0
        elif used:
            used += 1
        used += len(word)
        while used > width:
            rows, used = rows + 1, used - width
    return rows


def preview_rows(text: str) -> int:
    """Rows the command preview needs for ``text`` at :data:`PREVIEW_ROW_CHARS` characters a row
    (wrapped at spaces), plus one, at least 3 and at most 24."""
    wrapped = sum(_wrapped_rows(line, PREVIEW_ROW_CHARS) for line in text.splitlines() or [""])
    return min(max(wrapped + 1, 3), 24)
