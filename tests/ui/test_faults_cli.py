"""The CLI on a read-only, full or foreign TUNE_MAGIC_HOME: one paragraph, exit 2, no traceback.

Real faults from tests/faults.py (a read-only bind mount, a filled 2 MiB tmpfs, uid 65534), each in
a child process of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import faults

CLI = [sys.executable, "-m", "tune_magic"]


@pytest.fixture
def home():
    """An empty TUNE_MAGIC_HOME, root-owned 0755 outside pytest's 0700 tmp tree (uid 65534 can reach it)."""
    d = Path(tempfile.mkdtemp(prefix="tune_magic_faults_home_"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def env_for(home: Path) -> dict[str, str]:
    return {**os.environ, "TUNE_MAGIC_HOME": str(home)}


def assert_one_paragraph(r: faults.ChildResult, *words: str) -> None:
    assert r.returncode == 2, r
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("tune-magic assets: error: ")
    for word in words:
        assert word in lines[0]


def test_assets_on_a_read_only_home_is_one_paragraph(home):
    faults.require()
    r = faults.run_readonly(home, [*CLI, "assets"], env=env_for(home))
    assert_one_paragraph(r, f"cannot write the assets to {home}/assets", "Read-only file system (EROFS)",
                         "tune-magic assets DIR", "TUNE_MAGIC_HOME")


def test_assets_already_built_are_found_on_a_read_only_home(home):
    """Reading never needs a write: built assets are reported, exit 0."""
    faults.require()
    from tune_magic.assets import make_assets

    make_assets(home / "assets")
    r = faults.run_readonly(home, [*CLI, "assets"], env=env_for(home))
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{home}/assets\n", "")


def test_assets_on_a_full_disk_is_one_paragraph_and_leaves_nothing(home):
    faults.require()
    with faults.MountNamespace(tmpfs={home: 2048}) as ns:
        ns.fill(home)
        r = ns.run([*CLI, "assets"], env=env_for(home))
        assert_one_paragraph(r, "No space left on device (ENOSPC)")
        left = ns.run(["ls", "-A", str(home)]).stdout.split()
        assert sorted(left) == [".assets.lock", faults.FILL_NAME] or sorted(left) == [faults.FILL_NAME]


def test_assets_in_a_directory_of_root_as_uid_65534_is_one_paragraph(home):
    faults.require(as_nobody=True)
    r = faults.run_as_nobody([*CLI, "assets"], env={**env_for(home), "HOME": "/nonexistent"}, cwd="/")
    assert_one_paragraph(r, "Permission denied (EACCES)", str(home))


def test_assets_refuses_a_foreign_directory_in_one_paragraph(home):
    """Not a fault, the same paragraph rule: a non-empty directory without our manifest is never replaced."""
    (home / "mine").mkdir()
    (home / "mine" / "thesis.tex").write_text("keep me")
    r = subprocess.run([*CLI, "assets", str(home / "mine")], capture_output=True, text=True, timeout=120)
    assert_one_paragraph(faults.ChildResult(r.returncode, r.stdout, r.stderr), "refusing to replace", "tune-magic assets DIR")
    assert (home / "mine" / "thesis.tex").read_text() == "keep me"
