"""The SLURM scheduler against a real two-node SLURM cluster (tests/slurmcluster.py).

Each case once, through the one interface (tune_magic.launch / Job, the CLI, a kernel). The
project's LoRA recipe runs where the loss matters; the stand-in recipe (tests/recipes/toy_recipe.py)
everywhere else. Nodes are network namespaces with their own addresses and Debian's
``127.0.1.1 <hostname>`` line, so an unhandled rendezvous trap fails these tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tune_magic
import tune_magic.job as J
from tune_magic import faultpoints
from tune_magic.registry import store as jobstore
from tune_magic.errors import PlanError
from tune_magic.schedulers import slurm as slurm_sched

from jobhelpers import toy_args
from waiting import wait_for

pytestmark = pytest.mark.slurm
TIMEOUT = 240


def launch(c, args: str, **kw) -> J.Job:
    job = tune_magic.launch(args, scheduler="slurm", **{"nodes": 2, "cpus_per_node": 1, **kw})
    c.started.append(job)
    return job


def wait_status(job: J.Job, wanted, timeout=TIMEOUT) -> str:
    wait_for(lambda: job.status in wanted, timeout=timeout, interval=0.5, what=f"{job.id} to be {'/'.join(wanted)}",
             describe=lambda: f"{job.id} still {job.status}: {job.tail(20)}")
    return job.status


def job_processes(c, job: J.Job) -> list:
    out = []
    for node in c.node_names:
        for p in c.node_processes(node):
            try:
                if any(job.id in a for a in p.cmdline()):
                    out.append(p)
            except Exception:
                continue
    return out


def test_two_node_lora_is_one_job_with_the_loss_of_one_node_two_processes(cluster, tiny_assets, cleanup_jobs):
    lora = "lora_finetune --config tiny/lora max_steps_per_epoch=5 epochs=1"
    two_nodes = launch(cluster, f"--nproc_per_node 1 {lora}", name="two-nodes")
    local = tune_magic.launch(f"--nproc_per_node 2 {lora}", name="one-node")
    cleanup_jobs.append(local)
    assert two_nodes.wait(TIMEOUT) == "succeeded", two_nodes.tail(40)
    assert local.wait(TIMEOUT) == "succeeded", local.tail(40)
    losses = {p.step: p.value for p in two_nodes.metric_points() if p.name == "loss"}
    here = {p.step: p.value for p in local.metric_points() if p.name == "loss"}
    assert sorted(losses) == [1, 2, 3, 4, 5]
    assert abs(losses[5] - here[5]) <= 1e-4, (losses, here)  # world size 2 both ways
    assert sorted(two_nodes.nodes) == sorted(cluster.node_names)
    summary = two_nodes.summary()
    assert sorted(summary.nodes) == sorted(cluster.node_names)  # a "node" line from each
    assert sorted(summary.nodes.values()) == sorted(cluster.node_addresses)
    assert sorted(w["rank"] for w in two_nodes.workers) == [0, 1]
    assert {w["host"] for w in two_nodes.workers} == set(cluster.node_names)
    host, _, port = two_nodes.rendezvous_endpoint.rpartition(":")
    assert host in cluster.node_addresses and int(port) > 0 and two_nodes.pid is None
    assert len(jobstore.list_records()) >= 2 and two_nodes.record.num_nodes == 2


def test_two_two_node_jobs_at_once_share_the_head_node(cluster):
    a = launch(cluster, toy_args("steps=4", "step_s=0.5", nproc=1))
    b = launch(cluster, toy_args("steps=4", "step_s=0.5", nproc=1))
    assert (a.wait(TIMEOUT), b.wait(TIMEOUT)) == ("succeeded", "succeeded"), (a.tail(30), b.tail(30))
    (ha, _, pa), (hb, _, pb) = (j.rendezvous_endpoint.rpartition(":") for j in (a, b))
    assert pa != pb or ha != hb
    assert (a.summary().step, b.summary().step) == (4, 4)


@pytest.mark.parametrize("ignore_sigterm", [False, True])
def test_cli_stop_of_a_running_two_node_job_leaves_nothing(cluster, ignore_sigterm):
    job = launch(cluster, toy_args("steps=100000", "step_s=0.2", f"ignore_sigterm={str(ignore_sigterm).lower()}",
                                   nproc=1))
    wait_status(job, ("running",))
    wait_for(lambda: len(job.refresh().workers) >= 2, timeout=120, interval=0.5,  # both ranks started on their nodes
             what=f"both ranks of {job.id}", describe=lambda: job.tail(30))
    assert job_processes(cluster, job)
    r = subprocess.run([sys.executable, "-m", "tune_magic", "stop", "--grace", "2", job.id], capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and r.stdout.split() == [job.id, "stopped"], (r.stdout, r.stderr)
    assert job_processes(cluster, job) == []
    assert J.get_job(job.id).status == "stopped"


def test_a_rank_raising_on_the_second_node_names_rank_host_and_exception(cluster):
    job = launch(cluster, toy_args("crash_rank=1", "steps=5", nproc=1))
    assert job.wait(TIMEOUT) == "failed", "\n".join(job.tail(80))
    host = next(w["host"] for w in job.workers if w["rank"] == 1)
    assert "rank 1" in job.error and "RuntimeError: toy recipe crashed on purpose" in job.error, job.error
    assert host in job.error, job.error
    reason = job.failure()
    assert (reason.rank, reason.exc_type) == (1, "RuntimeError") and "Traceback" in reason.traceback


def test_pending_with_a_reason_then_runs_and_a_pending_job_is_cancelled(cluster):
    blocker = launch(cluster, toy_args("steps=100000", "step_s=0.2", nproc=1), cpus_per_node=4)
    wait_status(blocker, ("running",))
    waiting = launch(cluster, toy_args("steps=2", nproc=1))
    cancelled = launch(cluster, toy_args("steps=2", nproc=1))
    wait_for(lambda: waiting.status == "pending" and waiting.pending_reason, timeout=60, interval=0.5,
             what=f"{waiting.id} pending with a reason", describe=lambda: (waiting.status, waiting.pending_reason))
    assert waiting.pending_reason in ("Resources", "Priority"), waiting.pending_reason
    assert waiting.nodes == []
    with pytest.raises(PlanError, match="stop it first"):
        J.remove(waiting.id)  # a pending job is live
    assert cancelled.stop(grace_s=1) == "stopped"
    assert blocker.stop(grace_s=1) == "stopped"
    assert waiting.wait(TIMEOUT) == "succeeded", waiting.tail(30)


def test_polluted_kernel_environment_still_runs_the_two_node_job(cluster, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "7")
    monkeypatch.setenv("SBATCH_TIMELIMIT", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    job = launch(cluster, toy_args("steps=3", nproc=1))
    assert job.wait(TIMEOUT) == "succeeded", job.tail(30)
    environ = Path(job.log_path).read_text()
    assert "toy recipe done" in environ


def test_dry_run_script_and_submitted_script_differ_only_in_the_id(cluster):
    args = toy_args("steps=2", nproc=1)
    plan = tune_magic.launch(args, scheduler="slurm", nodes=2, cpus_per_node=1, sbatch=["--hold"], dry_run=True)
    assert plan.batch_script and plan.submit_argv[0] == "sbatch" and plan.job_id in plan.batch_script
    job = launch(cluster, args, sbatch=["--hold"])
    submitted = (job.dir / slurm_sched.SCRIPT).read_text()
    assert submitted == plan.batch_script.replace(plan.job_id, job.id)
    assert J.get_job(job.id).status == "pending"
    assert job.stop(grace_s=1) == "stopped"


def test_squeue_runs_at_most_once_per_5_s_for_a_listing_and_live_cards(cluster, tmp_path, monkeypatch):
    """A PATH wrapper counts squeue calls while 20 held (pending) SLURM jobs are listed again and
    again (at least 20 listings, each a live table) and 4 live cards follow 4 of them for 30 s or
    more: at most one call per 5 s of that time, plus the first."""
    from tune_magic.ui.cards import JobCard
    from tune_magic.ui.views import JobsTable

    held = [launch(cluster, toy_args("steps=1", nproc=1), sbatch=["--hold"]) for _ in range(20)]
    real = subprocess.run(["which", "squeue"], capture_output=True, text=True).stdout.strip()
    wrapper_dir, count = tmp_path / "bin", tmp_path / "squeue-calls"
    wrapper_dir.mkdir()
    (wrapper_dir / "squeue").write_text(f'#!/bin/sh\necho \"$*\" >> {count}\nexec {real} "$@"\n')
    (wrapper_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper_dir}:{os.environ['PATH']}")
    slurm_sched.WATCHER.forget()
    time.sleep(slurm_sched.status.interval_s())  # what launching queried is over
    count.write_text("")
    cards = [JobCard(J.get_job(j.id), interval_s=0.25) for j in held[:4]]
    t0 = time.monotonic()
    tables = []
    # a count of listings, not a time: on a loaded machine (CI's 2 cores) one listing takes longer
    while len(tables) < 20 or time.monotonic() - t0 < 30:
        listed = [j for j in tune_magic.jobs() if j.id in {h.id for h in held}]
        tables.append(JobsTable(listed))
        assert {j.status for j in listed} == {"pending"}
        time.sleep(1)
    elapsed, calls = time.monotonic() - t0, len(count.read_text().splitlines())  # before closing takes time
    for card in [*cards, *tables]:
        card.close()
    assert 1 <= calls <= int(elapsed // slurm_sched.status.interval_s()) + 1, (calls, elapsed)
    for j in held:
        j.stop(grace_s=0)


def test_bad_input_submits_nothing_and_leaves_no_record(cluster):
    before = {r.id for r in jobstore.list_records()}
    args = toy_args("steps=2", nproc=1)
    cases = [
        ({"partition": "nosuchpartition"}, "sbatch refused the job"),
        ({"sbatch": ["--constraint=nosuchfeature"]}, "sbatch refused the job"),
        ({"time_limit": "2h"}, "--time"),
        ({"sbatch": ["--output=/tmp/x"]}, "--output"),
    ]
    for kw, words in cases:
        with pytest.raises(PlanError, match=words):
            tune_magic.launch(args, scheduler="slurm", **{"nodes": 2, "cpus_per_node": 1, **kw})
    r = subprocess.run([sys.executable, "-m", "tune_magic", "run", "--scheduler", "slurm", "--nodes", "2",
                        "--partition", "nosuchpartition", *args.split()], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "sbatch refused the job" in r.stderr and "Traceback" not in r.stderr
    assert {r.id for r in jobstore.list_records()} == before
    listed = json.loads(subprocess.run([sys.executable, "-m", "tune_magic", "jobs", "--json"], capture_output=True,
                                       text=True, timeout=60).stdout)
    assert not [j for j in listed if j["status"] in ("pending", "running") and j["id"] not in before]


def test_cluster_notebook_runs_the_two_node_job_an_array_sweep_and_the_70b_dry_run(cluster, tiny_assets, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    repo = Path(__file__).resolve().parents[2]
    nb = nbformat.read(repo / "notebooks" / "cluster.ipynb", as_version=4)
    out = repo / "test-artifacts" / "notebooks"
    out.mkdir(parents=True, exist_ok=True)
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        nbformat.write(nb, out / "cluster.executed.ipynb")

    def text(cell_id):
        c = next(c for c in nb.cells if c.get("id") == cell_id)
        return "".join(o.get("text", "") for o in c.outputs if o.output_type == "stream")

    assert text("setup").strip() == "a SLURM controller answers: the cells below submit to it", text("setup")
    result = text("two-nodes-result")
    assert result.splitlines()[0] == "succeeded", result
    assert f"nodes: {' '.join(sorted(cluster.node_names))}" in result and "step 5 loss " in result
    assert "0@" in result and "1@" in result
    swept = text("array-sweep-result").splitlines()
    assert swept[0] == "{'succeeded': 3}", swept
    array_ids = swept[1].split()[2:]  # one array: <id>_0 <id>_1 <id>_2
    assert len({i.split("_")[0] for i in array_ids}) == 1 and [i.split("_")[1] for i in array_ids] == ["0", "1", "2"]
    rows = [line.split() for line in swept[-3:]]  # trial, lr, status, steps, final loss
    assert [r[0] for r in rows] == ["0", "1", "2"] and [r[2:4] for r in rows] == [["succeeded", "3"]] * 3
    dry = text("dry-run")
    assert dry.startswith("sbatch --parsable") and "#SBATCH --gpus-per-node=8" in dry and "#SBATCH --partition=gpu" in dry
    assert "#SBATCH --time=2:00:00" in dry and "srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=64" in dry
    assert "nodes: 2  processes per node: 8  rendezvous: scheduler" in text("dry-run-result")


LAUNCHER = """
import sys
import tune_magic
tune_magic.launch(sys.argv[1], scheduler="slurm", nodes=2, cpus_per_node=1)
"""


def test_a_launcher_killed_after_sbatch_leaves_a_job_that_is_found_by_name(cluster):
    before = {r.id for r in jobstore.list_records()}
    p = subprocess.run([sys.executable, "-c", LAUNCHER, toy_args("steps=2", nproc=1)],
                       env={**os.environ, faultpoints.KILL_ENV: "sbatch-returned"}, capture_output=True, timeout=120)
    assert p.returncode == -9, p.stderr[-2000:]
    (new,) = [r for r in jobstore.list_records() if r.id not in before]
    assert new.backend.get("job_id") is None and new.status == "pending"  # the id never got written
    job = J.get_job(new.id)
    cluster.started.append(job)
    assert job.wait(TIMEOUT) == "succeeded", job.tail(30)
    assert job.engine_id is not None and job.record.backend["job_id"] == job.engine_id


def test_a_job_squeue_no_longer_lists_without_an_exit_file_is_unknown_then_failed(cluster, monkeypatch):
    job = launch(cluster, toy_args("steps=1", nproc=1))
    assert job.wait(TIMEOUT) == "succeeded"
    # a second record pointing at a SLURM id squeue never had: what a job gone past MinJobAge looks like
    rec = jobstore.read(job.dir)
    ghost_dir = job.dir.parent / (job.id[:-6] + "0g0s7e")
    ghost_dir.mkdir()
    rec.id, rec.status, rec.returncode, rec.ended_at = ghost_dir.name, "running", None, None
    rec.backend = {**rec.backend, "job_id": "999999"}
    rec.log_path = str(ghost_dir / "output.log")
    jobstore.write_record(ghost_dir, rec)
    ghost = J.get_job(ghost_dir.name)
    cluster.started.append(ghost)
    slurm_sched.WATCHER.forget()
    wait_for(lambda: ghost.status == "unknown", timeout=30, interval=0.5, what="the ghost job's outcome unknown",
             describe=lambda: ghost.status)
    assert ghost.status.label == "outcome unknown"
    # failed only once the controller has left it out of its answers over the grace period
    monkeypatch.setenv("TUNE_MAGIC_SLURM_GRACE_S", "0")
    monkeypatch.setenv("TUNE_MAGIC_SLURM_MISSING_ANSWERS", "2")
    monkeypatch.setenv("TUNE_MAGIC_SLURM_INTERVAL_S", "0.2")
    for _ in range(2):
        slurm_sched.WATCHER.forget()
        ghost._checked = 0.0
        time.sleep(0.3)
        ghost.refresh()
    assert ghost.status == "failed"
    assert "SLURM no longer lists job 999999 and it left no exit code" in ghost.error


def test_a_slurm_job_with_a_damaged_record_is_still_found_stopped_and_kept_until_then(cluster):
    job = launch(cluster, toy_args("steps=2", nproc=1), sbatch=["--hold"])
    slurm_id = job.engine_id
    (job.dir / jobstore.RECORD).write_text("garbage")
    r = subprocess.run([sys.executable, "-m", "tune_magic", "rm", job.id], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 2 and "stop it first" in r.stderr, (r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-m", "tune_magic", "stop", job.id], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0 and r.stdout.split() == [job.id, "stopped"], (r.stdout, r.stderr)
    state = cluster.client(["squeue", f"--jobs={slurm_id}", "--states=all", "--noheader", "--format=%T"],
                           check=False).stdout.strip()
    assert state in ("", "CANCELLED"), state
    r = subprocess.run([sys.executable, "-m", "tune_magic", "rm", job.id], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0 and not job.dir.exists()
