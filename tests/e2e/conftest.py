"""Fixtures for end-to-end tests: tiny assets, a FAKE GPU count, and cleanup of leftover jobs."""

from __future__ import annotations

import os

import pytest

from jobhelpers import write_fake_nvidia_smi


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """Put a FAKE nvidia-smi listing 4 GPUs first on PATH (this machine has no GPU)."""
    write_fake_nvidia_smi(tmp_path / "fakebin", 4)
    monkeypatch.setenv("PATH", f"{tmp_path / 'fakebin'}{os.pathsep}{os.environ['PATH']}")
    return 4
