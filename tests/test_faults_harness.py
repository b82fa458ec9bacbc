"""The fault-injection harness itself (tests/faults.py): each fault is real, and nothing leaks."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

import faults


@pytest.fixture
def shared_dir():
    """A root-owned 0755 directory outside pytest's 0700 tmp tree, so uid 65534 can reach it."""
    d = Path(tempfile.mkdtemp(prefix="tune_magic_faults_"))
    d.chmod(0o755)
    (d / "kept.txt").write_text("kept\n")
    yield d
    shutil.rmtree(d)


def test_readonly_directory_refuses_writes_in_the_child_only(shared_dir):
    faults.require()
    before = faults.mount_lines_mentioning(shared_dir)
    with faults.MountNamespace(readonly=[shared_dir]) as ns:
        r = ns.python("import sys; print(open(sys.argv[1] + '/kept.txt').read().strip()); "
                      "open(sys.argv[1] + '/new.txt', 'w')".replace("sys.argv[1]", repr(str(shared_dir))))
        assert r.stdout.strip() == "kept"  # reading works
        assert r.returncode == 1 and "OSError: [Errno 30] Read-only file system" in r.stderr
        assert faults.mount_lines_mentioning(shared_dir) == before  # our own mount table never changed
        (shared_dir / "host.txt").write_text("x")  # the host still writes there
    assert not (shared_dir / "new.txt").exists()
    assert faults.mount_lines_mentioning(shared_dir) == before


def test_tiny_disk_holds_a_copy_and_fills_on_demand(shared_dir):
    faults.require()
    with faults.MountNamespace(tmpfs={shared_dir: 2048}) as ns:
        snippet = (f"import os; d = {str(shared_dir)!r}; st = os.statvfs(d); "
                   "print(st.f_blocks * st.f_frsize, open(d + '/kept.txt').read().strip(), oct(os.stat(d).st_mode & 0o777))")
        size, kept, mode = ns.python(snippet).stdout.split()
        assert int(size) == 2048 * 1024 and kept == "kept" and mode == "0o755"
        written = ns.fill(shared_dir, leave_bytes=8192)
        assert 1_500_000 < written <= 2048 * 1024
        small = ns.python(f"open({str(shared_dir)!r} + '/small', 'wb').write(b'x' * 4096)")
        assert small.returncode == 0, small.stderr  # the space left is usable...
        assert ns.fill(shared_dir) >= written  # ...until the disk is filled again
        full = ns.python(f"f = open({str(shared_dir)!r} + '/more', 'wb'); f.write(b'x' * 65536); f.flush()")
        assert full.returncode == 1 and "No space left on device" in full.stderr
    # the host's directory never saw any of it
    assert sorted(p.name for p in shared_dir.iterdir()) == ["kept.txt"]


def test_fill_refuses_a_directory_that_is_not_a_tiny_disk(shared_dir):
    faults.require()
    with faults.MountNamespace(readonly=[shared_dir]) as ns:
        with pytest.raises(faults.FaultSetupError, match="not a tiny disk"):
            ns.fill(tempfile.gettempdir())


def test_as_nobody_runs_with_uid_65534_and_cannot_write_roots_directory(shared_dir):
    faults.require(as_nobody=True)
    r = faults.run_as_nobody(faults.python(
        f"import os; print(os.getuid(), os.getgid()); open({str(shared_dir)!r} + '/x', 'w')"))
    assert r.stdout.split() == ["65534", "65534"]
    assert r.returncode == 1 and "PermissionError" in r.stderr
    assert not (shared_dir / "x").exists()


def test_one_shot_forms_return_code_stdout_stderr(shared_dir):
    faults.require(as_nobody=True)
    r = faults.run_readonly(shared_dir, ["sh", "-c", "echo out; echo err >&2; touch kept.txt; exit 3"], cwd=shared_dir)
    assert (r.returncode, r.stdout, r.stderr.splitlines()) == (
        3, "out\n", ["err", "touch: cannot touch 'kept.txt': Read-only file system"])
    r = faults.run_tiny_disk(shared_dir, ["sh", "-c", "head -c 65536 /dev/zero > y"], cwd=shared_dir, fill=True)
    assert r.returncode != 0 and "No space left on device" in r.stderr
    with faults.MountNamespace(readonly=[shared_dir]) as ns:
        r = ns.run(["id", "-u"], as_nobody=True)
        assert r.stdout.strip() == "65534"


def test_close_kills_what_still_runs_inside_and_leaves_no_mount(shared_dir):
    faults.require()
    before = faults.mount_lines_mentioning(shared_dir)
    ns = faults.MountNamespace(readonly=[shared_dir])
    sleeper = ns.popen(["sleep", "300"])
    # a grandchild in its own session: still found, because it lives in the namespace
    detached = ns.run(["sh", "-c", "setsid sleep 301 >/dev/null 2>&1 & echo $!"])
    orphan = int(detached.stdout)
    assert {sleeper.pid, orphan} <= set(ns.pids())
    holder = ns.holder.pid
    ns.close()
    assert sleeper.poll() is not None
    for pid in (orphan, holder):
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert faults.mount_lines_mentioning(shared_dir) == before


def test_require_skips_and_fails_by_the_environment():
    with pytest.raises(pytest.skip.Exception, match="no mounts here .*TUNE_MAGIC_REQUIRE_FAULTS=1"):
        faults.require(reason="no mounts here", env={})
    with pytest.raises(pytest.fail.Exception, match="no mounts here; TUNE_MAGIC_REQUIRE_FAULTS=1 requires"):
        faults.require(reason="no mounts here", env={"TUNE_MAGIC_REQUIRE_FAULTS": "1"})


def test_ci_requires_the_fault_tests():
    ci = (Path(__file__).parents[1] / ".ci" / "run").read_text()
    assert "export TUNE_MAGIC_REQUIRE_FAULTS=1" in ci
