"""Generation in the notebook and the shell: the prompt on a magic's line, the text shown as it
arrives, the comparison table. The work is :meth:`tune_magic.job.Job.generate`'s and
:func:`tune_magic.compare`'s; this module only reads words and shows results.

A magic's line is ``JOB [OPTIONS] PROMPT``: the job and the options are shell words; the prompt is
the rest of the line as typed (quotes, apostrophes, ``{}`` and ``$`` kept), or, when that rest is
one quoted word, the word inside the quotes. ``--`` ends the options (a prompt that starts with
``--``).
"""

from __future__ import annotations

import html
import math
import shlex
import sys
from typing import Any, Callable, Mapping, Sequence

from tune_magic.errors import PlanError

#: The options of ``%tune_generate`` / ``%tune_compare`` / ``tune-magic generate`` that take a value.
VALUE_OPTIONS = ("--checkpoint", "--max-new-tokens", "--temperature", "--top-k", "--seed")
_QUOTES = "'\""


def _prompt(raw: str) -> str | None:
    """The prompt a line's rest gives (module docstring); ``None`` when it is empty."""
    raw = raw.strip()
    if not raw:
        return None
    if raw[0] in _QUOTES and raw[-1] == raw[0] and len(raw) > 1:
        try:
            words = shlex.split(raw)
        except ValueError:
            return raw
        if len(words) == 1:
            return words[0]
    return raw


def split_prompt_line(line: str,
                      value_options: Sequence[str] = VALUE_OPTIONS) -> tuple[str | None, list[str], str | None]:
    """Split a magic's line into the job, the options (shell words) and the prompt.

    The first word that is not an option (nor an option's value) is the job; the next one starts
    the prompt, which is the rest of the line (see the module docstring). ``--opt=value`` and
    ``--opt value`` both work.

    Returns:
        (the job or ``None``, the option words in order, the prompt or ``None`` when the line has none).

    Raises:
        PlanError: a quote left open before the prompt, or an option at the end with no value.
    """
    lex = shlex.shlex(line, posix=True)
    lex.whitespace_split, lex.commenters = True, ""
    words: list[str] = []
    value_of, job = None, None
    while True:
        at = lex.instream.tell()
        try:
            token = lex.get_token()
        except ValueError:  # an open quote: an apostrophe in the prompt, else a mistake
            if job is not None and value_of is None:
                return job, words, _prompt(line[at:])
            raise PlanError("cannot split the line (a quote is never closed); close every quote") from None
        if token is None:
            if value_of is not None:
                raise PlanError(f"{value_of} needs a value, e.g. {value_of} 8")
            return job, words, None
        if value_of is not None:
            words.append(token)
            value_of = None
        elif token == "--":
            return job, words, _prompt(line[lex.instream.tell():])
        elif (token.startswith("-") and len(token) > 1 and job is None) or token.startswith("--"):
            words.append(token)
            value_of = token if token in value_options else None
        elif job is None:
            job = token
        else:
            return job, words, _prompt(line[at:])


class TextShower:
    """Shows generated text as it arrives by printing each piece (in the caller's thread: the
    generation calls it from the magic's own thread), then makes what was shown the answer."""

    def __init__(self, write: Callable[[str], Any] | None = None) -> None:
        self.write = write or (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
        self.shown = ""

    def __call__(self, piece: str) -> None:
        self.write(piece)
        self.shown += piece

    def finish(self, text: str) -> None:
        """End the line; where the pieces were not exactly ``text`` (a decoder that rewrote a
        prefix), print the answer whole on a line of its own."""
        if text.startswith(self.shown):
            self.write(text[len(self.shown):] + "\n")
        else:
            self.write("\n" + text + "\n")
        self.shown = text


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def compare_html(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], pending: int = 0) -> str:
    """The comparison table as HTML: one row per job, the text in full (wrapped, escaped), an error
    in its own column; ``pending`` rows still to come are counted under it."""
    head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = []
        for c in columns:
            style = "white-space:pre-wrap;text-align:left" + (";color:#b00" if c == "error" else "")
            cells.append(f"<td style='{style}'>{_cell(row.get(c))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f"<div><i>{pending} more to generate...</i></div>" if pending else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"
