"""Say why a job failed: one plain line for the user, and the whole traceback one step away.

Pure text processing, apart from reading torchelastic's error files when a report names one.
Formats read (torch 2.13 and earlier 2.x, measured here; see tests/data):

* torchrun's failure report, printed by the agent when a worker fails (``ChildFailedError``)::

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

  With ``@record`` on the worker's entry point, ``error_file`` names torchelastic's JSON error
  file ``{"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": ...}}}`` and
  ``traceback`` holds the traceback, indented by two spaces.
* Python tracebacks, with or without the ``[rankN]: `` prefix of ``init_process_group``'s
  excepthook and torchrun ``--tee``'s ``[defaultN]:`` (see :func:`tune_magic.logs.lineformat.strip_prefixes`);
  a rank that fails before ``init_process_group`` has no ``[rankN]:`` prefix.
* Known messages: CUDA out of memory, gloo and NCCL (watchdog) collective timeouts, rendezvous
  timeouts, ``EADDRINUSE`` on a fixed port.

The failing rank is the root cause of torchrun's report; when a log holds several reports
(several agents, e.g. one per node under ``srun``), a rank that raised wins over ranks that died
by a signal, and among those the earliest report time, then the first in the log. Its message is
found in this order: the error file, the report's own traceback, the last traceback of that
rank's ``[rankN]:`` lines, of its per-rank log file (``--redirects``/``--tee`` with
``--log-dir``), of its ``[defaultN]:`` lines, the last unprefixed worker traceback, and last the
log's last exception line.

A traceback the process *survived* is never the failure: one a recipe printed from its own
``except`` (``traceback.print_exc()``) and went on from. It is survived when more output of the
same process follows it: for an unprefixed traceback any later unprefixed line, for a
``[rankN]:`` / ``[defaultN]:`` one a later line of that rank; torchrun's and torch's own log lines
(``W1201 12:00:00.000 123 torch/...``, ``[rank0]:[W1201 ...]``, ``WARNING:torch...``), the
``OMP_NUM_THREADS`` banner, torchrun's ``ChildFailedError`` traceback and its report do not
count. Unprefixed output cannot be told apart by process, so an unprefixed traceback is given
to a rank the report says exited with a code other than 1 (Python's code for an uncaught
exception), or to a one-process job that did, only when it is the last worker output in the log
(other ranks' prefixed tracebacks aside); a process killed by a signal is reported as killed by
that signal.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import asdict, dataclass
from typing import Mapping

from tune_magic.logs.lineformat import split_prefixed, strip_ansi, strip_prefixes
from tune_magic.logs.oom import OomEvidence

__all__ = [
    "FailureReason",
    "Evidence",
    "ReportEntry",
    "describe_failure",
    "failure_line",
    "parse_reports",
    "KINDS",
]

#: Values of :attr:`FailureReason.kind`.
KINDS = (
    "exception",  # a Python exception (the traceback's last line)
    "signal",  # a process killed by a signal (no evidence of the OOM killer)
    "oom_killer",  # killed by the kernel's OOM killer (only with evidence, see tune_magic.logs.oom)
    "cuda_oom",  # torch.OutOfMemoryError / "CUDA out of memory"
    "gloo_timeout",  # a gloo collective timed out
    "nccl_timeout",  # an NCCL collective timed out (ProcessGroupNCCL watchdog)
    "rendezvous_timeout",  # torchrun's rendezvous did not complete in time
    "eaddrinuse",  # the rendezvous/master port was already taken
    "exit_code",  # a non-zero exit and nothing else known
)

#: Longest message kept in :attr:`FailureReason.line`, in characters.
LINE_MAX = 300

_TB_HEAD = "Traceback (most recent call last):"
_CHAIN = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_FIELD_RE = re.compile(r"^\s{0,4}(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_ENTRY_RE = re.compile(r"^\s{0,4}\[(\d+)\]:\s*$")
_RANK_RE = re.compile(r"(-?\d+)(?:\s*\(local_rank:\s*(\d+)\))?")
_EXIT_RE = re.compile(r"(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")
# A line that is only an exception: "KeyError: 'x'", "Exception: x", "pkg.mod.SomeError",
# "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError".
_EXC_LINE_RE = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*)?(?:Error|Exception|Exit|Interrupt|Failure))"
    r"(?::\s?(?P<msg>.*))?$"
)
# Inside a traceback any name can be the exception ("StopIteration", "KeyboardInterrupt"...).
_TB_EXC_RE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<msg>.*))?$")
_WRAPPER = "ChildFailedError"

_CUDA_OOM_NEW_RE = re.compile(
    r"Tried to allocate (?P<want>[\d.]+ \w+)\. GPU (?P<gpu>\d+) has a total capac\w* of (?P<total>[\d.]+ \w+) "
    r"of which (?P<free>[\d.]+ \w+) is free"
)
_CUDA_OOM_OLD_RE = re.compile(
    r"Tried to allocate (?P<want>[\d.]+ \w+) \(GPU (?P<gpu>\d+); (?P<total>[\d.]+ \w+) total capacity;"
    r"(?:[^;]*;)*? (?P<free>[\d.]+ \w+) free"
)
_GLOO_TIMEOUT_RE = re.compile(r"gloo.*Timed out waiting (?P<ms>\d+)ms for (?P<op>\w+) operation", re.I)
_NCCL_TIMEOUT_RE = re.compile(
    r"(?:\[Rank (?P<rank>\d+)\] )?Watchdog caught collective operation timeout: WorkNCCL\("
    r"(?:[^)]*?OpType=(?P<op>\w+))?[^)]*?Timeout\(ms\)=(?P<ms>\d+)\)"
)
_PORT_RE = re.compile(r"port:? (\d+)|:(\d+)\b")


@dataclass(frozen=True)
class FailureReason:
    """Why a job failed.

    Attributes:
        line: one plain line a user understands (the job record's ``error``), e.g.
            ``"rank 1: ValueError: learning rate must be positive, got -1"``,
            ``"rank 1: killed by SIGKILL (signal 9)"``.
        kind: one of :data:`KINDS`.
        rank: the failing global rank, or ``None`` when not known (one-process jobs, agent errors).
        local_rank: its local rank on its node, or ``None``.
        host: the host torchrun's report names for that rank, or ``None``.
        exc_type: the exception's type as printed (``"ValueError"``,
            ``"torch.distributed.DistNetworkError"``), or ``None``.
        message: the exception's message (may span lines), or ``None``.
        traceback: the whole traceback text (chained exceptions included, prefixes removed), or
            for signals and kernel kills the lines that explain them; ``None`` if none was found.
        exitcode: torchrun's exit code for the rank (negative: killed by that signal), or the
            process's return code when no report exists; ``None`` if unknown.
        pid: the pid of the failing process, when known.
    """

    line: str
    kind: str
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    exc_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    exitcode: int | None = None
    pid: int | None = None

    def __str__(self) -> str:
        return self.line

    def line_on_host(self) -> str:
        """:attr:`line`, followed by `` (on HOST)`` when the host is known and not in it (for jobs
        whose ranks run on other machines)."""
        return f"{self.line} (on {self.host})" if self.host and self.host not in self.line else self.line

    def to_dict(self) -> dict:
        """Return a JSON-ready dict of every field."""
        return asdict(self)


@dataclass(frozen=True)
class Evidence:
    """What is known about a job's end besides its log.

    Attributes:
        stopped: the user stopped the job (then nothing is blamed on the OOM killer).
        oom: the kernel's OOM evidence (:meth:`tune_magic.logs.oom.OomWatch.killed`), or ``None``.
        returncode: the launched process's exit status as ``subprocess`` gives it (``-9``:
            killed by SIGKILL), used when the log has no report (one-process jobs).
        pid: that process's pid.
    """

    stopped: bool = False
    oom: OomEvidence | None = None
    returncode: int | None = None
    pid: int | None = None


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
    """Return every failure entry of every torchrun report in ``text``, in log order."""
    entries: list[ReportEntry] = []
    report, in_root = -1, False
    cur: dict | None = None
    last_field = None

    def close() -> None:
        nonlocal cur
        if cur is not None and "rank" in cur:
            rank_m = _RANK_RE.match(cur.get("rank", ""))
            exit_m = _EXIT_RE.match(cur.get("exitcode", ""))
            if rank_m:
                ef = cur.get("error_file", "").strip()
                entries.append(ReportEntry(
                    rank=int(rank_m[1]),
                    local_rank=int(rank_m[2]) if rank_m[2] else None,
                    host=cur.get("host", "").strip() or None,
                    exitcode=int(exit_m[1]) if exit_m else None,
                    pid=int(exit_m[2]) if exit_m and exit_m[2] else None,
                    error_file=None if ef in ("", "<N/A>") else ef,
                    message="\n".join(cur.get("traceback_lines", [])).strip("\n"),
                    time=cur.get("time", "").strip() or None,
                    root=cur["root"],
                    report=cur["report"],
                ))
        cur = None

    for raw in text.splitlines():
        line = raw.rstrip("\r")
        stripped = line.strip()
        if stripped == "Failures:":
            close()
            report, in_root = report + 1, False
            continue
        if stripped == "Root Cause (first observed failure):":
            close()
            if report < 0:
                report = 0
            in_root = True
            continue
        if report < 0:
            continue
        if _ENTRY_RE.match(line):
            close()
            cur = {"root": in_root, "report": report}
            last_field = None
            continue
        if cur is None:
            continue
        if stripped and set(stripped) <= {"=", "-"}:
            close()
            continue
        m = _FIELD_RE.match(line)
        if m and m[1] not in cur:
            last_field = m[1]
            cur[m[1]] = m[2].strip() if m[1] != "traceback" else m[2]
            if m[1] == "traceback":
                cur["traceback_lines"] = [m[2].rstrip()]
            continue
        if last_field == "traceback" and (line.startswith("  ") or not stripped):
            cur["traceback_lines"].append(line[2:].rstrip())
            continue
        close()
    close()
    return entries


# -- tracebacks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Traceback:
    text: str
    exc_type: str
    message: str
    order: int  # position in the log (line index of its last line), to find the last one
    first: int = -1  # line index of its first line (-1: not from a log)


def _tracebacks(lines: list[tuple[int, str]]) -> list[_Traceback]:
    """Find the Python tracebacks in one stream's lines (``(index in log, text)``, prefixes gone)."""
    out: list[_Traceback] = []
    n = len(lines)
    i = 0
    chain_start: int | None = None
    while i < n:
        if lines[i][1].rstrip() != _TB_HEAD:
            i += 1
            continue
        start = i if chain_start is None else chain_start
        j = i + 1
        while j < n and lines[j][1][:1] in (" ", "\t"):
            j += 1
        if j >= n:
            break
        m = _TB_EXC_RE.match(lines[j][1].rstrip())
        if m is None or lines[j][1].rstrip() == _TB_HEAD:
            chain_start = None
            i = j
            continue
        k = j + 1
        while k < n and k - j <= 50 and lines[k][1][:1] in (" ", "\t") and lines[k][1].strip():
            k += 1  # an indented continuation of a multi-line message
        msg_lines = [m["msg"] or ""] + [line.strip() for _, line in lines[j + 1 : k]]
        # a chained exception continues after "During handling..." / "The above exception..."
        nxt = k
        while nxt < n and not lines[nxt][1].strip():
            nxt += 1
        if nxt < n and lines[nxt][1].strip() in _CHAIN:
            chain_start = start
            i = nxt + 1
            continue
        chain_start = None
        text = "\n".join(line.rstrip() for _, line in lines[start:k])
        out.append(_Traceback(text, m["type"], "\n".join(msg_lines).strip(), lines[k - 1][0], lines[start][0]))
        i = k
    return out


