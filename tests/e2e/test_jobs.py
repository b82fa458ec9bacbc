"""Background jobs with real torchrun processes: the two-jobs-on-one-node scenario, stop, reattach.

The core scenario and its negative control use the project's LoRA recipe on the tiny assets; the
lifecycle tests use a test-only recipe (tests/recipes/toy_recipe.py: real torchrun workers with a
gloo process group, no model) to keep the suite fast.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import tune_magic.job as J
import tune_magic.job.launch as L
from tune_magic.schedulers.local import procs
from tune_magic import errors
from tune_magic.registry import store as jobstore
from tune_magic.errors import PlanError

from jobhelpers import listening_on, processes_mentioning, toy_args
from waiting import wait_for

LORA = "--nproc_per_node 2 lora_finetune --config tiny/lora max_steps_per_epoch=6"
TIMEOUT = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def disklogger_lines(job: J.Job) -> list[str]:
    files = sorted(Path(job.record.metric_log_dir).glob("log_*.txt"))
    return [l for f in files for l in f.read_text().splitlines() if l.startswith("Step ")]


def assert_no_orphans(job: J.Job) -> None:
    r = job.refresh().record
    for ref in [r.agent, r.supervisor, *r.workers]:
        assert procs.alive(ref) is None, f"process {ref} of job {job.id} still alive"
    assert processes_mentioning(job.id) == []


def test_two_jobs_same_config_overlap_and_both_succeed(tiny_assets, cleanup_jobs):
    a = L.launch(LORA, name="a")
    b = L.launch(LORA, name="b")
    cleanup_jobs += [a, b]
    assert a.status == "running" and b.status == "running"  # launch returned while both run
    assert (a.wait(TIMEOUT), b.wait(TIMEOUT)) == ("succeeded", "succeeded"), (a.tail(30), b.tail(30))
    ra, rb = a.record, b.record
    assert ra.started_at < rb.ended_at and rb.started_at < ra.ended_at  # they overlapped in time
    assert (ra.returncode, rb.returncode) == (0, 0)
    assert ra.rendezvous == rb.rendezvous == "standalone"
    port_a, port_b = (int(r.rendezvous_endpoint.rsplit(":", 1)[1]) for r in (ra, rb))
    assert port_a != port_b
    assert ra.output_dir != rb.output_dir
    assert ra.output_dir.endswith(a.id) and rb.output_dir.endswith(b.id)
    for job in (a, b):
        steps = [int(l.split()[1]) for l in disklogger_lines(job)]
        assert steps == [1, 2, 3, 4, 5, 6]
        assert len(job.record.workers) == 2 and sorted(w.rank for w in job.record.workers) == [0, 1]
        assert_no_orphans(job)


def test_negative_control_shared_master_port_second_fails_eaddrinuse(tiny_assets, cleanup_jobs):
    port = free_port()
    a = L.launch(f"--master_port {port} {LORA.replace('max_steps_per_epoch=6', 'max_steps_per_epoch=200')}")
    cleanup_jobs.append(a)
    wait_for(lambda: listening_on(port), timeout=60, what=f"job {a.id}'s rendezvous to listen on port {port}")
    with pytest.raises(PlanError, match=f"port {port} of your rendezvous endpoint is the rendezvous of running job"):
        L.launch(f"--master_port {port} {LORA}")  # refused before it starts ...
    b = L.launch(f"--master_port {port} {LORA}", force=True)  # ... unless forced: then it fails as it would
    cleanup_jobs.append(b)
    assert b.wait(TIMEOUT) == "failed"
    assert "EADDRINUSE" in b.error
    assert a.status == "running"
    assert a.stop(grace_s=5) == "stopped"
    assert a.record.rendezvous == "user" and a.record.rendezvous_endpoint == f"127.0.0.1:{port}"


def test_stop_leaves_no_process_and_frees_the_port_5_times(cleanup_jobs):
    for attempt in range(5):
        job = L.launch(toy_args("steps=1000", "step_s=0.1"))
        cleanup_jobs.append(job)
        wait_for(lambda: len(job.refresh().record.workers) >= 2 and job.record.rendezvous_endpoint, timeout=60,
                 what=f"2 workers and the endpoint of {job.id}", describe=lambda: job.tail(20))
        port = int(job.rendezvous_endpoint.rsplit(":", 1)[1])
        pids = [w.pid for w in job.record.workers] + [job.pid]
        assert all(psutil.pid_exists(p) for p in pids)
        assert job.stop(grace_s=5) == "stopped", attempt
        assert_no_orphans(job)
        assert listening_on(port) == []


def test_stop_real_lora_job(tiny_assets, cleanup_jobs):
    job = L.launch(LORA.replace("max_steps_per_epoch=6", "max_steps_per_epoch=500"))
    cleanup_jobs.append(job)
    wait_for(lambda: len(job.refresh().record.workers) >= 2, timeout=120, interval=0.2, what=f"2 workers of {job.id}")
    assert job.stop(grace_s=10) == "stopped"
    assert_no_orphans(job)


def test_case7_gpus_reach_the_workers_environment_only(fake_gpus, cleanup_jobs):
    before = dict(os.environ)
    job = L.launch(toy_args("steps=1000", "step_s=0.1", nproc=None), gpus="2,3")
    cleanup_jobs.append(job)
    wait_for(lambda: len(job.refresh().record.workers) >= 2, timeout=60, what=f"2 workers of {job.id}",
             describe=lambda: job.tail(20))
    for w in job.record.workers:
        environ = Path(f"/proc/{w.pid}/environ").read_bytes().split(b"\0")
        assert b"CUDA_VISIBLE_DEVICES=2,3" in environ
    assert job.gpus == [2, 3]
    assert dict(os.environ) == before
    # the same GPUs are busy now; auto picks the free ones
    with pytest.raises(PlanError, match="GPU 2 is used by running job"):
        L.launch(toy_args(nproc=None), gpus="2,3")
    assert L.launch(toy_args(nproc=None), gpus="auto", dry_run=True).gpus == [0]  # one process: one GPU
    auto = L.launch(toy_args("steps=1000", "step_s=0.1", nproc=2), gpus="auto")
    cleanup_jobs.append(auto)
    assert auto.gpus == [0, 1]
    assert job.stop(grace_s=5) == auto.stop(grace_s=5) == "stopped"


def test_case6_custom_recipe_from_another_cwd(tmp_path, monkeypatch, cleanup_jobs):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "my_components.py").write_text("VALUE = 'from-components'\n")
    (proj / "my_recipe.py").write_text(textwrap.dedent("""
        import os, sys
        import my_components  # next to the recipe
        cfg = dict(a.split("=", 1) for a in sys.argv[3:])
        os.makedirs(cfg["output_dir"], exist_ok=True)
        open(os.path.join(cfg["output_dir"], f"rank{os.environ.get('RANK', '0')}.txt"), "w").write(my_components.VALUE)
    """))
    (proj / "my.yaml").write_text(f"output_dir: {tmp_path}/out\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for args, files in [("my_recipe.py --config my.yaml", ["rank0.txt"]),
                        ("--nproc_per_node 2 my_recipe.py --config my.yaml", ["rank0.txt", "rank1.txt"])]:
        job = L.launch(args, cwd=proj)
        cleanup_jobs.append(job)
        assert job.wait(TIMEOUT) == "succeeded", job.tail(30)
        out = Path(job.output_dir)
        assert out == tmp_path / "out" / job.id
        assert sorted(p.name for p in out.iterdir()) == files
        assert all((out / f).read_text() == "from-components" for f in files)


def test_rank1_crash_is_failed_with_rank_and_message(cleanup_jobs):
    job = L.launch(toy_args("crash_rank=1", "'crash_message=rank one blew up on purpose'"))
    cleanup_jobs.append(job)
    assert job.wait(TIMEOUT) == "failed"
    assert job.returncode != 0
    assert job.error == "rank 1: RuntimeError: rank one blew up on purpose"
    assert_no_orphans(job)  # regression: the supervisor was still exiting when wait() returned
    zombies = [p.pid for p in psutil.Process().children() if p.status() == psutil.STATUS_ZOMBIE]
    assert job.record.supervisor.pid not in zombies  # regression: ended supervisors stayed zombies


LAUNCHER = """
import sys, time
import tune_magic.job as J
import tune_magic.job.launch as L
from tune_magic.schedulers.local import procs
from tune_magic import errors
job = L.launch(sys.argv[1])
print(job.id, flush=True)
if sys.argv[2] == "hang":
    time.sleep(600)
