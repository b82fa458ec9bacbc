"""A small per-job summary (last step and loss, progress, epoch, the failure reason), kept current
by reading only the bytes each log gained, so listings never read a whole log.

``jobs/<id>/summary.json`` (this module's format, version 1) holds the values listings show and
the offsets reached in the job's combined log and its metric file. Whoever keeps it current — the
job's supervisor, at most once a second, or the first reader of a job with no local supervisor —
reads from those offsets to the last complete record (``\\n`` or a tqdm ``\\r`` redraw), so a
summary can always be resumed from the file alone. A failed write is ignored: reading never needs
a write.

Formats read: torchtune 0.6.1's combined stdout/stderr (progress bar, ``Writing logs to``,
``Saving checkpoint`` lines) and its DiskLogger metric file, through :class:`tune_magic.logs.parse.LogParser`.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from tune_magic.registry import store as jobstore

# tune_magic.logs.parse is imported where a log is read: a listing of summarised jobs never needs it

SUMMARY = "summary.json"
VERSION = 1
#: Most bytes read from one log by one :meth:`SummaryTracker.advance`.
ADVANCE_BYTES = 64 << 20
#: Most bytes of a log held in memory at once: an advance reads its budget a piece at a time, so a
#: listing that catches up on a 200 MB log grows by about this much, not by the budget.
PIECE_BYTES = 1 << 20
#: The metric whose last value listings show.
LOSS = "loss"
#: The validation loss (torchtune's later recipes' key; :mod:`tune_magic.checkpoints.validation`).
VAL_LOSS = "val_loss"

_RECORD_SPLIT = re.compile(r"\r\n|\n|\r")
# a progress-bar step or a "Step N | ..." metric line; torchtune 0.6.1 recipes print "Saving
# checkpoint. This may take some time. ..." before saving (or the checkpointer's "Saving checkpoint")
# lines the SLURM batch script and node helper print (tune_magic.schedulers.slurm.node's format)
_NODE_LINE = re.compile(r"^node (\S+) ([0-9a-fA-F.:]+)$")
_WORKER_LINE = re.compile(r"^worker (\S+) (\d+)$")
_RDZV_LINE = re.compile(r"^rendezvous (\S+:\d+)$")
_STEP_RECORD = re.compile(r"\d+\|\d+\|Loss: |Step \d+ \|")


@dataclass
class Summary:
    """What listings show of a job, and where reading its logs stopped.

    Attributes:
        step: the latest step with a loss (steps), or ``None`` before the first.
        loss: that step's loss (the metric file's value when it has one, else the progress bar's).
        min_loss: the lowest finite loss logged so far, from the same source as ``loss`` (the
            metric file's losses once it has one, else the progress bar's), or ``None``; older
            summaries (before this field) have ``None`` until the job's log is read again.
        epoch: 1-based epoch of the latest progress-bar step, or ``None``.
        progress: the latest progress-bar text (ANSI-free), e.g.
            ``1|13|Loss: 2.31: 65%|######5   | 13/20 [00:10<00:05, 1.3it/s]``.
        metrics: every metric's value at the metric file's latest step (``lr``,
            ``tokens_per_second_per_gpu``, ...).
        saving: a ``Saving checkpoint`` line came after the latest step.
        error: the job's failure reason once it failed (from its record), else ``None``.
        updated_at: unix seconds of the last change.
        log_offset, log_ident: bytes of the combined log consumed (at a record boundary), and
            that file's ``[st_dev, st_ino]`` (another file at the path starts over).
        metrics_path, metrics_offset: the metric file followed and bytes of it consumed.
        rank_offsets: bytes consumed of each rank's file under torchrun's ``--log-dir`` (jobs run
            with ``--redirects``/``--tee``, whose workers write there).
        val_step, val_loss: the latest validation loss a recipe logged in its loop (``val_loss``
            lines of the metric file or of stdout: torchtune's later recipes, tune_magic's own) and
            its step, or ``None``; ``min_val_loss``, ``min_val_step``: the lowest finite one and its
            step. (A job whose checkpoints are evaluated by jobs of their own has its validation
            losses in those jobs: ``Job.val_summary``.)
        nodes, rank_hosts, endpoint: what a SLURM job's batch script and node helper printed
            (``node <host> <address>``, ``worker <host> <rank>``, ``rendezvous <address>:<port>``;
            :mod:`tune_magic.schedulers.slurm.node`): host -> address, ``[host, rank]`` pairs, and
            the rendezvous endpoint.
    """

    step: int | None = None
    loss: float | None = None
    epoch: int | None = None
    progress: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    saving: bool = False
    error: str | None = None
    updated_at: float = 0.0
    log_offset: int = 0
    log_ident: list[int] | None = None
    metrics_path: str | None = None
    metrics_offset: int = 0
    rank_offsets: dict[str, int] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)
    rank_hosts: list[list] = field(default_factory=list)
    endpoint: str | None = None
    progress_step: int | None = None
    progress_loss: float | None = None
    metric_step: int | None = None
    metric_loss: float | None = None
    min_loss: float | None = None
    progress_min_loss: float | None = None
    metric_min_loss: float | None = None
    val_step: int | None = None
    val_loss: float | None = None
    min_val_loss: float | None = None
    min_val_step: int | None = None
    version: int = VERSION

    def to_json(self) -> bytes:
        """The file's bytes (non-finite losses as JSON's ``NaN``/``Infinity`` tokens)."""
        # the same bytes as json.dumps(asdict(self)) (every value is JSON-native), without
        # asdict's deep copy: listings call this for every job
        return json.dumps({name: getattr(self, name) for name in _FIELD_NAMES}).encode()

    @classmethod
    def from_dict(cls, data: Any) -> "Summary":
        """Build from parsed JSON; unknown keys are ignored, bad values dropped to defaults.

        Raises:
            ValueError: not an object, or another version.
        """
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError("not a tune_magic summary (version 1)")
        out = cls()
        for f in fields(cls):
            if f.name in data:
                value = data[f.name]
                if _type_ok(f.name, value):
                    setattr(out, f.name, value)
        return out


_FIELD_NAMES = tuple(f.name for f in fields(Summary))
_INTS = ("step", "epoch", "log_offset", "metrics_offset", "progress_step", "metric_step", "val_step", "min_val_step")
_FLOATS = ("loss", "progress_loss", "metric_loss", "updated_at", "min_loss", "progress_min_loss", "metric_min_loss",
           "val_loss", "min_val_loss")


def _type_ok(name: str, value: Any) -> bool:
    if name in _INTS:
        return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
    if name in _FLOATS:
        return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
    if name in ("progress", "error", "metrics_path"):
        return value is None or isinstance(value, str)
    if name == "metrics":
        return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in value.items())
    if name == "nodes":
        return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    if name == "rank_hosts":
        return isinstance(value, list) and all(isinstance(x, list) and len(x) == 2 for x in value)
    if name == "endpoint":
        return value is None or isinstance(value, str)
    if name == "rank_offsets":
        return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, int) for k, v in value.items())
    if name == "saving":
        return isinstance(value, bool)
    if name == "log_ident":
        return value is None or (isinstance(value, list) and len(value) == 2 and all(isinstance(x, int) for x in value))
    return name == "version"


def read_summary(job_dir: Path) -> Summary | None:
    """Return the job's summary, or ``None`` when there is none (or it is damaged)."""
    try:
        return Summary.from_dict(jobstore.read_json(job_dir / SUMMARY, 1 << 20))
    except (OSError, ValueError):
        return None


