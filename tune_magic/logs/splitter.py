"""Cut a decoded text stream into records (lines and ``\r`` segments) and display lines.

Pure and incremental (no files, no threads): :class:`RecordSplitter` is fed by the file follower
(:mod:`tune_magic.logs.linefollow`) and by the whole-text readers of :mod:`tune_magic.logs.parse`,
and hands its records to :class:`~tune_magic.logs.parse.LogParser`.
"""

from __future__ import annotations

from typing import MutableSequence

from tune_magic.logs.lineformat import strip_ansi

__all__ = ["RecordSplitter", "DEFAULT_MAX_LINE_CHARS"]

#: Longest kept segment of one line, in characters (tqdm lines and metric lines are far shorter).
DEFAULT_MAX_LINE_CHARS = 64 * 1024


class RecordSplitter:
    """Cut a text stream into records and display lines, the way a terminal shows tqdm output.

    Pure and incremental: :meth:`feed` any slicing of the same text and the records and lines
    come out identical. Rules:

    * ``\\n`` ends a line; ``\\r`` ends a *segment* and the next segment replaces the line's
      content (tqdm redraws), so ``\\r\\n`` is an ordinary newline.
    * Every non-blank segment (ANSI removed) is a *record*, handed to the parser. A blank
      segment (e.g. tqdm's clearing ``\\r   \\r``) replaces nothing.
    * A completed line shows its last non-blank segment, else its last segment as is.
    * A segment longer than ``max_line_chars`` keeps only its head; the record is cut back to
      the last space so a half-kept ``name:value`` field is not parsed as a shorter number.

    Args:
        max_line_chars: characters kept per segment (memory bound for endless lines).
        lines: where completed display lines (ANSI-free) are appended, e.g. a
            ``collections.deque(maxlen=N)`` ring buffer; ``None`` to keep none.

    Raises:
        ValueError: ``max_line_chars`` < 1.
    """

    __slots__ = ("max_line_chars", "lines", "_partial", "_truncated", "_display")

    def __init__(
        self,
        max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
        lines: MutableSequence[str] | None = None,
    ) -> None:
        if max_line_chars < 1:
            raise ValueError(f"max_line_chars must be >= 1, got {max_line_chars}")
        self.max_line_chars = max_line_chars
        self.lines = lines
        self._partial = ""  # raw text of the unterminated segment (ANSI not yet removed)
        self._truncated = False
        self._display = ""  # the current line's last non-blank segment, ANSI-free

    @property
    def current(self) -> str:
        """The line being written: the unterminated segment, else the line's last redraw."""
        partial = strip_ansi(self._partial)
        return partial if partial.strip() else self._display

    def feed(self, text: str) -> list[str]:
        """Consume more text; return the records it completed, in order.

        Args:
            text: the next piece of decoded text (any length, any boundary).

        Returns:
            ANSI-free records (``str`` without terminators).
        """
        records, plain = self.feed_plain(text)
        if plain:
            records += filter(str.strip, plain.split("\n"))
        return records

    def feed_plain(self, text: str) -> tuple[list[str], str]:
        """Like :meth:`feed`, but hand back a run of plain lines unsplit (the fast path).

        Args:
            text: the next piece of decoded text.

        Returns:
            ``(records, plain)``: ``plain`` is ``""`` or complete lines joined by ``"\\n"``
            (no ``\\r``, no ANSI, each under ``max_line_chars``) whose non-blank lines are the
            records that follow ``records``; :meth:`~tune_magic.logs.parse.LogParser.parse_plain`
            parses it. The lines have already gone to ``lines``.
        """
        records: list[str] = []
        if not text:
            return records, ""
        if "\r" in text or "\x1b" in text:
            self._feed_mixed(text, records)
            return records, ""
        first = text.find("\n")
        if first < 0:
            self._grow(text)
            return records, ""
        last = text.rfind("\n")
        self._end_segment(text[:first], records, True)
        if first == last:
            self._grow(text[last + 1 :])
            return records, ""
        middle = text[first + 1 : last]
        if not self._all_short(middle):
            for raw in middle.split("\n"):
                self._end_segment(raw, records, True)
            self._grow(text[last + 1 :])
            return records, ""
        lines = self.lines
        if lines is not None:
            maxlen = getattr(lines, "maxlen", None)
            if maxlen is None:
                lines.extend(middle.split("\n"))
            elif maxlen > 0:
                # Only the last maxlen lines can survive in the ring buffer; rsplit stops there.
                tail = middle.rsplit("\n", maxlen)
                lines.extend(tail[1:] if len(tail) > maxlen else tail)
        self._grow(text[last + 1 :])
        return records, middle

    def _feed_mixed(self, text: str, records: list[str]) -> None:
        """Text with ``\\r`` or ANSI: line by line, plain lines still at near C speed."""
        first = text.find("\n")
        if first < 0:
            self._segments(text, records, False)
            return
        last = text.rfind("\n")
        self._segments(text[:first], records, True)
        if first != last:
            cap = self.max_line_chars
            lines = self.lines
            push = lines.append if lines is not None else None
            for line in text[first + 1 : last].split("\n"):
                if "\r" in line or "\x1b" in line or len(line) > cap:
                    self._segments(line, records, True)
                    continue
                # What _end_segment() does for a plain line, inlined: most lines are plain.
                if line and not line.isspace():
                    records.append(line)
                if push is not None:
                    push(line)
        self._segments(text[last + 1 :], records, False)

    def _segments(self, text: str, records: list[str], newline: bool) -> None:
        """Consume ``text`` (no ``\\n``); ``newline`` if a ``\\n`` follows it."""
        if "\r" in text:
            segments = text.split("\r")
            for seg in segments[:-1]:
                self._end_segment(seg, records, False)
            text = segments[-1]
        if newline:
            self._end_segment(text, records, True)
        else:
            self._grow(text)

    def _all_short(self, text: str) -> bool:
        """Whether every line of ``text`` is at most ``max_line_chars`` long.

        Without splitting: a line longer than the cap covers a whole aligned window of half
        the cap, so it is enough that every such window holds a newline.
        """
        if len(text) <= self.max_line_chars:
            return True
        window = max(self.max_line_chars // 2, 1)
        find = text.find
        for start in range(0, len(text) - window + 1, window):
            if find("\n", start, start + window) < 0:
                return False
        return True

    def finish(self) -> list[str]:
        """End of stream: treat the unterminated segment as complete.

        Returns:
            Its record (zero or one); the pending line, if any, goes to ``lines``.
        """
        records: list[str] = []
        if self._partial or self._display:
            self._end_segment("", records, True)
        return records

    def reset(self) -> None:
        """Forget the pending segment and line (the followed file started over)."""
        self._partial = ""
        self._truncated = False
        self._display = ""

    def _grow(self, piece: str) -> None:
        if not piece or self._truncated:
            return
        partial = self._partial + piece if self._partial else piece
        if len(partial) > self.max_line_chars:
            partial = partial[: self.max_line_chars]
            self._truncated = True
        self._partial = partial

    def _end_segment(self, piece: str, records: list[str], newline: bool) -> None:
        """Finish the pending segment with ``piece``; ``newline`` if ``\\n`` ended it."""
        self._grow(piece)
        text, truncated = self._partial, self._truncated
        self._partial = ""
        self._truncated = False
        if "\x1b" in text:
            text = strip_ansi(text)
        rec = text
        if truncated:
            cut = text.rfind(" ")
            if cut > 0:
                rec = text[:cut]
        if rec and not rec.isspace():
            records.append(rec)
            self._display = rec
        if newline:
            if self.lines is not None:
                self.lines.append(self._display or text)
            self._display = ""