def _exception_lines(lines: list[tuple[int, str]]) -> list[_Traceback]:
    """Lines that are an exception by themselves (outside tracebacks, e.g. logged errors)."""
    out = []
    for idx, line in lines:
        m = _EXC_LINE_RE.match(line.strip())
        if m and not m["type"].endswith(_WRAPPER):
            out.append(_Traceback(line.strip(), m["type"], (m["msg"] or "").strip(), idx, idx))
    return out


# Lines that torchrun or torch write, not the worker's own code: glog-style lines of torchrun's
# agent and torch ("W1201 03:59:43.187000 10635 torch/..."), torch's C++ log lines
# ("[W1201 ...]", after a [rankN]: prefix), Python logging's default format of older torch
# ("WARNING:torch.distributed.run:..."), and the OMP_NUM_THREADS banner.
_TOOL_LINE_RE = re.compile(
    r"^(?:\s*[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ |\[[IWEF]\d{4} \d\d:\d\d:\d\d|"
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):torch[.:]|\*+\s*$|Setting OMP_NUM_THREADS environment variable )"
)
_REPORT_WORDS = ("Failures:", "Root Cause (first observed failure):", "<NO_OTHER_FAILURES>")


def _report_end(lines: list[tuple[int, str]], i: int) -> int:
    """Index (in ``lines``) just past the report that follows torchrun's ``ChildFailedError:``
    line at ``i``: its rules, title, entries and their fields."""
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


