"""File-change notification: the process's notifier (tune_magic.logs.notify) and the watcher that waits
on "notified or interval elapsed" (tune_magic.ui.watch.JobWatcher).

The notifier tests use the kernel's real inotify; where a failure must be simulated (no inotify
instance or watch left, a filesystem that never notifies), the backend is a real inotify instance
whose calls raise the OSError inotify_simple raises, or a backend that never reports an event.
Jobs are "pending" records written here (a pending job is live and no process is needed); the
test writes their logs itself. Behaviour only: counts and order, never wall-clock thresholds
(waits have generous deadlines and stop as soon as the awaited thing happened).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from tune_magic.registry import store as jobstore

from tune_magic.logs import notify
from tune_magic.job import Job
from tune_magic.registry.store import JobRecord
from tune_magic.ui.watch import JobWatcher

import waiting

inotify_simple = pytest.importorskip("inotify_simple")


#: this file's waits: 10 s deadlines, polled every 10 ms (a notification is seen within milliseconds)
wait_for = partial(waiting.wait_for, timeout=10.0, interval=0.01)


def metric_line(step: int) -> str:
    """A torchtune 0.6.1 DiskLogger line (loss 10/step)."""
    return f"Step {step} | loss:{10 / step} lr:0.001 tokens_per_second_per_gpu:100.0 \n"


def pending_job(root: Path, job_id: str = "20990101-000000-notif1") -> Job:
    """A live (pending) job whose combined log names its metric file, which holds step 1."""
    d = root / "jobs" / job_id
    d.mkdir(parents=True)
    metric_dir = root / "out" / job_id / "logs"
    metric_dir.mkdir(parents=True)
    metric = metric_dir / "log_1.txt"
    metric.write_text(metric_line(1))
    log = d / jobstore.OUTPUT_LOG
    log.write_text(f"INFO:torchtune.utils._logging:Writing logs to {metric}\n")
    rec = JobRecord(id=job_id, name="n", argv=["python", "x.py"], env={}, cwd=str(root), log_path=str(log),
                    started_at=time.time() - 5, status="pending", metric_log_dir=str(metric_dir))
    jobstore.write_record(d, rec)
    return Job(d)


def following(w: JobWatcher) -> bool:
    """Whether ``w``'s first poll is over and its subscription follows the metric file it found."""
    sub, metric = w.subscription, w.follower.metrics_path
    return (w._last is not None and sub is not None and sub.watching and metric is not None
            and str(metric) in sub.files)


def append(path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


class DeafBackend:
    """An inotify backend on a filesystem that never notifies (NFS, Lustre: writes from other
    nodes): every watch is accepted, no event ever comes."""

    def __init__(self):
        self._r, self._w = os.pipe()
        self.watched: list[str] = []
        self._next = 0

    def add_watch(self, path, mask):
        self.watched.append(os.fsdecode(path))
        self._next += 1
        return self._next

    def rm_watch(self, wd):
        pass

    def read(self, timeout=None):
        return []

    def fileno(self):
        return self._r

    def close(self):
        os.close(self._r)
        os.close(self._w)


class NoWatchLeft(inotify_simple.INotify):
    """Real inotify whose inotify_add_watch fails as when fs.inotify.max_user_watches is spent
    (inotify_simple raises OSError(ENOSPC))."""

    def add_watch(self, path, mask):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def no_instance_left():
    """inotify_init1 failing as when fs.inotify.max_user_instances is spent."""
    raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))


@pytest.fixture
def notifier():
    n = notify.Notifier()
    yield n
    n.close()


# -- the notifier, on real inotify ------------------------------------------------------------


def test_a_write_to_a_followed_file_wakes_its_subscription_once_until_rearmed(tmp_path, notifier):
    log, other = tmp_path / "output.log", tmp_path / "other.txt"
    log.write_text("")
    woke = threading.Event()
    sub = notifier.subscribe(woke.set)
    sub.watch([log])
    assert sub.watching and notifier.armed == {str(log)}
    append(log, "a\n")
    wait_for(woke.is_set, what="the write to wake the subscription")
    assert sub.wakes == 1
    wait_for(lambda: notifier.armed == set(), what="the one-shot watch to be seen fired")
    woke.clear()
    append(other, "x")  # not followed: wakes nobody, and is no reason to re-arm
    append(log, "b\n")  # followed but not re-armed yet: read by the follower's next read, no event
    sub.rearm()
    append(log, "c\n")
    wait_for(woke.is_set, what="the write after the re-arm to wake the subscription")
    assert sub.wakes == 2


