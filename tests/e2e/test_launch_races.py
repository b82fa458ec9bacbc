"""Two launches claiming the same GPU or ``output_dir`` at the same moment: exactly one is refused.

The launch lock is held only for the clash check and the record's registration, so both launches
plan in parallel. To make the race certain rather than likely, each launch is held after its plan
(and the checks made before the lock) until the other has planned too: both then pass every check
that does not see the other, and only the check under the lock can refuse one; a launch that
passed it waits a moment before registering, so that without the lock both would always pass. Threads of one
process and two separate processes (the lock is an ``flock`` on a file, shared across processes).
Real torchrun-free jobs of the toy recipe; GPUs are FAKE (an ``nvidia-smi`` stand-in: no GPU here).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import tune_magic.job as J
import tune_magic.job.launch as L
from tune_magic.errors import PlanError
from tune_magic.gpus import GpuError

from jobhelpers import toy_args
from waiting import wait_for

LONG = toy_args("steps=1000", "step_s=0.1", nproc=None)
#: Seconds a launch that passed the clash check waits before registering: without the lock, the
#: other launch's check would run meanwhile, see nothing and pass too (so a missing lock always fails).
WIDEN_S = 0.3

# A launching process: held after its plan until the other has planned (files in GATE).
CHILD = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import tune_magic.job as J
    import tune_magic.job.launch as L

    gate, me, args, gpus = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] or None
    WIDEN_S = float(sys.argv[5])
    real_plan, real_clashes, under_lock = L.checked_plan, L.check_clashes, []

    def held(*a, **kw):
        out = real_plan(*a, **kw)
        (gate / f"planned-{me}").touch()
        deadline = time.monotonic() + 90
        while len(list(gate.glob("planned-*"))) < 2:
            if time.monotonic() > deadline:
                raise SystemExit("the other launch never finished planning")
            time.sleep(0.005)
        return out

    def clashes(*a, **kw):
        try:
            real_clashes(*a, **kw)
        except Exception as exc:
            under_lock.append(type(exc).__name__)
            raise
        time.sleep(WIDEN_S)

    L.checked_plan, L.check_clashes = held, clashes
    try:
        print(json.dumps({"id": L.launch(args, gpus=gpus).id}))
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc), "under_lock": under_lock}))
""")


def _race_in_threads(monkeypatch, args: str, gpus: str | None) -> tuple[list, list, list]:
    """Launch ``args`` from two threads at once, each held after planning until both planned.
    Returns (jobs, errors, names of the errors the check under the lock raised)."""
    start, planned = threading.Barrier(2, timeout=90), threading.Barrier(2, timeout=90)
    real_plan, real_clashes = L.checked_plan, L.check_clashes
    under_lock: list[str] = []

    def held(*a, **kw):
        out = real_plan(*a, **kw)
        planned.wait()
        return out

    def clashes(*a, **kw):
        try:
            real_clashes(*a, **kw)
        except Exception as exc:
            under_lock.append(type(exc).__name__)
            raise
        time.sleep(WIDEN_S)

    monkeypatch.setattr(L, "checked_plan", held)
    monkeypatch.setattr(L, "check_clashes", clashes)
    results: list = []

    def go():
        start.wait()
        try:
            results.append(L.launch(args, gpus=gpus))
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=go) for _ in range(2)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    return ([r for r in results if isinstance(r, J.Job)], [r for r in results if isinstance(r, Exception)],
            under_lock)


def _race_in_processes(tmp_path: Path, args: str, gpus: str | None) -> tuple[list, list[dict]]:
    """Launch ``args`` from two processes at once, each held after planning until both planned.
    Returns (jobs, the refused ones' {"error", "message", "under_lock"})."""
    gate = tmp_path / "gate"
    gate.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(gate), str(i), args, gpus or "", str(WIDEN_S)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return [J.get_job(o["id"]) for o in outs if "id" in o], [o for o in outs if "error" in o]


def test_FAKE_two_threads_claiming_one_gpu_at_once_exactly_one_is_refused(fake_gpus, cleanup_jobs, monkeypatch):
    jobs, errors, under_lock = _race_in_threads(monkeypatch, LONG, "1")
    cleanup_jobs += jobs
    assert len(jobs) == 1 and len(errors) == 1, (jobs, errors)
    assert isinstance(errors[0], GpuError)
    assert str(errors[0]).startswith(f"GPU 1 is used by running job {jobs[0].id}; pick another GPU")
    assert under_lock == ["GpuError"]  # refused by the check under the launch lock
    assert jobs[0].status == "running" and jobs[0].gpus == [1]
    assert jobs[0].stop(grace_s=5) == "stopped"


