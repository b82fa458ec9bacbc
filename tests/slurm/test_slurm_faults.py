"""A cluster's bad minute never settles a job wrongly (issue 23), on the real test cluster.

The controller paused (SIGSTOP) and killed then restarted mid-job, squeue failing, silent or
hanging (a script first on PATH), a requeue, an outside scancel, an inherited SRUN_* variable, and
user words bash would expand: each ends with the job's true status, every listing stays fast and
says "SLURM not answering since HH:MM" while the controller is silent, and stop and rm act
through the engine whatever the record says. The grace periods and the query cadence are
settings (TUNE_MAGIC_SLURM_*), so outages of seconds stand for minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import tune_magic
from tune_magic.registry import store as jobstore
from tune_magic.registry.outcome import CANCELLED_OUTSIDE
from tune_magic.schedulers import slurm as slurm_sched

from jobhelpers import TOY_CONFIG, TOY_RECIPE, toy_args
from waiting import wait_for

pytestmark = pytest.mark.slurm
TIMEOUT = 240
NOT_ANSWERING = "SLURM not answering since "
SLEEP_MARK = "987"  # the hanging squeue's `sleep 987`: none may be left behind


@pytest.fixture
def fast(monkeypatch):
    """Outages of seconds: a query every 0.5 s, a vanished job failed after 3 answers over 3 s."""
    for name, value in (("INTERVAL_S", "0.5"), ("GRACE_S", "3"), ("MISSING_ANSWERS", "3")):
        monkeypatch.setenv(f"TUNE_MAGIC_SLURM_{name}", value)
    slurm_sched.WATCHER.forget()


def _launch(cluster, *overrides, **kw):
    job = tune_magic.launch(toy_args(*overrides, nproc=1), scheduler="slurm",
                            **{"nodes": 1, "cpus_per_node": 1, **kw})
    cluster.started.append(job)
    return job


def _stepping(job, timeout=TIMEOUT):
    wait_for(lambda: job.status == "running" and job.summary().step, timeout=timeout, interval=0.3,
             what=f"{job.id} past its first step", describe=lambda: (job.status, job.tail(10)))


def _notes_from(t: float) -> set[str]:
    """The notes a controller silent since about ``t`` (unix s) may show: its first failed query
    ends up to a query's time later, perhaps in the next minute."""
    return {NOT_ANSWERING + time.strftime("%H:%M", time.localtime(t + dt)) for dt in range(0, 8)}


def _fresh(job):
    job._checked = 0.0
    return job.refresh()


def _cli(*args, timeout=60):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "tune_magic", *args], capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - t0


def _listed(job_id):
    r, took = _cli("jobs", "--json")
    assert r.returncode == 0, r.stderr
    return next(j for j in json.loads(r.stdout) if j["id"] == job_id), took


def _empty_listing_s(tmp_path) -> float:
    """How long ``tune-magic jobs --json`` takes with no SLURM job (a fresh, empty registry)."""
    env = {**os.environ, "TUNE_MAGIC_HOME": str(tmp_path / "empty-home")}
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "tune_magic", "jobs", "--json"], env=env, capture_output=True, timeout=60,
                   check=True)
    return time.monotonic() - t0


@pytest.fixture
def first_on_path(cluster, tmp_path):
    """``put(name, body)`` puts a script called ``name`` first on PATH (what a broken or hanging
    client looks like). PATH is restored before the cluster fixture stops the test's jobs."""
    d = tmp_path / "bin"
    d.mkdir()
    before = os.environ["PATH"]

    def put(name: str, body: str):
        (d / name).write_text("#!/bin/sh\n" + body)
        (d / name).chmod(0o755)
        os.environ["PATH"] = f"{d}{os.pathsep}{before}"
        slurm_sched.WATCHER.forget()
        return d / name
    yield put
    os.environ["PATH"] = before
    slurm_sched.WATCHER.forget()


def _card_and_table(job):
    from tune_magic.ui.cards import JobCard
    from tune_magic.ui.views import JobsTable

    card = JobCard(tune_magic.get_job(job.id), watch=False)
    card.update(card.watcher.poll_once())
    table = JobsTable([tune_magic.get_job(job.id)], live=False)
    try:
        return card.text(), card.notes.value, card.error.value, table.text()
    finally:
        card.close()
        table.close()