"""


@pytest.mark.parametrize("how", ["exits", "sigkill"])
def test_job_outlives_its_launcher_and_is_managed_from_another_process(how, cleanup_jobs):
    steps = "steps=15" if how == "exits" else "steps=1000"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, toy_args(steps, "step_s=0.1"),
                                 "exit" if how == "exits" else "hang"], stdout=subprocess.PIPE, text=True)
    job_id = launcher.stdout.readline().strip()
    if how == "sigkill":
        launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=60)
    job = J.get_job(job_id)  # this process never launched it
    cleanup_jobs.append(job)
    assert job_id in [j.id for j in J.jobs()]
    if how == "exits":
        assert job.wait(TIMEOUT) == "succeeded"
        assert job.returncode == 0
        assert job.tail(1) == ["toy recipe done"]
    else:
        assert job.status == "running"
        wait_for(lambda: "|" in "".join(job.tail(5)), timeout=60, interval=0.2,  # followed: its progress shows up
                 what=f"progress in {job.id}'s log")
        assert job.stop(grace_s=5) == "stopped"
        assert_no_orphans(job)


def test_bad_input_starts_and_signals_nothing(fake_gpus, cleanup_jobs, tmp_path):
    job = L.launch(toy_args("steps=1000", "step_s=0.1", f"output_dir={tmp_path}/shared"))
    cleanup_jobs.append(job)
    before = {r.id for r in jobstore.list_records()}
    cases = [
        (lambda: J.get_job("a/b"), PlanError, "not valid"),
        (lambda: J.get_job(".."), PlanError, "not valid"),
        (lambda: J.get_job("20990101-000000-abcdef"), errors.JobNotFound, "no job"),
        (lambda: L.launch(toy_args(nproc=None), gpus="7"), PlanError, "GPU 7 does not exist"),
        (lambda: L.launch(toy_args(f"output_dir={tmp_path}/shared")), PlanError, "would share .* with running job"),
        (lambda: L.launch("--nnodes 2 " + toy_args()), PlanError, "endpoint"),
    ]
    for call, exc, words in cases:
        with pytest.raises(exc, match=words):
            call()
    assert {r.id for r in jobstore.list_records()} == before
    assert job.status == "running"
    forced = L.launch(toy_args("steps=2", f"output_dir={tmp_path}/shared"), force=True)
    cleanup_jobs.append(forced)
    assert forced.wait(TIMEOUT) == "succeeded"


def test_cli_run_wait_jobs_stop_rm(tmp_path):
    def cli(*args, **kw):
        return subprocess.run([sys.executable, "-m", "tune_magic", *args], capture_output=True, text=True,
                              timeout=TIMEOUT, **kw)

    r = cli("run", "--name", "cli-wait", "--wait", *toy_args("steps=3").split())
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.splitlines()[0]
    assert "toy recipe done" in r.stdout
    r = cli("run", "--wait", *toy_args("steps=3", "crash_rank=0").split())
    assert r.returncode == 1
    r = cli("run", "--name", "cli-bg", *toy_args("steps=1000", "step_s=0.1").split())
    bg = r.stdout.strip()
    listed = {j["id"]: j for j in __import__("json").loads(cli("jobs", "--json").stdout)}
    assert listed[job_id]["status"] == "succeeded" and listed[job_id]["name"] == "cli-wait"
    assert listed[bg]["status"] == "running" and isinstance(listed[bg]["pid"], int)
    assert cli("stop", bg).stdout.split() == [bg, "stopped"]
    assert "toy recipe done" in cli("logs", job_id).stdout
    assert cli("rm", bg).returncode == 0
    assert bg not in cli("jobs").stdout
    assert cli("rm", "--finished").returncode == 0
    assert cli("jobs", "--json").stdout.strip() in ("[]",) or all(
        j["status"] == "running" for j in __import__("json").loads(cli("jobs", "--json").stdout))


def test_simultaneous_launches_cannot_both_take_one_output_dir(tmp_path, cleanup_jobs):
    import threading

    results, barrier = [], threading.Barrier(2)

    def go():
        barrier.wait()
        try:
            results.append(L.launch(toy_args("steps=1000", "step_s=0.1", f"output_dir={tmp_path}/race")))
        except PlanError as exc:
            results.append(exc)

    threads = [threading.Thread(target=go) for _ in range(2)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    jobs = [r for r in results if isinstance(r, J.Job)]
    cleanup_jobs += jobs
    errors = [r for r in results if isinstance(r, PlanError)]
    assert len(jobs) == 1 and len(errors) == 1 and "would share" in str(errors[0])
    # the same directory through a symlink, and a directory inside it, clash too
    (tmp_path / "link").symlink_to(tmp_path)
    with pytest.raises(PlanError, match="would share"):
        L.launch(toy_args(f"output_dir={tmp_path}/link/race"))
    with pytest.raises(PlanError, match="would share"):
        L.launch(toy_args(f"output_dir={jobs[0].output_dir}/inner"))
    assert jobs[0].stop(grace_s=5) == "stopped"


def test_supervisor_dying_at_start_is_a_start_error(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    # a broken environment: every Python started with it exits at once
    (site / "sitecustomize.py").write_text("import os\nos._exit(3)\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    with pytest.raises(errors.JobStartError, match="did not start"):
        L.launch(toy_args("steps=2"), env=env)


def test_supervisor_keeps_the_summary_current(cleanup_jobs):
    from tune_magic.logs.summary import read_summary

    job = L.launch(toy_args("steps=25", "step_s=0.2"))
    cleanup_jobs.append(job)
    def three_steps() -> bool:
        if read_summary(job.dir) is not None and (read_summary(job.dir).step or 0) >= 3:
            return True
        assert job.status == "running", job.tail(10)  # still running while it gets there
        return False

    wait_for(three_steps, timeout=60, what=f"step 3 in {job.id}'s summary", describe=lambda: job.tail(10))
    live = read_summary(job.dir)
    assert job.status == "running" and live.loss == 10.0 / live.step  # the stand-in's loss is 10/step
    assert job.wait(TIMEOUT) == "succeeded"
    final = job.summary()
    assert (final.step, final.loss, final.epoch) == (25, 10.0 / 25, 1)
    assert read_summary(job.dir).log_offset == os.path.getsize(job.log_path)


def test_endpoint_with_port_0_records_the_real_address_and_workers_are_exactly_the_ranks(cleanup_jobs):
    job = L.launch("--rdzv-endpoint localhost:0 --rdzv-backend c10d "
                   + toy_args("steps=1000", "step_s=0.1", "spawn_sleep=true"))
    cleanup_jobs.append(job)
    wait_for(lambda: len(job.refresh().record.workers) >= 2 and job.record.rendezvous_endpoint != "localhost:0",
             timeout=60, what=f"2 workers and the real endpoint of {job.id}", describe=lambda: job.tail(20))
    ranks = {}
    for child in psutil.Process(job.pid).children():
        env = child.environ()
        ranks[child.pid] = int(env["RANK"])
        real = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    time.sleep(1.5)  # the ranks' own children (which inherit RANK) exist now and must not be listed
    assert {w.pid: w.rank for w in job.refresh().record.workers} == ranks
    assert sorted(ranks.values()) == [0, 1]
    assert job.record.rendezvous == "user" and job.rendezvous_endpoint == real and not real.endswith(":0")
    assert job.stop(grace_s=3) == "stopped"
