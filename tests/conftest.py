"""Shared test set-up: every test session gets its own TUNE_MAGIC_HOME, never the user's."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# Shared helper modules (jobhelpers, waiting, kernelhelpers, faults, slurmcluster, outcomerows, ...) import
# from tests/ in every subfolder. Test folders have no __init__.py (pytest's default import mode), so test file names
# must be unique across folders; pytest refuses a duplicate at collection.
sys.path.insert(0, str(Path(__file__).parent))

# Set at import time so subprocesses and modules imported during collection see it too.
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="tune_magic_test_home_"))
os.environ["TUNE_MAGIC_HOME"] = str(_SESSION_HOME)


@pytest.fixture(scope="session")
def session_home() -> Path:
    """The TUNE_MAGIC_HOME shared by this test session."""
    return _SESSION_HOME


# --- the SLURM test cluster (tests/slurmcluster.py) ----------------------------------------------
# Tests that use `slurm_cluster` are marked `slurm` and `e2e`. Without SLURM installed they skip,
# unless TUNE_MAGIC_REQUIRE_SLURM=1 (CI), where they fail. REQUIRE also demands the namespace
# mode; otherwise a machine that cannot make namespaces gets the loopback mode, where
# `slurm_netns_cluster` (the trap-dependent tests) skips. TUNE_MAGIC_SLURM_MODE=loopback forces it.

_SLURM_FIXTURES = {"slurm_cluster", "slurm_netns_cluster"}
_slurm_timings: dict[str, object] = {}
_slurm_items: set[str] = set()  # node ids of the tests on the test cluster (not tests/schedulers/slurm's unit tests)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _SLURM_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.slurm)
            item.add_marker(pytest.mark.e2e)
            _slurm_items.add(item.nodeid)


def _slurm_required() -> bool:
    return os.environ.get("TUNE_MAGIC_REQUIRE_SLURM") == "1"


def _no_slurm(reason: str):
    if _slurm_required():
        pytest.fail(f"{reason} (TUNE_MAGIC_REQUIRE_SLURM=1)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running two-node SLURM cluster for this session (tests/slurmcluster.py's SlurmCluster).

    Use ``slurm_cluster.env`` for every SLURM client (its own SLURM_CONF; no inherited
    SBATCH_*, SLURM_* or TUNE_MAGIC_SCHEDULER), ``node_names``/``node_addresses``, ``mode``,
    ``run_in_node``/``node_processes`` and ``shared_dir``. Stopped, with everything it made, at
    the end of the session.
    """
    import slurmcluster

    missing = slurmcluster.missing_programs()
    if missing:
        _no_slurm(f"SLURM is not installed (missing {', '.join(missing)}); run scripts/install-slurm")
    slurmcluster.reap_stale_clusters()
    forced = os.environ.get("TUNE_MAGIC_SLURM_MODE", "")
    if forced not in ("", "netns", "loopback"):
        pytest.fail(f"TUNE_MAGIC_SLURM_MODE={forced!r}: use netns or loopback", pytrace=False)
    if forced == "loopback" and _slurm_required():
        pytest.fail("TUNE_MAGIC_SLURM_MODE=loopback contradicts TUNE_MAGIC_REQUIRE_SLURM=1 (needs netns)", pytrace=False)
    cluster, why_loopback = None, "forced by TUNE_MAGIC_SLURM_MODE=loopback"
    if forced != "loopback":
        try:
            cluster = slurmcluster.start_cluster("netns")
        except slurmcluster.ClusterError as exc:
            if _slurm_required() or forced == "netns":
                pytest.fail(f"cannot start the namespace-mode SLURM test cluster: {exc}", pytrace=False)
            why_loopback = f"no namespace mode here: {exc}"
    if cluster is None:
        try:
            cluster = slurmcluster.start_cluster("loopback")
        except slurmcluster.ClusterError as exc:
            _no_slurm(f"cannot start the SLURM test cluster: {exc}")
        cluster.why_loopback = why_loopback
    _slurm_timings["cluster"] = cluster
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm_netns_cluster(slurm_cluster):
    """``slurm_cluster`` in the namespace mode; skips (with the reason) in the loopback mode."""
    if slurm_cluster.mode != "netns":
        pytest.skip(f"needs the namespace-mode SLURM cluster (the loopback mode hides the rendezvous traps); "
                    f"loopback here: {getattr(slurm_cluster, 'why_loopback', '')}")
    return slurm_cluster


def pytest_terminal_summary(terminalreporter):
    cluster = _slurm_timings.get("cluster")
    if cluster is not None:
        stop = f"{cluster.stop_s:.2f} s" if cluster.stop_s is not None else "not stopped"
        terminalreporter.write_line(
            f"SLURM test cluster ({cluster.mode}): started in {cluster.start_s:.2f} s, stopped in {stop}"
        )
    # what the SLURM tests add to a run (set-up, call and teardown of every test marked slurm)
    reports = [r for group in terminalreporter.stats.values() for r in group
               if getattr(r, "when", None) and getattr(r, "nodeid", None) in _slurm_items]
    if reports:
        tests = {r.nodeid for r in reports}
        terminalreporter.write_line(f"SLURM tests: {len(tests)} tests, {sum(r.duration for r in reports):.0f} s "
                                    "(set-up, call and teardown)")


# --- shared by the end-to-end and SLURM tests ---------------------------------------------------


@pytest.fixture(scope="session")
def tiny_assets(session_home):
    """The tiny offline model/tokenizer/dataset under the session's TUNE_MAGIC_HOME."""
    from tune_magic.assets import make_assets

    return make_assets()


@pytest.fixture(scope="session")
def ip():
    """The process's one IPython shell, with ``%load_ext tune_magic`` (run_cell_magic, user_ns, ...).

    IPython's test shell (``IPython.testing.globalipapp``, a ``TerminalInteractiveShell``): a process
    has one shell, so every test that needs one takes this fixture. Loading the extension again is
    harmless (it registers once). A fresh shell in a fresh process: tests/e2e/test_first_launch.py.
    """
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or get_ipython()  # start_ipython answers None once the shell exists
    shell.run_line_magic("load_ext", "tune_magic")
    return shell


@pytest.fixture
def cleanup_jobs():
    """Collect jobs a test starts; stop any still running at the end so no test leaks processes."""
    started = []
    yield started
    for job in started:
        try:
            job.stop(grace_s=2)
        except Exception:
            pass


@pytest.fixture
def job_registry(tmp_path, monkeypatch):
    """A registry of the test's own: ``TUNE_MAGIC_HOME`` under ``tmp_path`` (dry runs off); returns
    its ``jobs/`` folder, for records written by hand."""
    home = tmp_path / "home"
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(home))
    monkeypatch.delenv("TUNE_MAGIC_DRY_RUN", raising=False)
    root = home / "jobs"
    root.mkdir(parents=True)
    return root


@pytest.fixture
def third(monkeypatch):
    """The third scheduler's test distribution installed on this process's path (and its children's,
    through PYTHONPATH: kernels and JupyterLab started after it find it too); the scheduler registry
    forgets what it found before and after."""
    from jobhelpers import THIRD_PACKAGE
    from tune_magic import schedulers

    monkeypatch.syspath_prepend(str(THIRD_PACKAGE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(THIRD_PACKAGE), os.environ.get("PYTHONPATH")])))
    schedulers.refresh()
    yield
    schedulers.refresh()
