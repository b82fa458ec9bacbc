"""The last lines of a job's log as a card shows them. Pure; display only.

The log itself (``output.log``, ``tune-magic logs``, :meth:`tune_magic.Job.tail`) keeps every
line; a card's few lines are there to say what the job is doing, so here:

* tqdm redraws collapse to the latest: a line that is only a bar is shown once, the latest, and a
  log line glued after a bar (tqdm leaves its line open, so torchtune's next log line or another
  rank's traceback continues it) is shown without the bar;
* a repeated warning (every rank prints the same library warnings) is shown once, where it first
  appears, with a count; the source line Python's ``warnings`` prints under it goes with it;
  runs of one identical line collapse the same way; blank lines are never counted (a run of them
  is one blank line, and none starts or ends the tail);
* torchrun's own traceback when it is told to stop (``SignalException: Process N got signal: 15``,
  torch 2.x ``torch.distributed.elastic.multiprocessing.api``) becomes one line saying that
  torchrun stopped its workers: a stopped job does not end as if it had crashed;
* a failed job's tail ends with the failing rank's own last lines (its traceback), not with
  torchrun's ``ChildFailedError`` traceback and its ``Failures:`` / ``Root Cause`` report, which
  are dropped (the card's failure line and traceback say the same, better); the failing rank is
  the one the job's failure names (its ``failure.json``, when the caller passes it; else
  :func:`tune_magic.logs.failure.describe_failure` of the lines shown), as on the failure line, and
  its last traceback is moved below what other ranks and torchrun wrote after it, or added at the
  end when it is older than the lines shown;
* noise every job prints is dropped: torchrun's ``OMP_NUM_THREADS`` banner (torch 2.x
  ``torch.distributed.run``) and torch's ``'set_vital' is deprecated`` warning with its source
  line (``torch/__init__.py``'s ``__getattr__``, called by torchdata's ``StatefulDataLoader``), and
  torchao's ``Detected no triton`` warning (:data:`NO_TRITON_RULE`);
* each checkpoint save's INFO lines (torchtune 0.6.1's checkpoint client, checkpointers and
  recipes, see :data:`CHECKPOINT_RULE`) become one line such as
  ``checkpoint saved: epoch_1 (3 files, 0.15 GiB) in 1.20 s``;
* torchtune's resolved-config dump at start-up (torchtune 0.6.1 ``config/_utils.py``
  ``log_config``: the config as YAML, often a hundred lines) becomes its first line with a count;
  the rest of a dump whose first line is older than the lines shown is dropped;
* the bar (its latest redraw) stands where its step was first drawn: tqdm's closing redraw of the
  last step comes after the lines printed at that step's end (the checkpoint save), which come
  after the step in the card as in the run;
* callers add rules of their own (:class:`TailRule`), e.g. a scheduler's lines for a cancelled job.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Callable, Sequence

from tune_magic.logs.lineformat import strip_prefixes

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

# torchrun's banner (torch 2.x torch.distributed.run): a line of stars, this line, a line of stars
_OMP_RE = re.compile(r"^Setting OMP_NUM_THREADS environment variable for each process to be \d+ in default")
_STARS_RE = re.compile(r"^\*{10,}\s*$")
# torchrun's failure report after "ChildFailedError: " (torch 2.x torch.distributed.elastic.multiprocessing.errors)
_CHILD_FAILED = "ChildFailedError: "
_TB_HEAD = "Traceback (most recent call last):"
_RULE_RE = re.compile(r"^\s*(?:={10,}|-{10,})\s*$")
_REPORT_LINE_RE = re.compile(
    r"^\s*(?:Failures:|Root Cause \(first observed failure\):|<NO_OTHER_FAILURES>|\[\d+\]:|\S.* FAILED)\s*$"
    r"|^\s{1,4}(?:time|host|rank|exitcode|error_file|traceback)\s*:|^\s{2,}\S|^\s*$")


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


#: The one line :func:`display_tail` leaves of torchrun's traceback when it was told to stop (its
#: ``SignalException``); a caller's rule may group its own lines of that stop with it.
SIGNAL_NOTE = re.compile(r"^torchrun got (?:SIG[A-Z]+|signal \d+) \(signal \d+\) and stopped its workers$")


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


@dataclass(frozen=True)
class TailRule:
    """Lines of one kind that a card shows as fewer lines (one, or none).

    The lines of a rule form groups; each group is replaced by ``summary`` of it, shown where its
    first line was (its last, with ``at_last``). Without ``starts`` and ``ends`` every line of the
    rule in the tail is one group.

    Attributes:
        name: what the lines are (for tests and messages).
        member: a line belongs to the rule when this pattern matches (``search``) its text
            without torch's rank prefixes (:func:`tune_magic.logs.lineformat.strip_prefixes`).
        summary: ``(matches, prefix) -> lines``: the lines shown for one group, given the
            ``member`` matches of its lines (oldest first) and the rank prefix of its first line
            (e.g. ``"[default0]:"``, or ``""``); ``[]`` drops the group.
        starts: a line matching this (and ``member``) begins a new group.
        ends: a line matching this (and ``member``) is the last of its group.
        at_last: show the summary where the group's last line was (e.g. the end of a stop, which
            closes the tail), not its first.
    """

    name: str
    member: re.Pattern
    summary: Callable[[list[re.Match], str], list[str]]
    starts: re.Pattern | None = None
    ends: re.Pattern | None = None
    at_last: bool = False


def apply_rule(lines: Sequence[str], rule: TailRule) -> list[str]:
    """Replace each group of ``rule``'s lines by its summary (see :class:`TailRule`)."""
    groups: list[list[tuple[int, re.Match]]] = []
    open_group: list[tuple[int, re.Match]] | None = None
    for i, line in enumerate(lines):
        body = strip_prefixes(line)[2]
        m = rule.member.search(body)
        if m is None:
            continue
        if open_group is None or (rule.starts is not None and rule.starts.search(body) and open_group):
            open_group = []
            groups.append(open_group)
        open_group.append((i, m))
        if rule.ends is not None and rule.ends.search(body):
            open_group = None
    if not groups:
        return list(lines)
    replaced: dict[int, list[str]] = {}
    for group in groups:
        first = group[0][0]
        prefix = lines[first][:len(lines[first]) - len(strip_prefixes(lines[first])[2])]
        for i, _ in group:
            replaced[i] = []
        replaced[group[-1][0] if rule.at_last else first] = rule.summary([m for _, m in group], prefix)
    out: list[str] = []
    for i, line in enumerate(lines):
        out.extend(replaced.get(i, (line,)))
    return out


