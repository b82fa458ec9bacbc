"""Helpers shared by the tests in every folder (not tests themselves): where the test data and the
toy recipe are, processes of a job, a FAKE nvidia-smi."""

from __future__ import annotations

import os
import shlex
import stat
import sys
import uuid
from pathlib import Path

import psutil

HERE = Path(__file__).parent
#: the repository root and the captured logs and samples (tests/data/), for tests in any folder
REPO = HERE.parent
DATA = HERE / "data"
TOY_RECIPE = HERE / "recipes" / "toy_recipe.py"
TOY_CONFIG = HERE / "recipes" / "toy.yaml"
#: the third scheduler's test distribution (an entry point in tune_magic.schedulers; fixture ``third``)
THIRD_PACKAGE = HERE / "thirdsched"


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


def fake_gpu_uuid(index: int) -> str:
    """The UUID the FAKE ``nvidia-smi`` gives GPU ``index`` (the real format, GPU-8-4-4-4-12 hex)."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"tune-magic-fake-gpu-{index}"))


def fake_mig_uuid(index: int, instance: int) -> str:
    """A MIG device id (``MIG-<uuid>``, the R470+ form ``nvidia-smi -L`` prints) on FAKE GPU ``index``."""
    return "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"tune-magic-fake-mig-{index}-{instance}"))


def write_fake_nvidia_smi(bin_dir: Path, n: int, *, uuids: list[str] | None = None,
                          fail: str | None = None) -> Path:
    """Write a FAKE ``nvidia-smi`` listing ``n`` GPUs (this machine has none).

    It answers the two queries tune_magic makes, in the real CSV form (nvidia-smi 5xx):
    ``--query-gpu=index --format=csv,noheader`` -> ``0``; ``--query-gpu=index,uuid ...`` ->
    ``0, GPU-…``; anything else exits 2, so a test notices a query the fake does not model.

    Args:
        bin_dir: folder to put it in (created); put it first on ``PATH``.
        n: number of GPUs, indices 0..n-1.
        uuids: their UUIDs (default :func:`fake_gpu_uuid` of each index).
        fail: when given, print this line and exit 9, as nvidia-smi does without a driver.
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    uuids = [fake_gpu_uuid(i) for i in range(n)] if uuids is None else list(uuids)
    assert len(uuids) == n, "one UUID per GPU"
    index_lines = "".join(f"{i}\n" for i in range(n))
    uuid_lines = "".join(f"{i}, {u}\n" for i, u in enumerate(uuids))
    if fail is not None:
        body = f"echo {shlex.quote(fail)}\nexit 9\n"
    else:
        body = (
            'case "$*" in\n'
            f"  *--query-gpu=index,uuid*--format=csv,noheader*) printf {shlex.quote(uuid_lines)} ;;\n"
            f"  *--query-gpu=index\\ *--format=csv,noheader*) printf {shlex.quote(index_lines)} ;;\n"
            '  *) echo "FAKE nvidia-smi: unsupported arguments: $*" >&2; exit 2 ;;\n'
            "esac\n"
        )
    exe.write_text("#!/bin/sh\n# FAKE nvidia-smi for tests: there is no GPU here.\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def registry_problem(root: Path) -> str | None:
    """What is wrong with the registry ``root`` after a listing (which settles records and removes dead
    launchers' staging): a staging directory left, an unreadable record, a live record with no live
    process; ``None`` when nothing is."""
    import tune_magic.job as J
    from tune_magic.registry import store as jobstore

    J.jobs()
    for d in root.iterdir():
        if d.name.startswith(".") and not d.name.startswith(jobstore.STAGING_PREFIX):
            continue
        if d.name.startswith(jobstore.STAGING_PREFIX):
            return f"staging directory {d.name} left"
        try:
            rec = jobstore.read(d)
        except jobstore.CorruptRecord as exc:
            return f"{d.name}: {exc}"
        if rec.state.is_live and not J.Job(d, rec)._sched().has_live_parts(d, rec):
            return f"{d.name} is {rec.status} with no live process"
    return None


def own_python_warnings(plan, env) -> list[str]:
    """The node-local warning a multi-node plan rightly gets for this test run's own interpreter:
    ``[]``, or one line when ``sys.executable`` (the clone's venv) is under ``/tmp``, ``/dev/shm`` or
    ``$TMPDIR``, where the other nodes of a real cluster would not have it. Tests that count or
    compare a SLURM plan's warnings allow exactly this one, so they pass wherever the clone lives
    (tests/test_clone_location.py runs them with an interpreter under /tmp)."""
    from tune_magic.schedulers.slurm.nodelocal import node_local_warnings

    return [w for w in node_local_warnings(plan, env, home="/", python=sys.executable)
            if w.startswith("the Python every node runs, ")]
