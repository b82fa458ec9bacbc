"""The last lines of a job's log as a card shows them. Pure; display only.

The log itself (``output.log``, ``tune-magic logs``, :meth:`tune_magic.Job.tail`) keeps every
line; a card's few lines are there to say what the job is doing, so here:

* tqdm redraws collapse to the latest: a line that is only a bar is shown once, the latest, and a
  log line glued after a bar (tqdm leaves its line open, so torchtune's next log line or another
  rank's traceback continues it) is shown without the bar;
* a repeated warning (every rank prints the same library warnings) is shown once, where it first
  appears, with a count; the source line Python's ``warnings`` prints under it goes with it;
  runs of one identical line collapse the same way;
* torchrun's own traceback when it is told to stop (``SignalException: Process N got signal: 15``,
  torch 2.x ``torch.distributed.elastic.multiprocessing.api``) becomes one line saying that
  torchrun stopped its workers: a stopped job does not end as if it had crashed.
"""

from __future__ import annotations

import re
import signal
from typing import Sequence

from tune_magic.logs.parse import strip_prefixes

# a tqdm bar at the start of a line: optional description, then "pct%|bar| n/total [time, rate]",
# "n it [time, rate]" (no total), or torchtune's description and percentage cut short
_BAR_HEAD_RE = re.compile(
    r"^\s*(?:[^\r\n]*?:\s*)?(?:\d{1,3}%\|[^|]*\|\s*[\d.]+[kMGTP]?/(?:[\d.]+[kMGTP]?|\?)\s*\[[^\]]*\]"
    r"|[\d.]+[kMGTP]?it \[[^\]]*\])"
    r"|^\s*\d+\|\d+\|Loss: [^\s:]+:\s*\d{1,3}%\|(?:[^|\[]*\|)?"
)
_SIGNAL_EXC_RE = re.compile(r"SignalException: Process \d+ got signal: (\d+)\s*$")
_PY_WARNING_RE = re.compile(r":\d+: (?:[A-Z]\w*\.)*[A-Z]\w*Warning: ")
_WARNING_RE = re.compile(r"\b[A-Z]\w*Warning\b|^WARNING\b|^\[?W\d{4} ")
# glog's header: torch.distributed's Python logging "W1201 05:38:51.259000 6395 " (time, pid), c10's
# C++ warnings "[W1201 05:38:51.259045390 " (time only)
_GLOG_RE = re.compile(r"^\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+(?:\d+\s+)?")
_COUNT = " (×{})"


def _split_bars(lines: Sequence[str]) -> list[tuple[bool, str]]:
    """``(is_bar, text)`` items: a line holding a bar and more text gives two items."""
    out: list[tuple[bool, str]] = []
    for line in lines:
        m = _BAR_HEAD_RE.match(line) if ("%|" in line or "it [" in line) else None
        if m is None:
            out.append((False, line))
            continue
        rest = line[m.end():]
        out.append((True, line[:m.end()].strip()))
        if rest.strip():
            out.append((False, rest))
    return out


def _signal_note(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return f"torchrun got {name} (signal {number}) and stopped its workers"


def _drop_signal_tracebacks(lines: list[str]) -> list[str]:
    """Replace each torchrun ``SignalException`` traceback with one line."""
    out = list(lines)
    i = len(out) - 1
    while i >= 0:
        m = _SIGNAL_EXC_RE.search(out[i]) if "SignalException" in out[i] else None
        if m is None:
            i -= 1
            continue
        j = i
        while j > 0 and (out[j - 1][:1].isspace() or out[j - 1].startswith("Traceback (most recent call last)")):
            j -= 1
            if out[j].startswith("Traceback (most recent call last)"):
                break
        out[j:i + 1] = [_signal_note(int(m[1]))]
        i = j - 1
    return out


def _key(line: str) -> str:
    """What makes two warning lines the same warning: the text without torch's rank prefixes and
    glog's time and pid header."""
    return _GLOG_RE.sub("", strip_prefixes(line)[2]).strip()


def _collapse(lines: list[str]) -> list[str]:
    """Repeated warnings once, with a count; runs of one identical line once, with a count."""
    shown: list[str] = []
    counts: list[int] = []
    first_warning: dict[str, int] = {}  # key -> index in shown
    skip_source = False
    for line in lines:
        if skip_source:
            skip_source = False
            if strip_prefixes(line)[2][:1].isspace():
                continue  # the source line under a repeated Python warning
        if shown and line == shown[-1]:
            counts[-1] += 1
            continue
        if ("arning" in line or line[:1] == "W" or line[:2] == "[W") and _WARNING_RE.search(line):
            key = _key(line)
            at = first_warning.get(key)
            if at is not None:
                counts[at] += 1
                skip_source = bool(_PY_WARNING_RE.search(line))
                continue
            first_warning[key] = len(shown)
        shown.append(line)
        counts.append(1)
    return [line + _COUNT.format(n) if n > 1 else line for line, n in zip(shown, counts)]


def display_tail(lines: Sequence[str], n: int | None = None) -> list[str]:
    """The card's form of a log's last lines (see the module docstring).

    Args:
        lines: the log's last lines, oldest first (ANSI-free, ``\\r`` redraws already resolved
            to each line's last one, as :meth:`tune_magic.logs.follow.LineFollower.tail` gives them).
        n: most lines returned (the last ones), or ``None`` for all.

    Returns:
        The lines to show, oldest first.
    """
    items = _split_bars(lines)
    last_bar = max((i for i, (is_bar, _) in enumerate(items) if is_bar), default=-1)
    kept = [text for i, (is_bar, text) in enumerate(items) if not is_bar or i == last_bar]
    kept = _collapse(_drop_signal_tracebacks(kept))
    if n is not None:
        kept = kept[-n:] if n > 0 else []
    return kept
