"""Where a torchtune job's log files are: its metric file, and the per-rank files torchrun writes.

Directory scans only (``os.scandir``), no parsing: :func:`find_metric_file` finds the DiskLogger
file, :func:`rank_log_files` the worker stream files under torchrun's ``--log-dir``, and
:func:`read_rank_logs` reads their ends for :func:`tune_magic.logs.failure.describe_failure`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

__all__ = ["find_metric_file", "RankLogFile", "rank_log_files", "read_rank_logs"]


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
