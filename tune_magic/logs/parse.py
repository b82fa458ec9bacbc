"""Pure parsing of torchtune training logs into metric points.

Nothing here reads files incrementally, starts threads or imports IPython; the incremental
file follower lives in :mod:`tune_magic.logs.follow` and feeds this module's :class:`RecordSplitter`
and :class:`LogParser`.

Formats understood (all from torchtune 0.6.1 unless noted):

* DiskLogger / StdoutLogger metric lines: ``f"Step {step} | "`` followed by ``f"{name}:{value} "``
  per metric (trailing space), e.g. ``Step 7 | loss:2.0853 lr:2e-05 tokens_per_second_per_gpu:57.8 ``.
  ``DiskLogger.log`` writes a single ``Step N | name:value`` without the trailing space. Values are
  ``str()`` of whatever the recipe logged: ints, floats (``2e-05``, ``nan``, ``inf``) or 0-d tensors
  (``tensor(0.4300, device='cuda:0', grad_fn=<DivBackward0>)``, which contains spaces).
* JSON lines (``log_*.jsonl``, torchtune's main branch): ``{"step": N, "loss": 2.1, ...}``.
* The rank-0 tqdm progress bar, redrawn with ``\\r``, whose description is
  ``f"{epoch}|{global_step}|Loss: {loss}"``, e.g.
  ``1|10|Loss: 11.97315: 100%|####| 10/10 [00:11<00:00,  1.12s/it]``.
* ``Writing logs to <path>``, printed by ``DiskLogger.__init__``: names the job's metric file.

Each form is also read behind the line prefixes of torch 2.x (measured with torch 2.13):

* torchrun ``--tee``/``--local-ranks-filter`` copy each worker's output to the console as
  ``[default0]:<text>`` (``[<role><local rank>]:``, no space). Its tail threads read the per-rank
  files line by line with universal newlines, so a tqdm ``\r`` redraw arrives as its own
  prefixed line, and a line caught half-written comes out unterminated, with the next piece
  (``[default0]:<rest>``, or another stream's line) glued after it on the same physical line.
  Such pieces are split at the prefix and joined again per prefix (see :class:`LogParser`).
* ``torch.distributed``'s excepthook, set by ``init_process_group``, writes tracebacks as
  ``[rank1]: <text>`` (global rank, one space).
* Without any prefix, stdout and stderr in one file also glue: a tqdm bar is left without a line
  end until its next ``\r`` redraw, so the next stdout line lands right after the bar's
  ``[elapsed<remaining, rate]`` block; the text after that block is read as a record of its own.

ANSI escape sequences (colours, cursor show/hide, OSC titles) are removed before matching.
"""

from __future__ import annotations

import codecs
import json
import os
import re
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import Callable, Iterable, Iterator, MutableSequence, NamedTuple

__all__ = [
    "SOURCE_DISKLOGGER",
    "SOURCE_JSONL",
    "SOURCE_PROGRESS",
    "MetricPoint",
    "ProgressInfo",
    "ParseStats",
    "MetricBatch",
    "LogParser",
    "RecordSplitter",
    "strip_ansi",
    "parse_value",
    "parse_disklogger_line",
    "parse_jsonl_line",
    "parse_progress",
    "find_log_path",
    "strip_prefixes",
    "split_prefixed",
    "parse_text",
    "parse_file",
    "DEFAULT_MAX_LINE_CHARS",
]

#: ``MetricPoint.source`` of a point read from a DiskLogger/StdoutLogger ``Step N | ...`` line.
SOURCE_DISKLOGGER = "disklogger"
#: ``MetricPoint.source`` of a point read from a JSON-lines metric file.
SOURCE_JSONL = "jsonl"
#: ``MetricPoint.source`` of a loss read from the tqdm progress-bar description.
SOURCE_PROGRESS = "progress"

#: Longest kept segment of one line, in characters (tqdm lines and metric lines are far shorter).
DEFAULT_MAX_LINE_CHARS = 64 * 1024