def test_a_paused_controller_is_no_news_and_the_job_ends_with_its_true_status(cluster, fast, tmp_path):
    job = _launch(cluster, "steps=100", "step_s=0.2")
    _stepping(job)
    anchor = _empty_listing_s(tmp_path)
    paused_at = time.time()
    cluster.pause_controller()
    try:
        end = time.monotonic() + 7  # more than the grace period and its three answers
        while time.monotonic() < end:
            assert _fresh(job).status == "running" and job.record.ended_at is None, job.record
            time.sleep(0.3)
        note = job.engine_note
        assert note in _notes_from(paused_at), note
        listed, took = _listed(job.id)
        assert (listed["status"], listed["engine_note"]) == ("running", note)
        assert took - anchor < 4.0, (took, anchor)  # one bounded query at most, never squeue's 20 s
        card, notes, _, table = _card_and_table(job)
        assert note in notes and note in card and note in table
    finally:
        cluster.resume_controller()
    assert job.wait(TIMEOUT) == "succeeded", job.tail(20)
    exit_info = jobstore.read_exit_code(job.dir)
    assert (job.returncode, job.ended_at) == (0, exit_info.ended_at)
    assert job.engine_note is None and job.summary().step == 100


def test_a_killed_controller_then_back_and_stop_and_rm_act_through_slurm_whatever_the_record_says(
        cluster, fast, tmp_path):
    job = _launch(cluster, "steps=100000", "step_s=0.2")
    _stepping(job)
    slurm_id = job.engine_id
    cluster.kill_controller()
    try:
        for _ in range(6):
            assert _fresh(job).status == "running"
            time.sleep(0.5)
        listed, _ = _listed(job.id)
        assert listed["status"] == "running" and listed["engine_note"].startswith(NOT_ANSWERING)
    finally:
        cluster.restart_controller()
    slurm_sched.WATCHER.forget()
    wait_for(lambda: _fresh(job).engine_note is None, timeout=30, interval=0.5, what="SLURM answering again")
    assert job.status == "running" and cluster.job_state(slurm_id) == "RUNNING"
    # the record as the earlier code left it after such an outage: failed, while SLURM runs the job
    data = json.loads((job.dir / jobstore.RECORD).read_text())
    data.update(status="failed", ended_at=time.time(), error=f"SLURM no longer lists job {slurm_id}")
    (job.dir / jobstore.RECORD).write_text(json.dumps(data))
    r, _ = _cli("rm", job.id)
    assert r.returncode == 2 and "stop it first" in r.stderr, (r.stdout, r.stderr)
    r, _ = _cli("stop", "--grace", "2", job.id, timeout=TIMEOUT)
    assert r.returncode == 0 and r.stdout.split() == [job.id, "failed"], (r.stdout, r.stderr)
    # the stop's SIGTERM ends the batch script (FAILED: its exit code) or its cancel does (CANCELLED)
    assert cluster.wait_job(slurm_id, timeout=60) in ("CANCELLED", "FAILED")
    assert not [p for n in cluster.node_names for p in cluster.node_processes(n) if p.name() != "slurmd"]
    r, _ = _cli("rm", job.id)
    assert r.returncode == 0 and not job.dir.exists(), (r.stdout, r.stderr)
    cluster.started.remove(job)