def test_FAKE_two_processes_claiming_one_gpu_at_once_exactly_one_is_refused(fake_gpus, cleanup_jobs, tmp_path):
    jobs, refused = _race_in_processes(tmp_path, LONG, "1")
    cleanup_jobs += jobs
    assert len(jobs) == 1 and len(refused) == 1, (jobs, refused)
    assert refused[0]["error"] == "GpuError" and refused[0]["under_lock"] == ["GpuError"]
    assert refused[0]["message"].startswith(f"GPU 1 is used by running job {jobs[0].id}; pick another GPU")
    assert jobs[0].status == "running" and jobs[0].gpus == [1]
    assert len(J.jobs()) >= 1 and [j.id for j in J.jobs() if j.record.gpus == [1] and j.status == "running"] == [jobs[0].id]
    assert jobs[0].stop(grace_s=5) == "stopped"


def test_simultaneous_launches_from_two_processes_cannot_both_take_one_output_dir(cleanup_jobs, tmp_path):
    jobs, refused = _race_in_processes(tmp_path, toy_args("steps=1000", "step_s=0.1", f"output_dir={tmp_path}/race"),
                                       None)
    cleanup_jobs += jobs
    assert len(jobs) == 1 and len(refused) == 1, (jobs, refused)
    assert refused[0]["error"] == "PlanError" and refused[0]["under_lock"] == ["PlanError"]
    assert f"would share {tmp_path}/race with running job {jobs[0].id}" in refused[0]["message"]
    assert jobs[0].output_dir == f"{tmp_path}/race"
    assert jobs[0].stop(grace_s=5) == "stopped"


def test_two_threads_on_different_gpus_are_both_launched(fake_gpus, cleanup_jobs, monkeypatch):
    """The control: the same race on two different GPUs refuses neither (the check is not a blanket lock-out)."""
    start = threading.Barrier(2, timeout=90)
    results: list = []

    def go(gpu):
        start.wait()
        try:
            results.append(L.launch(LONG, gpus=gpu))
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=go, args=(g,)) for g in ("0", "3")]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    jobs = [r for r in results if isinstance(r, J.Job)]
    cleanup_jobs += jobs
    assert len(jobs) == 2, results
    assert sorted(j.gpus[0] for j in jobs) == [0, 3]
    assert [j.stop(grace_s=5) for j in jobs] == ["stopped", "stopped"]


def test_output_dir_race_in_threads_is_refused_under_the_lock(cleanup_jobs, tmp_path, monkeypatch):
    """The existing thread race (tests/e2e/test_jobs.py) with both launches held past planning."""
    jobs, errors, under_lock = _race_in_threads(monkeypatch, toy_args("steps=1000", "step_s=0.1",
                                                                      f"output_dir={tmp_path}/race"), None)
    cleanup_jobs += jobs
    assert len(jobs) == 1 and len(errors) == 1 and isinstance(errors[0], PlanError), (jobs, errors)
    assert f"would share {tmp_path}/race with running job {jobs[0].id}" in str(errors[0])
    assert under_lock == ["PlanError"]
    assert jobs[0].stop(grace_s=5) == "stopped"


def test_a_fixed_port_used_by_a_running_job_is_refused(cleanup_jobs):
    import socket

    import tune_magic.job as J
    import tune_magic.job.launch as L
    from tune_magic.errors import PlanError
    from jobhelpers import toy_args

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    first = L.launch(f"--master-port {port} " + toy_args("steps=1000", "step_s=0.1"))
    cleanup_jobs.append(first)
    wait_for(lambda: first.refresh().record.workers, timeout=60, what=f"the workers of {first.id}")
    for args in (f"--master-port {port} ", f"--rdzv-endpoint localhost:{port} --rdzv-backend c10d "):
        with pytest.raises(PlanError, match=f"port {port} of your rendezvous endpoint is the rendezvous of running job"):
            L.launch(args + toy_args("steps=2"))
    assert first.stop(grace_s=2) == "stopped"
