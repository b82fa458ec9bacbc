"""Free text (job names, errors, paths) made safe for one table cell. Pure.

A job name is whatever the user typed (``name="a\\nb"`` from Python, a pasted string with a NUL)
and a record may have been edited by hand, so a listing must never let a value break a row, move
the cursor or reorder the line. :func:`cell` escapes every such character and cuts long values;
``--json`` outputs keep the whole, unescaped value. :func:`table` lines cells up by the columns a
terminal gives them (:func:`display_width`: ``实验`` and most emoji take two), not by characters.
"""

from __future__ import annotations

from typing import Sequence

#: Longest name shown in a table, in characters; a longer one is cut and ends with :data:`ELLIPSIS`.
NAME_WIDTH = 40
#: Longest path shown in a table; paths keep their end (the job id is there) and start with ``…``.
PATH_WIDTH = 60
ELLIPSIS = "…"

_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def escape_char(c: str) -> str:
    """Return one character as it shows in a table: itself, or an escape.

    The rule is Python's ``repr``: ``\\n``, ``\\t``, ``\\r`` by name, and every other character that
    ``str.isprintable`` rejects (controls, DEL, C1, line and paragraph separators, bidirectional
    overrides, zero-width and other format characters, unassigned code points, lone surrogates
    from undecodable bytes, spaces other than U+0020) as ``\\xNN`` / ``\\uNNNN`` / ``\\UNNNNNNNN``.
    Everything else, backslash included, is shown as is.
    """
    if c == " " or c.isprintable():
        return c
    if c in _NAMED:
        return _NAMED[c]
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def escape(text: str) -> str:
    """Return ``text`` with every control character escaped (see :func:`escape_char`)."""
    if text.isprintable():  # the usual case, and what listings of many jobs meet: nothing to escape
        return text
    return "".join(escape_char(c) for c in text)


def cut(text: str, width: int = NAME_WIDTH, *, keep: str = "start") -> str:
    """Escape ``text`` and cut it to at most ``width`` characters plus :data:`ELLIPSIS`.

    An escape such as ``\\x00`` is never split: it is kept whole or dropped whole, so the result
    may be a few characters shorter than ``width``.

    Args:
        text: any string.
        width: characters to keep (>= 1).
        keep: ``"start"`` keeps the beginning and appends ``…`` (names); ``"end"`` keeps the end
            and prepends ``…`` (paths, whose last part is the most telling).

    Returns:
        The escaped text, unchanged if it fits in ``width`` characters.

    Raises:
        ValueError: ``width`` < 1 or ``keep`` is neither ``"start"`` nor ``"end"``.
    """
    if width < 1 or keep not in ("start", "end"):
        raise ValueError(f"cut(width={width!r}, keep={keep!r}): width >= 1, keep 'start' or 'end'")
    if text.isprintable():  # every character shows as itself (one unit each): the same result, faster
        if len(text) <= width:
            return text
        return text[:width] + ELLIPSIS if keep == "start" else ELLIPSIS + text[len(text) - width:]
    units = [escape_char(c) for c in text]
    if sum(map(len, units)) <= width:
        return "".join(units)
    if keep == "end":
        units.reverse()
    kept, used = [], 0
    for unit in units:
        if used + len(unit) > width:
            break
        kept.append(unit)
        used += len(unit)
    if keep == "end":
        return ELLIPSIS + "".join(reversed(kept))
    return "".join(kept) + ELLIPSIS


def cell(value: object, width: int = NAME_WIDTH, *, keep: str = "start", empty: str = "-") -> str:
    """Return a table cell for ``value``: ``empty`` for ``None`` or ``""``, else :func:`cut` of ``str(value)``."""
    if value is None or value == "":
        return empty
    return cut(str(value), width, keep=keep)


def display_width(text: str) -> int:
    """Return the terminal columns ``text`` takes, as ``wcwidth.wcswidth`` measures them.

    East Asian wide characters (``实验``) and emoji take 2, combining marks 0, others 1; a
    sequence joined by ZWJ or made wide by VS16 counts as one grapheme (wcwidth's rules). Text
    that is not printable (a control character: callers :func:`escape` first) counts one column
    per character.
    """
    if text.isascii():  # every printable ASCII character takes one column: the usual case, fast
        return len(text)
    from wcwidth import wcswidth

    width = wcswidth(text)
    return width if width >= 0 else len(text)


def pad(text: str, width: int) -> str:
    """Return ``text`` followed by spaces up to ``width`` terminal columns (:func:`display_width`)."""
    return text + " " * max(0, width - display_width(text))


def table(rows: Sequence[Sequence[str]], sep: str = "  ") -> list[str]:
    """Return the lines of a plain-text table: each column as wide as its widest cell, in terminal
    columns (:func:`display_width`), cells separated by ``sep``, trailing spaces cut.

    Args:
        rows: the rows (the header first), each a sequence of cells already made safe
            (:func:`cell`); rows shorter than the longest are padded with empty cells.
    """
    ncols = max((len(r) for r in rows), default=0)
    cells = [[*r, *[""] * (ncols - len(r))] for r in rows]
    widths = [max(display_width(r[i]) for r in cells) for i in range(ncols)]
    return [sep.join(pad(c, w) for c, w in zip(r, widths)).rstrip() for r in cells]


def print_warnings(command: str, messages) -> None:
    """A launch's warnings, once each, as plain lines on stderr (``tune-magic run: warning: ...``)."""
    import sys

    for message in dict.fromkeys(messages):
        print(f"tune-magic {command}: warning: {escape(message)}", file=sys.stderr, flush=True)
