"""Wake followers early when the files they follow change: one file-change notifier per process.

A follower (e.g. :class:`tune_magic.ui.watch.JobWatcher`) still polls on its own schedule; a
notification only shortens its wait. That keeps it correct wherever notifications never come:
on network filesystems (NFS, Lustre) inotify reports only this machine's writes, not those of a
job running on another node; and when the kernel runs out of inotify instances or watches
(``EMFILE`` from ``inotify_init``, ``ENOSPC`` from ``inotify_add_watch``), a subscription simply
stays unwatched, without an error, and is tried again :data:`RETRY_S` later.

Backend: Linux inotify through `inotify_simple <https://pypi.org/project/inotify_simple/>`_ (a
thin ``ctypes`` wrapper): one inotify instance and one daemon thread for the whole process. The
thread blocks in ``poll(2)`` while nothing happens, so an idle watch costs nothing. After the
first event it sleeps :data:`DEBOUNCE_S` before reading, so the rest of a burst (a progress
redraw, a metric line, log lines) lands first and wakes each follower once.

Two kinds of watch, so that the cost under load follows the followers' reads, not the job's writes:

* each followed file has a one-shot watch (``IN_MODIFY | IN_ONESHOT``) that fires on the first
  write and then stays quiet until the follower re-arms it with :meth:`Subscription.watch`, which
  it calls just before it reads: a write before the re-arm is in what it reads, a write after it
  fires the watch again. A job writing 200 lines a second costs one event per read of it.
* each followed file's directory (and each followed directory) has a lasting watch on its names
  only (created, moved in or out, deleted): a file that appears later, or is replaced under its
  name (``os.replace``, rotation), still wakes the follower.

Subscriptions following one path share its watch; a watch goes when the last of them releases it.
Elsewhere than Linux there is no notification: the followers' own polling does the work.

No IPython here. Callbacks run on the notifier's thread and must only set flags (e.g.
``threading.Event.set``).
"""

from __future__ import annotations

import errno
import os
import select
import threading
import time
from typing import Callable, Iterable

__all__ = ["Notifier", "Subscription", "get_notifier", "DEBOUNCE_S", "RETRY_S"]

#: Seconds between the first event of a burst and reading the burst (the debounce).
DEBOUNCE_S = 0.02

#: Seconds before a watch that could not be added (no inotify watch or instance left, no
#: permission) is tried again. A missing directory is tried again as soon as it exists.
RETRY_S = 5.0

# inotify(7) event bits (<sys/inotify.h>)
IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_ONESHOT = 0x4000, 0x8000, 0x01000000, 0x80000000
#: A followed file's watch: its writes (a truncation is one too), its removal or renaming.
FILE_MASK = IN_MODIFY | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONESHOT
#: A directory's watch: names created, moved in or out, deleted. Not writes (the files' own
#: watches have those), nor opens and closes, so the followers' own reads wake nobody.
DIR_MASK = IN_CREATE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR


def _default_backend():
    """A new inotify instance (``inotify_simple.INotify``: ``add_watch(path, mask) -> wd``,
    ``rm_watch(wd)``, ``read(timeout=0)`` -> events ``(wd, mask, cookie, name)``, ``fileno()``,
    ``close()``), or ``None`` where there is no inotify (not Linux).

    Raises:
        OSError: ``EMFILE`` (no inotify instance left for this user), ``ENFILE``.
    """
    try:
        from inotify_simple import INotify
    except ImportError:  # not Linux (the dependency is Linux-only)
        return None
    return INotify()


