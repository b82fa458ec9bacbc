"""The launch panel's form fields that are not its own widgets: a scheduler's option fields (one
widget per option it declares, :mod:`tune_magic.plan.options`), the ``--val-split`` field, a row that
wraps in a narrow notebook, and the warning lines. Presentation only; :mod:`tune_magic.ui.panel`
lays them out and reads them.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from tune_magic.plan.options import generic

# full-width children get no side margin: width 100% then is the panel's width, not 4 px more
MARGIN = "2px 0px"


def val_split_field() -> widgets.Text:
    """The ``--val-split`` field: the fraction of the training data held out as ``dataset_val``
    (e.g. ``0.1``); blank: no validation but the config's own."""
    opt = generic("--val-split")
    return widgets.Text(placeholder="e.g. 0.1 (blank: not asked)", description="val split",
                        tooltip=opt.help, layout=widgets.Layout(width="100%", max_width="34em", margin=MARGIN))


def val_split_options(field: widgets.Text) -> dict:
    """The keyword arguments of :func:`tune_magic.launch` (and of a sweep) the field holds:
    ``{"val_split": F}`` (0 < F < 1; whole percents are checked with the config), ``{}`` when blank.

    Raises:
        PlanError: not a number between 0 and 1 (the message names ``--val-split`` and an example).
    """
    text = field.value.strip()
    return {"val_split": generic("--val-split").read(text)} if text else {}


def wrap_row(children) -> widgets.HBox:
    """A row that wraps onto the next line instead of overflowing a narrow notebook."""
    return widgets.HBox(children, layout=widgets.Layout(flex_flow="row wrap", max_width="100%"))


def option_widget(opt) -> widgets.Widget:
    """The form field of one scheduler option (see :class:`tune_magic.plan.options.Option`)."""
    label = opt.flag.lstrip("-").replace("-per-", "/").replace("-", " ")
    if opt.kind == "count":
        return widgets.BoundedIntText(value=0, min=0, max=1_000_000, description=label, tooltip=opt.help,
                                      layout=widgets.Layout(width="14em"))
    if opt.kind == "switch":
        return widgets.Checkbox(value=False, description=label, tooltip=opt.help, indent=True)
    layout = widgets.Layout(width="100%", max_width="34em", margin=MARGIN)
    hint = f"e.g. {opt.example} (blank: not asked)" if opt.example else "blank: not asked"
    if opt.kind == "words":
        return widgets.Textarea(placeholder=f"one a line, {hint}", description=label, tooltip=opt.help,
                                layout=layout)
    if opt.choices is not None:
        return widgets.Combobox(options=[], placeholder=hint, description=label, ensure_option=False,
                                tooltip=opt.help, layout=layout)
    return widgets.Text(placeholder=hint, description=label, tooltip=opt.help, layout=layout)


def option_rows(opts, fields: dict) -> list:
    """The fields in declaration order, neighbouring number fields side by side on one row."""
    rows: list = []
    run: list = []
    for opt in opts:
        if opt.kind == "count":
            run.append(fields[opt.name])
            continue
        if run:
            rows.append(wrap_row(run))
            run = []
        rows.append(fields[opt.name])
    if run:
        rows.append(wrap_row(run))
    return rows


def option_value(opt, widget: widgets.Widget):
    """The value a field holds for :func:`tune_magic.launch`, or ``None`` when it asks nothing."""
    if opt.kind == "count":
        return widget.value or None
    if opt.kind == "switch":
        return True if widget.value else None
    if opt.kind == "words":
        lines = [line.strip() for line in widget.value.splitlines() if line.strip()]
        return lines or None
    return widget.value.strip() or None


def warning_divs(notes) -> str:
    """The panel's warning lines (HTML, one ``div.tm-warning`` each) for ``notes`` (plain text)."""
    return "".join(f"<div class='tm-warning' style='color:#8c564b'>{html.escape(n)}</div>" for n in notes)
