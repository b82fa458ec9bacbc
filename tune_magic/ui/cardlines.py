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
