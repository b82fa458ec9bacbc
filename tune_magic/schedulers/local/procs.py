"""The processes of a local job: find them by session, signal them, never a stranger.

A local job is a tree in several sessions: the job's wrapper starts the torchrun agent (or the one
recipe process) in a new session, and torchrun starts each worker in a session of its own. So
"every process of the job" is every member of the agent's session and of each recorded worker's
session: that also catches a rank's own children (DataLoader workers, a ``sleep`` it spawned) and
processes orphaned when the agent died. A session is matched by its leader's pid *and* create
time, so a recycled pid is never mistaken for the job. Every process signalled must also pass the
job's :class:`Owner` check: it is this user's, and it carries the job's token in its environment
(:mod:`tune_magic.registry.owner`), so a record planted by someone else names nothing a stop may kill.

Only this package (the local scheduler) imports psutil and sends signals.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Iterable

import psutil

from tune_magic.registry.owner import TOKEN_ENV
from tune_magic.registry.store import ProcessRef

#: Seconds of create-time difference under which two observations are the same process.
CREATE_TIME_TOLERANCE_S = 0.05


@dataclass(frozen=True)
class Owner:
    """Which processes belong to a job, beyond pid and create time.

    Attributes:
        token: the job's token (:data:`tune_magic.registry.owner.TOKEN_ENV` in each of its
            processes' environment), or ``None`` for a record of an earlier release, which has none.
        legacy_ok: for a record without a token: its record was written by this user (a planted
            one was not), so its processes are known by pid and create time alone, as before.
    """

    token: str | None = None
    legacy_ok: bool = True

    def allows(self, proc: psutil.Process) -> bool:
        """Whether ``proc`` is this user's and the job's (see the class docstring)."""
        try:
            if proc.uids().real != os.getuid():
                return False
            if self.token is None:
                return self.legacy_ok
            return proc.environ().get(TOKEN_ENV) == self.token
        except psutil.Error:  # gone, or not ours to read
            return False


def alive(ref: ProcessRef | None, owner: Owner | None = None) -> psutil.Process | None:
    """Return the process if ``ref``'s pid is alive and is the same process (create-time match,
    and ``owner``'s check when given); zombies count as gone."""
    if ref is None:
        return None
    try:
        proc = psutil.Process(ref.pid)
        if abs(proc.create_time() - ref.create_time) > CREATE_TIME_TOLERANCE_S:
            return None  # the pid was recycled: never signal a stranger
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    return proc if owner is None or owner.allows(proc) else None


def ref_of(proc: psutil.Process, rank: int | None = None) -> ProcessRef:
    """Return a :class:`ProcessRef` for a live process.

    Raises:
        psutil.Error: it is gone.
    """
    return ProcessRef(proc.pid, proc.create_time(), rank)


def session_members(leaders: Iterable[ProcessRef]) -> list[psutil.Process]:
    """Return every live (non-zombie) process in the sessions led by ``leaders``.

    A session whose leader pid is alive with another create time belongs to a stranger and is
    skipped. A dead leader's session still counts: Linux does not reuse a pid while a session
    or process group of that id has members, so its members are the job's orphans.
    """
    sessions: dict[int, float] = {}
    for ref in leaders:
        if ref is None:
            continue
        try:
            leader = psutil.Process(ref.pid)
            if abs(leader.create_time() - ref.create_time) > CREATE_TIME_TOLERANCE_S:
                continue
        except psutil.NoSuchProcess:
            pass
        except psutil.Error:
            continue
        sessions[ref.pid] = ref.create_time
    if not sessions:
        return []
    out = []
    me = os.getpid()
    # getsid() first (a system call, no /proc file read): only the few members are read further,
    # which keeps many stops at once (stop --all) from each reading every process's /proc files
    for pid in psutil.pids():
        if pid == me:
            continue
        try:
            started = sessions.get(os.getsid(pid))
            if started is None:
                continue
            proc = psutil.Process(pid)
            with proc.oneshot():
                ctime, status = proc.create_time(), proc.status()
        except (OSError, psutil.Error):
            continue
        if ctime + CREATE_TIME_TOLERANCE_S < started or status == psutil.STATUS_ZOMBIE:
            continue
        out.append(proc)
    return out


def descendants(ref: ProcessRef | None) -> list[psutil.Process]:
    """Return the live descendants of ``ref`` (empty when it is gone)."""
    proc = alive(ref)
    if proc is None:
        return []
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def job_processes(agent: ProcessRef | None, workers: Iterable[ProcessRef],
                  owner: Owner | None = None) -> list[psutil.Process]:
    """Every live process of a job: the agent, its sessions' members, each worker's session's
    members, and the agent's descendants (workers not yet recorded). Deduplicated by pid. With
    ``owner``, only the processes it allows (this user's, carrying the job's token)."""
    found: dict[int, psutil.Process] = {}
    workers = list(workers)
    proc = alive(agent)
    if proc is not None:
        found[proc.pid] = proc
    for p in session_members([agent, *workers]) + descendants(agent):
        found.setdefault(p.pid, p)
    for w in workers:
        p = alive(w)
        if p is not None:
            found.setdefault(p.pid, p)
    return [p for p in found.values() if owner is None or owner.allows(p)]


def from_supervisor(job_dir) -> tuple[ProcessRef, ProcessRef] | None:
    """(supervisor, agent) found from the live supervisor of ``job_dir`` (its command line names
    the directory; the agent is its exit wrapper's child), for a job whose records are all damaged.
    ``None`` when there is no such supervisor or it has no agent yet."""
    marker = "tune_magic.schedulers.local.supervisor"
    target = str(job_dir)
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if marker in cmd and target in cmd:
            try:
                for wrapper in p.children():
                    for agent in wrapper.children():
                        return ref_of(p), ref_of(agent)
                for child in p.children():  # an agent adopted after its wrapper died
                    if os.getsid(child.pid) == child.pid:
                        return ref_of(p), ref_of(child)
            except (psutil.Error, OSError):
                continue
    return None


def signal_all(procs: Iterable[psutil.Process], sig: int) -> None:
    """Send ``sig`` to each process that is still alive (errors ignored: it may just have ended)."""
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait up to ``timeout_s`` seconds for ``procs`` to end; return those still alive (zombies
    of another parent count as ended)."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    left = list(procs)
    while left:
        _, left = psutil.wait_procs(left, timeout=min(0.2, max(0.0, deadline - time.monotonic())))
        left = [p for p in left if _running(p)]
        if time.monotonic() >= deadline:
            break
    return left


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_job(agent: ProcessRef | None, workers: list[ProcessRef], grace_s: float, owner: Owner | None = None) -> int:
    """End every process of a job: SIGTERM to the agent (torchrun forwards it to its workers and
    kills them after its own grace), or to every member when the agent is gone; after ``grace_s``
    seconds, SIGKILL whatever is left, found afresh (a rank may have spawned more meanwhile). Only
    processes ``owner`` allows are signalled.

    Returns:
        How many processes were still alive and got SIGKILL.
    """
    procs = job_processes(agent, workers, owner)
    if not procs:
        return 0
    head = alive(agent, owner)
    signal_all([head] if head is not None else procs, signal.SIGTERM)
    wait_gone(procs, grace_s)
    killed = 0
    for _ in range(3):  # members may appear while we kill (a dying rank's children)
        left = job_processes(agent, workers, owner)
        if not left:
            break
        killed += len(left)
        signal_all(left, signal.SIGKILL)
        wait_gone(left, 5.0)
    return killed
