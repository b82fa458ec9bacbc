"""A requeueable SLURM job's batch script and exit files (issue 21): ``--requeue`` and
``--resume-on-timeout N`` as sbatch directives, the resume of a requeued attempt, one exit file per
attempt, and the ``USR1`` trap that requeues the job itself at most N times.

The script's parts run in a real bash here; ``scontrol`` and the pre-flight's interpreter are FAKE
executables on PATH (no SLURM controller in a unit test: tests/slurm/test_slurm_requeue.py runs the
real thing on the test cluster).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import tune_magic
import tune_magic.schedulers.slurm as S
from tune_magic.errors import PlanError
from tune_magic.registry import store as jobstore
from tune_magic.registry.store import JobRecord
from tune_magic.schedulers.slurm import status as queue
from tune_magic.schedulers.slurm import requeue as R
from tune_magic.schedulers.slurm import status as sq

from jobhelpers import toy_args

ODD = "name=a b $HOME `x` 'q'"  # every shell-special character: must reach the recipe as typed


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    """A folder first on PATH for FAKE executables (sbatch that must not run, scontrol that logs)."""
    d = tmp_path / "bin"
    d.mkdir()
    (d / "sbatch").write_text("#!/bin/sh\necho 'FAKE sbatch must not run' >&2\nexit 99\n")
    (d / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/scontrol.calls\nexit ${{FAKE_RC:-0}}\n")
    for exe in d.iterdir():
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    for key in list(os.environ):
        if key.startswith(("SBATCH_", "SLURM_")) or key == "TUNE_MAGIC_SCHEDULER":
            monkeypatch.delenv(key)
    return d


def _dry(**kw):
    return tune_magic.launch(toy_args("steps=3", f'"{ODD}"', nproc=1), scheduler="slurm", dry_run=True, nodes=1, **kw)


def _bash_n(text: str) -> None:
    r = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert r.returncode == 0, r.stderr


def test_requeue_and_resume_on_timeout_are_directives_and_the_script_passes_bash_n(fake_bin):
    plain = _dry().batch_script
    assert "#SBATCH --no-requeue" in plain and "exit_file" not in plain and "overrides[@]" not in plain
    asked = _dry(requeue=True).batch_script
    lines = [x for x in asked.splitlines() if x.startswith("#SBATCH")]
    assert "#SBATCH --requeue" in lines and "#SBATCH --no-requeue" not in lines
    assert not any("--signal" in x for x in lines) and "trap on_time_limit USR1" not in asked
    assert '"${overrides[@]}"' in asked and " &\nwait_srun" not in asked
    timed = _dry(resume_on_timeout=2, time_limit="1").batch_script
    assert "#SBATCH --requeue" in timed and "#SBATCH --signal=B:USR1@45" in timed
    assert "trap on_time_limit USR1" in timed and '"${overrides[@]}" &\nwait_srun $!\nrc=$?' in timed
    assert "#SBATCH --signal=B:USR1@120" in _dry(resume_on_timeout=1, time_limit="2:00:00").batch_script
    assert "#SBATCH --signal=B:USR1@120" in _dry(resume_on_timeout=1).batch_script  # the partition's limit
    for text in (plain, asked, timed):
        _bash_n(text)
    # the user's own --sbatch=--requeue: SLURM's plain rerun, with per-attempt exit files
    own = _dry(sbatch=["--requeue"]).batch_script
    assert 'exit_file="$job_dir/exit_code.attempt-$attempt"' in own and "overrides[@]" not in own
    _bash_n(own)


def test_the_options_are_declared_once_for_every_front_end():
    from tune_magic.schedulers.slurm.options import OPTIONS

    rows = {o.flag: o for o in OPTIONS}
    assert rows["--requeue"].kind == "switch" and rows["--resume-on-timeout"].kind == "count"
    assert rows["--resume-on-timeout"].read("2") == 2
    with pytest.raises(PlanError, match="positive integer"):
        rows["--resume-on-timeout"].read("0")


@pytest.mark.parametrize("kw, words", [
    ({"resume_on_timeout": 1, "sbatch": ["--signal=USR2@60"]}, "drop --sbatch=--signal"),
    ({"requeue": True, "sbatch": ["--no-requeue"]}, "--requeue needs a requeueable job"),
    ({"resume_on_timeout": 2, "sbatch": ["--no-requeue"]}, "--resume-on-timeout needs a requeueable job"),
])
def test_contradicting_sbatch_options_are_refused(fake_bin, kw, words):
    with pytest.raises(PlanError, match=words.replace("-", r"\-")):
        _dry(**kw)


def _prelude(tmp_path: Path, *, n: int | None, python: str = "/bin/true") -> str:
    parts = R.script_parts(overrides=["steps=3", ODD], python=python, resume=True, resume_on_timeout=n,
                           margin_s=45)
    return f"set -u\njob_dir={tmp_path}\n{parts.prelude}"


def test_a_requeued_attempt_takes_the_preflights_overrides_and_writes_its_own_exit_file(tmp_path):
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\n[ \"$1 $2 $4\" = '-m tune_magic.schedulers.slurm.requeue 2' ] || exit 9\n"
                           "printf 'steps=3\\0name=x y\\0resume_from_checkpoint=True\\0'\n")
    fake_python.chmod(0o755)
    body = _prelude(tmp_path, n=None, python=str(fake_python)) + \
        'printf "%s\\n" "${overrides[@]}" > "$job_dir/seen"\necho "$exit_file"\n'
    first = subprocess.run(["bash", "-c", body], text=True, capture_output=True, env={"PATH": os.environ["PATH"]})
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"{tmp_path}/exit_code"
    assert (tmp_path / "seen").read_text().splitlines() == ["steps=3", ODD]  # as typed, on the first attempt
    again = subprocess.run(["bash", "-c", body], text=True, capture_output=True,
                           env={"PATH": os.environ["PATH"], "SLURM_RESTART_COUNT": "1"})
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"{tmp_path}/exit_code.attempt-2"
    assert (tmp_path / "seen").read_text().splitlines() == ["steps=3", "name=x y", "resume_from_checkpoint=True"]


def test_a_preflight_that_refuses_ends_the_attempt_with_its_own_exit_file(tmp_path):
    r = subprocess.run(["bash", "-c", _prelude(tmp_path, n=None, python="/bin/false") + "echo srun-would-run\n"], text=True,
                       capture_output=True, env={"PATH": os.environ["PATH"], "SLURM_RESTART_COUNT": "2"})
    assert r.returncode == 3 and "srun-would-run" not in r.stdout
    assert json.loads((tmp_path / "exit_code.attempt-3").read_text())["returncode"] == 3
    assert not (tmp_path / jobstore.EXIT_CODE).exists()


def _trapped_run(tmp_path: Path, n: int, *, restart: int = 0, fake_rc: int = 0) -> subprocess.CompletedProcess:
    """The prelude, then a stand-in srun (sleep) waited for through the trap; USR1 sent after 0.5 s."""
    body = _prelude(tmp_path, n=n) + 'sleep 3 &\nwait_srun $!\nrc=$?\necho "srun ended $rc"\nexit "$rc"\n'
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": str(restart),
           "FAKE_RC": str(fake_rc)}
    p = subprocess.Popen(["bash", "-c", body], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    time.sleep(0.5)
    p.send_signal(signal.SIGUSR1)
    out, err = p.communicate(timeout=20)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_the_time_limit_trap_requeues_the_job_itself_at_most_n_times(tmp_path, fake_bin):
    calls = tmp_path / "scontrol.calls"
    first = _trapped_run(tmp_path, 2)
    assert first.returncode == 0 and "srun ended" not in first.stdout  # it ended in the trap, srun still running
    assert calls.read_text() == "requeue 77\n" and (tmp_path / f"{R.TIMEOUT_MARKER}1").exists()
    assert "requeueing job 77 (resume 1 of 2)" in first.stderr
    second = _trapped_run(tmp_path, 2, restart=1)
    assert second.returncode == 0 and calls.read_text() == "requeue 77\nrequeue 77\n"
    # used up: no third requeue; srun goes on to its own end (the time limit, on a cluster)
    third = _trapped_run(tmp_path, 2, restart=2)
    assert third.stdout.strip() == "srun ended 0" and third.returncode == 0
    assert calls.read_text().count("requeue") == 2 and not (tmp_path / f"{R.TIMEOUT_MARKER}3").exists()
    assert "--resume-on-timeout 2 is used up" in third.stderr


def test_a_requeue_scontrol_refuses_leaves_no_marker_and_srun_goes_on(tmp_path, fake_bin):
    r = _trapped_run(tmp_path, 1, fake_rc=1)
    assert r.stdout.strip() == "srun ended 0" and "scontrol requeue failed" in r.stderr
    assert not (tmp_path / f"{R.TIMEOUT_MARKER}1").exists()


# --- reading: only the current attempt's exit file settles the job ---------------------------------

def _record(tmp_path: Path, **options) -> tuple[Path, JobRecord]:
    d = tmp_path / "j1"
    d.mkdir(parents=True)
    (d / jobstore.OUTPUT_LOG).write_text("node n1 10.0.0.1\n\r1|3|Loss: 3.3: 10%|#| 3/20 [00:01<00:09, 2.0it/s]\n")
    rec = JobRecord(id="j1", name="n", argv=["torchrun", "x.py"], env={}, cwd=str(tmp_path),
                    log_path=str(d / jobstore.OUTPUT_LOG), started_at=time.time() - 10, status="running",
                    scheduler="slurm", backend={"job_id": "42"}, scheduler_options=options)
    jobstore.write_record(d, rec)
    return d, rec


def _exit(d: Path, name: str, code: int) -> None:
    (d / name).write_text(json.dumps({"returncode": code, "ended_at": time.time()}))


class _Said:
    """A FAKE watcher: the controller's (parsed) answer on job 42, and how often it was asked."""

    def __init__(self, job: sq.SlurmJob):
        self.job, self.asked = job, 0

    def forget(self):
        pass

    def get(self, slurm_id, env):
        self.asked += 1
        return queue.Answer(queue.LISTED, self.job, time.time())


