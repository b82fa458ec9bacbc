"""Jobs on disk outlive releases: jobs started by release 0.1.0 (its supervisors, its records) keep
being listed, followed and stopped by today's code after an upgrade in place, and the 0.1.0
supervisors keep writing their records to the end."""

from __future__ import annotations

import json

import psutil
import pytest

import tune_magic
from tune_magic.registry import store as jobstore

from jobhelpers import toy_args
from upgradehelpers import install_legacy, legacy_cli, upgrade_in_place
from waiting import wait_for

pytestmark = pytest.mark.e2e
TIMEOUT = 180


def _launch_old(site, *words: str) -> str:
    r = legacy_cli(site, "run", *words)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[0]


def test_jobs_started_by_0_1_0_are_listed_followed_stopped_and_settled_after_an_upgrade_in_place(tmp_path):
    site = install_legacy(tmp_path / "site")
    long_id = _launch_old(site, "--name", "old-long", *toy_args("steps=400", "step_s=0.2").split())
    ok_id = _launch_old(site, "--name", "old-ok", *toy_args("steps=12", "step_s=0.5").split())
    bad_id = _launch_old(site, "--name", "old-bad", *toy_args("steps=12", "step_s=0.5", "crash_rank=1",
                                                              "crash_step=8").split())
    done_id = _launch_old(site, "--name", "old-done", "--wait", *toy_args("steps=2", "step_s=0.1").split())
    before = {r["id"]: r for r in json.loads(legacy_cli(site, "jobs", "--json").stdout)}
    assert before[done_id]["status"] == "succeeded"
    assert json.loads((jobstore.job_dir(long_id) / jobstore.RECORD).read_text())["schema"] == 2
    wait_for(lambda: tune_magic.get_job(long_id).summary().step, timeout=TIMEOUT, interval=0.2,
             what="a step of the old long job")

    upgrade_in_place(site)  # the running 0.1.0 supervisors keep the modules they imported

    listed = {j.id: j for j in tune_magic.jobs()}
    assert {long_id, ok_id, bad_id, done_id} <= set(listed)
    assert listed[done_id].status == "succeeded" and listed[done_id].summary().step == 2
    assert listed[long_id].status == "running" and listed[long_id].pid is not None
    losses = [m for m in tune_magic.get_job(long_id).metrics() if m["name"] == "loss"]
    assert losses and losses[0]["step"] == 1 and losses[0]["value"] == pytest.approx(10.0)  # start_loss / step
    # the 0.1.0 supervisors write their records to the end, with today's package on disk
    ok, bad = tune_magic.get_job(ok_id), tune_magic.get_job(bad_id)
    assert ok.wait(TIMEOUT) == "succeeded" and ok.returncode == 0
    assert bad.wait(TIMEOUT) == "failed" and bad.error == "rank 1: RuntimeError: toy recipe crashed on purpose"
    # today's code stops a 0.1.0 job: every process of it goes
    job = tune_magic.get_job(long_id)
    procs = [psutil.Process(w["pid"]) for w in job.workers] + [psutil.Process(job.pid)]
    assert job.stop(grace_s=5) == "stopped"
    assert not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    # the upgraded CLI (the same folder, now today's package) lists them all
    after = {r["id"]: r for r in json.loads(legacy_cli(site, "jobs", "--json").stdout)}
    assert [after[i]["status"] for i in (long_id, ok_id, bad_id, done_id)] == ["stopped", "succeeded", "failed",
                                                                               "succeeded"]
