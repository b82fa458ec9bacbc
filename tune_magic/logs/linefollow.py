"""Read a growing text file incrementally, like ``tail -F``, in bounded memory: :class:`LineFollower`.

No threads: a caller polls. The text is cut into records and display lines by
:class:`~tune_magic.logs.splitter.RecordSplitter`; :class:`~tune_magic.logs.metricfollow.JobMetricsFollower`
parses what it reads.
"""

from __future__ import annotations

import codecs
import io
import os
from collections import deque
from pathlib import Path
from typing import Iterator

from tune_magic.logs.splitter import DEFAULT_MAX_LINE_CHARS, RecordSplitter

__all__ = ["LineFollower"]

_MISSING = (FileNotFoundError, NotADirectoryError)


class LineFollower:
    """Read a growing text file incrementally, keeping only its last lines.

    Each :meth:`poll` reads the bytes appended since the previous one (at most ``poll_bytes``,
    ``chunk_bytes`` per read), decodes UTF-8 incrementally (``errors="replace"``, so a
    multibyte character split across reads is kept whole and invalid bytes become U+FFFD),
    and cuts the text with :class:`~tune_magic.logs.splitter.RecordSplitter` (``\\r`` redraws
    replace the current line, ``\\r\\n`` is a newline, ANSI removed, segments capped at
    ``max_line_chars``).

    A missing file is "nothing yet". If the file shrinks (truncated) or the path comes to name
    another file (rotated: renamed and recreated), reading starts over at offset 0 of the file
    now at the path; after a rotation the old file is first read to its end.

    Memory is bounded by ``max_lines * max_line_chars`` characters plus one read chunk,
    however long the file.

    Args:
        path: file to follow (need not exist yet).
        max_lines: complete lines kept for :meth:`tail` (a ring buffer).
        max_line_chars: characters kept per line/segment; the rest of a longer one is dropped.
        chunk_bytes: bytes per ``read`` call (default 256 KiB: larger reads are no faster and
            raise the peak memory of catching up on a backlog).
        poll_bytes: most bytes read by one :meth:`poll` (bounds its time on a huge backlog;
            the next poll continues).

    Attributes:
        path: the followed path.
        lines: ``collections.deque`` of the last ``max_lines`` complete lines (ANSI-free).
        offset: bytes of the current file consumed.
        resets: times reading started over (truncation or rotation).
        caught_up: whether the last poll reached the end of the file.

    Raises:
        ValueError: a size argument is < 1 (``max_lines`` may be 0).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_lines: int = 1000,
        *,
        max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
        chunk_bytes: int = 256 << 10,
        poll_bytes: int = 64 << 20,
    ) -> None:
        if max_lines < 0 or chunk_bytes < 1 or poll_bytes < 1:
            raise ValueError("max_lines must be >= 0, chunk_bytes and poll_bytes >= 1")
        self.path = Path(path)
        self.lines: deque[str] = deque(maxlen=max_lines)
        self.chunk_bytes = chunk_bytes
        self.poll_bytes = poll_bytes
        self.offset = 0
        self.resets = 0
        self.caught_up = False
        self._splitter = RecordSplitter(max_line_chars, self.lines)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._file: io.FileIO | None = None
        self._ident: tuple[int, int] | None = None

    # -- reading -----------------------------------------------------------------------------

    def iter_poll(self) -> Iterator[list[str]]:
        """Read what is new, yielding the completed records one read chunk at a time.

        Prefer this to :meth:`poll` on large backlogs: only one chunk's records exist at once.

        Yields:
            Lists of ANSI-free records (lines and ``\\r`` segments), in file order.

        Raises:
            OSError: the file exists but cannot be read (e.g. permissions).
        """
        for records, plain in self.iter_chunks():
            if plain:
                records += filter(str.strip, plain.split("\n"))
            if records:
                yield records

    def iter_chunks(self) -> Iterator[tuple[list[str], str]]:
        """As :meth:`iter_poll`, one read chunk at a time in
        :meth:`~tune_magic.logs.splitter.RecordSplitter.feed_plain` form: ``(records, plain run)``,
        which :meth:`~tune_magic.logs.parse.LogParser.parse_plain` reads without splitting the run.

        Raises:
            OSError: the file exists but cannot be read.
        """
        self.caught_up = False
        self._sync()
        if self._file is None:
            self.caught_up = True  # no file (yet): nothing more to read now
            return
        budget = self.poll_bytes
        while self._file is not None and budget > 0:
            data = self._file.read(min(self.chunk_bytes, budget))
            if not data:
                if self._rotated():
                    self._restart()
                    continue
                self.caught_up = True
                return
            self.offset += len(data)
            budget -= len(data)
            yield self._splitter.feed_plain(self._decoder.decode(data))

    def poll(self) -> list[str]:
        """Read what is new; return the completed records (see :meth:`iter_poll`)."""
        out: list[str] = []
        for records in self.iter_poll():
            out += records
        return out

    def finish(self) -> list[str]:
        """End of stream (the writer is gone): complete the unterminated line, if any.

        Returns:
            Its record (zero or one); the line goes to :attr:`lines`.
        """
        records = self._splitter.feed(self._decoder.decode(b"", final=True))
        return records + self._splitter.finish()

    def tail(self, n: int | None = None) -> list[str]:
        """Return the last ``n`` lines (all kept lines if ``None``), oldest first.

        The line still being written (e.g. the live progress bar) is included as the last
        item when it is not blank.
        """
        lines = list(self.lines)
        current = self._splitter.current
        if current.strip():
            lines.append(current)
        if n is not None:
            lines = lines[-n:] if n > 0 else []
        return lines

    @property
    def current(self) -> str:
        """The unterminated line as last redrawn (ANSI-free), ``""`` if none."""
        return self._splitter.current

    def close(self) -> None:
        """Close the file. A later poll reopens it: it resumes at :attr:`offset` if the path
        still names the same file, else it starts over."""
        if self._file is not None:
            self._file.close()
        self._file = None

    def __enter__(self) -> LineFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- file identity -----------------------------------------------------------------------

    def _sync(self) -> None:
        """Open the file if it has appeared; start over if it was truncated."""
        if self._file is None:
            self._open()
        elif os.fstat(self._file.fileno()).st_size < self.offset:
            self._start_over()
            self._file.seek(0)

    def _open(self) -> None:
        try:
            f = open(self.path, "rb", buffering=0)
        except _MISSING:
            return
        st = os.fstat(f.fileno())
        ident = (st.st_dev, st.st_ino)
        if ident == self._ident and st.st_size >= self.offset:
            f.seek(self.offset)  # the same file, reopened after close(): resume
        elif self._ident is not None:
            self._start_over()  # another file now has the path (rotation), or it shrank
        self._file = f
        self._ident = ident

    def _rotated(self) -> bool:
        try:
            st = os.stat(self.path)
        except _MISSING:
            return False  # removed, nothing new yet: keep the old file, it may still grow
        return (st.st_dev, st.st_ino) != self._ident

    def _restart(self) -> None:
        """Switch to the file now at the path (after draining the old one)."""
        if self._file is not None:
            self._file.close()
        self._file = None
        self._open()

    def _start_over(self) -> None:
        self.resets += 1
        self.offset = 0
        self._decoder.reset()
        self._splitter.reset()
