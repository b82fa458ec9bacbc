"""Resume through the public API, the magics and the CLI, with real jobs (torchrun, CPU, gloo):

* exactness through ``job.resume()``: a 3-epoch tiny ``lora_finetune`` run stopped with ``job.stop()``
  after epoch 1's checkpoint, resumed, gives the uninterrupted run's losses step for step (1e-6);
* a lineage of 3 (stand-in recipe: two crashes, resumed by ``%tune_resume`` then ``tune-magic
  resume``), one series of metrics, the records linked both ways, ``tune-magic jobs`` marking them;
* two resumes of one job at once: exactly one starts;
* the resuming process killed at each step: no new job or a registered one, never a half state;
* ``%%tune_run --max-resumes 1``: a rank that crashes once after the first checkpoint is relaunched
  from it, as the same job, which ends succeeded at the right final step with two attempts recorded.

"Stopped after epoch 1's checkpoint" is a real interruption: the recipes' test-only pause
(TUNE_MAGIC_TEST_PAUSE_AFTER_STEP, recipes/_common.py) holds the run after step 5 (epoch 2's first,
after epoch_0/ was saved) and ``job.stop()`` sends SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest

import tune_magic
from tune_magic import faultpoints
from tune_magic.registry import store as jobstore

import waiting
from jobhelpers import registry_problem, toy_args
from resumehelpers import OFFLINE, TIMEOUT, assert_same, run_job, series, wait_for_file

pytestmark = pytest.mark.e2e
wait_for = partial(waiting.wait_for, timeout=60, interval=0.1)


def test_a_lora_run_stopped_after_its_first_checkpoint_resumes_exactly_through_the_api(tiny_assets, tmp_path,
                                                                                       cleanup_jobs):
    args = "--nproc_per_node 1 lora_finetune --config tiny/lora epochs=3 seed=0 max_steps_per_epoch=4"
    ref = run_job(f"{args} output_dir={tmp_path / 'ref'}", cleanup=cleanup_jobs)
    ref_loss, ref_lr = series(ref), series(ref, "lr")
    assert sorted(ref_loss) == list(range(1, 13))
    paused = tmp_path / "paused"
    job = tune_magic.launch(args, name="stopped", env={**os.environ, **OFFLINE, "TUNE_MAGIC_TEST_PAUSE_AFTER_STEP": "5",
                                                       "TUNE_MAGIC_TEST_PAUSE_FILE": str(paused)})
    cleanup_jobs.append(job)
    wait_for_file(paused, job)  # epoch_0/ saved, step 5 of epoch 2 done
    assert job.stop(grace_s=10) == "stopped"
    out = Path(job.output_dir)
    assert (out / "epoch_0").is_dir() and not (out / "epoch_1").exists()

    shown = []
    resumed = job.resume(env={**os.environ, **OFFLINE}, on_plan=shown.append)
    cleanup_jobs.append(resumed)
    assert resumed.wait(TIMEOUT) == "succeeded", resumed.tail(30)
    (plan,) = shown
    assert (plan.preflight.epoch, plan.preflight.resume_step, plan.preflight.lost_steps) == (0, 4, 1)
    assert plan.preflight.case == "exact" and "lost: 1 step (step 5), done again" in plan.summary()
    assert resumed.output_dir == job.output_dir and resumed.name == "stopped"  # the same folder, no new one
    assert resumed.record.resumed_from == job.id and tune_magic.get_job(job.id).record.resumed_by == resumed.id
    assert sorted(series(resumed)) == list(range(5, 13))
    assert_same(series(resumed), ref_loss, range(5, 13))
    assert_same(series(resumed, "lr"), ref_lr, range(5, 13), tol=1e-12)
    lineage = [m for m in resumed.lineage_metrics() if m["name"] == "loss" and m["source"] == "disklogger"]
    assert [(m["job"], m["step"]) for m in lineage] == [(job.id, s) for s in range(1, 5)] + [
        (resumed.id, s) for s in range(5, 13)]
    assert all(abs(m["value"] - ref_loss[m["step"]]) <= 1e-6 for m in lineage)


def _toy(tmp_path, name: str, *extra: str, nproc=None):
    """A stand-in job of 3 epochs of 2 steps that saves checkpoints and crashes once at step 3."""
    return tune_magic.launch(toy_args("epochs=3", "steps=2", "step_s=0.05", "save_checkpoints=true",
                                      f"output_dir={tmp_path / name}", f"crash_rank={0 if nproc is None else 1}",
                                      "crash_step=3", f"crash_once_file={tmp_path / (name + '.crashed')}", *extra,
                                      nproc=nproc), name=name)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "tune_magic", *args], capture_output=True, text=True,
                          timeout=TIMEOUT)


def test_a_lineage_of_three_through_the_magic_and_the_cli(tmp_path, ip, capsys, cleanup_jobs):
    a = _toy(tmp_path, "a")
    cleanup_jobs.append(a)
    assert a.wait(TIMEOUT) == "failed" and sorted(series(a)) == [1, 2]
    b = ip.run_line_magic("tune_resume", f"{a.id} crash_step=5 crash_once_file={tmp_path / 'b.crashed'}")
    cleanup_jobs.append(b)
    printed = capsys.readouterr().out
    assert printed.startswith(f"Resume job {a.id}: toy_recipe from epoch_0/ (1 of 3 epochs done, global step 2)")
    assert "  your overrides: crash_step=5" in printed and f"job {b.id} (a)" in printed  # then the card, as text
    assert b.wait(TIMEOUT) == "failed" and sorted(series(b)) == [3, 4]
    r = cli("resume", b.id)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"Resume job {b.id}: toy_recipe from epoch_1/ (2 of 3 epochs done, global step 4)")
    c = tune_magic.get_job(r.stdout.strip().splitlines()[-1])
    cleanup_jobs.append(c)
    assert c.wait(TIMEOUT) == "succeeded"
    assert [j.id for j in c.lineage()] == [a.id, b.id, c.id]
    loss = [(m["job"], m["step"], m["value"]) for m in c.lineage_metrics() if m["name"] == "loss"
            and m["source"] == "disklogger"]
    assert loss == [(j.id, s, 10.0 / s) for j, steps in ((a, (1, 2)), (b, (3, 4)), (c, (5, 6))) for s in steps]
    records = {j.id: jobstore.read(j.dir) for j in (a, b, c)}
    assert (records[a.id].resumed_by, records[b.id].resumed_from, records[b.id].resumed_by,
            records[c.id].resumed_from) == (b.id, a.id, c.id, b.id)
    assert records[c.id].resume_point["checkpoint"] == "epoch_1/" and records[c.id].resume_point["step"] == 4
    assert all(r.output_dir == str(tmp_path / "a") for r in records.values())
    rows = {line.split()[0]: line for line in cli("jobs").stdout.splitlines()[1:]}
    assert rows[a.id].endswith(f"resumed by {b.id}")
    assert rows[b.id].endswith(f"resume of {a.id} from epoch_0/, resumed by {c.id}")
    assert rows[c.id].endswith(f"resume of {b.id} from epoch_1/")


RESUMER = """
import sys, time, os
import tune_magic
from tune_magic.errors import PlanError
while not os.path.exists(sys.argv[2]):
    time.sleep(0.005)
