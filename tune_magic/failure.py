"""Say why a job failed, from the end of its combined log. Pure text processing.

Two sources, in order of trust:

1. torchrun's root-cause report (torch.distributed.elastic ``ChildFailedError``, torch 2.x)::

       Root Cause (first observed failure):
       [0]:
         ...
         rank      : 1 (local_rank: 1)
         exitcode  : 1 (pid: 4462)
         error_file: <N/A>
         traceback : To enable traceback see: ...

   which names the failing rank; the message is that rank's last exception line, which torchrun
   prefixes with ``[rank1]:`` (or the report's ``traceback`` when the recipe used ``@record``).
2. Otherwise (the agent itself failed, e.g. ``EADDRINUSE`` on a fixed ``--master-port``, or a
   one-process job) the log's last Python exception line.
"""

from __future__ import annotations

import re

_ROOT = re.compile(r"Root Cause \(first observed failure\):(?P<body>.*?)(?:={20,}|\Z)", re.S)
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)", re.M)
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.M)
_TRACEBACK = re.compile(r"^\s*traceback\s*:\s*(.*)$", re.M)
# "[rank1]: RuntimeError: boom", "torch.distributed.DistNetworkError: ...", "KeyError: 'x'"
_EXC = re.compile(r"^(?:\[rank(?P<rank>\d+)\]:\s*)?(?P<msg>(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::.*)?)$")
_NO_TRACEBACK = "To enable traceback"


def _exception_lines(text: str) -> list[tuple[int | None, str]]:
    out = []
    for line in text.splitlines():
        m = _EXC.match(line.strip().replace("\r", ""))
        if m:
            out.append((int(m["rank"]) if m["rank"] else None, m["msg"].strip()))
    return out


def describe_failure(log_text: str) -> str | None:
    """Return a one-line reason for a failed job, or ``None`` when the log shows none.

    Args:
        log_text: the end of the job's combined stdout+stderr (a few hundred KiB is plenty).

    Returns:
        ``"rank 1: RuntimeError: boom"`` when torchrun's report names a failing rank (with
        ``" (exit code N)"`` when no message was found), else the last exception line, e.g.
        ``"torch.distributed.DistNetworkError: ... EADDRINUSE ..."``.
    """
    excs = _exception_lines(log_text)
    roots = list(_ROOT.finditer(log_text))
    if roots:
        body = roots[-1]["body"]
        rank_m, exit_m, tb_m = _RANK.search(body), _EXIT.search(body), _TRACEBACK.search(body)
        if rank_m:
            rank = int(rank_m[1])
            msg = next((m for r, m in reversed(excs) if r == rank), None)
            if msg is None and tb_m and _NO_TRACEBACK not in tb_m[1]:
                msg = tb_m[1].strip()
            if msg is None:
                exitcode = exit_m[1] if exit_m else "?"
                return f"rank {rank}: exited with code {exitcode}"
            return f"rank {rank}: {msg}"
    # ChildFailedError itself is torchrun's wrapper, not the cause
    excs = [(r, m) for r, m in excs if not m.startswith("torch.distributed.elastic.multiprocessing.errors.ChildFailedError")]
    if excs:
        rank, msg = excs[-1]
        return f"rank {rank}: {msg}" if rank is not None else msg
    return None
