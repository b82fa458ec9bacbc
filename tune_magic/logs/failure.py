"""Say why a job failed: one plain line for the user, and the whole traceback one step away.

Pure text processing, apart from reading torchelastic's error files when a report names one.
Built on torchrun's failure report (:mod:`tune_magic.logs.reports`) and the tracebacks found in
the log by process (:mod:`tune_magic.logs.tracebacks`); this module chooses the failing rank and
phrases the reason. Known messages are phrased with their fix: CUDA out of memory, gloo and NCCL
(watchdog) collective timeouts, rendezvous timeouts, ``EADDRINUSE`` on a fixed port.

The failing rank is the root cause of torchrun's report; when a log holds several reports
(several agents, e.g. one per node under ``srun``), a rank that raised wins over ranks that died
by a signal, and among those the first failure by time, then the first in the log. Ranks that
raised are ordered by where their own tracebacks are in the log: each rank writes its traceback the
moment it raises, into the one combined log, whereas each agent prints its report only after it
stopped its other workers (measured: ``tests/data/two_agents_both_raise.log``, where the rank that
raised first has the second report), and its ``time`` field is the whole second its agent saw the
failure; otherwise by that ``time`` field (an entry without one comes last), then the traceback.
When more than one rank failed on its own (raised, or was the root cause of its report by a signal
other than torchrun's SIGTERM/SIGINT teardown; a raise that only says its peer went away does not
count; a rank whose traceback ends its output counts too when its agent was stopped before it
printed a report), the line says so: ``rank 1 on n2 failed first; 2 ranks failed: ...``.

The failing rank's message is found in this order: the error file, the report's own traceback,
the last traceback of that rank's ``[rankN]:`` lines, of its per-rank log file
(``--redirects``/``--tee`` with ``--log-dir``), of its ``[defaultN]:`` lines, the last unprefixed
worker traceback, and last the log's last exception line.

A traceback the process survived is never the failure (see :mod:`tune_magic.logs.tracebacks`);
a process killed by a signal is reported as killed by that signal.
"""

from __future__ import annotations

import math
import re
import signal
from dataclasses import asdict, dataclass
from typing import Mapping

from tune_magic.logs.oom import OomEvidence
from tune_magic.logs.reports import ReportEntry, parse_reports, read_error_file
from tune_magic.logs.tracebacks import TB_HEAD, LogStreams, Traceback, find_tracebacks, split_exception

__all__ = [
    "FailureReason",
    "Evidence",
    "describe_failure",
    "failure_line",
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
_REPORT_TIME_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})_(\d\d:\d\d:\d\d)$")


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
    lines = [line.strip() for line in message.split("\n") if line.strip()]
    first = lines[0] if lines else ""
    if first.endswith(":") and len(lines) > 1:  # "Error loading 'x':" says what, the next line why
        first = f"{first} {lines[1]}"
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


_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote process exited")


def _raised(e: ReportEntry) -> bool:
    return e.exitcode is not None and e.exitcode > 0


def _consequence(e: ReportEntry, log: LogStreams) -> bool:
    """Whether ``e`` raised only because a peer went away (gloo "Connection closed by peer"...)."""
    if not _raised(e):
        return False
    tb = log.last_traceback(("rank", e.rank))
    return tb is not None and any(s in tb.message for s in _PEER_GONE)


def _when(e: ReportEntry, log: LogStreams) -> tuple:
    """A sort key for when ``e`` failed: the report's second (``"~"``, after every time, when it has
    none), then where the rank's own traceback is in the log (a raise is written as it happens),
    then a report's root cause before its other entries (its agent saw the root first)."""
    m = _REPORT_TIME_RE.match(e.time or "")
    second = f"{m[1]}{m[2]}{m[3]} {m[4]}" if m else "~"
    tb = _own_traceback(e, log)
    return (second, tb.order if tb is not None else math.inf, not e.root)


def _own_traceback(e: ReportEntry, log: LogStreams):
    """The last traceback ``e``'s rank wrote with its ``[rankN]:`` prefix, when it raised, else ``None``."""
    return log.last_traceback(("rank", e.rank), survived=False) if _raised(e) else None


def _earliest(entries: list[ReportEntry], log: LogStreams) -> ReportEntry:
    """The entry that failed first: when each raised and wrote its traceback into the one log, the
    traceback's place there (to the line: two agents' whole-second report times can disagree with
    it across a second's edge); else by :func:`_when`; then the first report in the log."""
    tracebacks = [_own_traceback(e, log) for e in entries]
    if all(tb is not None for tb in tracebacks):
        return min(zip(entries, tracebacks), key=lambda p: (p[1].order, p[0].report))[0]
    return min(entries, key=lambda e: (_when(e, log), e.report))


def _failed_on_its_own(e: ReportEntry, log: LogStreams) -> bool:
    """Whether ``e`` is a failure of its own: a raise (not one that only says its peer went away,
    nor the 128+N exit of a worker that caught torchrun's teardown SIGTERM/SIGINT), or the root cause
    of its report by a signal other than that teardown's."""
    teardown = (signal.SIGTERM, signal.SIGINT)
    if _raised(e):
        return not _consequence(e, log) and (e.root or e.exitcode - 128 not in teardown)
    return e.root and e.exitcode is not None and e.exitcode < 0 and -e.exitcode not in teardown


