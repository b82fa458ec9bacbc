"""Follow a running job's logs incrementally and keep its metric series, in bounded memory.

No threads and no IPython here: a caller (a watcher thread, a CLI loop, a test) calls
``poll()`` whenever it wants fresh data. Parsing rules live in :mod:`tune_magic.logs.parse`.

* :class:`LineFollower` reads new bytes of one growing file by offset, like ``tail -F``.
* :class:`MetricStore` keeps merged metric series compactly (``array`` columns per metric).
* :class:`JobMetricsFollower` ties both together for one torchtune job: its combined
  stdout/stderr log (progress bar, ``Writing logs to``) plus its DiskLogger metric file, plus
  the per-rank files torchrun writes under ``--log-dir`` with ``--redirects``/``--tee``.
* :func:`rank_log_files` and :func:`read_rank_logs` find and read those per-rank files.
* :func:`points_to_json`, :func:`points_to_csv`, :func:`points_to_frame` serialise points.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import math
import os
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from itertools import islice, repeat
from operator import itemgetter, lt
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

from tune_magic.logs.parse import (
    DEFAULT_MAX_LINE_CHARS,
    SOURCE_DISKLOGGER,
    SOURCE_JSONL,
    SOURCE_PROGRESS,
    LogParser,
    MetricBatch,
    MetricPoint,
    ParseStats,
    RecordSplitter,
)

__all__ = [
    "LineFollower",
    "MetricStore",
    "Series",
    "JobMetricsFollower",
    "find_metric_file",
    "RankLogFile",
    "rank_log_files",
    "read_rank_logs",
    "points_to_json",
    "points_to_csv",
    "points_to_frame",
]

_MISSING = (FileNotFoundError, NotADirectoryError)


class LineFollower:
    """Read a growing text file incrementally, keeping only its last lines.

    Each :meth:`poll` reads the bytes appended since the previous one (at most ``poll_bytes``,
    ``chunk_bytes`` per read), decodes UTF-8 incrementally (``errors="replace"``, so a
    multibyte character split across reads is kept whole and invalid bytes become U+FFFD),
    and cuts the text with :class:`~tune_magic.logs.parse.RecordSplitter` (``\\r`` redraws
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
        for records, plain in self._iter_chunks():
            if plain:
                records += filter(str.strip, plain.split("\n"))
            if records:
                yield records

    def _iter_chunks(self) -> Iterator[tuple[list[str], str]]:
        """As :meth:`iter_poll`, in :meth:`RecordSplitter.feed_plain` form (records, plain run)."""
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


class Series(NamedTuple):
    """One metric's values for charts: parallel lists, ordered by step."""

    steps: list[int]
    values: list[float]


_CODE = {SOURCE_PROGRESS: 0, SOURCE_DISKLOGGER: 1, SOURCE_JSONL: 2}
_SOURCE = (SOURCE_PROGRESS, SOURCE_DISKLOGGER, SOURCE_JSONL)
# Merge precedence: a metric file's value beats the progress bar's rounded echo of it.
_RANK = (0, 1, 1)
_NO_EPOCH = -1
_EPOCH_LIMIT = 1 << 63
# dict.get(x, x) maps in C: None <-> _NO_EPOCH, any other epoch to itself.
_EPOCH_IN = {None: _NO_EPOCH}
_EPOCH_OUT = {_NO_EPOCH: None}
_STEP_NAME = itemgetter(0, 1)  # sort key of MetricPoint: (step, name)
_new_point = tuple.__new__


class _Column:
    """One metric's merged points, sorted by step, in typed arrays (25 bytes per point)."""

    __slots__ = ("steps", "values", "epochs", "sources", "taken_step", "changed")

    def __init__(self) -> None:
        self.steps = array("q")
        self.values = array("d")
        self.epochs = array("q")
        self.sources = array("b")
        # Steps <= taken_step were reported by take_changes(); changes among them are in `changed`.
        self.taken_step: int | None = None
        self.changed: set[int] = set()

    def points(self, name: str, start: int) -> Iterator[MetricPoint]:
        """Points ``start:`` as MetricPoint, built at C speed."""
        epochs = self.epochs[start:]
        return map(
            _new_point,
            repeat(MetricPoint),
            zip(
                self.steps[start:],
                repeat(name),
                self.values[start:],
                map(_EPOCH_OUT.get, epochs, epochs),
                map(_SOURCE.__getitem__, self.sources[start:]),
            ),
        )

    def points_at(self, name: str, indexes: list[int]) -> Iterator[MetricPoint]:
        """Points at ``indexes`` as MetricPoint, built at C speed."""
        epochs = list(map(self.epochs.__getitem__, indexes))
        return map(
            _new_point,
            repeat(MetricPoint),
            zip(
                map(self.steps.__getitem__, indexes),
                repeat(name),
                map(self.values.__getitem__, indexes),
                map(_EPOCH_OUT.get, epochs, epochs),
                map(_SOURCE.__getitem__, map(self.sources.__getitem__, indexes)),
            ),
        )

    def point(self, name: str, i: int) -> MetricPoint:
        epoch = self.epochs[i]
        return MetricPoint(
            self.steps[i],
            name,
            self.values[i],
            None if epoch == _NO_EPOCH else epoch,
            _SOURCE[self.sources[i]],
        )


class MetricStore:
    """Merged metric series: one value per (metric name, step).

    Merge rule: a value from a metric file (``"disklogger"``/``"jsonl"``) beats one from the
    progress bar for the same (name, step), whatever the arrival order; between equal ranks
    the later value replaces the earlier one (re-reading a file never duplicates a step).
    A replacing value without an epoch keeps the epoch already known for that step.

    Storage is ``array('q')`` steps, ``array('d')`` values, ``array('q')`` epochs and
    ``array('b')`` source codes per metric: 25 bytes per point.
    """

    def __init__(self) -> None:
        self._columns: dict[str, _Column] = {}
        self.dropped = 0  #: points whose step does not fit in 64 bits (skipped)
        #: changes merged since the last take_changes() (an upper bound: a key changed twice counts twice)
        self.pending = 0

    def __len__(self) -> int:
        """Number of merged points (one per name and step)."""
        return sum(len(c.steps) for c in self._columns.values())

    def names(self) -> list[str]:
        """Metric names seen, in first-seen order."""
        return list(self._columns)

    def add_points(self, points: Iterable[MetricPoint]) -> None:
        """Merge points (any order); see :meth:`take_changes` for what changed."""
        batch = MetricBatch()
        for p in points:
            batch.append(p)
        self.add_batch(batch)

    def add_batch(self, batch: MetricBatch) -> None:
        """Merge a parser batch, in its order.

        Raises:
            KeyError: a point's source is not one of the three known sources.
        """
        n = len(batch.values)
        if n == 0:
            return
        before = len(self)
        names = batch.names
        distinct = list(dict.fromkeys(names))
        m = len(distinct)
        # Parser batches are one name (progress) or a fixed name cycle (a DiskLogger block):
        # then each name's points are a strided slice, merged as a whole when they only append.
        if n >= 2 * m and all(names[j::m].count(distinct[j]) == len(names[j::m]) for j in range(m)):
            changed = 0
            for j, name in enumerate(distinct):
                changed += self._merge_run(
                    name, batch.steps[j::m], batch.values[j::m], batch.epochs[j::m], batch.sources[j::m]
                )
        else:
            changed = self._merge(zip(batch.steps, names, batch.values, batch.epochs, batch.sources))
        self.pending += changed + len(self) - before

    def _merge_run(self, name: str, steps: list, values: list, epochs: list, sources: list) -> int:
        """Merge one name's points; appended in bulk when their steps all come after the last."""
        col = self._columns.get(name)
        if col is None:
            col = self._columns[name] = _Column()
        old = col.steps
        if (not old or steps[0] > old[-1]) and all(map(lt, steps, islice(steps, 1, None))):
            codes = list(map(_CODE.__getitem__, sources))
            eps = list(map(_EPOCH_IN.get, epochs, epochs))
            if min(eps) < _NO_EPOCH:  # a negative epoch: _merge() stores it as unknown
                return self._merge(zip(steps, repeat(name), values, epochs, sources))
            n = len(old)
            try:
                old.extend(steps)
                col.epochs.extend(eps)
            except (OverflowError, TypeError):
                # a step or epoch that does not fit: undo, then point by point
                del old[n:], col.epochs[n:]
            else:
                col.values.extend(values)
                col.sources.extend(codes)
                return 0
        return self._merge(zip(steps, repeat(name), values, epochs, sources))

    def _merge(self, points: Iterable[tuple]) -> int:
        """Merge (step, name, value, epoch, source) tuples one by one; return replacements."""
        columns = self._columns
        code_of = _CODE
        rank = _RANK
        changed = 0
        for step, name, value, epoch, source in points:
            col = columns.get(name)
            if col is None:
                col = columns[name] = _Column()
            steps = col.steps
            code = code_of[source]
            if epoch is None or not 0 <= epoch < _EPOCH_LIMIT:
                epoch = _NO_EPOCH
            if not steps or step > steps[-1]:
                try:
                    steps.append(step)  # first: it is the only append that can overflow
                except OverflowError:
                    self.dropped += 1
                    continue
                col.values.append(value)
                col.epochs.append(epoch)
                col.sources.append(code)
                continue
            try:
                i = bisect_left(steps, step)
                if i < len(steps) and steps[i] == step:
                    old_code = col.sources[i]
                    if rank[code] < rank[old_code]:
                        continue
                    if epoch == _NO_EPOCH:
                        epoch = col.epochs[i]
                    old = col.values[i]
                    same = old == value or (old != old and value != value)
                    if same and old_code == code and col.epochs[i] == epoch:
                        continue
                    col.values[i] = value
                    col.epochs[i] = epoch
                    col.sources[i] = code
                    changed += 1
                else:
                    steps.insert(i, step)
                    col.values.insert(i, value)
                    col.epochs.insert(i, epoch)
                    col.sources.insert(i, code)
            except OverflowError:
                self.dropped += 1
                continue
            if col.taken_step is not None and step <= col.taken_step:
                col.changed.add(step)
        return changed

    def take_changes(self) -> list[MetricPoint]:
        """Return the points added or changed since the previous call, sorted by (step, name).

        A (name, step) changed several times appears once, with its merged value; a value
        ignored by the merge rule, or identical to the stored one, is not a change.
        """
        out: list[MetricPoint] = []
        for name, col in self._columns.items():
            steps = col.steps
            if not steps:
                continue
            start = 0 if col.taken_step is None else bisect_right(steps, col.taken_step)
            if col.changed:
                # changed steps were all <= taken_step, so they sit before `start`
                out += col.points_at(name, list(map(bisect_left, repeat(steps), col.changed)))
            out += col.points(name, start)
            col.changed.clear()
            col.taken_step = steps[-1]
        self.pending = 0
        out.sort(key=_STEP_NAME)
        return out

    def points(self) -> list[MetricPoint]:
        """Return every merged point, sorted by step then name."""
        out: list[MetricPoint] = []
        for name, col in self._columns.items():
            out += col.points(name, 0)
        out.sort(key=_STEP_NAME)
        return out

    def last(self, name: str) -> MetricPoint | None:
        """Return ``name``'s point at the highest step, or ``None`` if it has none."""
        col = self._columns.get(name)
        if col is None or not col.steps:
            return None
        return col.point(name, len(col.steps) - 1)

    def series(self, name: str, max_points: int | None = 2000) -> Series:
        """Return ``name``'s values by step, thinned to at most ``max_points`` for charts.

        Thinning splits all but the last point into ``(max_points - 1) // 2`` equal buckets of
        steps and keeps each bucket's lowest and highest finite value (so spikes survive), in
        step order, then the last point (the latest value). A bucket of only ``nan`` keeps
        its first point.

        Args:
            name: metric name; an unknown name gives empty lists.
            max_points: upper bound on the points returned (>= 2), or ``None`` for all.

        Raises:
            ValueError: ``max_points`` < 2.
        """
        col = self._columns.get(name)
        if col is None:
            return Series([], [])
        steps, values = col.steps, col.values
        n = len(steps)
        if max_points is None or n <= max_points:
            return Series(steps.tolist(), values.tolist())
        if max_points < 2:
            raise ValueError(f"max_points must be >= 2, got {max_points}")
        # Buckets over all but the last point, which is always kept (the latest value).
        buckets = (max_points - 1) // 2
        keep: list[int] = [] if buckets else [0]
        last = n - 1
        for b in range(buckets):
            lo = b * last // buckets
            hi = (b + 1) * last // buckets
            chunk = values[lo:hi]
            finite = [v for v in chunk if v == v] if any(map(math.isnan, chunk)) else chunk
            if not finite:
                keep.append(lo)
                continue
            i_min = lo + chunk.index(min(finite))
            i_max = lo + chunk.index(max(finite))
            keep.extend((i_min, i_max) if i_min < i_max else (i_max, i_min) if i_max < i_min else (i_min,))
        keep.append(last)
        return Series([steps[i] for i in keep], [values[i] for i in keep])


def find_metric_file(log_dir: str | os.PathLike[str], started_after: float | None = None) -> Path | None:
    """Return the newest torchtune metric file in ``log_dir``, or ``None``.

    Candidates are ``log_*.txt`` (DiskLogger, 0.6.1) and ``log_*.jsonl`` (main branch) whose
    mtime (unix seconds) is ``>= started_after`` when given; the newest mtime wins.
    A missing directory gives ``None``.
    """
    best: tuple[float, str] | None = None
    try:
        with os.scandir(log_dir) as it:
            for entry in it:
                name = entry.name
                if not name.startswith("log_") or not (name.endswith(".txt") or name.endswith(".jsonl")):
                    continue
                try:
                    st = entry.stat()
                except OSError:
                    continue
                if started_after is not None and st.st_mtime < started_after:
                    continue
                key = (st.st_mtime, entry.path)
                if best is None or key > best:
                    best = key
    except (FileNotFoundError, NotADirectoryError):
        return None
    return Path(best[1]) if best else None


class RankLogFile(NamedTuple):
    """One worker stream file torchrun wrote under ``--log-dir`` (torch 2.x ``DefaultLogsSpecs``):
    ``<log dir>/<run id>_<random>/attempt_<attempt>/<local rank>/<stream>.log``.

    Attributes:
        local_rank: the worker's local rank (its directory name; the rank itself on one node).
        stream: ``"stdout"`` or ``"stderr"``.
        attempt: torchrun's restart attempt (0 first).
        run_dir: the run's directory (one per torchrun run sharing the log dir).
        path: the file.
    """

    local_rank: int
    stream: str
    attempt: int
    run_dir: Path
    path: Path

    @property
    def label(self) -> str:
        """``"rank 0 stderr"`` (``"rank 0 stderr, attempt 1"`` after a restart)."""
        again = f", attempt {self.attempt}" if self.attempt else ""
        return f"rank {self.local_rank} {self.stream}{again}"


def _int_dirs(path: Path, prefix: str = "") -> list[tuple[int, Path]]:
    out = []
    try:
        with os.scandir(path) as it:
            for entry in it:
                tail = entry.name[len(prefix):]
                if entry.name.startswith(prefix) and tail.isdigit() and entry.is_dir():
                    out.append((int(tail), Path(entry.path)))
    except (FileNotFoundError, NotADirectoryError):
        pass
    return sorted(out)


def rank_log_files(
    log_dir: str | os.PathLike[str], started_after: float | None = None, *, latest_attempt: bool = False
) -> list[RankLogFile]:
    """Return the per-rank files under torchrun's ``--log-dir``, sorted by (attempt, rank, stream).

    Only the newest run directory counts (a ``--log-dir`` may be shared by several runs), and
    only one whose mtime (unix seconds) is ``>= started_after`` when given. A missing directory
    gives ``[]``.

    Args:
        log_dir: the directory given to ``--log-dir``.
        started_after: the job's start; older run directories are ignored.
        latest_attempt: only the last restart attempt's files.
    """
    runs = []
    try:
        with os.scandir(log_dir) as it:
            for entry in it:
                if entry.is_dir():
                    mtime = entry.stat().st_mtime
                    if started_after is None or mtime >= started_after:
                        runs.append((mtime, entry.path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    if not runs:
        return []
    run_dir = Path(max(runs)[1])
    attempts = _int_dirs(run_dir, "attempt_")
    if latest_attempt:
        attempts = attempts[-1:]
    found = []
    for attempt, adir in attempts:
        for local_rank, rdir in _int_dirs(adir):
            for stream in ("stdout", "stderr"):
                path = rdir / f"{stream}.log"
                if path.is_file():
                    found.append(RankLogFile(local_rank, stream, attempt, run_dir, path))
    return found


def read_rank_logs(
    log_dir: str | os.PathLike[str], started_after: float | None = None, tail_bytes: int = 256 << 10
) -> dict[int, str]:
    """Return the end of each rank's output under torchrun's ``--log-dir`` (last attempt only),
    keyed by local rank: its stdout's last ``tail_bytes`` then its stderr's (UTF-8, invalid bytes
    replaced). This is what :func:`tune_magic.logs.failure.describe_failure` takes as ``rank_logs``.
    """
    out: dict[int, str] = {}
    for f in rank_log_files(log_dir, started_after, latest_attempt=True):
        try:
            with open(f.path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - tail_bytes))
                text = fh.read().decode("utf-8", errors="replace")
        except OSError:
            continue
        if text:
            out[f.local_rank] = out[f.local_rank] + "\n" + text if f.local_rank in out else text
    return out


class JobMetricsFollower:
    """Follow one torchtune job: its combined stdout/stderr log and its metric file.

    The combined log gives progress-bar losses (source ``"progress"``), the latest progress
    text, the log tail, and the ``Writing logs to <path>`` line naming the DiskLogger file.
    Until that line is seen, the newest ``log_*.txt``/``log_*.jsonl`` in ``log_dir`` with
    mtime >= ``started_after`` is followed instead. Metric-file values win over progress-bar
    values for the same step (see :class:`MetricStore`).

    With ``rank_log_dir`` (torchrun's ``--log-dir``), each rank's stdout/stderr file there
    (``--redirects``/``--tee``; see :func:`rank_log_files`) is followed too and parsed like the
    combined log: with ``--redirects`` the progress bar, metric lines and ``Writing logs to`` are
    only there. :meth:`log_sections` gives the combined log and each rank file, labelled.

    Args:
        combined_log_path: the job's combined output file (need not exist yet).
        log_dir: directory searched for a metric file when the log names none.
        started_after: job start, unix seconds; older metric files are ignored.
        max_lines: lines of the combined log kept for :meth:`tail`.
        cwd: directory a relative ``Writing logs to`` path is resolved against (the job's
            working directory); default: this process's working directory at construction.
        poll_bytes: most bytes read per file by one :meth:`poll`.
        poll_points: a poll stops reading (after the current read chunk) once this many
            points changed, so catching up on a long job's backlog never builds one huge
            result list; call :meth:`poll` again while :attr:`caught_up` is ``False``.
        rank_log_dir: torchrun's ``--log-dir`` for this job, or ``None``.
        rank_scan_s: seconds between looks for new rank files (they appear when workers start).

    Attributes:
        metrics_path: the metric file followed, or ``None`` while none is known.
    """

    def __init__(
        self,
        combined_log_path: str | os.PathLike[str],
        log_dir: str | os.PathLike[str] | None = None,
        started_after: float | None = None,
        *,
        max_lines: int = 1000,
        cwd: str | os.PathLike[str] | None = None,
        poll_bytes: int = 64 << 20,
        poll_points: int = 20_000,
        rank_log_dir: str | os.PathLike[str] | None = None,
        rank_scan_s: float = 1.0,
    ) -> None:
        self.rank_log_dir = Path(rank_log_dir) if rank_log_dir is not None else None
        self.rank_scan_s = rank_scan_s
        self.max_lines = max_lines
        # path -> (file, its follower, its parser); in rank_log_files() order
        self._ranks: dict[Path, tuple[RankLogFile, LineFollower, LogParser]] = {}
        self._next_scan = 0.0
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.poll_points = poll_points
        self.started_after = started_after
        self.cwd = Path(cwd) if cwd is not None else Path.cwd()
        self.poll_bytes = poll_bytes
        self.metrics_path: Path | None = None
        self._log = LineFollower(combined_log_path, max_lines, poll_bytes=poll_bytes)
        self._log_parser = LogParser(strict=False)
        self._metrics: LineFollower | None = None
        self._metrics_parser = LogParser(strict=True)
        self._named: Path | None = None  # path from the last "Writing logs to" line handled
        self._store = MetricStore()

    @property
    def latest_progress(self) -> str | None:
        """The last progress-bar text seen in the combined log (ANSI-free), else in a rank file
        (lowest rank first), or ``None``."""
        if self._log_parser.latest_progress is not None:
            return self._log_parser.latest_progress
        for _, _, parser in self._ranks.values():
            if parser.latest_progress is not None:
                return parser.latest_progress
        return None

    @property
    def caught_up(self) -> bool:
        """Whether the last poll reached the end of the combined log and of the metric file
        (when one is known); ``False`` means a poll stopped at its byte budget."""
        return (self._log.caught_up and (self._metrics is None or self._metrics.caught_up)
                and all(f.caught_up for _, f, _ in self._ranks.values()))

    @property
    def stats(self) -> dict[str, ParseStats]:
        """Parse counters: ``{"log": ..., "metrics": ..., "<rank file label>": ...}``."""
        out = {"log": self._log_parser.stats, "metrics": self._metrics_parser.stats}
        for rf, _, parser in self._ranks.values():
            out[rf.label] = parser.stats
        return out

    def poll(self) -> list[MetricPoint]:
        """Read both files' new bytes and merge their points.

        Returns:
            Points added or changed by this poll (after merging), sorted by (step, name);
            about ``poll_points`` at most, plus one read chunk's worth.

        Raises:
            OSError: a file exists but cannot be read.
        """
        self._pump()
        return self._store.take_changes()

    def finish(self) -> list[MetricPoint]:
        """Read everything left, then treat both files' unterminated last lines as complete.

        For a job that has ended; no points budget applies.

        Returns:
            As :meth:`poll`.
        """
        budget, self.poll_points = self.poll_points, float("inf")
        self._next_scan = 0.0  # the last look for rank files
        try:
            while True:
                before = self._position()
                self._pump()
                # Only the byte budget can stop a pump early now; stop when one reads nothing.
                if self.caught_up or self._position() == before:
                    break
        finally:
            self.poll_points = budget
        self._store.add_batch(self._log_parser.flush(self._log_parser.parse(self._log.finish())))
        for _, follower, parser in self._ranks.values():
            self._store.add_batch(parser.flush(parser.parse(follower.finish())))
        self._choose_metric_file()
        if self._metrics is not None:
            self._store.add_batch(self._metrics_parser.parse(self._metrics.finish()))
        return self._store.take_changes()

    def _position(self) -> tuple:
        m = self._metrics
        ranks = tuple((f.offset, f.resets) for _, f, _ in self._ranks.values())
        return (self._log.offset, self._log.resets, self.metrics_path, m and m.offset, m and m.resets, ranks)

    def _pump(self) -> None:
        if not self._read(self._log, self._log_parser):
            return
        self._scan_ranks()
        for _, follower, parser in self._ranks.values():
            if not self._read(follower, parser):
                return
        self._choose_metric_file()
        if self._metrics is not None:
            self._read(self._metrics, self._metrics_parser)

    def _scan_ranks(self) -> None:
        if self.rank_log_dir is None or time.monotonic() < self._next_scan:
            return
        self._next_scan = time.monotonic() + self.rank_scan_s
        files = rank_log_files(self.rank_log_dir, self.started_after)
        if all(f.path in self._ranks for f in files):
            return
        old = self._ranks
        self._ranks = {}
        for f in files:  # keep rank_log_files() order: attempt, rank, stream
            self._ranks[f.path] = old.get(f.path) or (
                f, LineFollower(f.path, self.max_lines, poll_bytes=self.poll_bytes), LogParser(strict=False))

    def tail(self, n: int | None = None) -> list[str]:
        """Last ``n`` lines of the combined log (ANSI-free; see :meth:`LineFollower.tail`)."""
        return self._log.tail(n)

    def log_sections(self, n: int | None = None) -> list[tuple[str, list[str]]]:
        """The combined log's last ``n`` lines, then each rank file's, labelled.

        Returns:
            ``[("combined", lines), ("rank 0 stdout", lines), ("rank 0 stderr", lines), ...]``;
            rank files with no lines yet are left out. Labels: :attr:`RankLogFile.label`.
        """
        out = [("combined", self._log.tail(n))]
        for rf, follower, _ in self._ranks.values():
            lines = follower.tail(n)
            if lines:
                out.append((rf.label, lines))
        return out

    def labelled_tail(self, n: int | None = None) -> list[str]:
        """:meth:`log_sections` as one list: the combined lines as they are, then each rank
        file's lines prefixed with ``[<label>] `` (e.g. ``[rank 1 stderr] Traceback ...``)."""
        sections = self.log_sections(n)
        out = list(sections[0][1])
        for label, lines in sections[1:]:
            out += [f"[{label}] {line}" for line in lines]
        return out

    def points(self) -> list[MetricPoint]:
        """All merged points so far, sorted by step then name."""
        return self._store.points()

    def last(self, name: str) -> MetricPoint | None:
        """``name``'s point at the highest step, or ``None``."""
        return self._store.last(name)

    def series(self, name: str, max_points: int | None = 2000) -> Series:
        """``name``'s values for a chart (see :meth:`MetricStore.series`)."""
        return self._store.series(name, max_points)

    def names(self) -> list[str]:
        """Metric names seen so far."""
        return self._store.names()

    def close(self) -> None:
        """Close every followed file."""
        self._log.close()
        for _, follower, _ in self._ranks.values():
            follower.close()
        if self._metrics is not None:
            self._metrics.close()

    def __enter__(self) -> JobMetricsFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, follower: LineFollower, parser: LogParser) -> bool:
        """Merge ``follower``'s new records; ``False`` if it stopped at the points budget."""
        chunks = follower._iter_chunks()
        try:
            for records, plain in chunks:
                batch = parser.parse(records)
                parser.parse_plain(plain, batch)
                self._store.add_batch(batch)
                if self._store.pending >= self.poll_points:
                    return False
        finally:
            chunks.close()
        return True

    def _choose_metric_file(self) -> None:
        named = self._log_parser.log_path
        if named is None:
            named = next((p.log_path for _, _, p in self._ranks.values() if p.log_path is not None), None)
        if named is not None:
            path = Path(os.path.normpath(self.cwd / named))
            if path != self._named:
                self._named = path
                self._follow_metrics(path)
            return
        if self._metrics is None and self.log_dir is not None:
            found = find_metric_file(self.log_dir, self.started_after)
            if found is not None:
                self._follow_metrics(found)

    def _follow_metrics(self, path: Path) -> None:
        if path == self.metrics_path or path == self._log.path:
            return
        if self._metrics is not None:
            self._metrics.close()
        self.metrics_path = path
        self._metrics = LineFollower(path, 0, poll_bytes=self.poll_bytes)


# -- serialisers -------------------------------------------------------------------------------


def _json_value(value: float) -> float | str:
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


def points_to_json(points: Iterable[MetricPoint]) -> str:
    """Serialise points as strict JSON (no ``NaN``/``Infinity`` literals).

    Returns:
        A JSON array of ``{"step": int, "name": str, "value": number|"nan"|"inf"|"-inf",
        "epoch": int (only when known), "source": str}`` objects, in the given order.
    """
    rows = []
    for p in points:
        row: dict[str, object] = {"step": p.step, "name": p.name, "value": _json_value(p.value)}
        if p.epoch is not None:
            row["epoch"] = p.epoch
        row["source"] = p.source
        rows.append(row)
    return json.dumps(rows, allow_nan=False)


def points_to_csv(points: Iterable[MetricPoint]) -> str:
    """Serialise points as CSV with header ``step,name,value,epoch,source``.

    Values use Python's float repr (``nan``, ``inf``, ``-inf`` for non-finite); an unknown
    epoch is an empty field. Lines end with ``\\n``.
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(("step", "name", "value", "epoch", "source"))
    for p in points:
        writer.writerow((p.step, p.name, repr(float(p.value)), "" if p.epoch is None else p.epoch, p.source))
    return buf.getvalue()


def points_to_frame(points: Iterable[MetricPoint]):  # -> pandas.DataFrame (pandas is optional)
    """Return a long-form ``pandas.DataFrame``: one row per (step, metric name).

    Columns: ``step`` (int64), ``name`` (str), ``value`` (float64, non-finite kept),
    ``epoch`` (nullable Int64), ``source`` (str); rows sorted by step then name. Points that
    repeat a (name, step) are merged first with :class:`MetricStore`'s rule.

    Raises:
        ImportError: pandas is not installed (``pip install pandas``).
    """
    try:
        import pandas as pd
    except ImportError as exc:  # pandas is an optional ("notebook") dependency
        raise ImportError(
            "points_to_frame needs pandas, which is not installed: pip install pandas"
        ) from exc
    store = MetricStore()
    store.add_points(points)
    merged = store.points()
    return pd.DataFrame(
        {
            "step": pd.Series([p.step for p in merged], dtype="int64"),
            "name": pd.Series([p.name for p in merged], dtype="str"),
            "value": pd.Series([p.value for p in merged], dtype="float64"),
            "epoch": pd.Series([p.epoch for p in merged], dtype="Int64"),
            "source": pd.Series([p.source for p in merged], dtype="str"),
        }
    )
