"""Helpers shared by the job tests (not tests themselves)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import psutil

HERE = Path(__file__).parent
TOY_RECIPE = HERE / "recipes" / "toy_recipe.py"
TOY_CONFIG = HERE / "recipes" / "toy.yaml"


def toy_args(*overrides: str, nproc: int | None = 2) -> str:
    """tune run-style args for the test-only toy recipe (real torchrun + gloo, no model)."""
    prefix = f"--nproc_per_node {nproc} " if nproc else ""
    return f"{prefix}{TOY_RECIPE} --config {TOY_CONFIG} " + " ".join(overrides)


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Every live process whose command line contains ``text`` (a job id is unique to one job)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(text in a for a in (p.info["cmdline"] or [])):
                out.append(p)
        except psutil.Error:
            continue
    return [p for p in out if p.pid != os.getpid()]


def listening_on(port: int) -> list:
    """LISTEN sockets on ``port`` (any address)."""
    return [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.laddr.port == port]


def write_fake_nvidia_smi(bin_dir: Path, n: int) -> Path:
    """Write a FAKE ``nvidia-smi`` listing ``n`` GPUs (this machine has none)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    ids = " ".join(str(i) for i in range(n))
    exe.write_text(f"#!/bin/sh\n# FAKE nvidia-smi for tests: there is no GPU here.\nfor i in {ids}; do echo $i; done\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe
