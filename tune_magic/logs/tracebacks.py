"""Find the Python tracebacks in a job's log, by process, and tell which ones it survived.

Pure text processing. Formats read (torch 2.13 and earlier 2.x, measured here; see tests/data):
Python tracebacks (chained ones included), with or without the ``[rankN]: `` prefix of
``init_process_group``'s excepthook and torchrun ``--tee``'s ``[defaultN]:`` (see
:func:`tune_magic.logs.lineformat.strip_prefixes`); a rank that fails before ``init_process_group``
has no ``[rankN]:`` prefix. :class:`LogStreams` splits a log into streams by prefix;
:func:`tune_magic.logs.failure.describe_failure` chooses among what it finds.

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

An exception's message may span lines, indented or not (torchtune's ``InstantiationError``:
``Error loading '...':`` then ``ModuleNotFoundError(...)`` then ``Are you sure ...``, each at the
start of a line): every line after the exception line is its message, blank ones inside it too, up
to a traceback's first line, a chain's ``During handling ...`` / ``The above exception ...``
line, a torch or torchrun line, or training output (a progress bar, a metric line, a logging line:
what a recipe that survived the traceback goes on to print). A process that printed more of its
own after that survived the traceback; one that printed nothing more died of it, or ended with it
as its last word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tune_magic.logs.lineformat import split_prefixed, strip_ansi, strip_prefixes
from tune_magic.logs.reports import report_end

__all__ = ["Traceback", "LogStreams", "find_tracebacks", "exception_lines", "split_exception", "TB_HEAD", "WRAPPER"]

#: The first line of every Python traceback.
TB_HEAD = "Traceback (most recent call last):"
_CHAIN = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# A line that is only an exception: "KeyError: 'x'", "Exception: x", "pkg.mod.SomeError",
# "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError".
_EXC_LINE_RE = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*)?(?:Error|Exception|Exit|Interrupt|Failure))"
    r"(?::\s?(?P<msg>.*))?$"
)
# Inside a traceback any name can be the exception ("StopIteration", "KeyboardInterrupt"...).
_TB_EXC_RE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<msg>.*))?$")
#: The exception torchrun's agent raises when a worker failed (its traceback is not the worker's).
WRAPPER = "ChildFailedError"
# Lines that torchrun or torch write, not the worker's own code: glog-style lines of torchrun's
# agent and torch ("W1201 03:59:43.187000 10635 torch/..."), torch's C++ log lines
# ("[W1201 ...]", after a [rankN]: prefix), Python logging's default format of older torch
# ("WARNING:torch.distributed.run:..."), and the OMP_NUM_THREADS banner.
_TOOL_LINE_RE = re.compile(
    r"^(?:\s*[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ |\[[IWEF]\d{4} \d\d:\d\d:\d\d|"
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):torch[.:]|\*+\s*$|Setting OMP_NUM_THREADS environment variable )"
)

# Training output, never an exception's message: a tqdm bar ("1|3|Loss: 2.5: 20%|##  | 3/15"),
# a DiskLogger line ("Step 3 | loss:2.5 ..."), Python logging's default format ("INFO:name:text").
_OUTPUT_RE = re.compile(r"\d%\||^\s*\d+\|\d+\|Loss: |^\s*Step \d+ \||^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]*:")

# Where another process's output is glued onto a line that had no newline yet (a progress bar
# redrawn with \r): "1|1|Loss: 10.0: 20%|[rank1]: Traceback (most recent call last):". Cut before
# a [rankN]: prefix, or a traceback's first line, that is not at the start of the line nor right
# after another prefix ("[default1]:[rank1]: ", "[rank1]: Traceback").
_GLUED_RE = re.compile(r"(?<=.)(?<!\]:)(?<!\]: )(?=\[rank\d+\]: |Traceback \(most recent call last\):)")


@dataclass(frozen=True)
class Traceback:
    """One Python traceback (or one exception line) found in a log.

    Attributes:
        text: the whole traceback, chained exceptions included, prefixes removed.
        exc_type: the exception's type as printed (``"ValueError"``, ``"torch.OutOfMemoryError"``).
        message: its message (may span lines; ``""`` when none).
        order: position in the log (line index of its last line), to find the last one.
        first: line index of its first line (-1: not from a log).
    """

    text: str
    exc_type: str
    message: str
    order: int
    first: int = -1


def find_tracebacks(lines: list[tuple[int, str]]) -> list[Traceback]:
    """Find the Python tracebacks in one stream's lines.

    Args:
        lines: ``(index in the log, text)`` pairs, prefixes removed.

    Returns:
        The tracebacks in order; a chained exception and the ones it was raised from are one.
    """
    out: list[Traceback] = []
    n = len(lines)
    i = 0
    chain_start: int | None = None
    while i < n:
        if lines[i][1].rstrip() != TB_HEAD:
            i += 1
            continue
        start = i if chain_start is None else chain_start
        j = i + 1
        while j < n and lines[j][1][:1] in (" ", "\t"):
            j += 1
        if j >= n:
            break
        m = _TB_EXC_RE.match(lines[j][1].rstrip())
        if m is None or lines[j][1].rstrip() == TB_HEAD:
            chain_start = None
            i = j
            continue
        k = scan = j + 1
        # torchrun's own ChildFailedError is followed by its report (tune_magic.logs.reports), not a message
        wrapper = m["type"].endswith(WRAPPER)
        while not wrapper and scan < n and scan - j <= 50 and (not lines[scan][1].strip() or _continues(lines[scan][1])):
            scan += 1  # the message's next line (blank ones count only with more of it after them)
            if lines[scan - 1][1].strip():
                k = scan
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
        out.append(Traceback(text, m["type"], "\n".join(msg_lines).strip(), lines[k - 1][0], lines[start][0]))
        i = k
    return out


def _continues(line: str) -> bool:
    """Whether ``line`` may go on an exception's message: not blank, not a traceback's first line
    nor a chain's, not a line of torch or torchrun, not training output."""
    body = line.strip()
    return (bool(body) and body != TB_HEAD and body not in _CHAIN and not _TOOL_LINE_RE.match(line)
            and not _OUTPUT_RE.search(line))


