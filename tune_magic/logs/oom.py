"""Evidence that the kernel's OOM killer ended a job's process, gathered around the job's run.

A rank killed by the OOM killer and a rank killed by ``kill -9`` look the same to torchrun
(``exitcode: -9``); only the kernel knows the difference. Two sources, each optional:

* the ``oom_kill`` counter of the job's memory cgroup: cgroup v2 ``memory.events`` (it counts
  the cgroup's whole subtree) or cgroup v1 ``memory.oom_control`` (each cgroup of the subtree is
  read and summed), snapshotted by :meth:`OomWatch.start` and compared by
  :meth:`OomWatch.killed`;
* the kernel log (``/dev/kmsg``, records after the one that was last at the start), whose OOM
  report names the victim: ``Out of memory: Killed process 1234 (python) ...`` (the whole
  machine) or ``Memory cgroup out of memory: Killed process 1234 (python) ...`` (a cgroup limit),
  and ``oom-kill:constraint=...,task=python,pid=1234,...`` (Linux >= 4.19).

Either may be missing (no memory controller, no permission to read the kernel log): the
evidence says what was read. Nothing here starts or stops processes; the supervisor calls it::

    watch = OomWatch.start(agent_pid)          # before the job can allocate much
    ...                                        # the job runs and ends
    evidence = watch.killed(pids_of_the_job)   # OomEvidence
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

__all__ = ["OomEvidence", "OomWatch", "cgroup_dirs", "read_oom_kill_count", "read_kernel_log"]

_KILLED_RE = re.compile(r"(?P<cg>Memory cgroup out of memory: )?Killed process (?P<pid>\d+)\b")
_OOMKILL_RE = re.compile(r"oom-kill:.*?constraint=(?P<constraint>\w+).*?[,:]pid=(?P<pid>\d+)")
_MAX_V1_DIRS = 256  # cgroup v1 subtree dirs read per snapshot (bounds the work on a big host tree)


@dataclass(frozen=True)
class OomEvidence:
    """What the kernel says about OOM kills during a job.

    Attributes:
        pids: pids that a kernel log line names as killed by the OOM killer (among those asked).
        cgroup_kills: how much the watched cgroups' ``oom_kill`` counters rose (0 if unread).
        cgroup_read: whether at least one cgroup counter could be read before and after.
        kernel_log_read: whether the kernel log could be read.
        cgroup_limited: pids whose kill the kernel attributed to a cgroup limit (not the machine).
        lines: the kernel log lines about those pids (for the full report).
    """

    pids: frozenset[int] = frozenset()
    cgroup_kills: int = 0
    cgroup_read: bool = False
    kernel_log_read: bool = False
    cgroup_limited: frozenset[int] = frozenset()
    lines: tuple[str, ...] = field(default=())

    def killed(self, pid: int | None) -> bool:
        """Whether the OOM killer ended ``pid``.

        True when the kernel log names the pid; when the kernel log could not be read, also
        when the job's cgroup counted an OOM kill (the pid is then the likely victim: only
        pids that died by SIGKILL are asked about).
        """
        if pid is not None and pid in self.pids:
            return True
        return self.cgroup_kills > 0 and not self.kernel_log_read

    def where(self, pid: int | None) -> str:
        """What ran out, as far as known: ``"its memory cgroup reached its limit"`` or
        ``"the machine ran out of memory"``."""
        if pid in self.cgroup_limited or (pid not in self.pids and self.cgroup_kills > 0):
            return "its memory cgroup reached its limit"
        return "the machine ran out of memory"


def _mounts() -> list[tuple[str, str, str, str]]:
    """(root, mount point, fs type, super options) of each cgroup mount, from mountinfo."""
    out = []
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        a, b = left.split(), right.split()
        if len(a) >= 5 and b and b[0] in ("cgroup", "cgroup2"):
            out.append((a[3], a[4], b[0], b[2] if len(b) > 2 else ""))
    return out


def cgroup_dirs(pid: int) -> list[Path]:
    """Return the memory cgroup directories of ``pid``: its cgroup v2 directory when that has a
    memory controller, and its cgroup v1 ``memory`` hierarchy directory when one is mounted.

    Raises nothing: an unreadable ``/proc/<pid>/cgroup`` (the process is gone) gives ``[]``.
    """
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return []
    mounts = _mounts()
    found: list[Path] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        v2 = hier == "0" and controllers == ""
        if not v2 and "memory" not in controllers.split(","):
            continue
        for root, point, fstype, opts in mounts:
            if (fstype == "cgroup2") != v2 or (not v2 and "memory" not in opts.split(",")):
                continue
            rel = path
            if root != "/" and (rel == root or rel.startswith(root + "/")):
                rel = rel[len(root):]
            d = Path(point) / rel.lstrip("/")
            if (d / ("memory.events" if v2 else "memory.oom_control")).is_file():
                found.append(d)
            break
    return found


def _counter(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def read_oom_kill_count(cgroup: str | os.PathLike[str]) -> int | None:
    """Return the ``oom_kill`` count of a memory cgroup directory, or ``None`` if unreadable.

    cgroup v2: ``memory.events`` (the whole subtree). cgroup v1: ``memory.oom_control`` of the
    directory and of its sub-directories (at most 256 read), summed.
    """
    d = Path(cgroup)
    if (d / "memory.events").is_file():
        return _counter(d / "memory.events")
    total, seen = None, 0
    for dirpath, _, _ in os.walk(d):
        value = _counter(Path(dirpath) / "memory.oom_control")
        if value is not None:
            total = (total or 0) + value
        seen += 1
        if seen >= _MAX_V1_DIRS:
            break
    return total


def read_kernel_log(after_seq: int = -1, path: str = "/dev/kmsg") -> tuple[int, list[str]] | None:
    """Read the kernel log records after sequence number ``after_seq``.

    Args:
        after_seq: the last record already seen (-1: all records in the ring buffer).
        path: the kmsg device (a test may point it elsewhere).

    Returns:
        ``(last sequence number seen, messages)`` (messages without their ``prio,seq,...;``
        header), or ``None`` when the log cannot be read (no permission, no device).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    last, out = after_seq, []
    try:
        while True:
            try:
                rec = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records were overwritten while reading: go on with the next one
                if exc.errno == errno.EAGAIN:
                    break
                return None if last == after_seq and not out else (last, out)
            if not rec:
                break
            head, _, body = rec.decode("utf-8", "replace").partition(";")
            fields = head.split(",")
            try:
                seq = int(fields[1])
            except (IndexError, ValueError):
                continue
            if seq > after_seq:
                out.append(body.split("\n", 1)[0])
            last = max(last, seq)
    finally:
        os.close(fd)
    return last, out


