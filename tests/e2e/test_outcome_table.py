"""The outcome table on the local scheduler: every row of tests/outcomerows.py, a real job each
(the SLURM scheduler runs the shared rows on the test cluster: tests/slurm/test_slurm_outcome.py)."""

from __future__ import annotations

import os
import signal

import pytest

import tune_magic

from jobhelpers import toy_args
from outcomerows import LOCAL_ONLY, SHARED, Row, play, reason_of

pytestmark = pytest.mark.e2e


def _cancel_outside(job) -> None:
    """What someone else's `kill` does: SIGTERM to the job's torchrun agent (or its one process)."""
    os.kill(job.pid, signal.SIGTERM)


@pytest.mark.parametrize("row", SHARED + LOCAL_ONLY, ids=lambda r: r.name)
def test_local_jobs_end_as_the_outcome_table_says(row: Row, cleanup_jobs):
    job = tune_magic.launch(toy_args(*row.overrides, nproc=row.nproc))
    cleanup_jobs.append(job)
    play(row, job, _cancel_outside)
    assert (job.status, reason_of(job.error)) == (row.status, row.reason), job.tail(15)
    if row.status == "stopped" and row.action == "stop" and "sigterm_exit=0" in row.overrides:
        assert job.returncode is not None  # the exit code is kept with the stop