def exception_lines(lines: list[tuple[int, str]]) -> list[Traceback]:
    """Lines that are an exception by themselves (outside tracebacks, e.g. logged errors), as
    one-line :class:`Traceback` objects; torchrun's own ``ChildFailedError`` left out."""
    out = []
    for idx, line in lines:
        m = _EXC_LINE_RE.match(line.strip())
        if m and not m["type"].endswith(WRAPPER):
            out.append(Traceback(line.strip(), m["type"], (m["msg"] or "").strip(), idx, idx))
    return out


def split_exception(line: str) -> tuple[str, str]:
    """``(type, message)`` of an exception's text such as ``"RuntimeError: boom"`` (``@record``'s
    error file: ``"<type>: <str(exc)>"``, whose message may go on over more lines); a text whose
    first line does not read as one is ``("Exception", text)``."""
    first, _, rest = line.strip().partition("\n")
    m = _TB_EXC_RE.match(first.strip())
    if m is None:
        return "Exception", line.strip()
    return m["type"], "\n".join([m["msg"] or "", rest]).strip()


class LogStreams:
    """A log's lines split into streams by prefix, with the tracebacks of each stream.

    Stream keys: ``("rank", N)`` for ``[rankN]:`` lines, ``("local", N)`` for
    ``[defaultN]:``-only lines, ``("plain", None)`` for the rest. Lines are cut where another
    process's output was glued onto an unterminated line (a progress bar).

    Args:
        text: the log text (or its end), ANSI sequences and ``\\r`` redraws allowed.

    Attributes:
        streams: stream key -> ``[(index in the log, text without prefixes), ...]``.
        all: every line as ``(index, text)``, in log order.
    """

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
        self._found: dict[tuple, list[Traceback]] = {
            k: find_tracebacks(lines) for k, lines in self.streams.items()}
        # what a worker wrote: not blank, not torch's or torchrun's own lines, not torchrun's
        # ChildFailedError traceback and report; prefixed tracebacks (a crash) marked apart
        self._tool: set[int] = {i for i, body in self.all if not body.strip() or _TOOL_LINE_RE.match(body)}
        self._crash: set[int] = set()
        self._last_cache: dict[tuple | None, int] = {}
        plain = self.streams.get(("plain", None), [])
        pos = {line_idx: n for n, (line_idx, _) in enumerate(plain)}
        for k, tbs in self._found.items():
            for tb in tbs:
                if tb.exc_type.endswith(WRAPPER) and k == ("plain", None):
                    end = report_end(plain, pos[tb.order])
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

    def survived(self, key: tuple, tb: Traceback) -> bool:
        """Whether the process that printed ``tb`` (in stream ``key``) wrote more after it."""
        return self._last_written(key) > tb.order

    def last_output(self, tb: Traceback) -> bool:
        """Whether no worker wrote anything after ``tb`` (other ranks' prefixed tracebacks aside)."""
        return self._last_written(None) <= tb.order

    def tracebacks(self, key: tuple | None = None, *, survived: bool = True) -> list[tuple[tuple, Traceback]]:
        """``(stream key, traceback)`` of one stream (or all), torchrun's own wrapper left out,
        in log order; with ``survived=False`` only those the process did not go on from."""
        keys = [key] if key is not None else list(self.streams)
        found = [(k, tb) for k in keys for tb in self._found.get(k, [])
                 if not tb.exc_type.endswith(WRAPPER) and (survived or not self.survived(k, tb))]
        return sorted(found, key=lambda kt: kt[1].order)

    def last_traceback(self, key: tuple | None = None, *, survived: bool = True) -> Traceback | None:
        """The last traceback of one stream (or of any stream); see :meth:`tracebacks`."""
        found = self.tracebacks(key, survived=survived)
        return found[-1][1] if found else None

    def exception_lines(self, keys: list[tuple]) -> list[Traceback]:
        """Lines of these streams that are an exception by themselves, outside every traceback."""
        inside = {i for k in keys for tb in self._found.get(k, []) for i in range(tb.first, tb.order + 1)}
        lines = sorted(x for k in keys for x in self.streams.get(k, []) if x[0] not in inside)
        return exception_lines(lines)
