"""Follow a running torchtune job's logs and keep its metric series: :class:`JobMetricsFollower`.

No threads and no IPython here: a caller (a watcher thread, a CLI loop, a test) calls ``poll()``
whenever it wants fresh data. The parts: :class:`~tune_magic.logs.linefollow.LineFollower` reads
each growing file, :class:`~tune_magic.logs.parse.LogParser` parses it,
:class:`~tune_magic.logs.metricstore.MetricStore` merges the points, and
:mod:`tune_magic.logs.logfiles` finds the metric file and torchrun's per-rank files.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tune_magic.logs.linefollow import LineFollower
from tune_magic.logs.logfiles import RankLogFile, find_metric_file, rank_log_files
from tune_magic.logs.metricstore import MetricStore, Series
from tune_magic.logs.parse import LogParser, ParseStats
from tune_magic.logs.points import MetricPoint

__all__ = ["JobMetricsFollower"]


class JobMetricsFollower:
    """Follow one torchtune job: its combined stdout/stderr log and its metric file.

    The combined log gives progress-bar losses (source ``"progress"``), the latest progress
    text, the log tail, and the ``Writing logs to <path>`` line naming the DiskLogger file.
    Until that line is seen, the newest ``log_*.txt``/``log_*.jsonl`` in ``log_dir`` with
    mtime >= ``started_after`` is followed instead. Metric-file values win over progress-bar
    values for the same step (see :class:`~tune_magic.logs.metricstore.MetricStore`).

    With ``rank_log_dir`` (torchrun's ``--log-dir``), each rank's stdout/stderr file there
    (``--redirects``/``--tee``; see :func:`~tune_magic.logs.logfiles.rank_log_files`) is followed
    too and parsed like the combined log: with ``--redirects`` the progress bar, metric lines and
    ``Writing logs to`` are only there. :meth:`log_sections` gives the combined log and each rank file, labelled.

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
        self._earlier: set[Path] = set()  # metric files named before the latest, read whole already
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
        """Last ``n`` lines of the combined log (ANSI-free; see
        :meth:`~tune_magic.logs.linefollow.LineFollower.tail`)."""
        return self._log.tail(n)

    def log_sections(self, n: int | None = None) -> list[tuple[str, list[str]]]:
        """The combined log's last ``n`` lines, then each rank file's, labelled.

        Returns:
            ``[("combined", lines), ("rank 0 stdout", lines), ("rank 0 stderr", lines), ...]``;
            rank files with no lines yet are left out. Labels: :attr:`~tune_magic.logs.logfiles.RankLogFile.label`.
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
        """``name``'s values for a chart (see :meth:`~tune_magic.logs.metricstore.MetricStore.series`)."""
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
        chunks = follower.iter_chunks()
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
                self._read_earlier_metric_files()
                self._named = path
                self._follow_metrics(path)
            return
        if self._metrics is None and self.log_dir is not None:
            found = find_metric_file(self.log_dir, self.started_after)
            if found is not None:
                self._follow_metrics(found)

    def _read_earlier_metric_files(self) -> None:
        """Read whole, once, each metric file the combined log named before its latest one (a job
        started again names a new one: torchrun's restarts, ``--max-resumes`` attempts), so their
        points stay; the one followed until now is read to its end first."""
        for name in self._log_parser.log_paths[:-1]:
            path = Path(os.path.normpath(self.cwd / name))
            if path in self._earlier or path == self._log.path:
                continue
            self._earlier.add(path)
            if path == self.metrics_path and self._metrics is not None:
                follower, parser = self._metrics, self._metrics_parser
            else:
                follower, parser = LineFollower(path, 0, poll_bytes=self.poll_bytes), LogParser(strict=True)
            try:
                while True:
                    before = follower.offset
                    self._read(follower, parser)
                    if follower.caught_up or follower.offset == before:
                        break
                self._store.add_batch(parser.parse(follower.finish()))
            finally:
                if follower is not self._metrics:
                    follower.close()

    def _follow_metrics(self, path: Path) -> None:
        if path == self.metrics_path or path == self._log.path:
            return
        if self._metrics is not None:
            self._metrics.close()
        self.metrics_path = path
        self._metrics = LineFollower(path, 0, poll_bytes=self.poll_bytes)