def test_a_followed_file_replaced_under_its_name_or_appearing_wakes(tmp_path, notifier):
    record, metric_dir = tmp_path / "record.json", tmp_path / "logs"
    record.write_text("{}")
    woke = threading.Event()
    sub = notifier.subscribe(woke.set)
    sub.watch([record], [metric_dir])  # the metric directory does not exist yet
    assert isinstance(notifier.failures[str(metric_dir)], FileNotFoundError)
    assert not sub.watching  # a needed directory has no watch: the follower must poll on its own
    tmp = tmp_path / ".record.json.tmp"
    tmp.write_text('{"status": "failed"}')
    os.replace(tmp, record)  # how jobstore writes records
    wait_for(woke.is_set, what="the replacement to wake the subscription")
    woke.clear()
    metric_dir.mkdir()
    sub.rearm()  # a missing directory is watched as soon as it exists
    assert sub.watching and str(metric_dir) in notifier.watches
    (metric_dir / "log_1.txt").write_text(metric_line(1))
    wait_for(woke.is_set, what="a file appearing in a followed directory to wake the subscription")


def test_subscriptions_on_one_directory_share_its_watch_until_the_last_leaves(tmp_path, notifier):
    log = tmp_path / "output.log"
    log.write_text("")
    subs = [notifier.subscribe(lambda: None) for _ in range(3)]
    for s in subs:
        s.watch([log])
    assert notifier.watches == {str(tmp_path): 3}
    subs[0].close()
    subs[1].close()
    assert notifier.watches == {str(tmp_path): 1} and notifier.running
    subs[2].close()
    assert notifier.watches == {} and not notifier.running and notifier.subscriptions == 0


def test_one_burst_of_writes_wakes_each_follower_once_and_overflow_wakes_all(tmp_path, notifier):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("")
    b.write_text("")
    counts = {"a": 0, "b": 0}
    sa = notifier.subscribe(lambda: counts.__setitem__("a", counts["a"] + 1))
    sb = notifier.subscribe(lambda: counts.__setitem__("b", counts["b"] + 1))
    sa.watch([a])
    sb.watch([b])
    with open(a, "a") as f:
        for i in range(200):  # a progress redraw and log lines, as one burst
            f.write(f"line {i}\n")
            f.flush()
    wait_for(lambda: counts["a"] == 1, what="the burst to wake a's follower")
    time.sleep(3 * notifier.debounce_s)
    assert counts == {"a": 1, "b": 0}
    assert notifier.wake_all() == 2 and counts == {"a": 2, "b": 1}


def test_a_watched_directory_deleted_and_made_again_is_watched_again(tmp_path, notifier):
    d = tmp_path / "logs"
    d.mkdir()
    sub = notifier.subscribe(lambda: None)
    sub.watch([], [d])
    assert sub.watching
    d.rmdir()
    wait_for(lambda: str(d) in notifier.failures, what="the deletion to be seen")
    assert not sub.watching
    d.mkdir()
    sub.rearm()
    assert sub.watching and notifier.watches == {str(d): 1}


def test_get_notifier_is_one_per_process():
    assert notify.get_notifier() is notify.get_notifier()


# -- running out of inotify: silent fallback ---------------------------------------------------


def test_no_inotify_instance_left_leaves_subscriptions_unwatched_without_error(tmp_path):
    n = notify.Notifier(no_instance_left)
    sub = n.subscribe(lambda: None)
    sub.watch([tmp_path / "output.log"])
    assert not sub.watching and not n.running
    assert n.failures[""].errno == errno.EMFILE
    n.close()


def test_no_inotify_watch_left_leaves_subscriptions_unwatched_without_error(tmp_path):
    n = notify.Notifier(NoWatchLeft)
    sub = n.subscribe(lambda: None)
    sub.watch([tmp_path / "output.log"], [tmp_path / "logs"])
    assert not sub.watching
    assert {e.errno for e in n.failures.values()} == {errno.ENOSPC}
    n.close()


def test_a_missing_watch_is_tried_again_after_the_retry_delay(tmp_path):
    now = [0.0]
    failing = [True]

    class Flaky(inotify_simple.INotify):
        def add_watch(self, path, mask):
            if failing[0]:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().add_watch(path, mask)

    n = notify.Notifier(Flaky, clock=lambda: now[0])
    sub = n.subscribe(lambda: None)
    (tmp_path / "output.log").write_text("")
    sub.watch([tmp_path / "output.log"])
    assert not sub.watching
    failing[0] = False  # watches were freed meanwhile
    sub.rearm()
    assert not sub.watching  # not before RETRY_S
    now[0] += notify.RETRY_S
    sub.rearm()
    assert sub.watching
    n.close()


# -- the watcher: "notified or interval elapsed" -----------------------------------------------


def test_a_card_keeps_updating_with_a_notifier_that_never_fires(tmp_path):
    n = notify.Notifier(DeafBackend)
    job = pending_job(tmp_path)
    snaps = []
    w = JobWatcher(job, snaps.append, notifier=n).start()
    try:
        wait_for(lambda: snaps and snaps[-1].step == 1, what="the first snapshot")
        assert w.subscription.watching and w.trusting_notifications
        metric = w.follower.metrics_path
        for step in (2, 3):
            polls = w.polls
            append(metric, metric_line(step))
            wait_for(lambda: snaps[-1].step == step, what=f"step {step} on the card without a notification")
            assert w.polls > polls
        # both writes came without a notification: this filesystem does not notify, so the
        # watcher went back to the polling schedule
        assert w.woken == 0 and w.missed >= JobWatcher.BLIND_AFTER
        assert not w.trusting_notifications
        assert [s.loss for s in snaps if s.step == 3][0] == pytest.approx(10 / 3)
    finally:
        w.stop()
        n.close()


