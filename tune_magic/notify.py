"""Wake followers early when the files they follow change: one file-change notifier per process.

A follower (e.g. :class:`tune_magic.watch.JobWatcher`) still polls on its own schedule; a
notification only shortens its wait. That keeps it correct wherever notifications never come:
on network filesystems (NFS, Lustre) inotify reports only this machine's writes, not those of a
job running on another node; and when the kernel runs out of inotify instances or watches
(``EMFILE`` from ``inotify_init``, ``ENOSPC`` from ``inotify_add_watch``), a subscription simply
stays unwatched, without an error, and is tried again :data:`RETRY_S` later.

Backend: `watchdog <https://pypi.org/project/watchdog/>`_'s platform observer (inotify on Linux:
one inotify instance for all of its watches since watchdog 7). Idle watches cost nothing: its
threads block until the kernel has an event, and the kernel merges repeated writes to one file
that were not read yet into one event. A platform without a native backend (where watchdog would
stat directories itself) gets no notifications: the followers' own polling does that already.

Watches are on directories (a followed file's parent), so a file that appears later or is
replaced under its name (rotation, ``os.replace``) is still seen. Subscriptions on one directory
share its watch; the watch is removed when the last of them releases it.

No IPython here. Callbacks run on watchdog's dispatch thread and must only set flags (e.g.
``threading.Event.set``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Iterable

__all__ = ["Notifier", "Subscription", "get_notifier", "RETRY_S"]

#: Seconds before a directory whose watch could not be added (missing, no inotify watch or
#: instance left, deleted while watched) is tried again.
RETRY_S = 5.0


def _default_observer():
    """Start and return watchdog's observer for this platform, or ``None`` where it has no
    native backend.

    Raises:
        OSError: the backend could not start (``EMFILE``: no inotify instance left).
    """
    from watchdog.observers import Observer
    from watchdog.observers.polling import PollingObserver

    if Observer is PollingObserver:  # it would only stat what the followers poll anyway
        return None
    observer = Observer()
    observer.daemon = True
    observer.name = "tune_magic-notify"
    observer.start()
    return observer


def _event_filter() -> list:
    """Event types that can mean new data: writes, new files, files moved into place, removals.
    Opens and read-only closes (``IN_OPEN``, ``IN_CLOSE_NOWRITE``) are left out of the inotify
    mask, so the followers' own reads wake nobody."""
    from watchdog.events import (DirCreatedEvent, DirDeletedEvent, FileCreatedEvent, FileDeletedEvent,
                                 FileModifiedEvent, FileMovedEvent)

    return [FileModifiedEvent, FileCreatedEvent, FileMovedEvent, FileDeletedEvent, DirCreatedEvent,
            DirDeletedEvent]


class Subscription:
    """One follower's interest: the files (and directories) whose changes wake it.

    Made by :meth:`Notifier.subscribe`; thread-safe.

    Attributes:
        wake: called on the notifier's thread when a followed path changes.
        files: followed files (absolute paths, as given: links are not resolved).
        dirs: directories any entry of which wakes it (e.g. where a metric file will appear).
        wakes: notifications delivered so far.
        closed: True after :meth:`close`.
    """

    def __init__(self, notifier: "Notifier", wake: Callable[[], None]):
        self.notifier = notifier
        self.wake = wake
        self.files: frozenset[str] = frozenset()
        self.dirs: frozenset[str] = frozenset()
        self.needs: frozenset[str] = frozenset()  # directories watched for it
        self.wakes = 0
        self.closed = False

    def watch(self, files: Iterable[str | os.PathLike] = (), dirs: Iterable[str | os.PathLike] = ()) -> None:
        """Follow ``files`` (through watches on their parent directories) and any entry of
        ``dirs``; replaces what was followed. Cheap when nothing changed and no failed watch is
        due for a retry."""
        files = frozenset(os.path.abspath(f) for f in files)
        dirs = frozenset(os.path.abspath(d) for d in dirs)
        if files != self.files or dirs != self.dirs or self.notifier._retry_due(self.needs):
            self.notifier._update(self, files, dirs)

    @property
    def watching(self) -> bool:
        """Whether every directory it needs has a live watch, so that each local write to a
        followed file wakes it (``False`` while notification is unavailable for it)."""
        return self.notifier._watching(self.needs)

    def close(self) -> None:
        """Stop following; watches no other subscription needs are removed."""
        self.notifier._update(self, frozenset(), frozenset(), closing=True)