def _unreported_raises(entries: list[ReportEntry], log: LogStreams) -> dict[int, Traceback]:
    """Ranks that raised (their last ``[rankN]:`` traceback ends their output, and is not a peer
    gone away) though no report names them: their agent was stopped before it printed one (``srun
    --kill-on-bad-exit`` ends the other nodes' agents when one node's fails)."""
    reported = {x.rank for x in entries}
    out = {}
    for (kind, rank), tb in log.tracebacks(survived=False):
        if kind == "rank" and rank not in reported and not any(p in tb.message for p in _PEER_GONE):
            out[rank] = tb
    return out


def _earlier_unreported(chosen: ReportEntry, unreported: dict[int, Traceback],
                        log: LogStreams) -> tuple[int, Traceback] | None:
    """``(rank, traceback)`` of the first unreported raise when it beats ``chosen``: it came before
    ``chosen``'s own traceback in the log, or ``chosen`` did not raise on its own (a signal, a peer
    gone: a raise wins); else ``None``."""
    if not unreported:
        return None
    rank, tb = min(unreported.items(), key=lambda kv: kv[1].order)
    if _raised(chosen) and not _consequence(chosen, log):
        mine = _own_traceback(chosen, log)
        return (rank, tb) if mine is not None and tb.order < mine.order else None
    return rank, tb


def _choose(entries: list[ReportEntry], log: LogStreams) -> ReportEntry:
    """The failing entry: among the reports' root causes a raise beats a signal, which beats a
    raise that only says a peer went away; then the first by time (:func:`_when`), then the
    first in the log.

    torchrun's root cause is the first failure its monitor *noticed* (times are whole seconds),
    so when it names a rank that raised because its peer vanished, a rank of the same report
    that died by a signal other than torchrun's own SIGTERM/SIGINT teardown is the failure.
    """
    roots = [e for e in entries if e.root] or entries

    def kind(e: ReportEntry) -> int:
        consequence = _consequence(e, log)
        return 0 if _raised(e) and not consequence else 2 if consequence else 1

    first_kind = min(map(kind, roots))
    best = _earliest([e for e in roots if kind(e) == first_kind], log)
    if _consequence(best, log):
        for e in entries:
            if (e.report == best.report and e.exitcode is not None and e.exitcode < 0
                    and -e.exitcode not in (signal.SIGTERM, signal.SIGINT)):
                return e
    return best


def _nccl_lines(log: LogStreams, rank: int | None) -> list[tuple[int, str, re.Match]]:
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
    failed: int = 1  # ranks that failed on their own
    first: bool = True  # this one failed first of them

    def say(self, text: str) -> str:
        if self.rank is None:
            return text
        where = f"rank {self.rank}" + (f" on {self.host}" if self.show_host and self.host else "")
        if self.failed > 1:
            where += f"{' failed first' if self.first else ''}; {self.failed} ranks failed"
        return f"{where}: {text}"

    def reason(self, line: str, kind: str, **fields) -> FailureReason:
        return FailureReason(self.say(line), kind, self.rank, self.local_rank, self.host,
                             exitcode=self.exitcode, pid=self.pid, **fields)


def _signal_reason(who: _Who, log: LogStreams, evidence: Evidence | None, extra: str | None) -> FailureReason:
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


def _from_traceback(tb: Traceback, who: _Who) -> FailureReason:
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
    log = LogStreams(log_text)
    entries = parse_reports(log_text)
    if entries:
        chosen = _choose(entries, log)
        unreported = _unreported_raises(entries, log)
        early = _earlier_unreported(chosen, unreported, log)
        if early is not None:  # it raised before the reported failure, and its agent printed no report
            failed = len({x.rank for x in entries if _failed_on_its_own(x, log)}) + len(unreported)
            return _from_traceback(early[1], _Who(rank=early[0], failed=failed))
        return _from_report(chosen, entries, log, rank_logs, evidence, len(unreported))
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


def _from_report(e: ReportEntry, entries: list[ReportEntry], log: LogStreams, rank_logs: Mapping[int, str] | None,
                 evidence: Evidence | None, unreported: int = 0) -> FailureReason:
    several_hosts = len({x.host for x in entries if x.host}) > 1
    own = {x.rank: x for x in entries if _failed_on_its_own(x, log)}
    first = _earliest(list(own.values()), log) if own else e
    who = _Who(e.rank, e.local_rank, e.host, e.exitcode, e.pid, several_hosts,
               failed=max(len(own) + unreported, 1), first=first.rank == e.rank)
    if e.exitcode is not None and e.exitcode < 0:
        return _signal_reason(who, log, evidence, e.message or None)
    # 1. torchelastic's error file (@record); 2. the report's own traceback field
    if e.error_file:
        msg, stack = read_error_file(e.error_file)
        if msg:
            exc_type, message = split_exception(msg)
            return _from_traceback(Traceback(stack or msg, exc_type, message, 0), who)
    if e.message.startswith(TB_HEAD):
        tbs = find_tracebacks(list(enumerate(e.message.split("\n"))))
        if tbs:
            return _from_traceback(tbs[-1], who)
    # 3-6. the rank's own output: by prefix, its per-rank file, tee's local prefix; then unprefixed
    # (anyone's: for a plain exit code, only when nothing came after it). Never one it survived.
    candidates = [log.last_traceback(("rank", e.rank), survived=False)]
    if rank_logs and e.local_rank is not None and e.local_rank in rank_logs:
        candidates.append(LogStreams(rank_logs[e.local_rank]).last_traceback(survived=False))
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
