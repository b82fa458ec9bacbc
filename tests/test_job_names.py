"""A job can be named by its name wherever a JOB is taken (``tune_magic.get_job``, the CLI, the
magics), when only one job has it; a name several jobs have is refused with their ids; an id
always wins (a job whose *name* is another job's id never shadows it). Records written by hand."""

from __future__ import annotations

import time

import pytest

import tune_magic
from tune_magic.errors import AmbiguousJobName, JobNotFound, PlanError
from tune_magic.registry import store as jobstore
from tune_magic.registry.store import JobRecord

A, B1, B2, C = "20261201-100000-aaaaaa", "20261201-100001-bbbbbb", "20261201-100002-cccccc", "20261201-100003-dddddd"


@pytest.fixture
def named(job_registry):
    t0 = time.time() - 3600
    # C is named after A's id: the id still wins
    for i, (job_id, name) in enumerate([(A, "lr 3e-4 run"), (B1, "twin"), (B2, "twin"), (C, A)]):
        d = job_registry / job_id
        d.mkdir()
        (d / "output.log").write_text(f"log of {job_id}\n")
        jobstore.write_record(d, JobRecord(
            id=job_id, name=name, argv=["python", "x.py"], env={}, cwd=str(job_registry), started_at=t0 + i,
            ended_at=t0 + i + 60, log_path=str(d / "output.log"), status="succeeded", returncode=0))
    return job_registry


def test_get_job_takes_a_unique_name_an_id_wins_and_an_ambiguous_name_lists_the_ids(named):
    assert tune_magic.get_job("lr 3e-4 run").id == A  # spaces and all: a name is free text
    assert tune_magic.get_job(A).id == A and tune_magic.get_job(C).id == C
    with pytest.raises(AmbiguousJobName, match=f"2 jobs are named 'twin': {B1}, {B2}; give the id"):
        tune_magic.get_job("twin")
    with pytest.raises(PlanError, match="no job is named 'no such run', and it is not valid as a job id"):
        tune_magic.get_job("no such run")
    with pytest.raises(JobNotFound, match="no job '20261201-100009-eeeeee'"):
        tune_magic.get_job("20261201-100009-eeeeee")


def test_the_cli_and_the_magics_take_a_name(named, capsys, ip):
    from tune_magic.ui import cli

    capsys.readouterr()
    assert cli.main(["logs", "lr 3e-4 run"]) == 0
    assert capsys.readouterr().out == f"log of {A}\n"
    assert cli.main(["logs", "twin"]) == 2
    assert f"2 jobs are named 'twin': {B1}, {B2}" in capsys.readouterr().err
    assert cli.main(["rm", "lr 3e-4 run"]) == 0
    assert not (named / A).exists() and (named / C).exists()
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=f"2 jobs are named 'twin': {B1}, {B2}"):
        ip.run_line_magic("tune_logs", "twin")
