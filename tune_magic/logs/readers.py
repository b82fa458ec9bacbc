"""Parse a whole line, text or file at once, through :class:`~tune_magic.logs.parse.LogParser`.

The one-shot readers: for tests, benchmarks and a metric file read to its end. A job that is still
writing is followed incrementally instead (:mod:`tune_magic.logs.metricfollow`). Formats: see
:mod:`tune_magic.logs.lineformat`.
"""

from __future__ import annotations

import codecs
import os
from typing import Callable, MutableSequence

from tune_magic.logs.lineformat import strip_ansi, strip_prefixes
from tune_magic.logs.parse import LogParser, ParseStats
from tune_magic.logs.points import MetricBatch, MetricPoint
from tune_magic.logs.splitter import DEFAULT_MAX_LINE_CHARS, RecordSplitter

__all__ = ["parse_disklogger_line", "parse_jsonl_line", "parse_text", "parse_file"]


def parse_disklogger_line(line: str) -> list[MetricPoint] | None:
    """Parse one torchtune DiskLogger/StdoutLogger line (0.6.1 ``Step N | key:value ...``).

    Args:
        line: one line, with or without ANSI sequences, line terminator and torch's
            ``[default0]:``/``[rank0]: `` prefixes (see :func:`~tune_magic.logs.lineformat.strip_prefixes`).

    Returns:
        The line's points (source ``"disklogger"``, epoch ``None``), possibly empty when every
        field is unparsable; ``None`` if the line is not a ``Step N | ...`` line at all.
    """
    parser = LogParser(strict=True)
    line = strip_prefixes(strip_ansi(line).strip("\r\n"))[2]
    if not line.startswith("Step "):
        return None
    return parser.feed_record(line)


def parse_jsonl_line(line: str) -> list[MetricPoint] | None:
    """Parse one JSON-lines metric record (torchtune main branch, ``{"step": N, "loss": ...}``).

    Every numeric field other than ``step`` becomes a point; strings that read as numbers
    (``"nan"``, ``"inf"``, as strict-JSON writers emit them) count as numbers; other fields
    are ignored.

    Args:
        line: one line of a ``log_*.jsonl`` file (or of a job's output, prefixed or not).

    Returns:
        The points (source ``"jsonl"``), or ``None`` if the line is not a JSON object with an
        integer ``step``.
    """
    text = strip_prefixes(strip_ansi(line).strip())[2].strip()
    if not text.startswith("{"):
        return None
    parser = LogParser(strict=True)
    batch = parser.parse([text])
    return None if parser.stats.malformed else batch.points()


def parse_text(
    text: str,
    *,
    strict: bool = False,
    max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
    lines: MutableSequence[str] | None = None,
) -> tuple[list[MetricPoint], LogParser]:
    """Parse a whole log text at once (the reference the incremental follower must match).

    Args:
        text: the complete text; a final unterminated line is parsed too.
        strict: as for :class:`~tune_magic.logs.parse.LogParser` (``True`` for metric files).
        max_line_chars: per-segment cap, as for :class:`~tune_magic.logs.splitter.RecordSplitter`.
        lines: if given, receives the display lines (``\\r`` redraws resolved, ANSI-free).

    Returns:
        ``(points, parser)``: all points in order (not merged; a step may repeat), and the
        parser, whose ``stats``, ``latest_progress`` and ``log_path`` describe the text.
    """
    parser = LogParser(strict=strict)
    splitter = RecordSplitter(max_line_chars, lines)
    batch = MetricBatch()
    records, plain = splitter.feed_plain(text)
    parser.parse(records, batch)
    parser.parse_plain(plain, batch)
    parser.parse(splitter.finish(), batch)
    parser.flush(batch)
    return batch.points(), parser


def parse_file(
    path: str | os.PathLike[str],
    *,
    strict: bool = True,
    chunk_bytes: int = 1 << 20,
    on_batch: Callable[[MetricBatch], object] | None = None,
) -> tuple[MetricBatch, ParseStats]:
    """Parse a whole metric file (DiskLogger ``log_*.txt`` or ``log_*.jsonl``), streaming.

    Reads ``chunk_bytes`` at a time and decodes UTF-8 with ``errors="replace"``; memory stays
    flat when ``on_batch`` is given.

    Args:
        path: file path.
        strict: ``True`` (default) for a metric file, ``False`` for a combined job log.
        chunk_bytes: bytes per read (default 1 MiB).
        on_batch: if given, called with each chunk's :class:`~tune_magic.logs.points.MetricBatch` instead of collecting
            them; the returned batch is then empty.

    Returns:
        ``(batch, stats)``: all points (iterate the batch for
        :class:`~tune_magic.logs.points.MetricPoint`) and counters.

    Raises:
        OSError: the file cannot be opened or read.
    """
    parser = LogParser(strict=strict)
    splitter = RecordSplitter()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    collected = MetricBatch()

    def consume(text: str, final: bool) -> None:
        records, plain = splitter.feed_plain(text)
        batch = collected if on_batch is None else MetricBatch()
        parser.parse(records, batch)
        parser.parse_plain(plain, batch)
        if final:
            parser.parse(splitter.finish(), batch)
            parser.flush(batch)
        if on_batch is not None:
            on_batch(batch)

    with open(path, "rb") as f:
        while True:
            data = f.read(chunk_bytes)
            if not data:
                break
            consume(decoder.decode(data), False)
    consume(decoder.decode(b"", final=True), True)
    return collected, parser.stats