def test_squeue_failing_while_the_job_is_cancelled_outside_never_fails_it_and_says_who_stopped_it(
        cluster, fast, first_on_path):
    job = _launch(cluster, "steps=100000", "step_s=0.2")
    _stepping(job)
    # squeue exits 1 saying the id is invalid (a controller after a failover that has not
    # recovered its jobs yet): only scontrol can tell; squeue's word alone is a doubt
    first_on_path("squeue", "echo 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    cluster.client(["scancel", job.engine_id])
    seen = set()
    end = time.monotonic() + 8
    while time.monotonic() < end:
        seen.add(str(_fresh(job).status))
        time.sleep(0.3)
    assert seen <= {"running", "stopped"} and job.status == "stopped", seen
    assert job.error == CANCELLED_OUTSIDE
    step = job.summary().step
    card, _, error, table = _card_and_table(job)
    assert f"stopped: {CANCELLED_OUTSIDE} at step {step}" in card and "by the user" not in card
    row = next(x for x in table.splitlines() if x.startswith(job.id))
    assert CANCELLED_OUTSIDE in error and row.split()[2] == "stopped" and row.rstrip().endswith(CANCELLED_OUTSIDE)
    r, _ = _cli("jobs")
    line = next(x for x in r.stdout.splitlines() if x.startswith(job.id))
    assert line.rstrip().endswith(CANCELLED_OUTSIDE), line


def test_squeue_exiting_0_with_nothing_is_not_an_answer(cluster, fast, first_on_path):
    job = _launch(cluster, "steps=40", "step_s=0.25")
    _stepping(job)
    first_on_path("squeue", "exit 0\n")
    seen = set()
    end = time.monotonic() + 5
    while time.monotonic() < end:
        seen.add(str(_fresh(job).status))
        time.sleep(0.3)
    assert seen == {"running"}, seen  # scontrol, asked in doubt, lists it running
    assert job.wait(TIMEOUT) == "succeeded" and job.returncode == 0


def test_a_transient_unknown_never_overwrites_the_end_time(cluster, monkeypatch, first_on_path):
    monkeypatch.setenv("TUNE_MAGIC_SLURM_INTERVAL_S", "0.5")
    job = _launch(cluster, "steps=2", "step_s=0.2", "linger_s=12")
    wait_for(lambda: "toy recipe done" in "\n".join(job.tail(20)), timeout=TIMEOUT, interval=0.3,
             what="the job's last step (it then lingers silently)")
    # for a few seconds the controller says it knows no such job (squeue and scontrol both)
    first_on_path("squeue", "exit 0\n")
    first_on_path("scontrol", "echo 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    wait_for(lambda: _fresh(job).status == "unknown", timeout=20, interval=0.3, what="outcome unknown")
    assert job.record.ended_at is None
    # the exit file settles it, even after unknown (wait() returns at unknown: nothing of it is live)
    wait_for(lambda: _fresh(job).status == "succeeded", timeout=60, interval=0.3, what="the exit file's end",
             describe=lambda: (job.status, job.tail(5)))
    exit_info = jobstore.read_exit_code(job.dir)
    assert job.ended_at == exit_info.ended_at and job.elapsed_s > 12, (job.elapsed_s, job.record)


def test_a_hanging_squeue_costs_one_bounded_query_shared_by_every_job_and_process(cluster, monkeypatch, tmp_path,
                                                                                 first_on_path):
    monkeypatch.setenv("TUNE_MAGIC_SLURM_INTERVAL_S", "5")
    held = [_launch(cluster, "steps=1", sbatch=["--hold"]) for _ in range(3)]
    wait_for(lambda: all(_fresh(j).status == "pending" for j in held), timeout=30, interval=0.3, what="held jobs")
    anchor = _empty_listing_s(tmp_path)
    calls = tmp_path / "squeue-calls"
    hung_at = time.time()  # SLURM stops answering from here: the note names this minute (or the next)
    first_on_path("squeue", f"echo x >> {calls}\nexec sleep {SLEEP_MARK}\n")
    time.sleep(5.2)  # the answer this process keeps on disk is older than the interval now
    r, took = _cli("jobs", "--json")
    assert took - anchor <= 3.5, (took, anchor)  # one query, at most 3 s, for all three jobs
    listed = {j["id"]: j for j in json.loads(r.stdout)}
    for j in held:
        assert listed[j.id]["status"] == "pending"  # the last known state
        assert listed[j.id]["engine_note"] in _notes_from(hung_at), listed[j.id]
    assert len(calls.read_text().split()) == 1
    r, took = _cli("jobs")  # another process within the interval reads the answer kept on disk
    assert took - anchor < 1.5 and len(calls.read_text().split()) == 1, took
    assert NOT_ANSWERING in r.stdout
    t0 = time.monotonic()
    _card_and_table(held[0])  # a card and a table in this process: one bounded query between them
    assert time.monotonic() - t0 < 4.0
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", SLEEP_MARK]]


def test_a_requeued_job_is_pending_with_slurms_reason_and_its_wait_is_not_elapsed(cluster, fast):
    job = _launch(cluster, "steps=100000", "step_s=0.2", sbatch=["--requeue"])
    _stepping(job)
    cluster.client(["scontrol", "requeue", job.engine_id])
    slurm_sched.WATCHER.forget()
    wait_for(lambda: _fresh(job).status == "pending", timeout=60, interval=0.3, what="pending after the requeue")
    assert job.pending_reason == "BeginTime" and job.summary().step  # the first attempt's steps do not outvote SLURM
    waited_from = job.elapsed_s
    time.sleep(4)
    assert _fresh(job).status == "pending" and job.elapsed_s - waited_from < 1.0, (waited_from, job.elapsed_s)
    cluster.client(["scontrol", "update", f"jobid={job.engine_id}", "StartTime=now"])
    wait_for(lambda: _fresh(job).status == "running", timeout=60, interval=0.3, what="running again")
    assert job.record.backend["restarts"] == 1 and job.record.backend["waited_s"] >= 4
    assert job.stop(grace_s=2) == "stopped"


def test_srun_variables_of_the_kernels_allocation_stay_out_unless_named(cluster):
    env = {**os.environ, "SRUN_CPUS_PER_TASK": "4"}  # a kernel inside an allocation, as sites advise
    ok = tune_magic.launch(toy_args("steps=2", nproc=1), scheduler="slurm", nodes=1, env=env)
    named = tune_magic.launch(toy_args("steps=2", nproc=1), scheduler="slurm", nodes=1, env=env,
                              sbatch=["--export=SRUN_CPUS_PER_TASK"])
    cluster.started += [ok, named]
    assert ok.wait(TIMEOUT) == "succeeded", ok.tail(20)
    assert named.wait(TIMEOUT) == "failed"
    first = named.error
    assert first.startswith("srun: error: Unable to create step for job ") and \
        first.endswith("More processors requested than permitted"), first
    card, _, error, _ = _card_and_table(named)
    assert card.splitlines()[1] == first and first in error


def test_user_words_reach_the_recipe_as_typed_with_a_percent_in_the_home(cluster, monkeypatch):
    home = cluster.shared_dir / "100%home"
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(home))
    cfg_dir = cluster.shared_dir / "cfg-${SLURM_JOB_ID}"
    cfg_dir.mkdir(exist_ok=True)
    config = cfg_dir / "toy.yaml"
    shutil.copy(TOY_CONFIG, config)
    work = cluster.shared_dir / "wd-${SLURM_JOB_ID} %j"
    work.mkdir(exist_ok=True)
    typed = {"warning": "\\${SLURM_JOB_ID} \\${TUNE_MAGIC_RDZV_ENDPOINT} $(hostname) `id` $HOME",
             "checkpointer.recipe_checkpoint": "\\${SLURM_JOB_NUM_NODES}%j"}
    job = tune_magic.launch([str(TOY_RECIPE), "--config", str(config), "steps=2",
                             *(f"{k}={v}" for k, v in typed.items())],
                            scheduler="slurm", nodes=1, cpus_per_node=1, cwd=work)
    cluster.started.append(job)
    assert job.wait(TIMEOUT) == "succeeded", job.tail(30)
    assert Path(job.log_path).is_relative_to(home) and Path(job.log_path).stat().st_size > 0
    script = (job.dir / "job.sbatch").read_text()
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    import yaml

    # the recipe's resolved config, read as plain YAML (OmegaConf would take "${...}" as an interpolation)
    resolved = yaml.safe_load((Path(job.output_dir) / "resolved_config.yaml").read_text())
    assert resolved["warning"] == "${SLURM_JOB_ID} ${TUNE_MAGIC_RDZV_ENDPOINT} $(hostname) `id` $HOME"
    assert resolved["checkpointer"]["recipe_checkpoint"] == "${SLURM_JOB_NUM_NODES}%j"


def test_a_sweep_stop_slurm_never_took_leaves_the_sweep_finished_with_its_trials_true_ends(cluster, first_on_path,
                                                                                          tmp_path):
    # issue 30: `stop SWEEP` while the controller did not answer said the cancel was not taken; the tasks
    # then ran and succeeded, and the sweep read "stopped" with "3 succeeded". scancel fails here as it
    # does against an unreachable controller (a paused one takes the cancel late, when it resumes)
    sweep = tune_magic.sweep(toy_args("start_loss=1,2", "steps=12", "step_s=0.5", nproc=1), scheduler="slurm",
                             max_parallel=2, cpus_per_node=1, cwd=tmp_path)
    cluster.started.extend(sweep.jobs)
    wait_for(lambda: [str(t.status) for t in sweep.trials] == ["running"] * 2, timeout=TIMEOUT, interval=0.3,
             what="both tasks running", describe=lambda: [str(t.status) for t in sweep.trials])
    first_on_path("scancel", "echo 'scancel: error: Kill job error on job id 1: Unable to contact slurm controller "
                             "(connect failure)' >&2\nexit 1\n")
    with pytest.raises(slurm_sched.ControllerUnreachable, match="SLURM did not take the cancel"):
        sweep.stop(grace_s=1)
    assert sweep.wait(TIMEOUT) == {"succeeded": 2}
    assert sweep.status == "finished" and sweep.record.stop_requested_at is not None
    assert sweep.note.startswith("the stop asked at ") and sweep.note.endswith(
        "did not take: the trials ran to their own ends")
    r, _ = _cli("sweeps")
    (line,) = [row for row in r.stdout.splitlines() if row.startswith(sweep.id)]
    assert " finished " in line and line.endswith("2 succeeded"), line
    assert r.stderr.count(f"{sweep.id}: the stop asked at ") == 1, r.stderr