class Subscription:
    """One follower's interest: the files (and directories) whose changes wake it.

    Made by :meth:`Notifier.subscribe`; thread-safe.

    Attributes:
        wake: called on the notifier's thread when a followed path changes.
        files: followed files (absolute paths, as given: links are not resolved).
        dirs: directories any name created or moved in which wakes it (e.g. where a metric file
            will appear).
        wakes: notifications delivered so far.
        closed: True after :meth:`close`.
    """

    def __init__(self, notifier: "Notifier", wake: Callable[[], None]):
        self.notifier = notifier
        self.wake = wake
        self.files: frozenset[str] = frozenset()
        self.dirs: frozenset[str] = frozenset()
        #: the directories watched for it: its files' parents and its ``dirs``
        self.needs: frozenset[str] = frozenset()
        self.wakes = 0
        self.closed = False
        self._woken_by: set[str] = set()

    def take_woken_by(self) -> set[str]:
        """The paths whose changes woke it since the last call (followed files, or names in its
        directories), and forget them."""
        taken, self._woken_by = self._woken_by, set()
        return taken

    def watch(self, files: Iterable[str | os.PathLike] = (), dirs: Iterable[str | os.PathLike] = ()) -> None:
        """Follow ``files`` and the names in ``dirs``, replacing what was followed, and re-arm
        the files' one-shot watches that fired. Call it just before reading the followed files:
        a write before it is in what is read; a write after it fires the watch again. (A watch
        the kernel fired whose event the notifier's thread has not read yet still counts as
        armed: that event is about to wake this subscription, whose next call re-arms it.)
        No system call and no lock when nothing changed and nothing fired."""
        files = frozenset(os.path.abspath(f) for f in files)
        dirs = frozenset(os.path.abspath(d) for d in dirs)
        wds = self.notifier._wds
        if files == self.files and dirs == self.dirs and all(p in wds for p in files) \
                and all(d in wds for d in self.needs):
            return
        self.notifier._update(self, files, dirs)

    def rearm(self) -> None:
        """Re-arm the followed files' watches that fired (as :meth:`watch` with the same paths,
        cheaper: no path to normalise). No system call and no lock when none fired."""
        wds = self.notifier._wds
        if all(p in wds for p in self.files) and all(d in wds for d in self.needs):
            return
        self.notifier._update(self, self.files, self.dirs)

    @property
    def watching(self) -> bool:
        """Whether a local write to any followed file wakes it: every directory it needs has a
        watch and no file's watch failed for a reason other than the file not existing yet
        (``False`` while notification is unavailable for it)."""
        return self.notifier._watching(self)

    def close(self) -> None:
        """Stop following; watches no other subscription needs are removed."""
        self.notifier._update(self, frozenset(), frozenset(), closing=True)


