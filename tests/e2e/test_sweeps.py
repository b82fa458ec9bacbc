"""Sweeps end to end, with real jobs: the tiny LoRA recipe and the stand-in recipe, the sweep process,
a real Jupyter kernel, the CLI.

- 4 tiny LoRA trials, 2 at a time: each trial's losses equal, step for step, those of the same
  overrides run alone; never more than 2 at once; one output_dir, log and record each.
- the kernel killed mid-sweep, then the sweep process SIGKILLed mid-sweep: the sweep goes on, a
  listing starts its process again (only one), and every trial runs exactly once (counted from the
  records and from the lines each trial's recipe appends to one shared file).
- a failing trial does not stop the others; stop of a sweep stops every trial and queued ones never start.
- trials never start on GPUs another live job holds (FAKE nvidia-smi: there is no GPU here).
- the CLI: run --sweep, sweeps, jobs --sweep, jobs, metrics S --csv, stop S.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import tune_magic
from tune_magic.registry import store as jobstore
from tune_magic.sweeping import store as sweepstore
from tune_magic.registry.outcome import LAUNCH_INTERRUPTED

from jobhelpers import TOY_CONFIG, TOY_RECIPE, processes_mentioning, toy_args, write_fake_nvidia_smi
from kernelhelpers import Kernel
from waiting import wait_for

TOY = f"{TOY_RECIPE} --config {TOY_CONFIG}"
TIMEOUT = 600


def cli(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tune_magic", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def trial_jobs(sweep_id: str, *, ran: bool = False) -> dict[int, list[str]]:
    """Trial index -> ids of the registry's jobs for it (exactly one each when nothing ran twice).
    With ``ran``, a job whose launch was interrupted before it started (the sweep process killed
    between its registration and its start: it never ran, and its trial was queued again) is left out."""
    out: dict[int, list[str]] = {}
    for r in jobstore.list_records():
        if r.sweep and r.sweep["id"] == sweep_id and not (ran and r.error == LAUNCH_INTERRUPTED):
            out.setdefault(r.sweep["trial"], []).append(r.id)
    return out


def runners(sweep_id: str) -> list[psutil.Process]:
    """The live sweep processes of ``sweep_id``."""
    out = []
    for p in processes_mentioning(sweep_id):
        try:
            if "tune_magic.sweeping.runner" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:  # it exited meanwhile
            continue
    return out


def most_at_once(jobs) -> int:
    """The most jobs whose [started_at, ended_at] intervals overlap at one moment."""
    events = sorted([(j.started_at, 1) for j in jobs] + [(j.ended_at, -1) for j in jobs])
    now = most = 0
    for _, change in events:
        now += change
        most = max(most, now)
    return most


@pytest.fixture
def stop_sweeps():
    """Sweeps a test starts; any still running at the end are stopped."""
    started: list = []
    yield started
    for s in started:
        try:
            s.stop(grace_s=2)
        except Exception:  # noqa: BLE001 - best-effort cleanup
            pass


def losses(job) -> list[tuple[int, float]]:
    return [(p["step"], p["value"]) for p in job.metrics() if p["name"] == "loss"]


@pytest.mark.timeout(TIMEOUT)
def test_four_tiny_lora_trials_two_at_a_time_equal_the_same_runs_alone(tmp_path, tiny_assets, stop_sweeps):
    sweep = tune_magic.sweep("lora_finetune --config tiny/lora optimizer.lr=1e-3,2e-3 seed=1,2 max_steps_per_epoch=4",
                             max_parallel=2, name="lr-seed", cwd=tmp_path)
    stop_sweeps.append(sweep)
    assert sweep.wait(TIMEOUT) == {"succeeded": 4}
    jobs = sweep.jobs
    assert [j.name for j in jobs] == ["lr=1e-3,seed=1", "lr=1e-3,seed=2", "lr=2e-3,seed=1", "lr=2e-3,seed=2"]
    assert most_at_once(jobs) == 2
    for field in ("output_dir", "log_path"):  # each trial a normal job: its own output_dir, log, record
        assert len({getattr(j, field) for j in jobs}) == 4
    assert all(j.output_dir.endswith(j.id) and j.record.sweep["id"] == sweep.id for j in jobs)
    # the same overrides run alone give the same losses, step for step
    alone = tune_magic.launch("lora_finetune --config tiny/lora optimizer.lr=2e-3 seed=2 max_steps_per_epoch=4",
                              name="alone", cwd=tmp_path)
    assert alone.wait(300) == "succeeded"
    assert losses(alone) == losses(jobs[3]) and len(losses(alone)) == 4
    assert losses(jobs[0]) != losses(jobs[3])  # the axes did change the run
    frame = sweep.frame()
    assert list(frame.columns) == ["name", "optimizer.lr", "seed", "status", "job_id", "steps", "final_loss",
                                   "min_loss", "best_val_loss"]
    assert frame["best_val_loss"].isna().all() and frame.attrs["ranked_by"] == "final_loss"  # no trial validates
    assert frame["optimizer.lr"].tolist() == [0.001, 0.001, 0.002, 0.002] and frame["seed"].tolist() == [1, 2, 1, 2]
    assert frame["steps"].tolist() == [4] * 4
    for i, job in enumerate(jobs):
        values = [v for _, v in losses(job)]
        assert frame.loc[i, "final_loss"] == values[-1] and frame.loc[i, "min_loss"] == min(values)
    best = sweep.best()  # the lowest final loss (no ties here)
    assert best.trial.index == int(frame["final_loss"].idxmin()) and best.final_loss == frame["final_loss"].min()
    assert best.ranked_by == "final_loss" and sweep.ranking().note is None
    # %tune_jobs shows each trial with its sweep
    from tune_magic.ui.views import JobsTable

    table = JobsTable(jobs, live=False)
    assert [table.summaries[j.id][0] for j in jobs] == [f"{j.name} · sweep lr-seed #{i}" for i, j in enumerate(jobs)]
    table.close()


@pytest.mark.timeout(TIMEOUT)
def test_kernel_killed_then_sweep_process_killed_every_trial_still_runs_exactly_once(tmp_path, stop_sweeps):
    times = tmp_path / "steps.txt"  # each trial's recipe appends "step,time" here at each of its steps
    kernel = Kernel(cwd=str(tmp_path))
    try:
        kernel.run("%load_ext tune_magic")
        kernel.run(f"%%tune_run --sweep --max-parallel 2 --name survivor {TOY}\nstart_loss=1,2,3,4,5,6\nsteps=4\n"
                   f"step_s=0.6\nwrite_times_file={times}\n")
        sweep_id = kernel.value("_.id")
        sweep = tune_magic.get_sweep(sweep_id)
        stop_sweeps.append(sweep)
        wait_for(lambda: len(trial_jobs(sweep_id)) >= 2, 120, what="two trials to start")
        os.kill(kernel.pid, signal.SIGKILL)  # the kernel dies mid-sweep
    finally:
        kernel.shutdown()
    # the sweep goes on without it: a third trial starts after the kernel's death
    wait_for(lambda: len(trial_jobs(sweep_id)) >= 3, 120, what="a trial to start after the kernel died")
    (runner,) = runners(sweep_id)
    runner.kill()  # the sweep process dies mid-sweep (SIGKILL)
    runner.wait(10)
    started = len(trial_jobs(sweep_id))
    assert started < 6 and not sweepstore.runner_alive(sweepstore.sweep_dir(sweep_id))
    time.sleep(3)  # nothing starts trials while no sweep process runs
    assert len(trial_jobs(sweep_id)) == started
    # the next listing starts a new one; two listings at once still give one process
    listings = [subprocess.Popen([sys.executable, "-m", "tune_magic", "jobs"], stdout=subprocess.DEVNULL)
                for _ in range(2)]
    for p in listings:
        assert p.wait(120) == 0
    wait_for(lambda: len(runners(sweep_id)) == 1, 30, what="one sweep process again")
    counts = tune_magic.get_sweep(sweep_id).wait(TIMEOUT)
    assert counts == {"succeeded": 6}
    # the sweep process may die between a trial's registration and its start: that job never ran,
    # and the trial was queued again (once), so each trial has exactly one job that ran
    assert {i: len(ids) for i, ids in trial_jobs(sweep_id, ran=True).items()} == dict.fromkeys(range(6), 1)
    trials = tune_magic.get_sweep(sweep_id).refresh().record.trials
    for index, ids in trial_jobs(sweep_id).items():
        never_ran = [i for i in ids if i not in trial_jobs(sweep_id, ran=True)[index]]
        assert never_ran == ([trials[index].interrupted_job] if trials[index].interrupted_job else [])
    steps = [line.split(",")[0] for line in times.read_text().splitlines()]
    assert sorted(steps) == sorted(["1", "2", "3", "4"] * 6)  # 6 trials x 4 steps, each once
    assert most_at_once(tune_magic.get_sweep(sweep_id).jobs) <= 2
    wait_for(lambda: not runners(sweep_id), 30, what="the sweep process to exit")
    assert sweepstore.is_done(sweepstore.sweep_dir(sweep_id))


@pytest.mark.timeout(TIMEOUT)
def test_a_failing_trial_does_not_stop_the_others(stop_sweeps):
    sweep = tune_magic.sweep(f"{TOY} crash_rank=null,0 start_loss=1,2 steps=3 step_s=0.1 crash_step=2",
                             max_parallel=2)
    stop_sweeps.append(sweep)
    assert sweep.wait(240) == {"succeeded": 2, "failed": 2}
    statuses = {t.name: t.status for t in sweep.trials}
    assert statuses == {"crash_rank=null,start_loss=1": "succeeded", "crash_rank=null,start_loss=2": "succeeded",
                        "crash_rank=0,start_loss=1": "failed", "crash_rank=0,start_loss=2": "failed"}
    assert all("toy recipe crashed on purpose" in t.error for t in sweep.trials if t.status == "failed")
    best = sweep.best()  # among the trials that succeeded (a failed one logged step 1 only)
    assert (best.trial.name, best.steps) == ("crash_rank=null,start_loss=1", 3)
    assert best.final_loss == pytest.approx(1 / 3, rel=1e-4)


def one_running_two_queued(stop_sweeps, steps: str):
    """A sweep of three toy trials, one at a time, once trial 0 runs and trials 1-2 are queued."""
    sweep = tune_magic.sweep(f"{TOY} start_loss=1,2,3 {steps}", max_parallel=1)
    stop_sweeps.append(sweep)
    wait_for(lambda: [t.status for t in sweep.refresh().trials] == ["running", "queued", "queued"], timeout=120,
             interval=0.2, what="trial 0 running, 1-2 queued", describe=lambda: [t.status for t in sweep.trials])
    return sweep


@pytest.mark.timeout(TIMEOUT)
def test_a_sweep_record_cut_in_half_while_trial_0_runs_is_rebuilt_and_every_trial_runs(stop_sweeps):
    # issue 30: the sweep process exited with a CorruptRecord traceback, trials 1 and 2 never started,
    # `tune-magic sweeps` showed only "damaged sweep record" and stop refused
    sweep = one_running_two_queued(stop_sweeps, "steps=3 step_s=0.5")
    path = sweep.dir / sweepstore.SWEEP_FILE
    full = path.read_bytes()
    path.write_bytes(full[: len(full) // 2])
    listed = cli("sweeps")
    assert listed.returncode == 0 and sweep.id in listed.stdout and "damaged" not in listed.stdout, listed
    assert sweep.wait(240) == {"succeeded": 3}
    assert {i: len(ids) for i, ids in trial_jobs(sweep.id).items()} == {0: 1, 1: 1, 2: 1}  # each ran once
    repaired = json.loads(path.read_text())  # written back whole by the sweep process
    assert [t["status"] for t in repaired["trials"]] == ["started"] * 3
    assert any("sweep.json was damaged" in w for w in repaired["warnings"])
    assert "Traceback" not in (sweep.dir / sweepstore.RUNNER_LOG).read_text()


@pytest.mark.timeout(TIMEOUT)
def test_a_sweep_whose_record_and_backup_are_damaged_is_listed_with_its_trials_and_stoppable(stop_sweeps):
    sweep = one_running_two_queued(stop_sweeps, "steps=200 step_s=0.2")
    good = (sweep.dir / sweepstore.SWEEP_FILE).read_bytes()
    try:
        (first,) = trial_jobs(sweep.id)[0]
        # the copy first: the sweep process repairs a damaged record from an intact copy at its next look
        for name in (sweepstore.BACKUP_FILE, sweepstore.SWEEP_FILE):
            (sweep.dir / name).write_text("{")
        listed = cli("sweeps")
        assert listed.returncode == 0 and f"{sweep.id}: damaged sweep record (1 trial(s) started" in listed.stderr
        stopped = cli("stop", "--grace", "2", sweep.id)
        assert stopped.returncode == 0 and stopped.stdout.split() == [sweep.id, "1", "stopped"], stopped
        assert "queued ones are unknown and never start" in stopped.stderr
        assert tune_magic.get_job(first).status == "stopped"
        wait_for(lambda: not runners(sweep.id), timeout=60, interval=0.2, what="the sweep process to end")
        cli("sweeps")  # a listing starts no process for it again
        time.sleep(2)
        assert not runners(sweep.id) and list(trial_jobs(sweep.id)) == [0]  # trials 1-2 never started
        assert "Traceback" not in (sweep.dir / sweepstore.RUNNER_LOG).read_text()
    finally:  # the session's registry keeps no damaged sweep for later tests, even when this one fails
        for name in (sweepstore.SWEEP_FILE, sweepstore.BACKUP_FILE):
            (sweep.dir / name).write_bytes(good)


@pytest.mark.timeout(TIMEOUT)
def test_a_trial_whose_launch_was_interrupted_before_it_ran_is_queued_again_once(stop_sweeps):
    # issue 30: the sweep process died between a trial's registration and its start; the trial ended
    # "failed: the launch was interrupted" and was never run, though no trial may be lost
    from tune_magic import faultpoints

    sweep = tune_magic.sweep(f"{TOY} start_loss=1,2 steps=2 step_s=0.1", max_parallel=1,
                             env={**os.environ, faultpoints.KILL_ENV: "registered"})
    stop_sweeps.append(sweep)
    wait_for(lambda: trial_jobs(sweep.id).get(0) and not runners(sweep.id), timeout=120, interval=0.2,
             what="the sweep process killed right after registering trial 0")
    first = tune_magic.get_job(trial_jobs(sweep.id)[0][0])
    sweepstore.write_env(sweep.dir, dict(os.environ))  # the next sweep process runs without the fault
    assert sweep.revive()
    assert sweep.wait(240) == {"succeeded": 2}
    assert (first.refresh().status, first.error) == ("failed", LAUNCH_INTERRUPTED)
    zero = sweep.refresh().record.trials[0]
    assert zero.interrupted_job == first.id and zero.job_id != first.id
    assert sorted(len(ids) for ids in trial_jobs(sweep.id).values()) == [1, 2]  # trial 0 ran once, again
    assert "never ran (its launch was interrupted); queued again" in (sweep.dir / sweepstore.RUNNER_LOG).read_text()


@pytest.mark.timeout(TIMEOUT)
def test_trials_never_start_on_gpus_another_live_job_holds_with_FAKE_gpus(tmp_path, monkeypatch, stop_sweeps,
                                                                          cleanup_jobs):
    write_fake_nvidia_smi(tmp_path / "bin", 2)  # FAKE: there is no GPU here; the toy recipe never uses one
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    other = tune_magic.launch(toy_args("steps=40", "step_s=0.25", nproc=None), gpus="0", name="holds GPU 0")
    cleanup_jobs.append(other)
    sweep = tune_magic.sweep(f"{TOY} start_loss=1,2,3 steps=2 step_s=0.1", gpus="0,1", gpus_per_trial=1)
    stop_sweeps.append(sweep)
    assert sweep.max_parallel == 2
    waiting = wait_for(lambda: next((t.waiting for t in sweepstore.read(sweep.dir).trials if t.waiting), None), 120,
                       what="a trial to wait for GPU 0")
    assert f"GPU 0 is used by running job {other.id}" in waiting
    wait_for(lambda: len(trial_jobs(sweep.id)) >= 2, 120, what="two trials on GPU 1")
    assert other.status == "running"
    assert all(j.gpus == [1] for j in sweep.jobs)  # GPU 0 is the other job's while it lives
    other.stop(grace_s=2)
    assert sweep.wait(240) == {"succeeded": 3}
    ended = other.ended_at
    assert all(j.gpus == [1] or j.started_at >= ended for j in sweep.jobs)


@pytest.mark.timeout(TIMEOUT)
def test_cli_run_sweeps_jobs_metrics_and_stop(stop_sweeps):
    r = cli("run", "--sweep", "--max-parallel", "2", "--name", "cli-grid", *TOY.split(), "start_loss=1,2,3", "steps=3",
            "step_s=0.3")
    assert r.returncode == 0, r.stderr
    sweep_id = r.stdout.strip()
    sweep = tune_magic.get_sweep(sweep_id)
    stop_sweeps.append(sweep)
    assert sweepstore.is_sweep_id(sweep_id) and sweep.name == "cli-grid"
    listed = cli("jobs", "--sweep", "cli-grid")
    assert listed.returncode == 0 and listed.stdout.startswith(f"sweep cli-grid ({sweep_id}): ")
    rows = listed.stdout.splitlines()[2:5]
    assert [row.split()[:2] for row in rows] == [["0", "1"], ["1", "2"], ["2", "3"]]
    assert "queued" in rows[2] or "running" in rows[2] or "succeeded" in rows[2]
    assert sweep.wait(240) == {"succeeded": 3}
    data = json.loads(cli("jobs", "--sweep", sweep_id, "--json").stdout)
    assert [t["status"] for t in data["trials"]] == ["succeeded"] * 3 and data["best"] == 0
    sweeps = cli("sweeps").stdout.splitlines()
    (line,) = [s for s in sweeps if s.startswith(sweep_id)]
    assert line.split()[1:5] == ["cli-grid", "finished", "3", "2"] and line.endswith("3 succeeded")
    jobs = cli("jobs").stdout.splitlines()
    assert jobs[0].split()[:4] == ["ID", "NAME", "SWEEP", "STATUS"]
    assert sum(1 for j in jobs if "cli-grid #" in j) == 3
    metrics = cli("metrics", "cli-grid", "--csv")
    assert metrics.returncode == 0, metrics.stderr
    table = list(csv.DictReader(io.StringIO(metrics.stdout)))
    assert list(table[0]) == ["trial", "job_id", "start_loss", "step", "name", "value", "epoch", "source"]
    loss = {(row["start_loss"], int(row["step"])): float(row["value"]) for row in table if row["name"] == "loss"}
    assert loss == {(str(a), s): a / s for a in (1, 2, 3) for s in (1, 2, 3)}

    # stop: running trials are stopped, queued ones never start
    r = cli("run", "--sweep", "--max-parallel", "2", *TOY.split(), "start_loss=1,2,3,4", "steps=400", "step_s=0.2")
    long_id = r.stdout.strip()
    stop_sweeps.append(tune_magic.get_sweep(long_id))
    wait_for(lambda: len(trial_jobs(long_id)) == 2 and all(
        tune_magic.get_job(i[0]).summary().step for i in trial_jobs(long_id).values()), 120,
             what="two trials to run")
    stopped = cli("stop", long_id, "--grace", "2")
    assert stopped.returncode == 0 and stopped.stdout.strip() == f"{long_id} 2 stopped, 2 cancelled"
    time.sleep(3)
    assert len(trial_jobs(long_id)) == 2 and not runners(long_id)
    assert [t.status for t in tune_magic.get_sweep(long_id).trials] == ["stopped", "stopped", "cancelled", "cancelled"]
    assert not processes_mentioning(long_id) and all(
        not processes_mentioning(ids[0]) for ids in trial_jobs(long_id).values())
