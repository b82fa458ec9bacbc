"""The OOM killer, for real: a rank moves itself into a small memory cgroup and allocates past it.

Needs root and a writable memory cgroup (v2 with the memory controller, or the v1 ``memory``
hierarchy); skipped with the reason otherwise. The fixture removes exactly the cgroup it made.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tune_magic.logs.failure import Evidence, describe_failure
from tune_magic.logs.reports import parse_reports
from tune_magic.logs.oom import OomWatch, cgroup_dirs, read_oom_kill_count

DATA = Path(__file__).resolve().parents[1] / "data"
LIMIT = 64 << 20  # bytes


def _parent_cgroup() -> tuple[Path, str]:
    """A memory cgroup directory we may create a child in, and its version ("v1"/"v2")."""
    for d in cgroup_dirs(os.getpid()):
        if (d / "memory.oom_control").is_file():
            return d, "v1"
        # cgroup v2: a child gets the memory controller only if the parent delegates it
        try:
            if "memory" in (d / "cgroup.subtree_control").read_text().split():
                return d, "v2"
        except OSError:
            pass
    raise LookupError("no memory cgroup of this process delegates the memory controller")


@pytest.fixture
def small_memory_cgroup():
    if os.geteuid() != 0:
        pytest.skip("needs root to create a memory cgroup")
    try:
        parent, version = _parent_cgroup()
    except LookupError as exc:
        pytest.skip(f"cgroups not usable here: {exc}")
    cg = parent / f"tune-magic-oom-test-{os.getpid()}"
    try:
        cg.mkdir()
    except OSError as exc:
        pytest.skip(f"cgroups not writable here: cannot create {cg}: {exc}")
    try:
        try:
            if version == "v1":
                (cg / "memory.limit_in_bytes").write_text(str(LIMIT))
                if (cg / "memory.memsw.limit_in_bytes").exists():
                    (cg / "memory.memsw.limit_in_bytes").write_text(str(LIMIT))
            else:
                (cg / "memory.max").write_text(str(LIMIT))
                if (cg / "memory.swap.max").exists():
                    (cg / "memory.swap.max").write_text("0")
        except OSError as exc:
            pytest.skip(f"cannot set a memory limit on {cg}: {exc}")
        yield cg
    finally:
        # only processes this test started can be in it; end them so the directory can go
        try:
            for pid in (cg / "cgroup.procs").read_text().split():
                os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        cg.rmdir()


def test_rank_killed_by_the_oom_killer_with_evidence(small_memory_cgroup, tmp_path):
    cg = small_memory_cgroup
    before = read_oom_kill_count(cg)
    watch = OomWatch.start(os.getpid(), cgroup=cg)
    log_path = tmp_path / "output.log"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(DATA / "capture_worker.py"), "oom", "rank=1", f"cgroup={cg}", "mib=512"]
    with open(log_path, "wb") as out:
        code = subprocess.run(argv, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, timeout=180,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
    text = log_path.read_text()
    assert code == 1, text[-3000:]
    assert "allocated without being killed" not in text
    [killed] = [e for e in parse_reports(text) if e.rank == 1]
    assert killed.exitcode == -9 and killed.pid is not None

    evidence = watch.killed([killed.pid])
    assert evidence.killed(killed.pid)
    if before is not None:
        assert evidence.cgroup_read and evidence.cgroup_kills == 1
    if evidence.kernel_log_read:
        assert killed.pid in evidence.pids and killed.pid in evidence.cgroup_limited
        assert any(f"Killed process {killed.pid}" in line for line in evidence.lines)

    reason = describe_failure(text, evidence=Evidence(oom=evidence))
    assert (reason.line, reason.kind, reason.rank, reason.pid) == (
        "rank 1: killed by the OOM killer (its memory cgroup reached its limit; SIGKILL)", "oom_killer", 1, killed.pid)
    # without evidence, or for a job the user stopped, it is only a SIGKILL
    assert describe_failure(text).line == "rank 1: killed by SIGKILL (signal 9)"
    assert describe_failure(text, evidence=Evidence(stopped=True, oom=evidence)).line == \
        "rank 1: killed by SIGKILL (signal 9)"
    # the other rank's pid was not OOM-killed
    [other] = [e for e in parse_reports(text) if e.rank == 0]
    assert other.pid not in watch.killed([other.pid]).pids