def test_current_exit_reads_the_current_attempts_file_only(tmp_path):
    d, rec = _record(tmp_path, requeue=True)
    _exit(d, jobstore.EXIT_CODE, 1)
    assert R.current_exit(d, rec)[0].returncode == 1
    rec.backend["restarts"] = 1  # SLURM requeued it: attempt 2 runs
    assert R.current_exit(d, rec) == (None, 2)
    _exit(d, "exit_code.attempt-3", 0)  # attempt 3's file: newer than anything the record knows
    info, attempt = R.current_exit(d, rec)
    assert (info.returncode, attempt) == (0, 3)
    plain, _ = _record(tmp_path / "p")
    _exit(plain, "exit_code.attempt-2", 0)  # a job SLURM never runs again has one exit file
    assert R.current_exit(plain, jobstore.read(plain)) == (None, 1)


@pytest.mark.parametrize("options, status", [({"requeue": True}, "pending"), ({"sbatch": ["--requeue"]}, "pending"),
                                             ({}, "failed")])
def test_a_first_attempts_exit_file_never_ends_a_job_slurm_requeued(tmp_path, monkeypatch, options, status):
    d, rec = _record(tmp_path, **options)
    _exit(d, jobstore.EXIT_CODE, 143)  # its script got SIGTERM from the requeue and still wrote its code
    said = _Said(sq.SlurmJob("42", "tune_magic-j1", "PENDING", ("REQUEUED",), "BeginTime", restart_count=1))
    monkeypatch.setattr(S, "WATCHER", said)
    changes = S.SlurmScheduler().describe(d, rec)
    assert changes["status"] == status, changes
    if status == "pending":
        assert changes["backend"]["restarts"] == 1 and changes["pending_reason"] == "BeginTime"
    assert said.asked <= 2  # one fresh answer for the exit file, then the shared one


