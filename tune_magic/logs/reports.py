"""torchrun's failure report: its entries (:func:`parse_reports`) and the error files they name.

Pure text processing, apart from reading torchelastic's error file (:func:`read_error_file`).
Format (torch 2.13 and earlier 2.x, measured here; see tests/data): printed by torchrun's agent
when a worker fails (``ChildFailedError``)::

      Failures:
      [1]:
        time      : 2026-12-01_03:59:29
        host      : localhost
        rank      : 0 (local_rank: 0)
        exitcode  : -15 (pid: 10413)  (SIGTERM)
        error_file: <N/A>
        traceback : Signal 15 (SIGTERM) received by PID 10413
      ------------------------------------------------------------
      Root Cause (first observed failure):
      [0]:
        ...
        rank      : 1 (local_rank: 1)
        exitcode  : 1 (pid: 10414)
        error_file: <N/A>
        traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html

With ``@record`` on the worker's entry point, ``error_file`` names torchelastic's JSON error file
``{"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": ...}}}`` and
``traceback`` holds the traceback, indented by two spaces. A log may hold several reports (several
agents, e.g. one per node of a multi-node job).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["ReportEntry", "parse_reports", "report_end", "read_error_file"]

# One "name : value" field of a report entry; groups: the field name, the value.
_FIELD_RE = re.compile(r"^\s{0,4}(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
# The "[N]:" line that starts a report entry.
_ENTRY_RE = re.compile(r"^\s{0,4}\[(\d+)\]:\s*$")
_RANK_RE = re.compile(r"(-?\d+)(?:\s*\(local_rank:\s*(\d+)\))?")
_EXIT_RE = re.compile(r"(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")
_FAILURES = "Failures:"
_ROOT_CAUSE = "Root Cause (first observed failure):"
_REPORT_WORDS = (_FAILURES, _ROOT_CAUSE, "<NO_OTHER_FAILURES>")


@dataclass(frozen=True)
class ReportEntry:
    """One failure entry of torchrun's report.

    Attributes:
        rank: global rank. local_rank: rank on its node. host: as printed.
        exitcode: negative for a signal. pid: the worker's pid.
        error_file: path, or ``None`` for ``<N/A>``.
        message: the ``traceback`` field (several lines when an error file exists).
        time: as printed (``2026-12-01_03:59:29``), or ``None``.
        root: whether it is its report's root cause.
        report: index of its report in the log (0 = first).
    """

    rank: int
    local_rank: int | None
    host: str | None
    exitcode: int | None
    pid: int | None
    error_file: str | None
    message: str
    time: str | None
    root: bool
    report: int


def parse_reports(text: str) -> list[ReportEntry]:
    """Return every failure entry of every torchrun report in ``text``, in log order.

    Args:
        text: a job's combined output (or its end); lines may end with ``\\r\\n``.

    Returns:
        The entries; ``[]`` when the text holds no report. An entry without a readable ``rank``
        field is left out.
    """
    reader = _ReportReader()
    for raw in text.splitlines():
        reader.feed(raw.rstrip("\r"))
    reader.close_entry()
    return reader.entries


class _ReportReader:
    """The state of :func:`parse_reports`: which report and section it is in, and the fields of
    the entry being read."""

    def __init__(self) -> None:
        self.entries: list[ReportEntry] = []
        self.report = -1  # index of the report being read; -1 before the first
        self.in_root = False  # inside its "Root Cause" section
        self.fields: dict | None = None  # the entry being read
        self.last_field: str | None = None

    def feed(self, line: str) -> None:
        stripped = line.strip()
        if stripped == _FAILURES:
            self.close_entry()
            self.report, self.in_root = self.report + 1, False
        elif stripped == _ROOT_CAUSE:
            self.close_entry()
            self.report, self.in_root = max(self.report, 0), True
        elif self.report < 0:
            return
        elif _ENTRY_RE.match(line):
            self.close_entry()
            self.fields = {"root": self.in_root, "report": self.report}
            self.last_field = None
        elif self.fields is not None:
            self._entry_line(line, stripped)

    def _entry_line(self, line: str, stripped: str) -> None:
        """A line inside an entry: a field, the traceback field's next line, or the entry's end."""
        fields = self.fields
        if stripped and set(stripped) <= {"=", "-"}:
            self.close_entry()
            return
        m = _FIELD_RE.match(line)
        if m and m[1] not in fields:
            self.last_field = m[1]
            fields[m[1]] = m[2].strip() if m[1] != "traceback" else m[2]
            if m[1] == "traceback":
                fields["traceback_lines"] = [m[2].rstrip()]
        elif self.last_field == "traceback" and (line.startswith("  ") or not stripped):
            fields["traceback_lines"].append(line[2:].rstrip())
        else:
            self.close_entry()

    def close_entry(self) -> None:
        fields, self.fields = self.fields, None
        if fields is None or "rank" not in fields:
            return
        rank_m = _RANK_RE.match(fields["rank"])
        if not rank_m:
            return
        exit_m = _EXIT_RE.match(fields.get("exitcode", ""))
        ef = fields.get("error_file", "").strip()
        self.entries.append(ReportEntry(
            rank=int(rank_m[1]),
            local_rank=int(rank_m[2]) if rank_m[2] else None,
            host=fields.get("host", "").strip() or None,
            exitcode=int(exit_m[1]) if exit_m else None,
            pid=int(exit_m[2]) if exit_m and exit_m[2] else None,
            error_file=None if ef in ("", "<N/A>") else ef,
            message="\n".join(fields.get("traceback_lines", [])).strip("\n"),
            time=fields.get("time", "").strip() or None,
            root=fields["root"],
            report=fields["report"],
        ))


def report_end(lines: list[tuple[int, str]], i: int) -> int:
    """Index (in ``lines``) just past the report that follows torchrun's ``ChildFailedError:``
    line at ``i``: its rules, title, entries and their fields.

    Args:
        lines: ``(index in the log, text)`` pairs of one stream, prefixes removed.
        i: the position in ``lines`` of the ``ChildFailedError`` line.
    """
    j = i + 1
    while j < len(lines):
        raw = lines[j][1]
        s = raw.strip()
        if (not s or set(s) <= {"=", "-"} or s.endswith(" FAILED") or s in _REPORT_WORDS
                or _ENTRY_RE.match(raw) or _FIELD_RE.match(raw) or raw.startswith("  ")):
            j += 1
            continue
        break
    return j


def read_error_file(path: str) -> tuple[str | None, str | None]:
    """Read torchelastic's JSON error file (written by ``@record``; named by a report entry).

    Returns:
        ``(message, py_callstack)``: the exception line (``"RuntimeError: boom"``) and the
        traceback text, each ``None`` when missing; ``(None, None)`` when the file cannot be
        read or is not JSON.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None, None
    msg = data.get("message") if isinstance(data, dict) else None
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), dict) else {}
        return (msg.get("message") if isinstance(msg.get("message"), str) else None,
                extra.get("py_callstack") if isinstance(extra.get("py_callstack"), str) else None)
    return (msg if isinstance(msg, str) else None), None