try:
    print("STARTED", tune_magic.resume(sys.argv[1]).id, flush=True)
except PlanError as exc:
    print("REFUSED", exc, flush=True)
"""


def test_two_resumes_of_one_job_at_once_exactly_one_starts(tmp_path, cleanup_jobs):
    a = _toy(tmp_path, "a")
    cleanup_jobs.append(a)
    assert a.wait(TIMEOUT) == "failed"
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", RESUMER, a.id, str(go)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    time.sleep(3)  # both imported and waiting at the line
    go.touch()
    outs = sorted(p.communicate(timeout=TIMEOUT)[0].strip() for p in procs)
    assert [o.split()[0] for o in outs] == ["REFUSED", "STARTED"], outs
    new = tune_magic.get_job(outs[1].split()[1])
    cleanup_jobs.append(new)
    assert f"job {a.id} was resumed already, by job {new.id}" in outs[0]
    assert [r.id for r in jobstore.list_records() if r.resumed_from == a.id] == [new.id]
    assert new.wait(TIMEOUT) == "succeeded" and sorted(series(new)) == [3, 4, 5, 6]


KILLED = """
import sys
import tune_magic
tune_magic.resume(sys.argv[1])
"""


def _consistent(root: Path, old: str) -> str | None:
    """None when the registry is consistent (no staging left, every record reads, every live record
    has a live part) and at most one job says it resumed ``old``, which names it back; else what is
    wrong."""
    problem = registry_problem(root)
    if problem is not None:
        return problem
    children = [r.id for r in jobstore.list_records(root) if r.resumed_from == old]
    if len(children) > 1:
        return f"{old} resumed twice: {children}"
    linked = jobstore.read(root / old).resumed_by
    return None if linked == (children[0] if children else None) else f"{old}.resumed_by={linked}, children {children}"


@pytest.mark.parametrize("step", faultpoints.RESUME_STEPS)
def test_a_resume_killed_at_any_step_leaves_no_new_job_or_a_registered_one(step, tmp_path, cleanup_jobs):
    a = _toy(tmp_path, "a")
    cleanup_jobs.append(a)
    assert a.wait(TIMEOUT) == "failed"
    root = a.dir.parent
    before = {d.name for d in root.iterdir()}
    p = subprocess.run([sys.executable, "-c", KILLED, a.id], env={**os.environ, faultpoints.KILL_ENV: step},
                       capture_output=True, timeout=TIMEOUT)
    assert p.returncode == -signal.SIGKILL, (step, p.stderr[-2000:])
    wait_for(lambda: _consistent(root, a.id) is None, timeout=5, what=f"a consistent registry after {step}",
             describe=lambda: _consistent(root, a.id))
    new = [d.name for d in root.iterdir() if d.name not in before and not d.name.startswith(".")]
    registered = faultpoints.RESUME_STEPS.index(step) >= faultpoints.RESUME_STEPS.index("registered")
    assert len(new) == (1 if registered else 0), (step, new)
    if not registered:  # nothing happened: the job resumes as if never tried
        again = tune_magic.resume(a.id)
        cleanup_jobs.append(again)
        assert again.wait(TIMEOUT) == "succeeded"
        return
    child = tune_magic.get_job(new[0])
    cleanup_jobs.append(child)
    # killed before its supervisor started: the launch was interrupted; after: it runs to its end
    assert child.wait(TIMEOUT) == ("failed" if step == "registered" else "succeeded"), child.error
    with pytest.raises(tune_magic.PlanError, match=f"resumed already, by job {child.id}"):
        tune_magic.resume(a.id)


def test_max_resumes_1_recovers_a_rank_that_crashes_once_after_its_first_checkpoint(tmp_path, ip, capsys,
                                                                                     cleanup_jobs):
    line = toy_args("epochs=3", "steps=2", "step_s=0.05", "save_checkpoints=true", f"output_dir={tmp_path / 'o'}",
                    "crash_rank=1", "crash_step=3", f"crash_once_file={tmp_path / 'once'}")
    job = ip.run_cell_magic("tune_run", f"--max-resumes 1 {line}", "# crashes once, resumes once\n")
    cleanup_jobs.append(job)
    assert job.wait(TIMEOUT) == "succeeded", job.tail(40)
    assert (tmp_path / "once").exists() and job.record.max_resumes == 1
    assert job.summary().step == 6 and series(job) == {s: 10.0 / s for s in range(1, 7)}
    one, two = job.record.attempts
    assert (one["number"], one["reason"], one["step"], one["returncode"]) == (
        1, "rank 1: RuntimeError: toy recipe crashed on purpose", 2, 1)
    assert (two["number"], two["resumed_from"], two["reason"], two["step"], two["returncode"]) == (
        2, {"checkpoint": "epoch_0/", "epoch": 0, "step": 2}, None, 6, 0)
    assert one["started_at"] == job.started_at <= one["ended_at"] <= two["started_at"] < two["ended_at"] == job.ended_at
    assert "resume_from_checkpoint=True" in job.argv  # the command of the attempt that ran last
    assert (job.dir / "exit_code.attempt-1").is_file()
    from tune_magic.ui.cards import JobCard

    card = JobCard(job, watch=False)
    card.watcher.poll_once()
    assert ("attempt 2: resumed from epoch_0/ at step 2 after rank 1: RuntimeError: toy recipe crashed on purpose "
            "(attempt 1 reached step 2)") in card.text()
    assert card.snapshot.resumed_at == (2,)
    assert "[tune_magic] attempt 1 failed (rank 1: RuntimeError: toy recipe crashed on purpose) at step 2; attempt 2" \
        in "\n".join(job.tail(200))