def test_the_current_attempts_exit_file_ends_the_job_with_its_attempts_settled(tmp_path, monkeypatch):
    d, rec = _record(tmp_path, requeue=True)
    rec.backend["restarts"] = 1
    rec.attempts = [{"number": 1, "started_at": rec.started_at, "ended_at": rec.started_at + 1,
                     "reason": "requeued (preempted)", "step": 2},
                    {"number": 2, "started_at": rec.started_at + 2,
                     "resumed_from": {"checkpoint": "epoch_0/", "epoch": 0, "step": 2}, "log_offset": 0}]
    jobstore.write_record(d, rec)
    _exit(d, "exit_code.attempt-2", 0)
    monkeypatch.setattr(S, "WATCHER", _Said(sq.SlurmJob("42", "tune_magic-j1", "COMPLETED", restart_count=1)))
    changes = S.SlurmScheduler().describe(d, rec)
    assert changes["status"] == "succeeded" and changes["returncode"] == 0
    last = changes["attempts"][-1]
    assert (last["number"], last["returncode"], last["step"]) == (2, 0, 3) and last["ended_at"] is not None


@pytest.mark.parametrize("line, reason", [
    ("slurmstepd: error: *** JOB 42 ON n1 CANCELLED AT 2026-12-01T10:00:00 DUE TO PREEMPTION ***",
     "requeued (preempted)"),
    ("slurmstepd: error: *** JOB 42 ON n1 CANCELLED AT 2026-12-01T10:00:00 DUE TO NODE FAILURE ***",
     "requeued (node failure)"),
    ("", "requeued by SLURM"),
])
def test_the_requeue_helper_records_the_attempts_and_starts_over_without_a_checkpoint(tmp_path, line, reason):
    from jobhelpers import TOY_CONFIG, TOY_RECIPE

    out = tmp_path / "out"
    out.mkdir()
    overrides = ["steps=3", f"output_dir={out}"]
    d, rec = _record(tmp_path, requeue=True)
    with open(rec.log_path, "a") as f:
        f.write(line + "\n")
    rec.argv = ["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", str(TOY_RECIPE),
                "--config", str(TOY_CONFIG), *overrides]
    rec.recipe, rec.config, rec.overrides, rec.output_dir = str(TOY_RECIPE), str(TOY_CONFIG), overrides, str(out)
    jobstore.write_record(d, rec)
    r = subprocess.run([os.sys.executable, "-m", "tune_magic.schedulers.slurm.requeue", str(d), "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\0")[:-1] == overrides  # nothing saved yet: the same command, from the start
    assert f"[tune_magic] attempt 1 {reason} at step 3; attempt 2 starts over from the beginning" in r.stderr
    one, two = jobstore.read(d).attempts
    assert (one["number"], one["reason"], one["step"], two["number"], two["resumed_from"]) == (
        1, reason, 3, 2, None)
    assert two["log_offset"] == os.path.getsize(rec.log_path) and one["started_at"] == rec.started_at
    bad = subprocess.run([os.sys.executable, "-m", "tune_magic.schedulers.slurm.requeue", str(d), "1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "ATTEMPT >= 2" in bad.stderr


def test_an_attempt_slurm_ends_at_its_time_limit_records_the_step_it_reached(tmp_path, monkeypatch):
    # issue 30: attempt 2 of a --resume-on-timeout job cut by the time limit recorded step null (SLURM's
    # TIMEOUT ended it, no exit file: only the exit file's end looked up the step)
    d, rec = _record(tmp_path, requeue=True, resume_on_timeout=1)
    rec.backend["restarts"] = 1
    rec.attempts = [{"number": 1, "started_at": rec.started_at, "ended_at": rec.started_at + 1,
                     "reason": "requeued (time limit near; --resume-on-timeout 1)", "step": 2},
                    {"number": 2, "started_at": rec.started_at + 2, "log_offset": 0}]
    jobstore.write_record(d, rec)
    monkeypatch.setattr(S, "WATCHER", _Said(sq.SlurmJob("42", "tune_magic-j1", "TIMEOUT", restart_count=1)))
    end = jobstore.update(d, **S.SlurmScheduler().describe(d, rec))
    assert end.status == "failed" and "time limit" in end.error
    assert (end.attempts[-1]["number"], end.attempts[-1]["step"]) == (2, 3)  # the log's last step: 3 of 20


def _requeued_toy(tmp_path: Path, epochs: int) -> tuple[Path, JobRecord, Path]:
    """A ``--requeue`` toy job whose first attempt ran one epoch of 2 steps and saved it."""
    from jobhelpers import TOY_CONFIG, TOY_RECIPE
    from resumehelpers import toy_checkpoint

    out = toy_checkpoint(tmp_path / "out", epochs_run=1, steps=2, epochs=epochs)
    overrides = [f"epochs={epochs}", "steps=2", "save_checkpoints=true", f"output_dir={out}"]
    d, rec = _record(tmp_path, requeue=True)
    rec.argv = ["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", str(TOY_RECIPE),
                "--config", str(TOY_CONFIG), *overrides]
    rec.recipe, rec.config, rec.overrides, rec.output_dir = str(TOY_RECIPE), str(TOY_CONFIG), overrides, str(out)
    rec.backend["restarts"] = 1
    jobstore.write_record(d, rec)
    return d, rec, out


def _helper(d: Path) -> subprocess.CompletedProcess:
    return subprocess.run([os.sys.executable, "-m", "tune_magic.schedulers.slurm.requeue", str(d), "2"],
                          capture_output=True, text=True, timeout=60)


def test_an_attempt_that_cannot_continue_keeps_its_reason_in_the_record_the_end_and_the_failure(tmp_path, monkeypatch):
    # issue 30: the recipe state truncated before attempt 2 starts; the job ended "exited with code 3"
    # with attempts [] and only the log said why
    d, rec, out = _requeued_toy(tmp_path, epochs=3)
    state = out / "recipe_state" / "recipe_state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    r = _helper(d)
    assert r.returncode == R.REFUSED_RC and "attempt 2 cannot continue the job" in r.stderr and r.stdout == ""
    one, two = jobstore.read(d).attempts
    assert (one["number"], one["reason"], one["step"]) == (1, "requeued by SLURM", 3)
    assert two["number"] == 2 and two["returncode"] == R.REFUSED_RC and two["ended_at"] is not None
    assert two["reason"].startswith("cannot continue the job: ") and "recipe_state.pt is truncated" in two["reason"]
    _exit(d, "exit_code.attempt-2", R.REFUSED_RC)  # what the batch script writes then
    monkeypatch.setattr(S, "WATCHER", _Said(sq.SlurmJob("42", "tune_magic-j1", "FAILED", restart_count=1, exit_code=3)))
    end = jobstore.update(d, **S.SlurmScheduler().describe(d, jobstore.read(d)))
    assert end.status == "failed" and end.error.startswith("attempt 2 cannot continue the job: ")
    assert "recipe_state.pt is truncated" in end.error and len(end.attempts) == 2
    assert json.loads((d / jobstore.FAILURE).read_text())["line"] == end.error  # what logs --error prints first


def test_a_requeue_after_the_final_checkpoint_ends_the_job_succeeded(tmp_path, monkeypatch):
    d, rec, out = _requeued_toy(tmp_path, epochs=1)  # its one epoch is saved: training finished
    r = _helper(d)
    assert r.returncode == R.FINISHED_RC and "attempt 2: training had finished" in r.stderr
    two = jobstore.read(d).attempts[-1]
    assert (two["number"], two["returncode"]) == (2, 0) and two["reason"].startswith("training had finished: ")
    for code in (R.REFUSED_RC, 0):  # an earlier release's batch script exits 3 here; today's exits 0
        e = tmp_path / f"rc{code}"
        e.mkdir()
        d2, _, _ = _requeued_toy(e, epochs=1)
        assert _helper(d2).returncode == R.FINISHED_RC
        _exit(d2, "exit_code.attempt-2", code)
        monkeypatch.setattr(S, "WATCHER", _Said(sq.SlurmJob("42", "tune_magic-j1", "COMPLETED", restart_count=1)))
        end = jobstore.update(d2, **S.SlurmScheduler().describe(d2, jobstore.read(d2)))
        assert (end.status, end.returncode, end.error) == ("succeeded", 0, None), (code, end)


def test_the_script_maps_the_helpers_finished_status_to_exit_0(tmp_path):
    fake_python = tmp_path / "python"
    fake_python.write_text(f"#!/bin/sh\nexit {R.FINISHED_RC}\n")
    fake_python.chmod(0o755)
    r = subprocess.run(["bash", "-c", _prelude(tmp_path, n=None, python=str(fake_python)) + "echo srun-would-run\n"],
                       text=True, capture_output=True, env={"PATH": os.environ["PATH"], "SLURM_RESTART_COUNT": "1"})
    assert r.returncode == 0 and "srun-would-run" not in r.stdout
    assert json.loads((tmp_path / "exit_code.attempt-2").read_text())["returncode"] == 0


def test_a_requeue_shown_without_a_restart_count_also_outvotes_the_earlier_attempts_file():
    # squeue's plain format (no JSON) has no restart count: a job queued again after its script ended was requeued
    pending = sq.parse_squeue_format("42|PENDING|BeginTime|1|(null)|10:00|tune_magic-j1")["42"]
    done = sq.parse_squeue_format("42|COMPLETED|None|1|n1|10:00|tune_magic-j1")["42"]
    assert R.requeued_since(pending, 1) and not R.requeued_since(done, 1) and not R.requeued_since(None, 1)
    assert R.requeued_since(sq.SlurmJob("42", "n", "RUNNING", restart_count=1), 1)
    assert not R.requeued_since(sq.SlurmJob("42", "n", "COMPLETED", restart_count=1), 2)


def test_requeue_of_a_recipe_the_preflight_does_not_know_is_refused_before_submitting(fake_bin, tmp_path):
    recipe = tmp_path / "my_recipe.py"  # a recipe file without TUNE_MAGIC_RESUME: its checkpoints are unknown
    recipe.write_text("print('hi')\n")
    from jobhelpers import TOY_CONFIG

    args = f"--nproc_per_node 1 {recipe} --config {TOY_CONFIG} steps=2"
    with pytest.raises(PlanError, match=r"--requeue resumes each requeued attempt .* cannot resume recipe .*"
                                        r"--sbatch=--requeue instead"):
        tune_magic.launch(args, scheduler="slurm", dry_run=True, requeue=True)
    plan = tune_magic.launch(args, scheduler="slurm", dry_run=True, sbatch=["--requeue"])  # SLURM's plain rerun
    assert "#SBATCH --requeue" in plan.batch_script