class Notifier:
    """A process's file-change notifier. Use :func:`get_notifier`; tests build their own.

    Args:
        backend_factory: returns a new inotify instance (see :func:`_default_backend`), or
            ``None`` where there is none. It may raise ``OSError`` (``EMFILE``: no inotify
            instance left), and its ``add_watch`` may (``ENOSPC``: no watch left; ``ENOENT``;
            ``EACCES``). Such errors are kept in :attr:`failures`, never raised.
        clock: monotonic seconds, for the retry delays.
        debounce_s: seconds from the first event of a burst to reading it (at most 0.05).

    Attributes:
        failures: ``{path: OSError}`` for watches that could not be added or were lost (``""``:
            the backend itself could not start), until a retry succeeds.
        reads: bursts read from the kernel so far.
    """

    def __init__(self, backend_factory: Callable[[], object] | None = None,
                 clock: Callable[[], float] = time.monotonic, debounce_s: float = DEBOUNCE_S):
        self._factory = backend_factory or _default_backend
        self._clock = clock
        self.debounce_s = min(max(debounce_s, 0.0), 0.05)
        self._lock = threading.Lock()
        self._ino = None
        self._thread: threading.Thread | None = None
        self._stop_w: int | None = None  # write end of the pipe that stops the reader thread
        self._no_backend = False
        self._holders: dict[str, set[Subscription]] = {}  # watched path -> subscriptions needing it
        self._is_dir: dict[str, bool] = {}
        self._wds: dict[str, int] = {}  # path -> its armed watch descriptor (read without the lock)
        self._paths_by_wd: dict[int, set[str]] = {}
        self.failures: dict[str, OSError] = {}
        self._failed_at: dict[str, float] = {}
        self._subs: set[Subscription] = set()
        self.reads = 0
        # read by the reader thread without the lock; replaced whole under it
        self._routes: dict[str, tuple[Subscription, ...]] = {}

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
            return {p: len(self._holders[p]) for p in self._wds if self._is_dir.get(p)}

    @property
    def armed(self) -> set[str]:
        """Followed files whose one-shot watch is armed (it has not fired since it was re-armed)."""
        with self._lock:
            return {p for p in self._wds if not self._is_dir.get(p)}

    @property
    def running(self) -> bool:
        """Whether the inotify instance and its thread exist (they go with the last watch)."""
        return self._ino is not None

    def _watching(self, sub: Subscription) -> bool:
        with self._lock:
            needs = sub.needs
            return (bool(needs) and all(d in self._wds for d in needs)
                    and not any(f in self.failures and not isinstance(self.failures[f], FileNotFoundError)
                                for f in sub.files))

    def _update(self, sub: Subscription, files: frozenset, dirs: frozenset, closing: bool = False) -> None:
        stop = None
        with self._lock:
            if sub.closed:
                return
            old = sub.files | sub.needs
            sub.files, sub.dirs = files, dirs
            sub.needs = frozenset(os.path.dirname(f) for f in files) | dirs
            new = files | sub.needs
            for p in old - new:
                holders = self._holders.get(p)
                if holders is not None:
                    holders.discard(sub)
                    if not holders:
                        del self._holders[p]
                        self._release(p)
            for p in new:
                self._holders.setdefault(p, set()).add(sub)
                self._is_dir[p] = p not in files
            if closing:
                sub.closed = True
                self._subs.discard(sub)
            for p in new:
                if p not in self._wds:  # a directory's watch lasts; a file's, until it fires
                    self._arm(p, is_dir=p not in files)
            self._routes = {p: tuple(h) for p, h in self._holders.items()}
            if not self._holders and self._ino is not None:
                stop = self._detach()
        if stop is not None:
            stop()

    # -- watches (the lock is held) -----------------------------------------------------------

    def _due(self, key: str) -> bool:
        t = self._failed_at.get(key)
        if t is None or self._clock() - t >= RETRY_S:
            return True
        # missing: tried again as soon as it exists (a file: at once, its directory's watch
        # reports it when it appears)
        exc = self.failures.get(key)
        return key != "" and isinstance(exc, FileNotFoundError) and (not self._is_dir.get(key) or os.path.isdir(key))

    def _fail(self, key: str, exc: OSError) -> None:
        self.failures[key] = exc
        self._failed_at[key] = self._clock()

    def _ok(self, key: str) -> None:
        self.failures.pop(key, None)
        self._failed_at.pop(key, None)

    def _arm(self, p: str, is_dir: bool) -> None:
        if not self._due(p):
            return
        ino = self._attach()
        if ino is None:
            return
        try:
            wd = ino.add_watch(p, DIR_MASK if is_dir else FILE_MASK)
        except OSError as exc:  # ENOENT (not there yet), ENOSPC (no inotify watch left), EACCES
            self._fail(p, exc)
            old = self._wds.get(p)
            if old is not None:
                self._forget(p, old)
            return
        self._ok(p)
        old = self._wds.get(p)
        if old is not None and old != wd:  # the old watch fired, or followed a replaced file
            self._forget(p, old)
        self._wds[p] = wd
        self._paths_by_wd.setdefault(wd, set()).add(p)

    def _forget(self, p: str, wd: int) -> None:
        if self._wds.get(p) == wd:
            del self._wds[p]
        paths = self._paths_by_wd.get(wd)
        if paths is not None:
            paths.discard(p)
            if not paths:
                del self._paths_by_wd[wd]

    def _release(self, p: str) -> None:
        self._ok(p)
        self._is_dir.pop(p, None)
        wd = self._wds.get(p)
        if wd is None:
            return
        self._forget(p, wd)
        # two spellings of one file or directory (a link) share the kernel's watch
        if wd not in self._paths_by_wd and self._ino is not None:
            try:
                self._ino.rm_watch(wd)
            except OSError:  # EINVAL: it fired (one-shot) or its file went meanwhile
                pass

    def _attach(self):
        """The inotify instance, made (with its reader thread) on first need."""
        if self._ino is None and not self._no_backend and self._due(""):
            try:
                ino = self._factory()
            except OSError as exc:  # EMFILE: no inotify instance left for this user
                self._fail("", exc)
                return None
            self._ok("")
            if ino is None:  # no inotify on this platform: never retry
                self._no_backend = True
                return None
            stop_r, self._stop_w = os.pipe()
            self._ino = ino
            self._thread = threading.Thread(target=self._reader, args=(ino, stop_r), name="tune_magic-notify",
                                            daemon=True)
            self._thread.start()
        return self._ino

    def _detach(self) -> Callable[[], None]:
        """Forget the inotify instance; return what stops its thread (to call without the lock:
        the thread closes the instance itself once it is out of ``poll``)."""
        thread, stop_w = self._thread, self._stop_w
        self._ino = self._thread = self._stop_w = None
        self._wds.clear()
        self._paths_by_wd.clear()

        def stop() -> None:
            try:
                os.write(stop_w, b"x")
            finally:
                os.close(stop_w)
            if thread is not threading.current_thread():
                thread.join(2.0)

        return stop

    def close(self) -> None:
        """Close every subscription and stop the reader thread."""
        for sub in list(self._subs):
            sub.close()
        with self._lock:
            stop = self._detach() if self._ino is not None else None
        if stop is not None:
            stop()

    # -- events -------------------------------------------------------------------------------

    def _reader(self, ino, stop_r: int) -> None:
        poller = select.poll()
        poller.register(ino.fileno(), select.POLLIN)
        poller.register(stop_r, select.POLLIN)
        try:
            while True:
                if any(fd == stop_r for fd, _ in poller.poll()):
                    return
                time.sleep(self.debounce_s)  # let the rest of the burst land
                events = ino.read(timeout=0)
                self.reads += 1
                self._dispatch_events(events)
        except Exception:  # closed under us, or a failure of the backend: the followers poll on
            return
        finally:
            os.close(stop_r)
            try:
                ino.close()
            except OSError:
                pass

    def _dispatch_events(self, events) -> None:
        paths: set[str] = set()
        overflow = False
        with self._lock:
            for wd, mask, _cookie, name in events:
                if mask & IN_Q_OVERFLOW:  # the kernel dropped events: anyone may have missed one
                    overflow = True
                    continue
                for p in list(self._paths_by_wd.get(wd, ())):
                    if self._is_dir.get(p):
                        if mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                            self._forget(p, wd)  # gone (or renamed): added again when it exists
                            self._fail(p, FileNotFoundError(errno.ENOENT, "watched directory went", p))
                    else:
                        self._forget(p, wd)  # one-shot: fired (IN_IGNORED follows)
                    if not mask & IN_IGNORED:
                        paths.add(os.path.join(p, name) if name else p)
        if overflow:
            self.wake_all()
        elif paths:
            self.dispatch(*paths)

    def dispatch(self, *paths: str | bytes) -> int:
        """Wake, once each, the subscriptions that follow one of ``paths`` (a file, or a name in
        a followed directory). Called by the reader thread for each burst; public so that tests
        (or another backend) can feed events.

        Returns:
            How many subscriptions were woken.
        """
        routes = self._routes
        woken = set()
        for p in paths:
            p = os.fsdecode(p)
            hit = set(routes.get(p, ()))  # a followed file, or a followed directory itself
            parent = os.path.dirname(p)
            hit.update(sub for sub in routes.get(parent, ()) if p in sub.files or parent in sub.dirs)
            for sub in hit:
                sub._woken_by.add(p)
            woken |= hit
        for sub in woken:
            sub.wakes += 1
            sub.wake()
        return len(woken)

    def wake_all(self) -> int:
        """Wake every subscription (the kernel's event queue overflowed). Returns how many."""
        subs = {s for holders in self._routes.values() for s in holders}
        for sub in subs:
            sub.wakes += 1
            sub.wake()
        return len(subs)


_NOTIFIER: Notifier | None = None
_NOTIFIER_LOCK = threading.Lock()


def get_notifier() -> Notifier:
    """Return this process's notifier, made on first use. Its inotify instance and thread start
    with the first watch and stop when the last one is released."""
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