def write_summary(job_dir: Path, summary: Summary, *, forward_only: bool = True) -> bool:
    """Replace the job's summary; return whether it was written (failures are ignored).

    Two processes may catch the same job's summary up (its supervisor every few seconds, and a
    reader, e.g. a table in another kernel, while the supervisor was not yet holding its lock), so
    with ``forward_only`` a summary that read less of the same files than the one on disk is not
    written: what a table shows never goes back (a step 3, 1, 3 was seen). The supervisor's last
    write, with the job's end, passes ``forward_only=False``."""
    if forward_only:
        current = read_summary(job_dir)
        if current is not None and _behind(summary, current):
            return False
    try:
        jobstore.write_atomic(job_dir / SUMMARY, summary.to_json(), fsync=False)
        return True
    except OSError:
        return False


def _behind(new: Summary, current: Summary) -> bool:
    """Whether ``new`` read less than ``current`` of the same log and metric file."""
    if new.log_ident != current.log_ident or new.metrics_path != current.metrics_path:
        return False
    reads = [(new.log_offset, current.log_offset), (new.metrics_offset, current.metrics_offset),
             *((new.rank_offsets.get(k, 0), v) for k, v in current.rank_offsets.items())]
    return all(a <= b for a, b in reads) and any(a < b for a, b in reads)