class OomWatch:
    """A snapshot taken when a job starts, to ask later whether the OOM killer ended its processes.

    Args:
        cgroups: memory cgroup directories to watch.
        kmsg_path: the kernel log device.

    Attributes:
        cgroups: the watched directories.
        before: their ``oom_kill`` counts at the start (``None`` where unreadable).
        kmsg_seq: the kernel log's last record number at the start, or ``None`` if unreadable.
    """

    def __init__(self, cgroups: Iterable[str | os.PathLike[str]] = (), *, kmsg_path: str = "/dev/kmsg") -> None:
        dirs = list(dict.fromkeys(Path(c) for c in cgroups))
        # a directory inside another watched one is already counted there (v2 counts the
        # subtree, v1 is summed over it): watching both would count one kill twice
        self.cgroups = [d for d in dirs if not any(o != d and o in d.parents for o in dirs)]
        self.kmsg_path = kmsg_path
        self.before = {c: read_oom_kill_count(c) for c in self.cgroups}
        start = read_kernel_log(path=kmsg_path)
        self.kmsg_seq: int | None = start[0] if start is not None else None

    @classmethod
    def start(
        cls,
        pid: int | None = None,
        *,
        cgroup: str | os.PathLike[str] | None = None,
        kmsg_path: str = "/dev/kmsg",
    ) -> OomWatch:
        """Snapshot now: the memory cgroups of ``pid`` (see :func:`cgroup_dirs`; the job's
        processes inherit them) and/or ``cgroup``, and the kernel log's position.

        Args:
            pid: a process of the job, or the process that will start it (e.g. ``os.getpid()``).
            cgroup: a memory cgroup directory to watch as well.
            kmsg_path: the kernel log device.
        """
        dirs: list[Path] = cgroup_dirs(pid) if pid is not None else []
        if cgroup is not None:
            dirs.append(Path(cgroup))
        return cls(dirs, kmsg_path=kmsg_path)

    def killed(self, pids: Iterable[int]) -> OomEvidence:
        """Return what the kernel says about OOM kills since :meth:`start`.

        Args:
            pids: the job's processes (agent, ranks) that ended; only these are named in
                :attr:`OomEvidence.pids`.
        """
        wanted = set(pids)
        rise, cgroup_read = 0, False
        for c, before in self.before.items():
            after = read_oom_kill_count(c)
            if before is not None and after is not None:
                cgroup_read = True
                rise += max(after - before, 0)
        named: set[int] = set()
        limited: set[int] = set()
        lines: list[str] = []
        kernel_read = False
        if self.kmsg_seq is not None:
            got = read_kernel_log(self.kmsg_seq, self.kmsg_path)
            if got is not None:
                kernel_read = True
                for msg in got[1]:
                    m = _KILLED_RE.search(msg) or _OOMKILL_RE.search(msg)
                    if m is None or int(m["pid"]) not in wanted:
                        continue
                    pid = int(m["pid"])
                    named.add(pid)
                    lines.append(msg)
                    if m.re is _KILLED_RE and m["cg"] or m.re is _OOMKILL_RE and m["constraint"] == "CONSTRAINT_MEMCG":
                        limited.add(pid)
        return OomEvidence(frozenset(named), rise, cgroup_read, kernel_read, frozenset(limited), tuple(lines))
