"""A launch's warnings appear once: a plain line (the card's, a dry run's stderr, the CLI's stderr),
never also as a Python ``UserWarning`` block that starts with one of tune_magic's files. The API
issues them as :class:`tune_magic.errors.LaunchWarning` at the caller's own line.

The warnings here are a key the toy config lacks, on the line (``nokey=2``) and in a YAML cell body
(``other_key: 1``): the override checks warn about both and start the job all the same."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

import tune_magic
from tune_magic.errors import LaunchWarning

from jobhelpers import REPO, toy_args

LINE_KEY = "override nokey=2: the config has no key nokey"
BODY_KEY = "cell line 1: other_key: the config has no key other_key"


def _python_warnings(caught) -> list[str]:
    return [f"{w.filename}: {w.category.__name__}: {w.message}" for w in caught]


def test_the_magics_dry_run_prints_each_warning_once_and_python_warns_nothing(ip, capsys, job_registry):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = ip.run_cell_magic("tune_run", "--dry-run " + toy_args("steps=1", "nokey=2", nproc=None), "other_key: 1\n")
    err = capsys.readouterr().err
    assert [w for w in _python_warnings(caught) if "UserWarning" in w or "LaunchWarning" in w] == []
    assert [line.split(" (")[0] for line in err.splitlines() if line.startswith("warning: ")] == [
        f"warning: {BODY_KEY}", f"warning: {LINE_KEY}"]
    assert [w.split(" (")[0] for w in plan.warnings] == [BODY_KEY, LINE_KEY]  # the body's are the plan's too


def test_the_api_warns_at_the_callers_line_never_at_a_file_of_tune_magic(job_registry):
    import tune_magic.job.launch

    package = os.path.dirname(tune_magic.__file__)

    def caller():
        return tune_magic.launch(toy_args("steps=1", nproc=None), dry_run=True)  # no warning: nothing to say

    assert caller().warnings == []
    from tune_magic.errors import warn_launch

    with pytest.warns(LaunchWarning) as caught:
        warn_launch(["a", "b", "a"])  # from this file: attributed to it
    assert [(str(w.message), w.filename) for w in caught] == [("a", __file__), ("b", __file__)]
    assert not any(w.filename.startswith(package) for w in caught)
    assert tune_magic.job.launch.warn_launch is warn_launch


@pytest.mark.e2e
def test_a_launch_says_each_warning_once_in_the_api_the_magic_and_the_cli(ip, capsys, job_registry, cleanup_jobs):
    args = toy_args("steps=1", "step_s=0", "nokey=2", nproc=None)
    # the API: a LaunchWarning at the caller's line; the record keeps the body's warning too
    with pytest.warns(LaunchWarning) as caught:
        job = tune_magic.launch(args, config_overlay="other_key: 1\n")
    cleanup_jobs.append(job)
    assert [(str(w.message).split(" (")[0], w.filename) for w in caught if w.category is LaunchWarning] == [
        (BODY_KEY, __file__), (LINE_KEY, __file__)]
    assert [w.split(" (")[0] for w in job.record.warnings] == [BODY_KEY, LINE_KEY]
    # the magic: the card's lines, no Python warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        job = ip.run_cell_magic("tune_run", args, "other_key: 1\n")
    cleanup_jobs.append(job)
    assert [w for w in _python_warnings(caught) if "UserWarning" in w or "LaunchWarning" in w] == []
    assert "UserWarning" not in capsys.readouterr().err
    from tune_magic.ui.cards import JobCard

    card = JobCard.for_job(job.id)
    notes = card.notes.value
    assert notes.count("the config has no key other_key") == 1 and notes.count("the config has no key nokey") == 1
    card.close()
    # the CLI: one plain line each on stderr
    r = subprocess.run([sys.executable, "-W", "always", "-m", "tune_magic", "run", "--wait", *args.split()],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert "UserWarning" not in r.stderr and "LaunchWarning" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if "the config has no key" in line]
    assert [line.split(" (")[0] for line in lines] == [f"tune-magic run: warning: {LINE_KEY}"]
