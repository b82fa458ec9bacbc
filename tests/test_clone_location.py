"""The tests pass wherever the clone lives, /tmp included: a clone under /tmp has its venv there,
and the SLURM scheduler rightly warns that the Python every node runs is on a node's own disk
(tune_magic/schedulers/slurm/nodelocal.py). Tests that compare a SLURM plan's warnings must allow
that one warning for their own interpreter (jobhelpers.own_python_warnings), not assume the clone
lives elsewhere. Here the tests that count those warnings run under an interpreter that lives under
/tmp: a venv made there whose site-packages are this run's own (real packages, nothing faked)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Every test that compares a multi-node SLURM plan's warnings (each failed from a clone under /tmp).
WARNING_TESTS = ["tests/schedulers/slurm/test_slurm_nodelocal.py",
                 "tests/ui/test_panel_unit.py::test_FAKE_sbatch_slurm_fields_preview_sbatch_line_and_script"]


def _venv_under_tmp(root: Path) -> Path:
    """A venv under ``root`` (in /tmp) that runs this interpreter's base Python with this run's
    site-packages: ``sys.executable`` is then under /tmp, as for a clone and its venv there."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests do not run in a virtualenv: no site-packages to lend a venv under /tmp")
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / site.relative_to(sys.prefix)).parent.mkdir(parents=True)
    (venv / site.relative_to(sys.prefix)).symlink_to(site)
    (venv / "pyvenv.cfg").write_text((Path(sys.prefix) / "pyvenv.cfg").read_text())
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    return venv / "bin" / "python"


def test_the_slurm_warning_tests_pass_with_the_venv_under_tmp():
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="tm-clone-") as root:
        python = _venv_under_tmp(Path(root))
        probe = subprocess.run([str(python), "-c", "import sys, tune_magic; print(sys.executable)"],
                               capture_output=True, text=True, timeout=120, cwd=REPO,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
        assert probe.returncode == 0, probe.stderr
        assert probe.stdout.strip() == str(python) and str(python).startswith("/tmp/")
        env = {k: v for k, v in os.environ.items() if k not in ("TUNE_MAGIC_HOME", "PYTEST_ADDOPTS")}
        r = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *WARNING_TESTS],
                           capture_output=True, text=True, timeout=600, cwd=REPO,
                           env={**env, "PYTHONPATH": str(REPO)})
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
        assert " passed" in r.stdout and "failed" not in r.stdout