# torchtune 0.6.1's lines for one checkpoint save, in the order they come: the checkpoint client
# (training/checkpointing/_checkpoint_client.py) and the *_distributed recipes, the checkpointers
# (_checkpointer.py: one "... checkpoint of size X GiB saved to PATH" per file), the
# *_single_device recipes ("Starting checkpoint save..." / "Checkpoint saved in X seconds."), and
# the project's own recipes (recipes/*.py: "Saving checkpoint. Retrieving full model state dict...").
_SAVE_START = (r"Saving checkpoint\. This may take some time\. Retrieving full model state dict\.\.\."
               r"|Saving checkpoint\. Retrieving full model state dict\.\.\."
               r"|Saving checkpoint asynchronously\. Retrieving full state dict\.\.\."
               r"|Starting checkpoint save\.\.\.")
_SAVE_END = (r"Saving (?:asynchronous )?checkpoint took (?P<secs>[\d.]+) secs"
             r"|Checkpoint saved in (?P<secs2>[\d.]+) seconds\.")
_SAVE_MEMBER = (r"Getting full model state dict took [\d.]+ secs|Getting optimizer state dict(?:\.\.\.| took [\d.]+ secs)"
                r"|(?:Model|Adapter|Recipe) checkpoint of size (?P<gib>[\d.]+) GiB saved to (?P<path>\S+)"
                r"|Saving final epoch checkpoint\."
                r"|Please note that you have set adapter_only=True, so only adapter weights will be saved\."
                r"|The full model checkpoint, including all (?:the )?weights and configurations, has been saved"
                r"|DistributedCheckpointer is saving a checkpoint for the epoch (?P<epoch>\d+)"
                r"|Saving model checkpoint synchronously to (?P<dcp>\S+?)\.?$")
