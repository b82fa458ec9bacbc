"""SLURM jobs submitted by release 0.1.0 (its records with SLURM's id at the top level, its batch
scripts with the options on sbatch's command line) keep being listed, followed and stopped by
today's code after an upgrade in place, on the real test cluster."""

from __future__ import annotations

import json

import pytest

import tune_magic
from tune_magic.registry import store as jobstore
from tune_magic.schedulers import slurm as slurm_sched

from jobhelpers import toy_args
from upgradehelpers import install_legacy, legacy_cli, upgrade_in_place
from waiting import wait_for

pytestmark = pytest.mark.slurm
TIMEOUT = 240


def _submit_old(site, *words: str) -> str:
    r = legacy_cli(site, "run", "--scheduler", "slurm", "--nodes", "1", "--cpus-per-node", "2", *words)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[0]


def test_slurm_jobs_of_0_1_0_are_followed_settled_and_stopped_after_an_upgrade(cluster, tmp_path):
    site = install_legacy(tmp_path / "site")
    long_id = _submit_old(site, *toy_args("steps=400", "step_s=0.2").split())
    short_id = _submit_old(site, *toy_args("steps=12", "step_s=0.5").split())
    old = json.loads((jobstore.job_dir(long_id) / jobstore.RECORD).read_text())  # before today's code reads it
    for job_id in (long_id, short_id):
        cluster.started.append(tune_magic.get_job(job_id))
    assert old["schema"] == 2 and old["slurm_job_id"] and "backend" not in old
    assert "#SBATCH" not in (jobstore.job_dir(long_id) / "job.sbatch").read_text()  # 0.1.0's script
    wait_for(lambda: (tune_magic.get_job(long_id).summary().step or 0) >= 2, timeout=TIMEOUT, interval=0.2,
             what="a step of the old job")

    upgrade_in_place(site)
    slurm_sched.WATCHER.forget()

    long_job, short_job = tune_magic.get_job(long_id), tune_magic.get_job(short_id)
    assert long_job.engine_id == old["slurm_job_id"] and long_job.status == "running"
    assert [m["value"] for m in long_job.metrics() if m["name"] == "loss"][:2] == pytest.approx([10.0, 5.0])
    assert short_job.wait(TIMEOUT) == "succeeded" and short_job.returncode == 0  # 0.1.0's script wrote its exit file
    assert long_job.stop(grace_s=2) == "stopped"
    state = cluster.client(["squeue", f"--jobs={old['slurm_job_id']}", "--states=all", "--noheader", "--format=%T"],
                           check=False).stdout.strip()
    assert state in ("", "CANCELLED", "COMPLETING", "FAILED"), state
    written = json.loads((jobstore.job_dir(long_id) / jobstore.RECORD).read_text())
    assert written["schema"] == 3 and written["backend"]["job_id"] == old["slurm_job_id"]
    after = {r["id"]: r for r in json.loads(legacy_cli(site, "jobs", "--json").stdout)}  # the upgraded CLI
    assert (after[long_id]["status"], after[short_id]["status"]) == ("stopped", "succeeded")