class MetricPoint(NamedTuple):
    """One value of one metric at one optimizer step.

    Attributes:
        step: the recipe's ``global_step`` (steps, not samples).
        name: metric name as the recipe logged it (``loss``, ``lr``, ``tokens_per_second_per_gpu``...).
        value: the value as a float; ``nan``/``inf``/``-inf`` are kept as such.
        epoch: 1-based epoch when the format carries one (progress bar only), else ``None``.
        source: ``"disklogger"``, ``"jsonl"`` or ``"progress"``.
    """

    step: int
    name: str
    value: float
    epoch: int | None = None
    source: str = SOURCE_DISKLOGGER


class ProgressInfo(NamedTuple):
    """A parsed torchtune progress-bar description (``{epoch}|{step}|Loss: {loss}``).

    Attributes:
        epoch: 1-based epoch.
        step: global step.
        loss: the loss shown, or ``None`` when the value is not a number.
        text: the whole progress line, ANSI-free, surrounding whitespace removed.
    """

    epoch: int
    step: int
    loss: float | None
    text: str


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


# ECMA-48: OSC/DCS-like strings first (they may contain '[' or letters), then CSI, then the short
# two/three-byte escapes; a lone ESC left over (e.g. a sequence cut by the line-length cap) goes too.
_ANSI_RE = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b[ -/]*[0-~]"
    r"|\x1b"
)

# A wrapped scalar: tensor(0.43, device='cuda:0'), np.float32(0.5), Decimal('1.5').
_WRAPPED_RE = re.compile(r"[A-Za-z_][\w.]*\(\s*['\"]?([^,)'\"\s]+)")
# One DiskLogger field when the line holds a wrapped value; the key is lazy so that a key which
# itself contains ':' still pairs with the last ':'-free value, as the fast path's rpartition does.
_FIELD_RE = re.compile(r"(\S+?):([A-Za-z_][\w.]*\([^)]*\)|[^\s:]*)(?=\s|$)")
_PROGRESS_RE = re.compile(r"(?<![\w.|])(\d+)\|(\d+)\|Loss: ([A-Za-z_][\w.]*\([^)]*\)|[^\s:]+)")
_LOGPATH_RE = re.compile(r"Writing logs to (\S.*?)\s*$")
# Any tqdm bar ("Tokenizing: 45%|####  | 9/20 [00:01<00:02, 4.5it/s]"), for the progress text only.
_TQDM_RE = re.compile(r"\d%\|.*\|\s*[\d.]+[kMGTP]?/(?:[\d.]+[kMGTP]?|\?)\s*\[")
# The end of a tqdm bar: its "[elapsed<remaining, rate]" block (or "[elapsed, rate]" without a total).
_BAR_END_RE = re.compile(r"\[(?:\d+d )?(?:\d+:)?\d+:\d\d(?:<[^\],]*)?,[^\]\n]*\]")
# A torch 2.x line prefix: "[default0]:" (torchrun --tee, role + local rank) or "[rank1]: "
# (the excepthook of init_process_group, global rank; it adds one space).
_PREFIX_RE = re.compile(r"\[([A-Za-z_][\w.-]*?)(\d+)\]:")
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

_new_point = tuple.__new__  # skips NamedTuple's Python-level __new__: ~3x faster per point


def strip_ansi(text: str) -> str:
    """Return ``text`` without ANSI/VT100 escape sequences (CSI, OSC, DCS, two-byte escapes).

    Args:
        text: any string; cheap when it holds no ESC character.

    Returns:
        The text with every escape sequence removed.
    """
    if "\x1b" not in text:
        return text
    return _ANSI_RE.sub("", text)


def parse_value(text: str) -> float | None:
    """Parse one metric value as torchtune writes it with ``str()``.

    Accepts ints, floats, scientific notation (``2e-05``, ``1.5E+3``), ``nan``/``inf``/``-inf``
    and scalar wrappers such as ``tensor(0.43)``, ``tensor(0.4300, device='cuda:0', grad_fn=<...>)``
    or ``np.float32(0.5)``.

    Args:
        text: the value text (no surrounding ``name:``).

    Returns:
        The value as a float (possibly non-finite), or ``None`` if it is not a number
        (e.g. ``True``, ``abc``, a multi-element ``tensor([...])``).
    """
    try:
        return float(text)
    except ValueError:
        pass
    m = _WRAPPED_RE.match(text)
    if m is not None:
        try:
            return float(m.group(1))
        except ValueError:
            return None
    return None