_EPOCH_RE = re.compile(r"(?:^|/)(epoch_\d+)(?:/|$)")


def _checkpoint_summary(matches: list[re.Match], prefix: str) -> list[str]:
    """One line for one save: ``checkpoint saved: epoch_1 (3 files, 0.15 GiB) in 1.20 s``."""
    files = [(m["path"], float(m["gib"])) for m in matches if m["path"]]
    secs = next((m["secs"] or m["secs2"] for m in matches if m["secs"] or m["secs2"]), None)
    epoch = next((e[1] for m in matches for p in (m["path"], m["dcp"]) if p and (e := _EPOCH_RE.search(p))), None)
    epoch = epoch or next((f"epoch_{m['epoch']}" for m in matches if m["epoch"]), None)
    what = [epoch] if epoch else []
    if files:
        total = sum(gib for _, gib in files)
        size = f"{total:.2f} GiB" if total >= 0.01 else "< 0.01 GiB"  # torchtune rounds each file to 0.01 GiB
        what.append(f"({len(files)} file{'s' if len(files) != 1 else ''}, {size})")
    if secs is None:
        return [prefix + " ".join(["saving checkpoint:", *what]).rstrip(":") + " ..."]
    return [prefix + " ".join(["checkpoint saved:", *what, f"in {float(secs):.2f} s"]).replace(": in", " in")]


#: Each checkpoint save of torchtune 0.6.1 (and the project's recipes) as one line.
CHECKPOINT_RULE = TailRule(
    name="checkpoint save",
    member=re.compile(rf"(?:^|[:\]\s])(?:{_SAVE_START}|{_SAVE_END}|{_SAVE_MEMBER})"),
    summary=_checkpoint_summary,
    starts=re.compile(rf"(?:^|[:\]\s])(?:{_SAVE_START})"),
    ends=re.compile(rf"(?:^|[:\]\s])(?:{_SAVE_END})"),
)

#: torch's warning when torchdata's StatefulDataLoader calls ``torch.set_vital`` (torch 2.x
#: ``torch/__init__.py``), printed once per rank, and the source line ``warnings`` prints under it.
SET_VITAL_RULE = TailRule(
    name="set_vital deprecation",
    member=re.compile(r"UserWarning: 'set_vital' is deprecated, please do not call\s*$|^\s+torch\.set_vital\("),
    summary=lambda matches, prefix: [],
)

#: torchao's warning at import on a machine without Triton (torchao 0.11 ``torchao/kernel/intmm.py``,
#: through Python's ``logging``: ``WARNING:torchao.kernel.intmm:Warning: Detected no triton, ...``),
#: printed once per process by every job that imports torchtune: nothing to act on, so dropped.
NO_TRITON_RULE = TailRule(
    name="torchao without triton",
    member=re.compile(r"^WARNING:torchao\.kernel\.intmm:Warning: Detected no triton, on systems without Triton "
                      r"certain kernels will not work\s*$"),
    summary=lambda matches, prefix: [],
)

BUILTIN_RULES = (SET_VITAL_RULE, NO_TRITON_RULE, CHECKPOINT_RULE)


def _drop_omp_banner(lines: list[str]) -> list[str]:
    """Drop torchrun's OMP_NUM_THREADS banner: its line and the lines of stars around it."""
    drop: set[int] = set()
    for i, line in enumerate(lines):
        if _OMP_RE.match(line):
            drop.add(i)
            for j in (i - 1, i + 1):
                if 0 <= j < len(lines) and _STARS_RE.match(lines[j]):
                    drop.add(j)
    return [line for i, line in enumerate(lines) if i not in drop] if drop else lines


def _report_span(lines: list[str], i: int) -> tuple[int, int]:
    """``[start, end)`` of torchrun's ChildFailedError traceback and report around line ``i``
    (the ``...ChildFailedError: `` line, or a ``Failures:`` line whose traceback is cut off)."""
    start = i
    if lines[i].rstrip().endswith(_CHILD_FAILED.rstrip()):
        while start > 0 and (lines[start - 1][:1].isspace() or lines[start - 1] == _TB_HEAD):
            start -= 1
            if lines[start] == _TB_HEAD:
                break
    else:  # the report's title and rules above "Failures:"
        while start > 0 and (_RULE_RE.match(lines[start - 1]) or lines[start - 1].rstrip().endswith(" FAILED")):
            start -= 1
    end, seen_root = i + 1, False
    while end < len(lines):
        line = lines[end]
        if _RULE_RE.match(line):
            end += 1
            if seen_root and line.strip().startswith("="):
                break  # the report's closing rule
            continue
        if not _REPORT_LINE_RE.match(line):
            break
        seen_root = seen_root or line.strip() == "Root Cause (first observed failure):"
        end += 1
    return start, end