def test_a_notification_wakes_the_watcher_before_its_interval(tmp_path):
    n = notify.Notifier(DeafBackend)  # events are fed by hand through dispatch()
    job = pending_job(tmp_path)
    snaps = []
    # an interval no test waits for: only a notification can bring the second poll
    w = JobWatcher(job, snaps.append, notifier=n, interval_s=0.05, max_interval_s=3600).start()
    try:
        wait_for(lambda: following(w), what="the first poll")
        assert w.polls == 1
        append(w.follower.metrics_path, metric_line(2))
        assert n.dispatch(str(w.follower.metrics_path)) == 1
        wait_for(lambda: w.polls == 2, what="the notified poll")
        assert w.woken == 1 and snaps[-1].step == 2
        # a write to a file the watcher does not follow wakes nobody
        assert n.dispatch(str(Path(job.log_path).with_name("supervisor.log"))) == 0
    finally:
        w.stop()
        n.close()


def test_watchers_share_the_process_notifier_and_release_their_watches_on_stop(tmp_path):
    from tune_magic.ui.cards import JobCard

    job, other = pending_job(tmp_path), pending_job(tmp_path, "20990101-000000-notif2")
    shared = notify.get_notifier()
    cards = [JobCard(job), JobCard(job), JobCard(other)]
    try:
        wait_for(lambda: all(following(c.watcher) for c in cards), what="the cards to follow their metric files")
        assert all(c.watcher.subscription.notifier is shared for c in cards)
        metric_dir = str(Path(cards[0].watcher.follower.metrics_path).parent)
        watches = shared.watches
        assert watches[str(job.dir)] == 2 and watches[metric_dir] == 2 and watches[str(other.dir)] == 1
        cards[0].close()
        assert shared.watches[str(job.dir)] == 1 and cards[0].watcher.subscription.closed
        cards[1].close()
        watches = shared.watches
        assert str(job.dir) not in watches and metric_dir not in watches and watches[str(other.dir)] == 1
    finally:
        for c in cards:
            c.close()
    assert str(other.dir) not in shared.watches


def test_exhausted_inotify_falls_back_to_the_polling_schedule_silently(tmp_path):
    for factory in (no_instance_left, NoWatchLeft):
        n = notify.Notifier(factory)
        job = pending_job(tmp_path / factory.__name__)
        snaps = []
        w = JobWatcher(job, snaps.append, notifier=n).start()
        try:
            wait_for(lambda: snaps and snaps[-1].step == 1, what="the first snapshot")
            assert not w.trusting_notifications
            append(w.follower.metrics_path, metric_line(2))
            wait_for(lambda: snaps[-1].step == 2, what="step 2 by polling")
            assert w.woken == 0 and w._thread.is_alive()
        finally:
            w.stop()
            n.close()


def test_a_notified_poll_that_finds_nothing_changed_reads_nothing(tmp_path):
    job = pending_job(tmp_path)
    w = JobWatcher(job, notify=True)
    w.poll_once()  # finds the metric file named in the log
    first = w.poll_once()  # reads it
    calls = []
    real = w.follower.poll
    w.follower.poll = lambda: calls.append(1) or real()
    again = w.poll_once()
    assert calls == [] and not w.changed and not w.files_changed
    assert (again.step, again.loss, again.tail) == (first.step, first.loss, first.tail)
    append(w.follower.metrics_path, metric_line(2))
    assert w.poll_once().step == 2 and calls == [1] and w.changed
    # today's polling card reads on every poll
    old = JobWatcher(job, notify=False)
    old.poll_once()
    old_calls = []
    real_old = old.follower.poll
    old.follower.poll = lambda: old_calls.append(1) or real_old()
    old.poll_once()
    assert old_calls == [1] and old.subscription is None


def test_a_replaced_record_is_shown_without_waiting_for_the_poll_spacing(tmp_path):
    n = notify.Notifier(DeafBackend)
    job = pending_job(tmp_path)
    snaps = []
    # woken polls are spaced interval_s apart: a log write now would wait an hour
    w = JobWatcher(job, snaps.append, notifier=n, interval_s=3600, max_interval_s=3600).start()
    try:
        wait_for(lambda: following(w), what="the first poll")
        assert w.polls == 1
        jobstore.update(job.dir, status="stopped", ended_at=time.time(), returncode=-15)
        assert n.dispatch(os.path.join(job.dir, jobstore.RECORD)) == 1
        wait_for(lambda: w.polls == 2, what="the poll the record change brings")
        assert snaps[-1].status == "stopped" and w.finished
    finally:
        w.stop()
        n.close()
