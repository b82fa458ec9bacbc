"""The line formats of torchtune training logs, read one line at a time. Pure.

The incremental parser (:mod:`tune_magic.logs.parse`) and the failure reader
(:mod:`tune_magic.logs.failure`) build on these; :class:`~tune_magic.logs.parse.LogParser` reads
the metric forms below in bulk.

Formats understood (all from torchtune 0.6.1 unless noted):

* DiskLogger / StdoutLogger metric lines: ``f"Step {step} | "`` followed by ``f"{name}:{value} "``
  per metric (trailing space), e.g. ``Step 7 | loss:2.0853 lr:2e-05 tokens_per_second_per_gpu:57.8 ``.
  ``DiskLogger.log`` writes a single ``Step N | name:value`` without the trailing space. Values are
  ``str()`` of whatever the recipe logged: ints, floats (``2e-05``, ``nan``, ``inf``) or 0-d tensors
  (``tensor(0.4300, device='cuda:0', grad_fn=<DivBackward0>)``, which contains spaces).
* JSON lines (``log_*.jsonl``, torchtune's main branch): ``{"step": N, "loss": 2.1, ...}``.
* The rank-0 tqdm progress bar, redrawn with ``\\r``, whose description is
  ``f"{epoch}|{global_step}|Loss: {loss}"``, e.g.
  ``1|10|Loss: 11.97315: 100%|####| 10/10 [00:11<00:00,  1.12s/it]``.
* ``Writing logs to <path>``, printed by ``DiskLogger.__init__``: names the job's metric file.

Each form is also read behind the line prefixes of torch 2.x (measured with torch 2.13):

* torchrun ``--tee``/``--local-ranks-filter`` copy each worker's output to the console as
  ``[default0]:<text>`` (``[<role><local rank>]:``, no space). Its tail threads read the per-rank
  files line by line with universal newlines, so a tqdm ``\r`` redraw arrives as its own
  prefixed line, and a line caught half-written comes out unterminated, with the next piece
  (``[default0]:<rest>``, or another stream's line) glued after it on the same physical line.
  Such pieces are split at the prefix (:func:`split_prefixed`) and joined again per prefix (see
  :class:`~tune_magic.logs.parse.LogParser`).
* ``torch.distributed``'s excepthook, set by ``init_process_group``, writes tracebacks as
  ``[rank1]: <text>`` (global rank, one space).
* Without any prefix, stdout and stderr in one file also glue: a tqdm bar is left without a line
  end until its next ``\r`` redraw, so the next stdout line lands right after the bar's
  ``[elapsed<remaining, rate]`` block; the text after that block is read as a record of its own.

ANSI escape sequences (colours, cursor show/hide, OSC titles) are removed before matching.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = [
    "ProgressInfo",
    "strip_ansi",
    "parse_value",
    "parse_progress",
    "find_log_path",
    "strip_prefixes",
    "split_prefixed",
    "PREFIX_RE",
    "PROGRESS_RE",
    "LOGPATH_RE",
]


class ProgressInfo(NamedTuple):
    """A parsed torchtune progress-bar description (``{epoch}|{step}|Loss: {loss}``).

    Attributes:
        epoch: 1-based epoch.
        step: global step.
        loss: the loss shown, or ``None`` when the value is not a number.
        text: the whole progress line, ANSI-free, surrounding whitespace removed.
    """

    epoch: int
    step: int
    loss: float | None
    text: str


# ECMA-48: OSC/DCS-like strings first (they may contain '[' or letters), then CSI, then the short
# two/three-byte escapes; a lone ESC left over (e.g. a sequence cut by the line-length cap) goes too.
_ANSI_RE = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b[ -/]*[0-~]"
    r"|\x1b"
)
# A wrapped scalar: tensor(0.43, device='cuda:0'), np.float32(0.5), Decimal('1.5').
_WRAPPED_RE = re.compile(r"[A-Za-z_][\w.]*\(\s*['\"]?([^,)'\"\s]+)")
#: torchtune's progress-bar description ``{epoch}|{global_step}|Loss: {loss}``: groups epoch,
#: step and the loss text (a number or a wrapped scalar such as ``tensor(0.43)``).
PROGRESS_RE = re.compile(r"(?<![\w.|])(\d+)\|(\d+)\|Loss: ([A-Za-z_][\w.]*\([^)]*\)|[^\s:]+)")
#: DiskLogger's ``Writing logs to <path>`` line; group 1 is the path as printed.
LOGPATH_RE = re.compile(r"Writing logs to (\S.*?)\s*$")
#: A torch 2.x line prefix: ``[default0]:`` (torchrun ``--tee``, role + local rank) or ``[rank1]:``
#: (the excepthook of ``init_process_group``, global rank; it adds one space). Groups: role, number.
PREFIX_RE = re.compile(r"\[([A-Za-z_][\w.-]*?)(\d+)\]:")


def strip_ansi(text: str) -> str:
    """Return ``text`` without ANSI/VT100 escape sequences (CSI, OSC, DCS, two-byte escapes).

    Args:
        text: any string; cheap when it holds no ESC character.

    Returns:
        The text with every escape sequence removed.
    """
    if "\x1b" not in text:
        return text
    return _ANSI_RE.sub("", text)


def parse_value(text: str) -> float | None:
    """Parse one metric value as torchtune writes it with ``str()``.

    Accepts ints, floats, scientific notation (``2e-05``, ``1.5E+3``), ``nan``/``inf``/``-inf``
    and scalar wrappers such as ``tensor(0.43)``, ``tensor(0.4300, device='cuda:0', grad_fn=<...>)``
    or ``np.float32(0.5)``.

    Args:
        text: the value text (no surrounding ``name:``).

    Returns:
        The value as a float (possibly non-finite), or ``None`` if it is not a number
        (e.g. ``True``, ``abc``, a multi-element ``tensor([...])``).
    """
    try:
        return float(text)
    except ValueError:
        pass
    m = _WRAPPED_RE.match(text)
    if m is not None:
        try:
            return float(m.group(1))
        except ValueError:
            return None
    return None


def parse_progress(line: str) -> ProgressInfo | None:
    """Parse torchtune's tqdm description ``{epoch}|{global_step}|Loss: {loss}`` (0.6.1).

    Args:
        line: one progress segment (after splitting on ``\\r``); ANSI sequences and torch's
            line prefixes are removed.

    Returns:
        A :class:`ProgressInfo`, or ``None`` when the line holds no such description.
    """
    if "Loss: " not in line:
        return None
    text = strip_prefixes(strip_ansi(line).strip())[2].strip()
    m = PROGRESS_RE.search(text)
    if m is None:
        return None
    return ProgressInfo(int(m.group(1)), int(m.group(2)), parse_value(m.group(3)), text)


def find_log_path(line: str) -> str | None:
    """Return the path in torchtune DiskLogger's ``Writing logs to <path>`` line (0.6.1).

    Args:
        line: one line of the job's combined output.

    Returns:
        The path text as printed (may be relative to the job's working directory), or ``None``.
    """
    if "Writing logs to " not in line:
        return None
    m = LOGPATH_RE.search(strip_ansi(line))
    return m.group(1) if m else None


def strip_prefixes(line: str) -> tuple[int | None, int | None, str]:
    """Remove the torch 2.x prefixes at the start of one line (see the module docstring).

    Args:
        line: one line (or one piece of a line, see :func:`split_prefixed`).

    Returns:
        ``(rank, local_rank, text)``: the global rank of a ``[rankN]: `` prefix (torch's
        excepthook), the local rank of a ``[<role>N]:`` prefix (torchrun ``--tee``, role
        ``default`` unless ``--role`` was given), each ``None`` when absent, and the text after
        them. ``"[default1]:[rank1]: ValueError: x"`` gives ``(1, 1, "ValueError: x")``.
    """
    rank = local = None
    pos = 0
    while line.startswith("[", pos):
        m = PREFIX_RE.match(line, pos)
        if m is None:
            break
        pos = m.end()
        if m.group(1) == "rank" and rank is None:
            rank = int(m.group(2))
            if line.startswith(" ", pos):
                pos += 1
        elif local is None and rank is None:
            local = int(m.group(2))
        else:
            pos = m.start()
            break
    return rank, local, line[pos:]


def split_prefixed(line: str) -> list[tuple[str, str]]:
    """Cut one physical line of torchrun ``--tee`` output into its prefixed pieces.

    torchrun writes ``[default0]:`` + whatever its tail thread read, which need not end a line;
    the next piece then follows on the same physical line. Only prefixes of the first piece's
    role are cut at (``[default0]:[rank0]: ...`` is one piece: the second prefix is torch's).

    Args:
        line: one line that starts with a prefix (no line terminator).

    Returns:
        ``[(prefix, text), ...]`` in order, e.g. ``[("[default0]:", "1|1|Loss: 9.0: 10%|..."),
        ("[default0]:", "Step 2 | loss:5.0 ")]``; every piece but the last was cut short.
        ``[]`` when ``line`` does not start with a prefix.
    """
    first = PREFIX_RE.match(line)
    if first is None:
        return []
    role = "[" + first.group(1)
    pieces: list[tuple[str, str]] = []
    start, prefix = first.end(), first.group(0)
    pos = line.find(role, start)
    while pos >= 0:
        m = PREFIX_RE.match(line, pos)
        if m is not None and m.group(1) == first.group(1):
            pieces.append((prefix, line[start:pos]))
            start, prefix = m.end(), m.group(0)
            pos = line.find(role, start)
        else:
            pos = line.find(role, pos + 1)
    pieces.append((prefix, line[start:]))
    return pieces
