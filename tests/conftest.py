"""Shared test set-up: every test session gets its own TUNE_MAGIC_HOME, never the user's."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# Shared helper modules (jobhelpers) import from tests/ in every subfolder.
sys.path.insert(0, str(Path(__file__).parent))

# Set at import time so subprocesses and modules imported during collection see it too.
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="tune_magic_test_home_"))
os.environ["TUNE_MAGIC_HOME"] = str(_SESSION_HOME)


@pytest.fixture(scope="session")
def session_home() -> Path:
    """The TUNE_MAGIC_HOME shared by this test session."""
    return _SESSION_HOME
