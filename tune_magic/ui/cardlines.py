"""Small lines a job's card shows besides its progress: the overrides it ran with and the engine's
own id of the job. Pure text and HTML; no widgets.

A failed card is read against the overrides the job ran with, so the card shows them as one
collapsed line (``overrides: optimizer.lr=abc seed=2``; a click shows one a line). The per-job
``output_dir`` tune_magic adds (``<config's output_dir>/<job id>``) is left out there: the card's
header shows the ``output_dir`` already. ``Job.overrides`` keeps every word.
"""

from __future__ import annotations

import html
import shlex
from typing import Sequence

#: Characters of the collapsed overrides line before it is cut with ``…``.
OVERRIDES_LINE_CHARS = 160


def shown_overrides(words: Sequence[str], job_id: str) -> list[str]:
    """``words`` without the ``output_dir`` override tune_magic added for job ``job_id`` (its value
    ends with ``/<job id>``); a user's own ``output_dir=...`` stays."""
    return [w for w in words if not (w.startswith("output_dir=") and w.rstrip("/").endswith("/" + job_id))]


def overrides_text(words: Sequence[str], width: int | None = OVERRIDES_LINE_CHARS) -> str:
    """``overrides: w1 w2 ...`` (each word quoted as a shell would need it, :func:`shlex.join`),
    at most ``width`` characters (``None``: never cut); ``""`` for no words.

    A line that does not fit is cut between two overrides, never inside one (a resumed job's
    ``checkpointer.checkpoint_dir=/long/path`` cut mid-path reads as a wrong value), and ends with
    ``… (+N more)``; the first override is shown whole even when it alone is longer."""
    if not words:
        return ""
    quoted = [shlex.quote(w) for w in words]
    text = "overrides: " + " ".join(quoted)
    if width is None or len(text) <= width:
        return text
    shown = ["overrides:", quoted[0]]
    for i, word in enumerate(quoted[1:], start=1):
        rest = f" … (+{len(quoted) - i - 1} more)" if i < len(quoted) - 1 else ""
        if len(" ".join(shown + [word])) + len(rest) > width:
            break
        shown.append(word)
    return " ".join(shown) + f" … (+{len(quoted) - len(shown) + 1} more)"


def overrides_html(words: Sequence[str]) -> str:
    """The collapsed overrides line as HTML: a ``<details>`` whose summary is :func:`overrides_text`
    and whose body lists every word as the recipe got it, one a line (all escaped); ``""`` for no
    words."""
    if not words:
        return ""
    each = "".join(f"<div><code>{html.escape(w)}</code></div>" for w in words)
    return (f"<details class='tm-overrides' style='font-size:12px;overflow-wrap:anywhere;word-break:break-word'>"
            f"<summary style='cursor:pointer'>{html.escape(overrides_text(words))}</summary>{each}</details>")


def engine_id_text(label: str | None, engine_id: str | None) -> str:
    """``"SLURM ID 7"``: the engine's id of a job under the scheduler's name for it (``"engine id"``
    when the scheduler names none); ``""`` when the job has no engine id."""
    if not engine_id:
        return ""
    return f"{label or 'engine id'} {engine_id}"


# -- a card whose kernel is gone (issue 26) ------------------------------------------------------
#
# A saved notebook keeps a card in two forms, and a frontend shows one:
# * its widget, where the notebook also saved the widgets' state (JupyterLab's "Save Widget State",
#   nbclient's store_widget_state): ipywidgets 8 draws it from that state with no kernel behind
#   it, and marks every view of a model that has no live comm with the class
#   ``jupyter-widgets-disconnected`` (@jupyter-widgets/base ``DOMWidgetView._comm_live_update``;
#   also when the kernel dies or restarts while the page is open), each with a broken-chain icon.
#   The CSS below shows the card's own "kernel is gone" line then, hides its buttons and dims its
#   stale progress line. (It leaves the icons alone: a rule hiding the children's ``::before``
#   made Playwright find the traceback toggle not visible in tests/e2e/test_browser.py.)
# * the bundle's text/html (else text/plain), where the widget is not drawn: JupyterLab 4 renders
#   an untrusted output (a notebook it did not save itself, e.g. one nbclient executed) with its
#   safe renderers only, and the widget renderer is not one (@jupyter-widgets/jupyterlab-manager 5
#   registers it with ``safe: false``); nbconvert, nbviewer and GitHub without widget state too.
#
# A trusted notebook saved without widget state (JupyterLab's default) shows JupyterLab's own
# "Error displaying widget: model not found": the widget renderer is chosen and draws nothing else.

_GONE_CSS = ("<style>.tune-magic-card .tm-gone{display:none}"
             ".tune-magic-card.jupyter-widgets-disconnected .tm-gone{display:block}"
             ".tune-magic-card.jupyter-widgets-disconnected .widget-button{display:none}"
             ".tune-magic-card.jupyter-widgets-disconnected .tm-progress{opacity:.6}</style>")


def gone_text(job_id: str, what: str = "job") -> str:
    """What a card says once its kernel is gone: that it was live there and shows job ``job_id``
    (or a sweep: ``what``) as it was then, and the two ways to see it again (the magic and the CLI)."""
    return (f"This card was live in a kernel that is gone: it shows {what} {job_id} as it was then. "
            f"See the {what} again with %tune_logs {job_id} in a notebook (after %load_ext tune_magic), "
            f"or tune-magic logs {job_id} --follow in a terminal.")


def gone_hint(job_id: str, what: str = "job") -> str:
    """The card's text/plain last line: true where the kernel runs on (terminal IPython prints the
    text/plain) and where it is gone (a saved notebook read as text)."""
    return (f"(this card is live only in the kernel that showed it; once that kernel is gone, see {what} {job_id} "
            f"again with %tune_logs {job_id} in a notebook or tune-magic logs {job_id} --follow in a terminal)")


def gone_html(job_id: str, what: str = "job") -> str:
    """The card's hidden "kernel is gone" line and the CSS that shows it on a disconnected card
    (see the comment above), for the top of the card's header; all escaped."""
    text = html.escape(gone_text(job_id, what))
    for command in (f"%tune_logs {job_id}", f"tune-magic logs {job_id} --follow"):
        # a command never breaks at its hyphens ("tune-magic logs JOB -" / "-follow")
        # (a span, not <code>: the header's first <code> stays the job id, which readers pick)
        text = text.replace(html.escape(command), f"<span class='tm-cmd' style='font-family:monospace;"
                                                  f"white-space:nowrap'>{html.escape(command)}</span>")
    return (f"{_GONE_CSS}<div class='tm-gone' style='color:#8a6d3b;font-weight:bold;margin-bottom:4px;"
            f"white-space:normal;line-height:1.4'>{text}</div>")


def fallback_html(job_id: str, card_text: str, what: str = "job") -> str:
    """The card's text/html for frontends that do not draw its widget: the "kernel is gone" line,
    then ``card_text`` (the card as text when it was shown), escaped."""
    return (f"<div class='tm-card-gone'><p><b>{html.escape(gone_text(job_id, what))}</b></p>"
            f"<pre>{html.escape(card_text)}</pre></div>")