class Notifier:
    """A process's file-change notifier. Use :func:`get_notifier`; tests build their own.

    Args:
        observer_factory: returns a started watchdog-style observer (``schedule(handler, path,
            recursive=, event_filter=)`` returning a handle, ``unschedule(handle)``, ``stop()``,
            ``join(timeout)``), or ``None`` when the platform has no native backend. It may raise
            ``OSError`` (e.g. ``EMFILE``); so may ``schedule`` (``ENOSPC``, ``ENOENT``). Such
            errors are kept in :attr:`failures`, never raised.
        clock: monotonic seconds, for the retry delays.

    Attributes:
        failures: ``{directory: OSError}`` for watches that could not be added or were lost
            (``""``: the backend itself could not start), until a retry succeeds.
    """

    def __init__(self, observer_factory: Callable[[], object] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._factory = observer_factory or _default_observer
        self._clock = clock
        self._lock = threading.Lock()
        self._observer = None
        self._no_backend = False
        self._handles: dict[str, object] = {}  # directory -> the observer's handle of its watch
        self._holders: dict[str, set[Subscription]] = {}  # directory -> subscriptions needing it
        self.failures: dict[str, OSError] = {}
        self._failed_at: dict[str, float] = {}
        self._lost: list[str] = []  # watched directories deleted; released by the next update
        self._subs: set[Subscription] = set()
        # Dispatch reads this without the lock (swapped whole under it): watchdog calls handlers
        # holding its own lock, and _update holds ours while calling watchdog.
        self._routes: dict[str, tuple[Subscription, ...]] = {}
        self._handler = None

    # -- subscriptions ------------------------------------------------------------------------

    def subscribe(self, wake: Callable[[], None]) -> Subscription:
        """Return a new subscription that calls ``wake`` (set what it follows with
        :meth:`Subscription.watch`)."""
        sub = Subscription(self, wake)
        with self._lock:
            self._subs.add(sub)
        return sub

    @property
    def subscriptions(self) -> int:
        """Open subscriptions."""
        return len(self._subs)

    @property
    def watches(self) -> dict[str, int]:
        """``{directory: subscriptions sharing its watch}`` for the directories watched now."""
        with self._lock:
            return {d: len(self._holders.get(d, ())) for d in self._handles}

    @property
    def running(self) -> bool:
        """Whether the backend is started (it stops when the last watch is released)."""
        return self._observer is not None

    def _update(self, sub: Subscription, files: frozenset, dirs: frozenset, closing: bool = False) -> None:
        stop = None
        with self._lock:
            if sub.closed:
                return
            self._drop_lost()
            needs = frozenset(os.path.dirname(f) for f in files) | dirs
            for d in sub.needs - needs:
                holders = self._holders.get(d)
                if holders is not None:
                    holders.discard(sub)
                    if not holders:
                        del self._holders[d]
                        self._release(d)
            for d in needs:
                self._holders.setdefault(d, set()).add(sub)
            sub.files, sub.dirs, sub.needs = files, dirs, needs
            if closing:
                sub.closed = True
                self._subs.discard(sub)
            for d in needs:
                if d not in self._handles:
                    self._acquire(d)
            self._routes = {d: tuple(h) for d, h in self._holders.items()}
            if not self._handles and self._observer is not None:
                stop, self._observer = self._observer, None
        if stop is not None:
            _stop(stop)

    def _retry_due(self, needs: frozenset) -> bool:
        if not self._failed_at and not self._lost:
            return False
        return bool(self._lost) or any(d in self._failed_at and self._due(d) for d in (*needs, ""))

    def _watching(self, needs: frozenset) -> bool:
        with self._lock:
            return bool(needs) and all(d in self._handles and d not in self._lost for d in needs)

    # -- watches (the lock is held) -----------------------------------------------------------

    def _due(self, key: str) -> bool:
        t = self._failed_at.get(key)
        if t is None or self._clock() - t >= RETRY_S:
            return True
        # a directory that was missing is tried again as soon as it exists (one stat)
        return isinstance(self.failures.get(key), FileNotFoundError) and os.path.isdir(key)

    def _fail(self, key: str, exc: OSError) -> None:
        self.failures[key] = exc
        self._failed_at[key] = self._clock()

    def _ok(self, key: str) -> None:
        self.failures.pop(key, None)
        self._failed_at.pop(key, None)

    def _acquire(self, d: str) -> None:
        if not self._due(d):
            return
        observer = self._start_observer()
        if observer is None:
            return
        try:
            self._handles[d] = observer.schedule(self._get_handler(), d, recursive=False,
                                                 event_filter=_event_filter())
        except OSError as exc:  # ENOENT (not there yet), ENOSPC (no inotify watch left), EACCES
            self._fail(d, exc)
        else:
            self._ok(d)

    def _release(self, d: str) -> None:
        self._ok(d)
        handle = self._handles.pop(d, None)
        if handle is not None and self._observer is not None:
            try:
                self._observer.unschedule(handle)
            except (KeyError, OSError):  # already gone
                pass

    def _drop_lost(self) -> None:
        while self._lost:
            d = self._lost.pop()
            if d in self._handles:
                self._release(d)
                self._fail(d, FileNotFoundError(2, "watched directory was deleted", d))

    def _start_observer(self):
        if self._observer is None and not self._no_backend and self._due(""):
            try:
                self._observer = self._factory()
            except OSError as exc:  # EMFILE: no inotify instance left for this user
                self._fail("", exc)
                return None
            self._ok("")
            self._no_backend = self._observer is None
        return self._observer

    def close(self) -> None:
        """Close every subscription and stop the backend."""
        for sub in list(self._subs):
            sub.close()
        with self._lock:
            stop, self._observer = self._observer, None
            self._handles.clear()
        if stop is not None:
            _stop(stop)

    # -- events -------------------------------------------------------------------------------

    def _get_handler(self):
        if self._handler is None:
            from watchdog.events import FileSystemEventHandler

            dispatch = self.dispatch

            class _Handler(FileSystemEventHandler):
                def dispatch(self, event) -> None:  # every event, without watchdog's per-type calls
                    dispatch(event.src_path, getattr(event, "dest_path", ""),
                             deleted_dir=event.is_directory and event.event_type == "deleted")

            self._handler = _Handler()
        return self._handler

    def dispatch(self, src: str | bytes, dest: str | bytes = "", *, deleted_dir: bool = False) -> int:
        """Wake the subscriptions following ``src`` or ``dest`` (a move's target), or the
        directory either is in. Called by the backend for each event; public so that tests (or
        another backend) can feed events.

        Returns:
            How many subscriptions were woken.
        """
        routes = self._routes
        woken = set()
        for p in (src, dest):
            if not p:
                continue
            p = os.fsdecode(p)
            if deleted_dir and p in routes:
                self._lost.append(p)  # its watch died with it; the next update re-adds it
            parent = os.path.dirname(p)
            for sub in routes.get(parent, ()):
                if p in sub.files or parent in sub.dirs:
                    woken.add(sub)
        for sub in woken:
            sub.wakes += 1
            sub.wake()
        return len(woken)


def _stop(observer) -> None:
    try:
        observer.stop()
        observer.join(2.0)
    except Exception:  # it is dropped either way; a daemon thread cannot outlive the process
        pass


_NOTIFIER: Notifier | None = None
_NOTIFIER_LOCK = threading.Lock()


def get_notifier() -> Notifier:
    """Return this process's notifier, made on first use. Its backend starts with the first
    watch and stops when the last one is released."""
    global _NOTIFIER
    with _NOTIFIER_LOCK:
        if _NOTIFIER is None:
            _NOTIFIER = Notifier()
        return _NOTIFIER


def _after_fork_in_child() -> None:
    # a forked child has none of the parent's threads: it gets a notifier of its own
    global _NOTIFIER, _NOTIFIER_LOCK
    _NOTIFIER, _NOTIFIER_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
