"""Parse torchtune training logs into metric points, incrementally: :class:`LogParser`.

Records come from :class:`~tune_magic.logs.splitter.RecordSplitter` (lines and ``\\r`` segments, ANSI
removed); their formats (DiskLogger ``Step N | ...`` lines, JSON lines, the tqdm progress bar,
``Writing logs to``, torch's line prefixes) are described in :mod:`tune_magic.logs.lineformat`.
Uniform DiskLogger blocks take the column-wise fast path of :mod:`tune_magic.logs.columns`.
A line gives points for the names it holds and no others: a validation line
(``Step N | val_loss:X `` or ``{"step": N, "val_loss": X}``, torchtune's recipes after 0.6.1 and
tune_magic's) is a ``val_loss`` point at step N and never makes or changes a ``loss`` point.
Nothing here reads files or starts threads: the file follower lives in
:mod:`tune_magic.logs.linefollow`, and :mod:`tune_magic.logs.readers` parses a whole line, text or
file at once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterable

from tune_magic.logs.columns import parse_uniform_block
from tune_magic.logs.lineformat import (
    LOGPATH_RE,
    PREFIX_RE,
    PROGRESS_RE,
    parse_value,
    split_prefixed,
    strip_prefixes,
)
from tune_magic.logs.points import SOURCE_DISKLOGGER, SOURCE_JSONL, SOURCE_PROGRESS, MetricBatch, MetricPoint

__all__ = [
    "ParseStats",
    "LogParser",
    "BLOCK",
    "PIECE_CHARS",
]


@dataclass
class ParseStats:
    """Counters kept by a :class:`LogParser`; all counts are of records (lines or ``\\r`` segments).

    Attributes:
        records: records seen.
        points: metric points produced.
        malformed: records that looked like metric records but gave nothing (skipped, not fatal).
        bad_fields: single ``name:value`` fields or JSON values skipped inside otherwise good records.
        other: records that are not metric records (INFO text, blank lines...).
    """

    records: int = 0
    points: int = 0
    malformed: int = 0
    bad_fields: int = 0
    other: int = 0


# One DiskLogger field when the line holds a wrapped value; the key is lazy so that a key which
# itself contains ':' still pairs with the last ':'-free value, as the fast path's rpartition does.
_FIELD_RE = re.compile(r"(\S+?):([A-Za-z_][\w.]*\([^)]*\)|[^\s:]*)(?=\s|$)")
# Any tqdm bar ("Tokenizing: 45%|####  | 9/20 [00:01<00:02, 4.5it/s]"), for the progress text only.
_TQDM_RE = re.compile(r"\d%\|.*\|\s*[\d.]+[kMGTP]?/(?:[\d.]+[kMGTP]?|\?)\s*\[")
# The end of a tqdm bar: its "[elapsed<remaining, rate]" block (or "[elapsed, rate]" without a total).
_BAR_END_RE = re.compile(r"\[(?:\d+d )?(?:\d+:)?\d+:\d\d(?:<[^\],]*)?,[^\]\n]*\]")
# A piece that starts a line of its own (a metric line, JSON, a logging record); a piece that
# starts otherwise continues a cut line.
_LINE_START_RE = re.compile(r"Step \d|\{|Writing logs to |[A-Z]+:[\w.]+:")

#: Records per block tried by the column-wise DiskLogger fast path (see LogParser.parse).
BLOCK = 512
#: Characters per piece of a plain run tried by the same fast path (see LogParser.parse_plain).
PIECE_CHARS = 32 * 1024
_MIN_BLOCK = 16
# Substrings without which a combined-log record is plain text (see LogParser._skip_text).
_MARKERS = ("Step ", "{", "Loss: ", "Writing logs to ", "%|")


class LogParser:
    """Turn log records (lines or ``\\r``-separated segments) into metric points.

    Stateless apart from its counters, the last progress text / log path seen and the pieces
    of prefixed lines still waiting for their rest, so one parser per followed file.

    Prefixed records (``[default0]:...``, ``[rank0]: ...``) are read like their text without the
    prefix. A torchrun ``--tee`` piece cut short (see
    :func:`~tune_magic.logs.lineformat.split_prefixed`) waits, per prefix, for its rest, which is
    the next piece of that prefix that does not start a line of its own (a ``Step`` line, JSON, a
    logging record) and is not a tqdm redraw. A rank's stdout and
    stderr share the prefix, so an empty piece may end the waiting line or be an empty stderr
    line: it only marks the line as possibly complete, and the line is parsed when the rank's
    next stdout line (``Step``, JSON) starts, or at :meth:`flush`. tqdm writes each redraw
    whole, so a cut redraw is parsed at once and its (empty) rest changes nothing.

    Args:
        strict: ``True`` for a metric file (every non-blank record should be a metric record;
            anything else counts as malformed); ``False`` for a job's combined stdout/stderr,
            where most records are ordinary text (counted as ``other``) and progress bars and
            ``Writing logs to`` lines are looked for too.

    Attributes:
        stats: :class:`ParseStats` counters.
        latest_progress: last progress-bar text seen (ANSI-free), or ``None``.
        log_path: last path named by a ``Writing logs to`` line, or ``None``.
        log_paths: every path so named, in order (a job started again names a new file each time:
            torchrun's restarts, ``--max-resumes`` attempts).
    """

    __slots__ = ("strict", "stats", "latest_progress", "log_path", "log_paths", "_names", "_waiting")

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self.stats = ParseStats()
        self.latest_progress: str | None = None
        self.log_path: str | None = None
        self.log_paths: list[str] = []
        # One str object per metric name, so a million points share a handful of names.
        self._names: dict[str, str] = {}
        # prefix -> [cut line, possibly complete] (see the class docstring)
        self._waiting: dict[str, list] = {}

    def feed_record(self, record: str) -> list[MetricPoint]:
        """Parse one record that has no ANSI sequences and no line terminator.

        Returns:
            The record's points, in field order.
        """
        return self.parse([record]).points()

    def feed_records(self, records: Iterable[str]) -> list[MetricPoint]:
        """Parse ANSI-free records into a list of :class:`~tune_magic.logs.points.MetricPoint` (see :meth:`parse`)."""
        return self.parse(records).points()

    def parse(self, records: Iterable[str], into: MetricBatch | None = None) -> MetricBatch:
        """Parse ANSI-free records into columns; the hot path of this module.

        Records are taken in blocks of :data:`BLOCK`. When every record of a block is a
        ``Step N | ...`` line with the first record's keys in the same order and plain numeric
        values (the normal DiskLogger file), the block is converted column-wise with C-level
        ``split``/``map``, giving the same points as the record-by-record path several times
        faster; any other block takes the record-by-record path.

        Args:
            records: lines or ``\\r`` segments without terminators (as
                :class:`~tune_magic.logs.splitter.RecordSplitter` gives).
            into: batch to append to; a new one by default.

        Returns:
            The batch, with this call's points appended in record order.
        """
        batch = MetricBatch() if into is None else into
        if not isinstance(records, list):
            records = list(records)
        if len(records) < _MIN_BLOCK:
            self._generic(records, batch)
            return batch
        for start in range(0, len(records), BLOCK):
            block = records[start : start + BLOCK]
            if len(block) < _MIN_BLOCK:
                self._generic(block, batch)
                continue
            joined = "\n".join(block)
            if joined.startswith("["):
                bare = self._unprefix(joined, len(block))
                if bare is not None:
                    self.parse(bare, batch)
                    continue
            if not (self._block_text(joined, len(block), batch) or self._skip_text(joined, len(block))):
                self._generic(block, batch)
        return batch

    def parse_plain(self, text: str, into: MetricBatch | None = None) -> MetricBatch:
        """Parse a run of complete plain lines joined by ``"\\n"`` (see
        :meth:`~tune_magic.logs.splitter.RecordSplitter.feed_plain`).

        Same points as :meth:`parse` of the run's non-blank lines, without first splitting
        the run into a list: uniform DiskLogger pieces of about :data:`PIECE_CHARS` go
        straight to the column-wise path.

        Args:
            text: lines without ``\\r`` or ANSI, each shorter than the splitter's cap.
            into: batch to append to; a new one by default.

        Returns:
            The batch.
        """
        batch = MetricBatch() if into is None else into
        pos, end = 0, len(text)
        while pos < end:
            stop = pos + PIECE_CHARS
            if stop >= end:
                cut = end
            else:
                cut = text.rfind("\n", pos, stop)
                if cut <= pos:
                    cut = text.find("\n", stop)
                    cut = end if cut < 0 else cut
            piece = text[pos:cut]
            pos = cut + 1
            if piece.startswith("["):
                records = [r for r in piece.split("\n") if r.strip()]
                bare = self._unprefix("\n".join(records), len(records))
                if bare is not None:
                    self.parse(bare, batch)
                    continue
            n = piece.count("\n") + 1
            if n >= _MIN_BLOCK and self._block_text(piece, n, batch):
                continue
            records = piece.split("\n")
            if "" in records or any(map(str.isspace, records)):
                records = list(filter(str.strip, records))
            if not self._skip_text(piece, len(records)):
                self._generic(records, batch)
        return batch

    def _unprefix(self, joined: str, n: int) -> list[str] | None:
        """The ``n`` records joined in ``joined`` without their prefix, when all have the same one
        exactly once (a block of ``--tee`` output with no cut pieces) and no cut line waits: then
        they parse like unprefixed records, on the fast paths, with the points and progress text
        of the record-by-record path (:meth:`_prefixed`). ``None`` otherwise, and so also when

        * another prefix of that role occurs: a piece of another rank glued after a cut or
          unterminated one (``[default1]:<bar>[default0]:<bar>``) is a piece of its own
          (:func:`~tune_magic.logs.lineformat.split_prefixed`);
        * a record goes on with a ``[`` (``[default0]:[rank0]: ...``): a second prefix is
          torch's, read with the first (:func:`~tune_magic.logs.lineformat.strip_prefixes`), and
          a piece glued after it is not cut out.

        Records left blank (torchrun's ``[default0]:`` for an empty line) are counted and dropped.
        """
        m = PREFIX_RE.match(joined)
        if m is None or self._waiting:
            return None
        prefix = m.group(0)
        if m.group(1) == "rank":
            if not joined.startswith(" ", m.end()):
                return None
            prefix += " "
        # "[<role>" n times: each record's own prefix, and no piece of any rank glued after it
        if joined.count("[" + m.group(1)) != n or ("\n" + joined).count("\n" + prefix) != n:
            return None
        bare = joined[len(prefix):].replace("\n" + prefix, "\n")
        if bare.startswith("[") or "\n[" in bare:
            return None
        records = bare.split("\n")
        kept = list(filter(str.strip, records))
        self.stats.records += len(records) - len(kept)
        return kept

    def _skip_text(self, joined: str, n: int) -> bool:
        """Count ``n`` records as ``other`` at once if none can matter (combined logs only).

        ``joined`` holds the records; without any of these substrings no record can be a
        metric line, JSON record, progress bar or ``Writing logs to`` line.
        """
        if self.strict or self._waiting:
            return False
        for marker in _MARKERS:
            if marker in joined:
                return False
        self.stats.records += n
        self.stats.other += n
        return True

    def _block_text(self, joined: str, n: int, batch: MetricBatch) -> bool:
        """Column-wise parse of ``n`` uniform DiskLogger lines joined by ``"\\n"``
        (:func:`~tune_magic.logs.columns.parse_uniform_block`), counted in :attr:`stats`.

        Returns ``False``, adding nothing, unless every line is a ``Step N | ...`` line with
        the first line's keys in the same order and plain numeric values.
        """
        points = parse_uniform_block(joined, n, batch, self._names)
        if not points:
            return False
        self.stats.records += n
        self.stats.points += points
        return True

    def _generic(self, records: list[str], batch: MetricBatch, top: bool = True) -> None:
        """Record-by-record parse; ``top=False`` for records cut out of another record (their
        points and records are counted by the outer call).

        Long: the per-record loop with the batch's appends bound once; the DiskLogger fields read
        in a call of their own cost ~10% on small batches of ``Step`` lines (measured).
        """
        steps_append = batch.steps.append
        names_append = batch.names.append
        values_append = batch.values.append
        names = self._names
        stats = self.stats
        before = len(batch.values)
        n_bad = 0
        for rec in records:
            if rec.startswith("Step "):
                # Whitespace tokenisation of the header, the rule parse_uniform_block() relies on too.
                parts = rec.split(None, 3)
                try:
                    if len(parts) < 3 or parts[2] != "|":
                        raise ValueError(rec)
                    step = int(parts[1])
                except ValueError:
                    stats.malformed += 1
                    continue
                if len(parts) == 3:
                    continue  # "Step N | " with no metrics: what log_dict({}) writes
                body = parts[3]
                got = 0
                if "(" not in body:
                    # Plain numbers never contain spaces, so a split is exact.
                    for field in body.split():
                        name, sep, text = field.rpartition(":")
                        if not sep or not name:
                            n_bad += 1
                            continue
                        try:
                            value = float(text)
                        except ValueError:
                            n_bad += 1
                            continue
                        steps_append(step)
                        names_append(names.get(name) or names.setdefault(name, name))
                        values_append(value)
                        got += 1
                else:
                    for fm in _FIELD_RE.finditer(body):
                        value = parse_value(fm.group(2))
                        if value is None:
                            n_bad += 1
                            continue
                        name = fm.group(1)
                        steps_append(step)
                        names_append(names.get(name) or names.setdefault(name, name))
                        values_append(value)
                        got += 1
                if got == 0:
                    stats.malformed += 1
                else:
                    batch.epochs += [None] * got
                    batch.sources += [SOURCE_DISKLOGGER] * got
            elif rec.startswith("{"):
                if not self._jsonl(rec, batch):
                    if self.strict:
                        stats.malformed += 1
                    else:
                        stats.other += 1
            elif rec.startswith("[") and PREFIX_RE.match(rec) is not None:
                self._prefixed(rec, batch)
            elif self.strict:
                if rec.strip():
                    stats.malformed += 1
                else:
                    stats.other += 1
            elif "Loss: " in rec or "Writing logs to " in rec or "%|" in rec:
                self._text(rec, batch)
            else:
                stats.other += 1  # ordinary output: most of a combined log
        if top:
            stats.records += len(records)
            stats.points += len(batch.values) - before
        stats.bad_fields += n_bad

    def _prefixed(self, rec: str, batch: MetricBatch) -> None:
        """Parse a prefixed record: its pieces, cut lines joined per prefix (see the class docstring)."""
        pieces = split_prefixed(rec)
        last = len(pieces) - 1
        done: list[str] = []
        waiting = self._waiting
        for i, (prefix, text) in enumerate(pieces):
            text = strip_prefixes(prefix + text)[2]
            whole = i == last  # every piece but the last was cut short
            w = waiting.get(prefix)
            if not text.strip():
                if w is not None:
                    w[1] = True
                continue
            if "%|" in text or "|Loss: " in text:
                done.append(text)  # a tqdm redraw: written whole
                continue
            if _LINE_START_RE.match(text):
                # a new stdout line (StdoutLogger, JSON) ends a waiting line that may be complete;
                # logging records go to stderr and say nothing about it
                stdout_line = text.startswith(("Step ", "{"))
                if w is not None and stdout_line and (w[1] or not whole):
                    done.append(waiting.pop(prefix)[0])
                    w = None
                if whole or w is not None:
                    done.append(text)  # (a cut logging line while another line waits: as is)
                else:
                    waiting[prefix] = [text, False]
                continue
            if w is not None:
                text = waiting.pop(prefix)[0] + text
            if whole:
                done.append(text)
            else:
                waiting[prefix] = [text, False]
        if done:
            self._generic(done, batch, top=False)

    def flush(self, into: MetricBatch | None = None) -> MetricBatch:
        """End of stream: parse the cut prefixed lines still waiting for their rest.

        Args:
            into: batch to append to; a new one by default.

        Returns:
            The batch.
        """
        batch = MetricBatch() if into is None else into
        if self._waiting:
            rest = [w[0] for w in self._waiting.values()]
            self._waiting.clear()
            before = len(batch.values)
            self._generic(rest, batch, top=False)
            self.stats.points += len(batch.values) - before
        return batch

    def _jsonl(self, rec: str, batch: MetricBatch) -> bool:
        """Add a JSON-lines record's points; ``False`` if it is not ``{"step": int, ...}``."""
        try:
            obj = json.loads(rec)
        except ValueError:
            return False
        if not isinstance(obj, dict):
            return False
        step = obj.get("step")
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        if not isinstance(step, int) or isinstance(step, bool):
            return False
        names = self._names
        for name, raw in obj.items():
            if name == "step":
                continue
            if isinstance(raw, (int, float)) and not isinstance(raw, bool):
                value = float(raw)
            elif isinstance(raw, str):
                value = parse_value(raw)
                if value is None:
                    continue
            else:
                continue
            batch.steps.append(step)
            batch.names.append(names.get(name) or names.setdefault(name, name))
            batch.values.append(value)
            batch.epochs.append(None)
            batch.sources.append(SOURCE_JSONL)
        return True

    def _text(self, rec: str, batch: MetricBatch) -> None:
        if "%|" in rec and not rec.rstrip().endswith("]"):
            m = _BAR_END_RE.search(rec)
            if m is not None:
                rest = rec[m.end() :].lstrip()
                if rest:  # a line glued after the bar (see the module docstring)
                    self._text(rec[: m.end()], batch)
                    if rest.startswith(("Step ", "{", "[")) or any(map(rest.__contains__, _MARKERS)):
                        self._generic([rest], batch, top=False)
                    else:
                        self.stats.other += 1  # ordinary text, as most glued lines are
                    return
        if "Loss: " in rec:
            m = PROGRESS_RE.search(rec)
            if m is not None:
                self.latest_progress = rec.strip()
                value = parse_value(m.group(3))
                if value is None:
                    self.stats.malformed += 1
                    return
                batch.steps.append(int(m.group(2)))
                batch.names.append("loss")
                batch.values.append(value)
                batch.epochs.append(int(m.group(1)))
                batch.sources.append(SOURCE_PROGRESS)
                return
        if "Writing logs to " in rec:
            m = LOGPATH_RE.search(rec)
            if m is not None:
                self.log_path = m.group(1)
                self.log_paths.append(self.log_path)
        elif "%|" in rec and _TQDM_RE.search(rec):
            self.latest_progress = rec.strip()
        self.stats.other += 1