def parse_disklogger_line(line: str) -> list[MetricPoint] | None:
    """Parse one torchtune DiskLogger/StdoutLogger line (0.6.1 ``Step N | key:value ...``).

    Args:
        line: one line, with or without ANSI sequences, line terminator and torch's
            ``[default0]:``/``[rank0]: `` prefixes (see :func:`strip_prefixes`).

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
    batch = MetricBatch()
    if not LogParser(strict=True)._jsonl(strip_prefixes(strip_ansi(line).strip())[2], batch):
        return None
    return batch.points()


def parse_progress(line: str) -> ProgressInfo | None:
    """Parse torchtune's tqdm description ``{epoch}|{global_step}|Loss: {loss}`` (0.6.1).

    Args:
        line: one progress segment (after splitting on ``\\r``); ANSI sequences and torch's
            line prefixes are removed.

    Returns:
        A :class:`ProgressInfo`, or ``None`` when the line holds no such description.
    """
    if "Loss: " not in line:
        return None
    text = strip_prefixes(strip_ansi(line).strip())[2].strip()
    m = _PROGRESS_RE.search(text)
    if m is None:
        return None
    return ProgressInfo(int(m.group(1)), int(m.group(2)), parse_value(m.group(3)), text)


def find_log_path(line: str) -> str | None:
    """Return the path in torchtune DiskLogger's ``Writing logs to <path>`` line (0.6.1).

    Args:
        line: one line of the job's combined output.

    Returns:
        The path text as printed (may be relative to the job's working directory), or ``None``.
    """
    if "Writing logs to " not in line:
        return None
    m = _LOGPATH_RE.search(strip_ansi(line))
    return m.group(1) if m else None


def strip_prefixes(line: str) -> tuple[int | None, int | None, str]:
    """Remove the torch 2.x prefixes at the start of one line (see the module docstring).

    Args:
        line: one line (or one piece of a line, see :func:`split_prefixed`).

    Returns:
        ``(rank, local_rank, text)``: the global rank of a ``[rankN]: `` prefix (torch's
        excepthook), the local rank of a ``[<role>N]:`` prefix (torchrun ``--tee``, role
        ``default`` unless ``--role`` was given), each ``None`` when absent, and the text after
        them. ``"[default1]:[rank1]: ValueError: x"`` gives ``(1, 1, "ValueError: x")``.
    """
    rank = local = None
    pos = 0
    while line.startswith("[", pos):
        m = _PREFIX_RE.match(line, pos)
        if m is None:
            break
        pos = m.end()
        if m.group(1) == "rank" and rank is None:
            rank = int(m.group(2))
            if line.startswith(" ", pos):
                pos += 1
        elif local is None and rank is None:
            local = int(m.group(2))
        else:
            pos = m.start()
            break
    return rank, local, line[pos:]


def split_prefixed(line: str) -> list[tuple[str, str]]:
    """Cut one physical line of torchrun ``--tee`` output into its prefixed pieces.

    torchrun writes ``[default0]:`` + whatever its tail thread read, which need not end a line;
    the next piece then follows on the same physical line. Only prefixes of the first piece's
    role are cut at (``[default0]:[rank0]: ...`` is one piece: the second prefix is torch's).

    Args:
        line: one line that starts with a prefix (no line terminator).

    Returns:
        ``[(prefix, text), ...]`` in order, e.g. ``[("[default0]:", "1|1|Loss: 9.0: 10%|..."),
        ("[default0]:", "Step 2 | loss:5.0 ")]``; every piece but the last was cut short.
        ``[]`` when ``line`` does not start with a prefix.
    """
    first = _PREFIX_RE.match(line)
    if first is None:
        return []
    role = "[" + first.group(1)
    pieces: list[tuple[str, str]] = []
    start, prefix = first.end(), first.group(0)
    pos = line.find(role, start)
    while pos >= 0:
        m = _PREFIX_RE.match(line, pos)
        if m is not None and m.group(1) == first.group(1):
            pieces.append((prefix, line[start:pos]))
            start, prefix = m.end(), m.group(0)
            pos = line.find(role, start)
        else:
            pos = line.find(role, pos + 1)
    pieces.append((prefix, line[start:]))
    return pieces


class MetricBatch:
    """Metric points held as parallel columns, in parse order.

    The parser's native output: filling five lists is several times cheaper than building one
    :class:`MetricPoint` per value, which matters for million-line metric files. Iterating
    yields :class:`MetricPoint` objects.

    Attributes:
        steps: ``list[int]``, global steps.
        names: ``list[str]``, metric names.
        values: ``list[float]``, values (non-finite kept).
        epochs: ``list[int | None]``, 1-based epochs or ``None``.
        sources: ``list[str]``, ``"disklogger"`` / ``"jsonl"`` / ``"progress"``.
    """

    __slots__ = ("steps", "names", "values", "epochs", "sources")

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.names: list[str] = []
        self.values: list[float] = []
        self.epochs: list[int | None] = []
        self.sources: list[str] = []

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[MetricPoint]:
        return map(
            _new_point,
            repeat(MetricPoint),
            zip(self.steps, self.names, self.values, self.epochs, self.sources),
        )

    def __repr__(self) -> str:
        return f"MetricBatch({len(self)} points)"

    def points(self) -> list[MetricPoint]:
        """Return the points as a list of :class:`MetricPoint`."""
        return list(self)

    def append(self, point: MetricPoint) -> None:
        """Add one point at the end."""
        step, name, value, epoch, source = point
        self.steps.append(step)
        self.names.append(name)
        self.values.append(value)
        self.epochs.append(epoch)
        self.sources.append(source)

    def extend(self, other: MetricBatch) -> None:
        """Add all of ``other``'s points at the end."""
        self.steps += other.steps
        self.names += other.names
        self.values += other.values
        self.epochs += other.epochs
        self.sources += other.sources


class LogParser:
    """Turn log records (lines or ``\\r``-separated segments) into metric points.

    Stateless apart from its counters, the last progress text / log path seen and the pieces
    of prefixed lines still waiting for their rest, so one parser per followed file.

    Prefixed records (``[default0]:...``, ``[rank0]: ...``) are read like their text without the
    prefix. A torchrun ``--tee`` piece cut short (see :func:`split_prefixed`) waits, per prefix,
    for its rest, which is the next piece of that prefix that does not start a line of its own
    (a ``Step`` line, JSON, a logging record) and is not a tqdm redraw. A rank's stdout and
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
    """

    __slots__ = ("strict", "stats", "latest_progress", "log_path", "_names", "_waiting")

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self.stats = ParseStats()
        self.latest_progress: str | None = None
        self.log_path: str | None = None
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
        """Parse ANSI-free records into a list of :class:`MetricPoint` (see :meth:`parse`)."""
        return self.parse(records).points()

    def parse(self, records: Iterable[str], into: MetricBatch | None = None) -> MetricBatch:
        """Parse ANSI-free records into columns; the hot path of this module.

        Records are taken in blocks of :data:`BLOCK`. When every record of a block is a
        ``Step N | ...`` line with the first record's keys in the same order and plain numeric
        values (the normal DiskLogger file), the block is converted column-wise with C-level
        ``split``/``map``, giving the same points as the record-by-record path several times
        faster; any other block takes the record-by-record path.

        Args:
            records: lines or ``\\r`` segments without terminators (as :class:`RecordSplitter` gives).
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
        """Parse a run of complete plain lines joined by ``"\\n"`` (see :meth:`RecordSplitter.feed_plain`).

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
        they parse like unprefixed records, on the fast paths. ``None`` otherwise.

        Records left blank (torchrun's ``[default0]:`` for an empty line) are counted and dropped.
        """
        m = _PREFIX_RE.match(joined)
        if m is None or self._waiting:
            return None
        prefix = m.group(0)
        if m.group(1) == "rank":
            if not joined.startswith(" ", m.end()):
                return None
            prefix += " "
        if joined.count(prefix) != n or ("\n" + joined).count("\n" + prefix) != n:
            return None
        records = joined[len(prefix):].replace("\n" + prefix, "\n").split("\n")
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
        """Column-wise parse of ``n`` uniform DiskLogger lines joined by ``"\\n"``.

        Returns ``False``, adding nothing, unless every line is a ``Step N | ...`` line with
        the first line's keys in the same order and plain numeric values.

        Sound because every line starts with ``Step ``: a line with more or fewer tokens
        than the first shifts a later ``Step`` token into a column that rejects it (column 1
        must be an int, column 2 ``|``, field columns ``key:``), so passing every column check
        means each line has exactly the first line's tokens, in the same order.
        """
        # Lines hold no "\n", so this counts lines that start with "Step ".
        if not joined.startswith("Step ") or ("\n" + joined).count("\nStep ") != n:
            return False
        first_end = joined.find("\n")
        first = (joined if first_end < 0 else joined[:first_end]).split()
        k = len(first)
        if k < 4 or first[2] != "|":
            return False
        tokens = joined.split()
        if len(tokens) != n * k:
            return False
        if tokens[0::k].count("Step") != n or tokens[2::k].count("|") != n:
            return False
        try:
            steps = list(map(int, tokens[1::k]))
        except ValueError:
            return False
        m = k - 3
        total = n * m
        all_steps: list = [None] * total
        all_names: list = [None] * total
        all_values: list = [None] * total
        names = self._names
        for j in range(m):
            name, sep, _ = first[3 + j].rpartition(":")
            if not sep or not name:
                return False
            col = tokens[3 + j :: k]
            prefix = name + ":"
            # Tokens hold no whitespace, so "\n" marks exactly the start of each token.
            if ("\n" + "\n".join(col)).count("\n" + prefix) != n:
                return False
            try:
                values = list(map(float, map(itemgetter(slice(len(prefix), None)), col)))
            except ValueError:
                return False
            name = names.get(name) or names.setdefault(name, name)
            all_steps[j::m] = steps
            all_names[j::m] = [name] * n
            all_values[j::m] = values
        batch.steps += all_steps
        batch.names += all_names
        batch.values += all_values
        batch.epochs += [None] * total
        batch.sources += [SOURCE_DISKLOGGER] * total
        self.stats.records += n
        self.stats.points += total
        return True

    def _generic(self, records: list[str], batch: MetricBatch, top: bool = True) -> None:
        """Record-by-record parse; ``top=False`` for records cut out of another record (their
        points and records are counted by the outer call)."""
        steps_append = batch.steps.append
        names_append = batch.names.append
        values_append = batch.values.append
        names = self._names
        stats = self.stats
        before = len(batch.values)
        n_bad = 0
        for rec in records:
            if rec.startswith("Step "):
                # Whitespace tokenisation of the header, the rule _block_text() relies on too.
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
            elif rec.startswith("[") and _PREFIX_RE.match(rec) is not None:
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
            m = _PROGRESS_RE.search(rec)
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
            m = _LOGPATH_RE.search(rec)
            if m is not None:
                self.log_path = m.group(1)
        elif "%|" in rec and _TQDM_RE.search(rec):
            self.latest_progress = rec.strip()
        self.stats.other += 1


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
            records that follow ``records``; :meth:`LogParser.parse_plain` parses it. The
            lines have already gone to ``lines``.
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
        strict: as for :class:`LogParser` (``True`` for metric files).
        max_line_chars: per-segment cap, as for :class:`RecordSplitter`.
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
        on_batch: if given, called with each chunk's :class:`MetricBatch` instead of collecting
            them; the returned batch is then empty.

    Returns:
        ``(batch, stats)``: all points (iterate the batch for :class:`MetricPoint`) and counters.

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
