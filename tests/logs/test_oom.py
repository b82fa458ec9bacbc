"""tune_magic.logs.oom without a real OOM kill (the real one is tests/e2e/test_oom_killer.py).

The cgroup files here are written in the kernel's documented formats (Documentation/admin-guide/
cgroup-v2.rst ``memory.events``; cgroup-v1/memory.rst ``memory.oom_control``)."""

from __future__ import annotations

import os

from tune_magic.logs.oom import OomEvidence, OomWatch, cgroup_dirs, read_kernel_log, read_oom_kill_count

V2_EVENTS = "low 0\nhigh 0\nmax 12\noom 3\noom_kill {n}\noom_group_kill 0\n"
V1_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"


def test_v2_memory_events_counts_the_subtree(tmp_path):
    (tmp_path / "memory.events").write_text(V2_EVENTS.format(n=2))
    (tmp_path / "child").mkdir()
    (tmp_path / "child" / "memory.events").write_text(V2_EVENTS.format(n=2))
    assert read_oom_kill_count(tmp_path) == 2  # v2 already counts the child's kills


def test_v1_oom_control_is_summed_over_the_subtree(tmp_path):
    (tmp_path / "memory.oom_control").write_text(V1_CONTROL.format(n=1))
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "memory.oom_control").write_text(V1_CONTROL.format(n=2))
    assert read_oom_kill_count(tmp_path) == 3
    assert read_oom_kill_count(tmp_path / "missing") is None


def test_watch_counts_a_rise_once_and_reads_no_kernel_log_without_one(tmp_path):
    cg = tmp_path / "job"
    (cg / "rank1").mkdir(parents=True)
    (cg / "memory.events").write_text(V2_EVENTS.format(n=0))
    watch = OomWatch([cg, cg / "rank1"], kmsg_path=str(tmp_path / "no-kmsg"))
    assert watch.cgroups == [cg] and watch.kmsg_seq is None
    (cg / "memory.events").write_text(V2_EVENTS.format(n=1))
    ev = watch.killed([123])
    assert (ev.cgroup_kills, ev.cgroup_read, ev.kernel_log_read, ev.pids) == (1, True, False, frozenset())
    # no kernel log to name the victim: a SIGKILLed rank of the job counts as OOM-killed
    assert ev.killed(123) and ev.where(123) == "its memory cgroup reached its limit"


def test_evidence_rules():
    named = OomEvidence(pids=frozenset({7}), kernel_log_read=True)
    assert named.killed(7) and not named.killed(8) and named.where(7) == "the machine ran out of memory"
    quiet = OomEvidence(cgroup_kills=0, cgroup_read=True, kernel_log_read=True)
    assert not quiet.killed(7)


def test_this_machine_has_cgroups_and_maybe_a_kernel_log():
    # real /proc and /sys here: this process sits in at least one memory cgroup we can read
    dirs = cgroup_dirs(os.getpid())
    assert dirs and all(read_oom_kill_count(d) is not None for d in dirs)
    got = read_kernel_log()
    if got is not None:  # root in this container may read /dev/kmsg
        last, lines = got
        assert last >= 0 and lines
        # only records after `last` come back: at most the few written since
        assert len(read_kernel_log(last)[1]) < len(lines)