def _drop_failure_reports(lines: list[str]) -> list[str]:
    """Drop every torchrun ChildFailedError traceback and report (one per agent)."""
    out = list(lines)
    i = 0
    while i < len(out):
        line = out[i]
        if line.rstrip().endswith(_CHILD_FAILED.rstrip()) or line.strip() == "Failures:":
            start, end = _report_span(out, i)
            del out[start:end]
            i = start
        else:
            i += 1
    return out


def _failing_block(lines: list[str], reason) -> list[int]:
    """Indices of the failing rank's last traceback in ``lines`` (``reason``: a FailureReason)."""
    owned = [i for i, line in enumerate(lines) if reason.rank is not None and strip_prefixes(line)[0] == reason.rank]
    if owned:
        heads = [i for i in owned if strip_prefixes(lines[i])[2] == _TB_HEAD]
        first = heads[-1] if heads else owned[-1]
        return [i for i in owned if i >= first]
    tb = [t for t in (reason.traceback or "").splitlines() if t.strip()]
    if not tb:
        return []
    last = max((i for i, line in enumerate(lines) if strip_prefixes(line)[2].rstrip() == tb[-1].rstrip()), default=None)
    if last is None:
        return []
    first = max((i for i in range(last + 1) if strip_prefixes(lines[i])[2].rstrip() == tb[0].rstrip()), default=last)
    return list(range(first, last + 1))


def _failure_last(lines: list[str], failure=None) -> list[str]:
    """A failed job's tail: torchrun's reports dropped, the failing rank's traceback last
    (``failure``: the job's FailureReason, when known)."""
    reports = any("ChildFailedError" in line or line.strip() == "Root Cause (first observed failure):"
                  for line in lines)
    if not reports and failure is None:
        return lines
    from tune_magic.logs.failure import describe_failure

    reason = failure if failure is not None else describe_failure("\n".join(lines))
    kept = _drop_failure_reports(lines) if reports else list(lines)
    block = _failing_block(kept, reason) if reason is not None else []
    if not block and failure is not None and failure.exc_type and failure.traceback and failure.rank is not None:
        # the failing rank wrote its traceback before the lines shown: its end closes the tail
        return kept + [f"[rank{failure.rank}]: {t}" for t in failure.traceback.splitlines() if t.strip()]
    if not block or not any(line.strip() for line in kept[block[-1] + 1:]):
        return kept
    inside = set(block)
    return [line for i, line in enumerate(kept) if i not in inside] + [kept[i] for i in block]


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
        if not strip_prefixes(line)[2].strip():  # blank: never counted, a run of them is one
            if shown and not strip_prefixes(shown[-1])[2].strip():
                continue
            shown.append(line)
            counts.append(1)
            skip_source = False
            continue
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
    while shown and not strip_prefixes(shown[0])[2].strip():
        del shown[0], counts[0]
    while shown and not strip_prefixes(shown[-1])[2].strip():
        del shown[-1], counts[-1]
    return [line + _COUNT.format(n) if n > 1 else line for line, n in zip(shown, counts)]


# torchtune 0.6.1's config dump (config/_utils.py log_config, rank 0 only): one INFO record
# "Running <Recipe> with resolved config:\n\n<OmegaConf.to_yaml(cfg)>", i.e. this line, a blank line,
# the YAML (sorted keys, no blank lines), and the blank line its trailing newline leaves
_CONFIG_HEAD_RE = re.compile(r"(?:^|:)Running (\w+) with resolved config:\s*$")
# a line of that YAML: "key: value", "key:", an indented line of either, or a "- item"
_YAML_LINE_RE = re.compile(r"^\s*(?:- )?[A-Za-z_][\w.\-]*:(?: .*)?$|^\s*- \S")