def _read_records(path: Path, offset: int, budget: int, final: bool) -> tuple[list[str], int] | None:
    """Read ``path`` from ``offset`` to its last record boundary (to its end when ``final``).

    Returns:
        (ANSI-free records, new offset), or ``None`` when the file cannot be read.
    """
    try:
        fd = jobstore.open_nofollow(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.pread(fd, budget, offset)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not data:
        return [], offset
    cut = len(data) if final and len(data) < budget else max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
    if cut <= 0:
        # one unfinished record so far; one longer than a whole read is no line torchtune writes
        # (a run of NULs, a binary dump): skipped, or no reader would ever get past it
        return ([], offset + len(data)) if len(data) >= budget else ([], offset)
    from tune_magic.logs.lineformat import strip_ansi

    # "\r" and "\n" never occur inside a UTF-8 multibyte character, so the cut never splits one
    text = strip_ansi(data[:cut].decode("utf-8", errors="replace"))
    return [r for r in _RECORD_SPLIT.split(text) if r], offset + cut


def _catch_up(path: Path, offset: int, budget: int, final: bool, consume: Callable[[list[str]], None]) -> int | None:
    """Give ``consume`` the records of ``path`` from ``offset`` on, at most :data:`PIECE_BYTES` at a
    time, until ``budget`` bytes were read or the file's last boundary is reached.

    Returns:
        the new offset (bytes), or ``None`` when the file cannot be read at all.
    """
    read = 0
    while read < budget:
        got = _read_records(path, offset, min(PIECE_BYTES, budget - read), final)
        if got is None:
            return offset if read else None
        records, new = got
        if new == offset:
            break
        consume(records)
        read, offset = read + new - offset, new
    return offset


class SummaryTracker:
    """Keep one job's :class:`Summary` current by reading only what its logs gained.

    Args:
        record: the job's record (log path, working directory, metric-log directory, start).
        summary: where a previous reader stopped (default: the beginning).
    """

    def __init__(self, record: jobstore.JobRecord, summary: Summary | None = None):
        self.record = record
        self.summary = summary or Summary()

    def advance(self, *, final: bool = False, budget: int = ADVANCE_BYTES) -> bool:
        """Read what the logs gained since the summary's offsets; return whether it changed.

        Args:
            final: the job has ended: read to the end, unfinished last records included.
            budget: most bytes read from each file by this call (call again while it returns
                True to catch up on a long backlog).
        """
        s = self.summary
        before = s.to_json()
        log = Path(self.record.log_path)
        try:
            st = os.stat(log)
            ident = [st.st_dev, st.st_ino]
            if s.log_ident != ident or st.st_size < s.log_offset:
                s.log_offset, s.log_ident = 0, ident  # another file now (recreated, truncated)
                s.progress_min_loss = None
        except OSError:
            st = None
        if st is not None and st.st_size > s.log_offset:
            got = _catch_up(log, s.log_offset, budget, final, self._combined)
            if got is not None:
                s.log_offset = got
        self._rank_files(budget, final)
        self._find_metric_file()
        if s.metrics_path and _size(s.metrics_path) > s.metrics_offset:
            got = _catch_up(Path(s.metrics_path), s.metrics_offset, budget, final, self._metric_file)
            if got is not None:
                s.metrics_offset = got
        self._settle()
        if final and self.record.error:
            s.error = self.record.error
        changed = s.to_json() != before
        if changed:
            s.updated_at = time.time()
        return changed

    def _combined(self, records: list[str]) -> None:
        from tune_magic.logs.parse import LogParser
        from tune_magic.logs.points import SOURCE_PROGRESS

        s = self.summary
        parser = LogParser(strict=False)
        batch = parser.parse(records)
        for step, name, value, epoch, source in zip(batch.steps, batch.names, batch.values, batch.epochs,
                                                    batch.sources):
            if name == VAL_LOSS:
                self._val(step, value)
            if name != LOSS:
                continue
            if source == SOURCE_PROGRESS:
                s.progress_min_loss = _lower(s.progress_min_loss, value)
                if s.progress_step is None or step >= s.progress_step:
                    s.progress_step, s.progress_loss = step, value
                    if epoch is not None:
                        s.epoch = epoch
            else:  # "Step N | ..." printed to stdout
                s.metric_min_loss = _lower(s.metric_min_loss, value)
                if s.metric_step is None or step >= s.metric_step:
                    s.metric_step, s.metric_loss = step, value
        if parser.latest_progress is not None:
            s.progress = parser.latest_progress[:500]
        if parser.log_path is not None:
            path = os.path.normpath(os.path.join(self.record.cwd, parser.log_path))
            if path != s.metrics_path and path != os.path.normpath(self.record.log_path):
                s.metrics_path, s.metrics_offset = path, 0
        for r in records:
            if r[:1] in "nwr" and (r.startswith("node ") or r.startswith("worker ") or r.startswith("rendezvous ")):
                self._placement(r.strip())
        for r in reversed(records):  # the later of "a step" and "saving" decides
            if "Saving checkpoint" in r:
                s.saving = True
                break
            if _STEP_RECORD.search(r):
                s.saving = False
                break

    def _placement(self, line: str) -> None:
        s = self.summary
        if m := _NODE_LINE.match(line):
            s.nodes[m[1]] = m[2]
        elif m := _WORKER_LINE.match(line):
            pair = [m[1], int(m[2])]
            if pair not in s.rank_hosts:
                s.rank_hosts.append(pair)
                s.rank_hosts.sort(key=lambda x: (x[1], x[0]))
        elif m := _RDZV_LINE.match(line):
            s.endpoint = m[1]

    def _rank_files(self, budget: int, final: bool) -> None:
        """Read what each rank's own file gained (``--redirects``/``--tee`` send output there)."""
        if not self.record.rank_log_dir:
            return
        from tune_magic.logs.logfiles import rank_log_files

        s = self.summary
        for f in rank_log_files(self.record.rank_log_dir, self.record.started_at - 1):
            key = str(f.path)
            offset = s.rank_offsets.get(key, 0)
            if _size(key) <= offset:
                continue
            got = _catch_up(f.path, offset, budget, final, self._combined)
            if got is not None:
                s.rank_offsets[key] = got

    def _find_metric_file(self) -> None:
        s = self.summary
        if s.metrics_path is None and self.record.metric_log_dir:
            from tune_magic.logs.logfiles import find_metric_file

            found = find_metric_file(self.record.metric_log_dir, self.record.started_at - 1)
            if found is not None:
                s.metrics_path, s.metrics_offset = str(found), 0

    def _metric_file(self, records: list[str]) -> None:
        from tune_magic.logs.parse import LogParser

        s = self.summary
        batch = LogParser(strict=True).parse(records)
        if not batch.steps:
            return
        last = max(batch.steps)
        values = {}
        for step, name, value in zip(batch.steps, batch.names, batch.values):
            if name == LOSS:
                s.metric_min_loss = _lower(s.metric_min_loss, value)
            elif name == VAL_LOSS:
                self._val(step, value)
            if step == last:
                values[name] = value
        if s.metric_step is None or last >= s.metric_step:
            if last == s.metric_step:  # the rest of a step whose first lines an earlier read gave
                values = {**s.metrics, **values}
            s.metrics = {k: v for k, v in values.items() if math.isfinite(v) or k == LOSS}
            if LOSS in values:
                s.metric_step, s.metric_loss = last, values[LOSS]

    def _val(self, step: int, value: float) -> None:
        """A validation loss logged at ``step``: the latest, and the lowest finite one."""
        s = self.summary
        if s.val_step is None or step >= s.val_step:
            s.val_step, s.val_loss = step, value
        if math.isfinite(value) and (s.min_val_loss is None or value < s.min_val_loss):
            s.min_val_loss, s.min_val_step = value, step

    def _settle(self) -> None:
        """step/loss: the metric file's value for its latest step, unless the progress bar is ahead."""
        s = self.summary
        if s.metric_step is not None and (s.progress_step is None or s.metric_step >= s.progress_step):
            s.step, s.loss = s.metric_step, s.metric_loss
        elif s.progress_step is not None:
            s.step, s.loss = s.progress_step, s.progress_loss
        # the lowest loss from the source the points have (Job.metric_points: the metric file's
        # values win where it has them): the sweep's best trial is ranked on it
        s.min_loss = s.metric_min_loss if s.metric_min_loss is not None else s.progress_min_loss


def _lower(lowest: float | None, value: float) -> float | None:
    """The lower of ``lowest`` and ``value``, ``nan`` and infinities ignored."""
    if not math.isfinite(value):
        return lowest
    return value if lowest is None else min(lowest, value)


def current_summary(job_dir: Path, record: jobstore.JobRecord, *, kept: bool, final: bool,
                    write: bool = True) -> Summary:
    """Return the job's summary: as written when someone ``kept`` it current (a live supervisor),
    else caught up from its offsets (and written back, if ``write`` and the registry allows).

    Args:
        job_dir: the job's directory.
        record: its record.
        kept: a live process keeps the summary current (read it as is).
        final: the job has ended (read unfinished last records too).
        write: try to save what was caught up (never required).
    """
    summary = read_summary(job_dir)
    if kept and summary is not None:
        return summary
    tracker = SummaryTracker(record, summary)
    changed = False
    while tracker.advance(final=final):
        changed = True
        if tracker.summary.log_offset >= _size(record.log_path) and (
                not tracker.summary.metrics_path or tracker.summary.metrics_offset >= _size(tracker.summary.metrics_path)):
            break
    if changed and write:
        write_summary(job_dir, tracker.summary)
    return tracker.summary


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
