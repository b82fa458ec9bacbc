"""Run the last release (tests/data/legacy) and upgrade it in place (not a test module)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEGACY_ZIP = REPO / "tests" / "data" / "legacy" / "tune_magic-0.1.0.zip"


def install_legacy(site: Path) -> Path:
    """Extract release 0.1.0 into ``site`` (a folder for PYTHONPATH); return it."""
    site.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(LEGACY_ZIP) as z:
        z.extractall(site)
    return site


def upgrade_in_place(site: Path) -> None:
    """Replace the release in ``site`` with today's package, as an upgrade does: files change under
    running processes, which keep the modules they had imported."""
    shutil.rmtree(site / "tune_magic")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "tune_magic", site / "tune_magic", ignore=ignore)
    shutil.copytree(REPO / "recipes", site / "tune_magic" / "recipes", ignore=ignore)


def legacy_env(site: Path, env: dict | None = None) -> dict[str, str]:
    """An environment whose Python imports ``tune_magic`` from ``site`` first."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env.pop("TUNE_MAGIC_SCHEDULER", None)
    return env


def legacy_cli(site: Path, *args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """``python -m tune_magic ARGS`` with ``site``'s package (the release, or after the upgrade)."""
    return subprocess.run([sys.executable, "-m", "tune_magic", *args], capture_output=True, text=True,
                          env=legacy_env(site, env), timeout=timeout, cwd=str(site))