# Where another process's output is glued onto a line that had no newline yet (a progress bar
# redrawn with \r): "1|1|Loss: 10.0: 20%|[rank1]: Traceback (most recent call last):". Cut before
# a [rankN]: prefix, or a traceback's first line, that is not at the start of the line nor right
# after another prefix ("[default1]:[rank1]: ", "[rank1]: Traceback").
_GLUED_RE = re.compile(r"(?<=.)(?<!\]:)(?<!\]: )(?=\[rank\d+\]: |Traceback \(most recent call last\):)")


class _Log:
    """The log's lines split into streams by prefix: ``("rank", N)`` for ``[rankN]:`` lines,
    ``("local", N)`` for ``[defaultN]:``-only lines, ``("plain", None)`` for the rest."""

    def __init__(self, text: str) -> None:
        self.streams: dict[tuple, list[tuple[int, str]]] = {}
        self.all: list[tuple[int, str]] = []
        self._who: list[tuple[int | None, int | None]] = []  # (rank, local rank) of each line
        locals_of: dict[int, set[int]] = {}
        idx = 0
        lines = strip_ansi(text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
        for raw in (part for line in lines for part in _GLUED_RE.split(line)):
            pieces = split_prefixed(raw) if raw.startswith("[") else []
            for piece in [p + t for p, t in pieces] or [raw]:
                rank, local, body = strip_prefixes(piece)
                key = ("rank", rank) if rank is not None else ("local", local) if local is not None else ("plain", None)
                self.streams.setdefault(key, []).append((idx, body))
                self.all.append((idx, body))
                self._who.append((rank, local))
                if rank is not None and local is not None:
                    locals_of.setdefault(rank, set()).add(local)
                idx += 1
        self._locals_of = locals_of
        self._found: dict[tuple, list[_Traceback]] = {
            k: _tracebacks(lines) for k, lines in self.streams.items()}
        # what a worker wrote: not blank, not torch's or torchrun's own lines, not torchrun's
        # ChildFailedError traceback and report; prefixed tracebacks (a crash) marked apart
        self._tool: set[int] = {i for i, body in self.all if not body.strip() or _TOOL_LINE_RE.match(body)}
        self._crash: set[int] = set()
        self._last_cache: dict[tuple | None, int] = {}
        plain = self.streams.get(("plain", None), [])
        pos = {line_idx: n for n, (line_idx, _) in enumerate(plain)}
        for k, tbs in self._found.items():
            for tb in tbs:
                if tb.exc_type.endswith(_WRAPPER) and k == ("plain", None):
                    end = _report_end(plain, pos[tb.order])
                    last = plain[end - 1][0] if end > pos[tb.order] else tb.order
                    self._tool.update(i for i, _ in plain if tb.first <= i <= last)
                elif k[0] != "plain":
                    self._crash.update(range(tb.first, tb.order + 1))

    def _same_process(self, key: tuple, line: int) -> bool:
        rank, local = self._who[line]
        if key[0] == "plain":
            return rank is None and local is None
        if key[0] == "rank":
            return rank == key[1] or (rank is None and local in self._locals_of.get(key[1], ()))
        return local == key[1]

    def _last_written(self, key: tuple | None) -> int:
        """Index of the last line a worker wrote: of stream ``key``'s process, or (``None``) of
        any process, other ranks' prefixed tracebacks aside; -1 if none."""
        if key not in self._last_cache:
            self._last_cache[key] = max(
                (i for i in range(len(self.all)) if i not in self._tool
                 and (self._same_process(key, i) if key is not None else i not in self._crash)), default=-1)
        return self._last_cache[key]

    def survived(self, key: tuple, tb: _Traceback) -> bool:
        """Whether the process that printed ``tb`` (in stream ``key``) wrote more after it."""
        return self._last_written(key) > tb.order

    def last_output(self, tb: _Traceback) -> bool:
        """Whether no worker wrote anything after ``tb`` (other ranks' prefixed tracebacks aside)."""
        return self._last_written(None) <= tb.order

    def tracebacks(self, key: tuple | None = None, *, survived: bool = True) -> list[tuple[tuple, _Traceback]]:
        """``(stream key, traceback)`` of one stream (or all), torchrun's own wrapper left out,
        in log order; with ``survived=False`` only those the process did not go on from."""
        keys = [key] if key is not None else list(self.streams)
        found = [(k, tb) for k in keys for tb in self._found.get(k, [])
                 if not tb.exc_type.endswith(_WRAPPER) and (survived or not self.survived(k, tb))]
        return sorted(found, key=lambda kt: kt[1].order)

    def last_traceback(self, key: tuple | None = None, *, survived: bool = True) -> _Traceback | None:
        """The last traceback of one stream (or of any stream); see :meth:`tracebacks`."""
        found = self.tracebacks(key, survived=survived)
        return found[-1][1] if found else None

    def exception_lines(self, keys: list[tuple]) -> list[_Traceback]:
        """Lines of these streams that are an exception by themselves, outside every traceback."""
        inside = {i for k in keys for tb in self._found.get(k, []) for i in range(tb.first, tb.order + 1)}
        lines = sorted(x for k in keys for x in self.streams.get(k, []) if x[0] not in inside)
        return _exception_lines(lines)


# -- plain lines --------------------------------------------------------------------------------


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def _secs(ms: str) -> str:
    s = int(ms) / 1000
    return f"{s:g} s"


def _classify(exc_type: str, message: str) -> tuple[str, str]:
    """Return (kind, plain text) for an exception."""
    first = message.split("\n", 1)[0].strip()
    both = f"{exc_type}: {message}"
    if exc_type.endswith("OutOfMemoryError") or "CUDA out of memory" in message:
        m = _CUDA_OOM_NEW_RE.search(message) or _CUDA_OOM_OLD_RE.search(message)
        if m:
            return "cuda_oom", (
                f"CUDA out of memory on GPU {m['gpu']}: tried to allocate {m['want']} with {m['free']} free "
                f"of {m['total']} ({exc_type}); lower the batch size or sequence length, or turn on activation "
                f"checkpointing")
        return "cuda_oom", f"CUDA out of memory ({exc_type}: {_cut(first)})"
    m = _NCCL_TIMEOUT_RE.search(both)
    if m:
        return "nccl_timeout", _collective_timeout("NCCL", m["op"], m["ms"])
    m = _GLOO_TIMEOUT_RE.search(both)
    if m:
        return "gloo_timeout", _collective_timeout("gloo", m["op"], m["ms"])
    if exc_type.endswith("RendezvousTimeoutError"):
        return "rendezvous_timeout", (
            "rendezvous timed out: not every node's torchrun joined within the join timeout; start one torchrun "
            "per node with the same --nnodes, --rdzv-endpoint and --rdzv-id (--rdzv-conf join_timeout=SECONDS "
            "waits longer)")
    if "EADDRINUSE" in message or "address already in use" in message.lower():
        pm = _PORT_RE.search(message)
        port = next((g for g in pm.groups() if g), None) if pm else None
        what = f"port {port}" if port else "the rendezvous port"
        return "eaddrinuse", (
            f"{what} is already in use (EADDRINUSE): another job or program listens on it; leave the endpoint "
            f"out (no --master-port / --rdzv-endpoint) and a free port is picked")
    return "exception", f"{exc_type}: {_cut(first)}" if first else exc_type


def _collective_timeout(backend: str, op: str | None, ms: str) -> str:
    what = f"{backend} {op.lower()}" if op else f"{backend} collective"
    return (f"{what} timed out after {_secs(ms)} waiting for the other ranks (one of them stalled, crashed, or "
            f"ran different code); the limit is init_process_group's timeout")


def _cut(text: str) -> str:
    return text if len(text) <= LINE_MAX else text[: LINE_MAX - 3] + "..."


# -- the algorithm ------------------------------------------------------------------------------


def _read_error_file(path: str) -> tuple[str | None, str | None]:
    """(message, py_callstack) of torchelastic's error file, (None, None) if unreadable."""
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


def _split_exception(line: str) -> tuple[str, str]:
    m = _TB_EXC_RE.match(line.strip())
    if m is None:
        return "Exception", line.strip()
    return m["type"], (m["msg"] or "").strip()


_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote process exited")


def _raised(e: ReportEntry) -> bool:
    return e.exitcode is not None and e.exitcode > 0


def _consequence(e: ReportEntry, log: _Log) -> bool:
    """Whether ``e`` raised only because a peer went away (gloo "Connection closed by peer"...)."""
    if not _raised(e):
        return False
    tb = log.last_traceback(("rank", e.rank))
    return tb is not None and any(s in tb.message for s in _PEER_GONE)


def _choose(entries: list[ReportEntry], log: _Log) -> ReportEntry:
    """The failing entry: among the reports' root causes a raise beats a signal, which beats a
    raise that only says a peer went away; then the earliest time, then the first in the log.

    torchrun's root cause is the first failure its monitor *noticed* (times are whole seconds),
    so when it names a rank that raised because its peer vanished, a rank of the same report
    that died by a signal other than torchrun's own SIGTERM/SIGINT teardown is the failure.
    """
    roots = [e for e in entries if e.root] or entries

    def key(e: ReportEntry) -> tuple:
        consequence = _consequence(e, log)
        return (0 if _raised(e) and not consequence else 2 if consequence else 1, e.time or "", e.report)

    best = min(roots, key=key)
    if _consequence(best, log):
        for e in entries:
            if (e.report == best.report and e.exitcode is not None and e.exitcode < 0
                    and -e.exitcode not in (signal.SIGTERM, signal.SIGINT)):
                return e
    return best


def _nccl_lines(log: _Log, rank: int | None) -> list[tuple[int, str, re.Match]]:
    found = []
    for idx, line in log.all:
        if "Watchdog caught collective operation timeout" in line:
            m = _NCCL_TIMEOUT_RE.search(line)
            if m:
                found.append((idx, line, m))
    if rank is not None:
        own = [f for f in found if f[2]["rank"] == str(rank)]
        if own:
            return own
    return found


@dataclass(frozen=True)
class _Who:
    """The failing process as the report names it; ``show_host`` when the log has several hosts."""

    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    exitcode: int | None = None
    pid: int | None = None
    show_host: bool = False

    def say(self, text: str) -> str:
        if self.rank is None:
            return text
        where = f"rank {self.rank}" + (f" on {self.host}" if self.show_host and self.host else "")
        return f"{where}: {text}"

    def reason(self, line: str, kind: str, **fields) -> FailureReason:
        return FailureReason(self.say(line), kind, self.rank, self.local_rank, self.host,
                             exitcode=self.exitcode, pid=self.pid, **fields)


def _signal_reason(who: _Who, log: _Log, evidence: Evidence | None, extra: str | None) -> FailureReason:
    sig = -(who.exitcode or 0)
    name = _signal_name(sig)
    oom = evidence.oom if evidence is not None else None
    stopped = evidence is not None and evidence.stopped
    if sig == signal.SIGKILL and oom is not None and not stopped and oom.killed(who.pid):
        return who.reason(f"killed by the OOM killer ({oom.where(who.pid)}; SIGKILL)", "oom_killer",
                          traceback="\n".join(oom.lines) or None)
    nccl = _nccl_lines(log, who.rank) if not stopped else []
    if nccl:
        _, line, m = nccl[0]
        text = _collective_timeout("NCCL", m["op"], m["ms"]) + f"; the process was ended by {name}"
        return who.reason(text, "nccl_timeout", message=line.strip(),
                          traceback="\n".join(x[1].strip() for x in nccl))
    return who.reason(f"killed by {name} (signal {sig})", "signal", traceback=extra)


def _from_traceback(tb: _Traceback, who: _Who) -> FailureReason:
    kind, text = _classify(tb.exc_type, tb.message)
    return who.reason(text, kind, exc_type=tb.exc_type, message=tb.message or None, traceback=tb.text)


def describe_failure(
    log_text: str,
    *,
    rank_logs: Mapping[int, str] | None = None,
    evidence: Evidence | None = None,
) -> FailureReason | None:
    """Say why a job failed, from the end of its combined log (see the module docstring).

    Args:
        log_text: the end of the job's combined stdout+stderr (a few hundred KiB is plenty).
        rank_logs: the ends of the per-rank files torchrun writes with ``--redirects``/``--tee``
            and ``--log-dir`` (stdout then stderr of one rank), keyed by *local* rank; see
            :func:`tune_magic.logs.logfiles.read_rank_logs`.
        evidence: what else is known (stopped by the user, OOM evidence, return code).

    Returns:
        A :class:`FailureReason`, or ``None`` when neither the log nor ``evidence`` explains
        anything (the caller then says ``exited with code N``).
    """
    log = _Log(log_text)
    entries = parse_reports(log_text)
    if entries:
        return _from_report(_choose(entries, log), entries, log, rank_logs, evidence)
    # No report: the agent itself failed (EADDRINUSE, rendezvous timeout), or a one-process job.
    who = _Who(exitcode=evidence.returncode, pid=evidence.pid) if evidence is not None else _Who()
    if who.exitcode is not None and who.exitcode < 0:  # killed: no traceback of its own explains that
        return _signal_reason(who, log, evidence, None)
    # a plain exit code (sys.exit(3)) is explained by a traceback only if nothing came after it
    plain_code = who.exitcode not in (None, 0, 1)
    found = [(k, tb) for k, tb in log.tracebacks(survived=False) if not plain_code or log.last_output(tb)]
    if found:
        key, tb = found[-1]
        if key[0] == "rank":
            who = _Who(rank=key[1], exitcode=who.exitcode, pid=who.pid)
        return _from_traceback(tb, who)
    lines = [x for x in log.exception_lines(list(log.streams)) if not plain_code or log.last_output(x)]
    if lines:
        return _from_traceback(lines[-1], who)
    nccl = _nccl_lines(log, None)
    if nccl:
        _, line, m = nccl[0]
        who = _Who(rank=int(m["rank"]) if m["rank"] else None, exitcode=who.exitcode, pid=who.pid)
        return who.reason(_collective_timeout("NCCL", m["op"], m["ms"]), "nccl_timeout", message=line.strip(),
                          traceback="\n".join(x[1].strip() for x in nccl))
    if who.exitcode:
        return who.reason(f"exited with code {who.exitcode}", "exit_code")
    return None


def _from_report(e: ReportEntry, entries: list[ReportEntry], log: _Log, rank_logs: Mapping[int, str] | None,
                 evidence: Evidence | None) -> FailureReason:
    several_hosts = len({x.host for x in entries if x.host}) > 1
    who = _Who(e.rank, e.local_rank, e.host, e.exitcode, e.pid, several_hosts)
    if e.exitcode is not None and e.exitcode < 0:
        return _signal_reason(who, log, evidence, e.message or None)
    # 1. torchelastic's error file (@record); 2. the report's own traceback field
    if e.error_file:
        msg, stack = _read_error_file(e.error_file)
        if msg:
            exc_type, message = _split_exception(msg)
            return _from_traceback(_Traceback(stack or msg, exc_type, message, 0), who)
    if e.message.startswith(_TB_HEAD):
        tbs = _tracebacks(list(enumerate(e.message.split("\n"))))
        if tbs:
            return _from_traceback(tbs[-1], who)
    # 3-6. the rank's own output: by prefix, its per-rank file, tee's local prefix; then unprefixed
    # (anyone's: for a plain exit code, only when nothing came after it). Never one it survived.
    candidates = [log.last_traceback(("rank", e.rank), survived=False)]
    if rank_logs and e.local_rank is not None and e.local_rank in rank_logs:
        candidates.append(_Log(rank_logs[e.local_rank]).last_traceback(survived=False))
    if e.local_rank is not None:
        candidates.append(log.last_traceback(("local", e.local_rank), survived=False))
    python_exit = e.exitcode in (1, None)  # 1: what Python exits with after an uncaught exception
    plain = log.last_traceback(("plain", None), survived=False)
    candidates.append(plain if plain is not None and (python_exit or log.last_output(plain)) else None)
    for tb in candidates:
        if tb is not None:
            return _from_traceback(tb, who)
    # 7. the last exception line of the rank's or the unprefixed output (outside tracebacks)
    lines = sorted(log.exception_lines([("rank", e.rank)]) + [
        x for x in log.exception_lines([("plain", None)]) if python_exit or log.last_output(x)], key=lambda x: x.order)
    if lines:
        return _from_traceback(lines[-1], who)
    return who.reason(f"exited with code {e.exitcode}", "exit_code")


def failure_line(
    log_text: str,
    *,
    rank_logs: Mapping[int, str] | None = None,
    evidence: Evidence | None = None,
) -> str | None:
    """Return just :attr:`FailureReason.line` of :func:`describe_failure` (``None`` if it has none)."""
    reason = describe_failure(log_text, rank_logs=rank_logs, evidence=evidence)
    return reason.line if reason is not None else None