def _yaml_run(lines: Sequence[str], i: int) -> int:
    """End (exclusive) of the run of YAML lines from ``lines[i]``."""
    while i < len(lines) and _YAML_LINE_RE.match(strip_prefixes(lines[i])[2]):
        i += 1
    return i


def _collapse_config_dump(lines: list[str]) -> list[str]:
    """torchtune's resolved-config dump as one line (``... with resolved config: (84 lines, in the
    full log)``); the rest of a dump whose first line is older than the lines shown is dropped, so
    the tail begins at a line of the run (e.g. "Setting manual seed"), not at ``  num_heads: 4``."""
    out: list[str] = []
    i = 0
    start = next((k for k, line in enumerate(lines) if strip_prefixes(line)[2].strip()), len(lines))
    end = _yaml_run(lines, start)
    # the tail opens inside a dump: its YAML runs up to the blank line the dump ends with, and its
    # unindented keys are in sorted order (to_yaml's sort_keys), which other "word: ..." lines
    # (slurmstepd's, a recipe's "loss: 2.0") hardly are
    top = [strip_prefixes(line)[2].split(":", 1)[0] for line in lines[start:end]
           if not strip_prefixes(line)[2][:1].isspace() and not strip_prefixes(line)[2].startswith("- ")]
    if (end - start >= 3 and end < len(lines) and not strip_prefixes(lines[end])[2].strip()
            and all(a < b for a, b in zip(top, top[1:]))):
        i = end
    while i < len(lines):
        line = lines[i]
        if "resolved config" in line and _CONFIG_HEAD_RE.search(strip_prefixes(line)[2]):
            j = i + 1
            while j < len(lines) and not strip_prefixes(lines[j])[2].strip():
                j += 1  # the blank line between the header and the YAML
            end = _yaml_run(lines, j)
            if end > j:
                n = end - j
                out.append(f"{line.rstrip()} ({n} line{'s' if n != 1 else ''}, in the full log)")
                i = end
                continue
        out.append(line)
        i += 1
    return out


def _bar_key(text: str) -> str:
    """What a bar shows apart from its time and rate (``1|5|Loss: 5.45: 100%|███| 5/5``): two
    redraws with one key show the same step."""
    return text.split(" [", 1)[0].strip()


def display_tail(lines: Sequence[str], n: int | None = None, *, rules: Sequence[TailRule] = (),
                 failure=None) -> list[str]:
    """The card's form of a log's last lines (see the module docstring).

    Args:
        lines: the log's last lines, oldest first (ANSI-free, ``\\r`` redraws already resolved
            to each line's last one, as :meth:`tune_magic.logs.linefollow.LineFollower.tail` gives them).
        n: most lines returned (the last ones), or ``None`` for all.
        rules: more lines to collapse (:class:`TailRule`), applied after the built-in ones, in
            order; e.g. a scheduler's lines for a cancelled job.
        failure: a failed job's :class:`tune_magic.logs.failure.FailureReason` (its
            ``failure.json``): the rank the tail ends with, so that the tail and the card's failure
            line name the same rank. Default: the one the lines themselves show.

    Returns:
        The lines to show, oldest first.
    """
    items = _split_bars(lines)
    bars = [i for i, (is_bar, _) in enumerate(items) if is_bar]
    kept = [text for is_bar, text in items if not is_bar]
    if bars:
        # the latest redraw is shown where its step was first drawn: tqdm redraws the bar when
        # it closes, after the lines the step's end printed (a checkpoint save), so the step comes
        # before them, as the run did it
        at = len(bars) - 1
        while at > 0 and _bar_key(items[bars[at - 1]][1]) == _bar_key(items[bars[-1]][1]):
            at -= 1
        before = sum(1 for i in range(bars[at]) if not items[i][0])
        kept.insert(before, items[bars[-1]][1])
    kept = _failure_last(_collapse_config_dump(_drop_omp_banner(kept)), failure)
    kept = _drop_signal_tracebacks(kept)
    for rule in (*BUILTIN_RULES, *rules):
        kept = apply_rule(kept, rule)
    kept = _collapse(kept)
    if n is not None:
        kept = kept[-n:] if n > 0 else []
    return kept
