"""The disk holding TUNE_MAGIC_HOME fills while jobs run: nothing is lost.

Listings keep working (reading never needs a write), a stop still signals and stops its job, and
once space is back every job's record holds its real end: status and exit code. TUNE_MAGIC_HOME is
a 4 MiB tmpfs in a private mount namespace (tests/faults.py); everything of the test runs inside it.
"""

from __future__ import annotations

import json
import sys

import faults
from jobhelpers import toy_args
from waiting import wait_for

PY = sys.executable


def _status(ns, env) -> dict:
    r = ns.python("import json, tune_magic; print(json.dumps({j.id: [str(j.status), j.returncode] "
                  "for j in tune_magic.jobs()}))", env=env, timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def _on_disk(ns, env, job_id) -> dict:
    r = ns.run(["cat", f"{env['TUNE_MAGIC_HOME']}/jobs/{job_id}/record.json"], env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_full_disk_loses_no_outcome_and_stop_still_works(tmp_path):
    faults.require()
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "out"  # the jobs' own outputs live elsewhere: only the registry's disk fills
    env = {**__import__("os").environ, "TUNE_MAGIC_HOME": str(home)}
    with faults.MountNamespace(tmpfs={home: 4096}) as ns:
        def launch(*args):
            r = ns.run([PY, "-m", "tune_magic", "run", *toy_args(*args).split()], env=env, timeout=120)
            assert r.returncode == 0, r.stderr
            return r.stdout.strip()

        finishing = launch("steps=40", "step_s=0.25", f"output_dir={out}/a")
        stopping = launch("steps=100000", "step_s=0.1", f"output_dir={out}/b")
        wait_for(lambda: all(len(_on_disk(ns, env, j)["workers"]) == 2 for j in (finishing, stopping)),
                 timeout=90, interval=0.5, what="workers")
        ns.fill(home)
        assert ns.run(["sh", "-c", f"echo x > {home}/probe"], env=env).returncode != 0  # really full

        listing = ns.run([PY, "-m", "tune_magic", "jobs"], env=env, timeout=60)
        assert listing.returncode == 0 and finishing in listing.stdout and "Traceback" not in listing.stderr
        assert _status(ns, env)[stopping][0] == "running"

        stopped = ns.run([PY, "-m", "tune_magic", "stop", "--grace", "2", stopping], env=env, timeout=120)
        assert stopped.returncode == 0 and stopped.stdout.split() == [stopping, "stopped"], stopped.stderr
        pids = ns.python(f"import tune_magic; r = tune_magic.get_job({stopping!r}).record; "
                         "from tune_magic.schedulers.local.procs import job_processes; "
                         "print(len(job_processes(r.agent, r.workers)))", env=env)
        assert pids.stdout.strip() == "0", pids.stderr

        # the other job ends by itself while the disk is full; listings show its end at once
        # (the exit file was made with room for the code) — nothing says "running" for ever
        ended = wait_for(lambda: (s := _status(ns, env)[finishing])[0] != "running" and s,
                         timeout=90, interval=0.5, what="the end")
        assert ended[0] in ("succeeded", "failed") and ended[1] is not None
        assert _on_disk(ns, env, finishing)["status"] == "running"  # not yet written: no room

        ns.run(["rm", "-f", f"{home}/{faults.FILL_NAME}"], env=env)
        wait_for(lambda: _on_disk(ns, env, finishing)["status"] != "running", timeout=30, interval=0.5,
                 what="the supervisor's retried write")
        final = _on_disk(ns, env, finishing)
        assert [final["status"], final["returncode"]] == ended
        assert _on_disk(ns, env, stopping)["status"] == "stopped"
        assert _on_disk(ns, env, stopping)["returncode"] is not None


def test_launch_on_a_full_disk_is_one_paragraph_and_leaves_nothing(tmp_path):
    faults.require()
    home = tmp_path / "home"
    (home / "jobs").mkdir(parents=True)
    env = {**__import__("os").environ, "TUNE_MAGIC_HOME": str(home)}
    with faults.MountNamespace(tmpfs={home: 2048}) as ns:
        ns.fill(home)
        r = ns.run([PY, "-m", "tune_magic", "run", *toy_args("steps=2").split()], env=env, timeout=120)
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert "is full" in r.stderr and "nothing was started" in r.stderr
        left = ns.run(["ls", "-A", f"{home}/jobs"], env=env).stdout.split()
        assert [x for x in left if x != ".launch.lock"] == []
        assert ns.python("import tune_magic; print(len(tune_magic.jobs()))", env=env).stdout.strip() == "0"


def _trials(ns, env, sweep_id) -> list[str]:
    r = ns.python(f"import tune_magic; print(' '.join(t.status for t in tune_magic.get_sweep({sweep_id!r}).trials))",
                  env=env, timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return r.stdout.split()


def _runners(sweep_id) -> list[int]:
    import psutil

    from jobhelpers import processes_mentioning

    out = []
    for p in processes_mentioning(sweep_id):
        try:
            if "tune_magic.sweeping.runner" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def test_a_sweep_on_a_full_disk_says_why_starts_no_process_and_goes_on_when_space_returns(tmp_path):
    # issue 30: the queue stalled at "3 queued" with no reason, and every listing started a sweep
    # process that died
    import os
    import signal

    faults.require()
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "out"
    env = {**os.environ, "TUNE_MAGIC_HOME": str(home)}
    with faults.MountNamespace(tmpfs={home: 4096}) as ns:
        r = ns.run([PY, "-m", "tune_magic", "run", "--sweep", "--max-parallel", "1",
                    *toy_args("start_loss=1,2,3", "steps=4", "step_s=0.5", f"output_dir={out}/l" + "${start_loss}").split()],
                   env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        sweep_id = r.stdout.strip()
        wait_for(lambda: _trials(ns, env, sweep_id)[0] == "running", timeout=90, interval=0.5, what="trial 0 running")
        (runner,) = _runners(sweep_id)
        ns.fill(home)
        # trial 0 ends (its log on the full disk may cost it its run); trial 1 cannot be registered:
        # the queue waits, its process lives on
        wait_for(lambda: (t := _trials(ns, env, sweep_id))[0] in ("succeeded", "failed") and t[1:] == ["queued"] * 2,
                 timeout=90, interval=0.5,
                 what="trial 0 ended, 1-2 queued", describe=lambda: (_trials(ns, env, sweep_id), ns.run(
                     ["cat", f"{home}/sweeps/{sweep_id}/runner.log"], env=env).stdout[-2000:]))
        listed = ns.run([PY, "-m", "tune_magic", "sweeps"], env=env, timeout=60)
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
        assert f"tune-magic sweeps: {sweep_id}: waiting for disk space: the disk holding {home} is full" \
            in listed.stderr and "2 queued" in listed.stdout
        assert _runners(sweep_id) == [runner]  # alive, and no second one
        os.kill(runner, signal.SIGKILL)
        wait_for(lambda: not _runners(sweep_id), timeout=30, interval=0.2, what="the sweep process gone")
        for _ in range(2):  # listings start no process that could not write a line
            assert ns.run([PY, "-m", "tune_magic", "sweeps"], env=env, timeout=60).returncode == 0
            assert _runners(sweep_id) == []
        ns.run(["rm", "-f", f"{home}/{faults.FILL_NAME}"], env=env)
        assert ns.run([PY, "-m", "tune_magic", "sweeps"], env=env, timeout=60).returncode == 0  # revives it
        wait_for(lambda: _trials(ns, env, sweep_id)[1:] == ["succeeded"] * 2, timeout=120, interval=0.5,
                 what="trials 1-2 run once there is room", describe=lambda: _trials(ns, env, sweep_id))
        listed = ns.run([PY, "-m", "tune_magic", "sweeps"], env=env, timeout=60)
        assert "waiting for disk space" not in listed.stderr and " succeeded" in listed.stdout
        log = ns.run(["cat", f"{home}/sweeps/{sweep_id}/runner.log"], env=env).stdout
        # said at most once (never again on each look); the line itself may be lost: the runner wrote
        # it to runner.log on the full disk, and was killed before space returned
        assert log.count("trial 1 (start_loss=2) waits: waiting for disk space") <= 1, log
