"""What SLURM's controller says about our jobs: one bounded query, shared by every job and process.

A listing, a card or a table never waits long on the controller. At most one query per
:func:`interval_s` for all live SLURM jobs of the registry at once (one ``squeue --jobs=... --json``,
the plain ``--format`` where that fails), bounded by :func:`query_timeout_s` seconds in all; its
answer is kept on disk with its time (``$TUNE_MAGIC_HOME/cache/slurm-queue-<cluster>.json``), so
other processes read it instead of asking again, and the process that asks holds a lock meanwhile.

Absence of an answer is not an answer. Each asked job comes out as one of:

- ``listed``: squeue (or ``scontrol show job``) described it;
- ``not_listed``: the controller answered and does not know it: a structured squeue answer
  without it, confirmed by ``scontrol show job N`` saying "Invalid job id" (squeue exiting 0 with
  nothing, or 1 for an id it calls invalid, is a doubt until scontrol confirms);
- ``no_answer``: the query failed or timed out (an unreachable, paused or overloaded controller):
  no news, which never changes a job's status; :meth:`QueueWatcher.note` then says since when;
- ``not_asked``: the job was not among the last query's ids yet (launched a moment ago).

Settings (read at each use, so tests and CLI subprocesses run outages of seconds):
``TUNE_MAGIC_SLURM_INTERVAL_S`` (default :data:`SQUEUE_INTERVAL_S`),
``TUNE_MAGIC_SLURM_QUERY_TIMEOUT_S`` (:data:`QUERY_TIMEOUT_S`), ``TUNE_MAGIC_SLURM_GRACE_S``
(:data:`MISSING_GRACE_S`) and ``TUNE_MAGIC_SLURM_MISSING_ANSWERS`` (:data:`MISSING_ANSWERS`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from tune_magic.paths import home
from tune_magic.registry import store as jobstore
from tune_magic.schedulers.slurm import squeue as sq

#: Seconds between queries of the controller (one for every live SLURM job).
SQUEUE_INTERVAL_S = 5.0
#: Seconds one query (squeue, and scontrol for the jobs it left out) may take in all.
QUERY_TIMEOUT_S = 3.0
#: Seconds a job may be missing from the controller's answers, without an exit file, before it is
#: called failed (and only after :data:`MISSING_ANSWERS` such answers).
MISSING_GRACE_S = 60.0
#: Answers that must leave the job out (over :data:`MISSING_GRACE_S`) before it is called failed.
MISSING_ANSWERS = 3

LISTED, NOT_LISTED, NO_ANSWER, NOT_ASKED = "listed", "not_listed", "no_answer", "not_asked"


def setting(name: str, default: float) -> float:
    """The setting ``TUNE_MAGIC_SLURM_<NAME>`` from the environment (a number >= 0), else ``default``."""
    raw = os.environ.get(f"TUNE_MAGIC_SLURM_{name}", "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else default


def interval_s() -> float:
    """Seconds between two queries of the controller."""
    return setting("INTERVAL_S", SQUEUE_INTERVAL_S)


def query_timeout_s() -> float:
    """Seconds one query may take in all."""
    return setting("QUERY_TIMEOUT_S", QUERY_TIMEOUT_S)


def missing_grace_s() -> float:
    """Seconds of "not listed" answers before a job without an exit file is called failed."""
    return setting("GRACE_S", MISSING_GRACE_S)


def missing_answers() -> int:
    """Answers leaving a job out that must come (over the grace period) before it is called failed."""
    return max(1, int(setting("MISSING_ANSWERS", MISSING_ANSWERS)))


@dataclass(frozen=True)
class Answer:
    """The controller's word on one job.

    Attributes:
        kind: :data:`LISTED`, :data:`NOT_LISTED`, :data:`NO_ANSWER` or :data:`NOT_ASKED`.
        job: the job as described (``listed`` only).
        at: unix seconds of the answer (of the last query, for ``no_answer``).
        failing_since: unix seconds since which the controller has not answered, else ``None``.
    """

    kind: str
    job: sq.SlurmJob | None = None
    at: float | None = None
    failing_since: float | None = None


def run_bounded(argv: list[str], env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess | None:
    """Run a SLURM client for at most ``timeout`` seconds; ``None`` when it could not run or took
    longer (it runs in a session of its own, which is then killed whole: a hanging wrapper script
    leaves no child behind)."""
    try:
        p = subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    except OSError:
        return None
    try:
        out, err = p.communicate(timeout=max(timeout, 0.05))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the group this call made, led by its own child
        except OSError:
            pass
        try:
            p.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:  # a grandchild left the group and holds the pipes
            for stream in (p.stdout, p.stderr):
                stream.close()
            p.wait()
        return None
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def _job_from(data: dict) -> sq.SlurmJob:
    return sq.SlurmJob(**{**data, "flags": tuple(data.get("flags") or ()), "nodes": tuple(data.get("nodes") or ())})


@dataclass
class _View:
    """One cluster's last query: when (unix and monotonic seconds), which ids it asked, which it
    answered (listed: ``jobs``; confirmed unknown: ``gone``), and since when the controller fails."""

    asked_at: float = float("-inf")
    mono: float = float("-inf")
    ids: frozenset = frozenset()
    answered: frozenset = frozenset()
    jobs: dict | None = None
    gone: frozenset = frozenset()
    failing_since: float | None = None
    error: str | None = None

    def to_json(self) -> dict:
        return {"asked_at": self.asked_at, "ids": sorted(self.ids), "answered": sorted(self.answered),
                "jobs": {k: asdict(v) for k, v in (self.jobs or {}).items()}, "gone": sorted(self.gone),
                "failing_since": self.failing_since, "error": self.error}

    @classmethod
    def from_json(cls, data: dict) -> "_View":
        asked = float(data["asked_at"])
        age = max(0.0, time.time() - asked)
        return cls(asked_at=asked, mono=time.monotonic() - age, ids=frozenset(data["ids"]),
                   answered=frozenset(data["answered"]), jobs={k: _job_from(v) for k, v in data["jobs"].items()},
                   gone=frozenset(data["gone"]), failing_since=data.get("failing_since"), error=data.get("error"))


def _cache_file(conf: str) -> Path:
    digest = hashlib.sha256(conf.encode()).hexdigest()[:12]
    return home() / "cache" / f"slurm-queue-{digest}.json"


def _read_view(path: Path) -> _View | None:
    try:
        return _View.from_json(jobstore.read_json(path, 16 << 20))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class QueueWatcher:
    """Every process's shared view of the controller (see the module docstring). ``ids_for(conf)``
    gives the SLURM ids of the registry's live jobs on that cluster (the scheduler's)."""

    def __init__(self, ids_for: Callable[[str], Iterable[str]]) -> None:
        self._lock = threading.Lock()
        self._views: dict[str, _View] = {}
        self._ids_for = ids_for
        self._forced = False
        self.queries = 0  #: queries made by this process (tests and benchmarks read it)

    def forget(self) -> None:
        """Drop what is known: the next :meth:`get` asks the controller at once."""
        with self._lock:
            self._views.clear()
            self._forced = True

    def get(self, slurm_id: str, env: Mapping[str, str]) -> Answer:
        """The controller's word on ``slurm_id`` (asking it when the last answer is older than
        :func:`interval_s`, here or on disk); never takes longer than about :func:`query_timeout_s`."""
        conf = env.get("SLURM_CONF", "")
        with self._lock:
            view = self._fresh_view(conf, slurm_id, env)
        return self._answer(view, slurm_id)

    def note(self, env: Mapping[str, str]) -> str | None:
        """``"SLURM not answering since HH:MM"`` while the last query of this cluster failed (from
        this process's view or the one on disk), else ``None``. Never asks the controller."""
        conf = env.get("SLURM_CONF", "")
        with self._lock:
            view = self._views.get(conf)
            if view is None or time.monotonic() - view.mono >= interval_s():
                view = _read_view(_cache_file(conf)) or view
        if view is None or view.failing_since is None:
            return None
        return "SLURM not answering since " + time.strftime("%H:%M", time.localtime(view.failing_since))

    @staticmethod
    def _answer(view: _View, slurm_id: str) -> Answer:
        if slurm_id in view.answered:
            if slurm_id in (view.jobs or {}):
                return Answer(LISTED, view.jobs[slurm_id], view.asked_at)
            return Answer(NOT_LISTED, None, view.asked_at)
        if slurm_id in view.ids:
            return Answer(NO_ANSWER, None, view.asked_at, view.failing_since or view.asked_at)
        return Answer(NOT_ASKED, None, view.asked_at, view.failing_since)

    def _fresh_view(self, conf: str, slurm_id: str, env: Mapping[str, str]) -> _View:
        """This process's view if recent, else the one on disk if recent, else a new query (one
        process at a time asks: the others wait for its answer, as long as a query may take)."""
        now = time.monotonic()
        every = interval_s()
        view = self._views.get(conf)
        if view is not None and now - view.mono < every:
            return view
        path = _cache_file(conf)
        forced, self._forced = self._forced, False

        def recent_on_disk() -> _View | None:
            disk = None if forced else _read_view(path)
            fresh = disk is not None and 0 <= time.monotonic() - disk.mono < every and slurm_id in disk.ids
            return disk if fresh else None

        disk = recent_on_disk()
        if disk is not None:
            self._views[conf] = disk
            return disk
        lock_fd, busy = self._take_lock(path)
        try:
            if busy:  # another process asked all this time: what it found, or no news
                disk = _read_view(path)
                view = disk if disk is not None and slurm_id in disk.ids else _View(
                    asked_at=time.time(), mono=time.monotonic(), failing_since=view.failing_since if view else None)
            elif (disk := recent_on_disk()) is not None:  # another process answered while this one waited
                view = disk
            else:
                view = self._query(conf, slurm_id, env, view or _read_view(path))
                try:
                    jobstore.write_atomic(path, json.dumps(view.to_json()).encode(), fsync=False)
                except OSError:
                    pass  # a read-only or full home: this process keeps it in memory
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._views[conf] = view
        return view

    @staticmethod
    def _take_lock(path: Path) -> tuple[int | None, bool]:
        """Hold the cache's lock, waiting while another process queries (at most about one query's
        time): ``(fd, False)``; ``(None, True)`` when it stayed busy; ``(None, False)`` without a
        writable home (every process then asks alone)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = jobstore.open_nofollow(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT)
        except OSError:
            return None, False
        deadline = time.monotonic() + query_timeout_s() + 0.5
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd, False
            except OSError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    return None, True
                time.sleep(0.05)

    def _query(self, conf: str, slurm_id: str, env: Mapping[str, str], previous: _View | None) -> _View:
        """Ask the controller about every live job of ``conf`` and ``slurm_id``, within one deadline."""
        ids = {slurm_id}
        try:
            ids.update(self._ids_for(conf))
        except Exception:  # a listing problem never blocks the query for this job
            pass
        ids = sorted(ids, key=lambda x: int(x.split("_")[0]) if x.split("_")[0].isdigit() else 0)
        deadline = time.monotonic() + query_timeout_s()
        self.queries += 1
        jobs, error = _squeue(ids, env, deadline)
        answered: set[str] = set()
        gone: set[str] = set()
        if jobs is not None:
            answered = {i for i in ids if i in jobs}
            for missing in (i for i in ids if i not in jobs):  # a doubt until scontrol confirms it
                found = _scontrol(missing, env, deadline)
                if found is None:
                    continue
                answered.add(missing)
                if found is False:
                    gone.add(missing)
                else:
                    jobs[missing] = found
        failing = None if answered else (previous.failing_since if previous and previous.failing_since
                                         else time.time())
        last_jobs = jobs if jobs is not None else (previous.jobs if previous else None)
        return _View(asked_at=time.time(), mono=time.monotonic(), ids=frozenset(ids), answered=frozenset(answered),
                     jobs=last_jobs, gone=frozenset(gone), failing_since=failing, error=error)


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


def _squeue(ids: list[str], env: Mapping[str, str], deadline: float) -> tuple[dict | None, str | None]:
    """squeue's jobs among ``ids`` ({} when it answered and listed none of them), or ``(None,
    why)`` when it gave no answer in time. ``--json`` first, the plain format where that fails."""
    r = run_bounded(sq.squeue_argv(ids, json_output=True), env, _left(deadline))
    if r is None:
        return None, "squeue did not answer in time"
    if r.returncode == 0:
        try:
            return sq.parse_squeue_json(r.stdout, ids), None
        except (sq.SqueueParseError, ValueError):
            pass  # older or odd squeue, or "errors" without jobs: the plain format says more
    if _left(deadline) <= 0:
        return None, "squeue did not answer in time"
    r = run_bounded(sq.squeue_argv(ids, json_output=False), env, _left(deadline))
    if r is None:
        return None, "squeue did not answer in time"
    if r.returncode == 0 or sq.scontrol_invalid_id(r.returncode, r.stderr):
        try:
            return sq.parse_squeue_format(r.stdout if r.returncode == 0 else ""), None
        except sq.SqueueParseError as exc:
            return None, str(exc)
    return None, " ".join((r.stderr or r.stdout or f"squeue exited {r.returncode}").split())[:300]


def _scontrol(slurm_id: str, env: Mapping[str, str], deadline: float) -> "sq.SlurmJob | bool | None":
    """``scontrol show job``'s word on one job: the job, ``False`` (it knows no such job), or
    ``None`` (no answer in time)."""
    left = _left(deadline)
    if left <= 0:
        return None
    r = run_bounded(["scontrol", "--oneliner", "show", "job", slurm_id], env, left)
    if r is None:
        return None
    if sq.scontrol_invalid_id(r.returncode, r.stderr):
        return False
    if r.returncode != 0:
        return None
    try:
        job = sq.parse_scontrol_jobs(r.stdout).get(slurm_id)
    except sq.SqueueParseError:
        return None
    return job
