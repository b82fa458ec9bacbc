"""A third scheduler, defined entirely in a test package (tests/thirdsched: an installed
distribution with an entry point in the group ``tune_magic.schedulers``), appears everywhere a
scheduler is chosen — ``%%tune_run --scheduler``, ``tune-magic run --help``, the panel's choices,
``tune_magic.launch(scheduler=...)`` — with its own options, and runs jobs end to end through the
seam. No file of tune_magic names it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tune_magic import schedulers
from tune_magic.errors import PlanError

from jobhelpers import processes_mentioning, toy_args
from waiting import wait_for

pytestmark = pytest.mark.e2e
TIMEOUT = 180

from jobhelpers import THIRD_PACKAGE as PACKAGE_DIR
REPO = Path(__file__).resolve().parents[2]


def test_no_file_of_tune_magic_names_the_third_scheduler():
    for path in (REPO / "tune_magic").rglob("*.py"):
        text = path.read_text()
        assert "tm_third" not in text and "ThirdScheduler" not in text and '"third"' not in text, path


def test_it_is_found_with_its_options_and_without_the_package_it_is_not(third, monkeypatch):
    assert schedulers.names()[:2] == ("local", "slurm") and "third" in schedulers.names()
    opts = dict(schedulers.options())["third"]
    assert [(o.flag, o.name, o.kind) for o in opts] == [("--niceness", "niceness", "count"), ("--label", "label", "text")]
    monkeypatch.syspath_prepend("/nonexistent")  # (sys.path is restored by monkeypatch)
    sys.path.remove(str(PACKAGE_DIR))
    schedulers.refresh()
    assert "third" not in schedulers.names()
    with pytest.raises(PlanError, match="'third' is not a scheduler; use local or slurm"):
        schedulers.read_options("third")


def test_its_options_are_read_by_its_rows_and_other_schedulers_refuse_them(third):
    assert schedulers.read_options("third", niceness="5", label="exp1").values == {"niceness": 5, "label": "exp1"}
    with pytest.raises(PlanError, match="--niceness 20: niceness goes up to 19"):
        schedulers.read_options("third", niceness=20)
    with pytest.raises(PlanError, match="^--niceness: an option of --scheduler third, not of local: add --scheduler third"):
        schedulers.read_options("local", niceness=5)
    with pytest.raises(PlanError, match="--nodes: an option of --scheduler slurm, not of third"):
        schedulers.read_options("third", nodes=2)


def test_cli_help_and_a_dry_run_show_its_options(third):
    env = {**os.environ, "TUNE_MAGIC_SCHEDULER": ""}
    out = subprocess.run([sys.executable, "-m", "tune_magic", "run", "--help"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "options of --scheduler third:" in out.stdout and "--niceness VALUE" in out.stdout
    assert "options of --scheduler slurm:" in out.stdout
    dry = subprocess.run([sys.executable, "-m", "tune_magic", "cmd", "--scheduler", "third", "--niceness", "7",
                          *toy_args(nproc=1).split()], capture_output=True, text=True, env=env, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert " nice -n 7 " in f" {dry.stdout.strip()} ", dry.stdout


def test_the_magics_help_in_a_fresh_process_lists_its_options(third):
    code = ("from tune_magic.ui.magics import TuneMagics; import sys; "
            "sys.stdout.write(TuneMagics.tune_run.__doc__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--niceness NICENESS" in out.stdout and "third: run the job's processes at this niceness" in out.stdout


def test_the_panel_offers_it_with_a_field_per_option(third, tmp_path):
    from tune_magic.ui.panel import Panel

    panel = Panel(cwd=tmp_path)
    assert "third" in panel.schedulers_offered and list(panel.scheduler_fields["third"]) == ["niceness", "label"]
    panel.recipe.value, panel.config.value = "lora_finetune", "tiny/lora"
    panel.scheduler.value = "third"
    panel.scheduler_fields["third"]["niceness"].value = 3
    panel.scheduler_fields["third"]["label"].value = "from-panel"
    assert panel.scheduler_options() == {"scheduler": "third", "niceness": 3, "label": "from-panel"}
    assert "nice -n 3 " in panel.command_preview.value, panel.command_preview.value


def test_a_job_runs_end_to_end_through_the_magic_and_is_listed_followed_and_stopped(third, ip, cleanup_jobs):
    job = ip.run_cell_magic("tune_run", f"--scheduler third --niceness 5 --label exp1 {toy_args('steps=40', nproc=2)}",
                            "step_s=0.2")
    cleanup_jobs.append(job)
    assert (job.scheduler, job.record.scheduler_options, job.engine_id) == ("third", {"niceness": 5, "label": "exp1"},
                                                                            "exp1")
    wait_for(lambda: job.refresh().record.workers, timeout=TIMEOUT, interval=0.2,
             what="the supervisor to find the ranks")
    assert job.record.workers, "the supervisor never found the ranks"
    assert psutil.Process(job.pid).nice() == 5  # the option reached the processes
    listed = subprocess.run([sys.executable, "-m", "tune_magic", "jobs", "--json"], capture_output=True, text=True,
                            timeout=120)
    row = next(r for r in json.loads(listed.stdout) if r["id"] == job.id)
    assert (row["scheduler"], row["engine_id"], row["scheduler_options"]) == ("third", "exp1",
                                                                              {"niceness": 5, "label": "exp1"})
    assert job.stop(grace_s=5) == "stopped"
    assert json.loads((job.dir / "procs.json").read_text())["scheduler"] == "third"


def test_launch_runs_it_to_success_and_a_process_without_the_package_still_lists_the_job(third, cleanup_jobs):
    import tune_magic

    job = tune_magic.launch(toy_args("steps=3", "step_s=0.1", nproc=1), scheduler="third", label="plain")
    cleanup_jobs.append(job)
    assert job.wait(TIMEOUT) == "succeeded" and job.returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    listed = subprocess.run([sys.executable, "-m", "tune_magic", "jobs", "--json"], capture_output=True, text=True,
                            timeout=120, env=env)
    assert listed.returncode == 0, listed.stderr
    row = next(r for r in json.loads(listed.stdout) if r["id"] == job.id)
    assert (row["scheduler"], row["status"]) == ("third", "succeeded")


def test_a_scheduler_can_take_a_whole_sweep_at_once_through_submit_sweep(third, tmp_path):
    """The seam a job-array scheduler uses: ``submit_sweep`` registers every trial (``register_trial``)
    and submits them together; no sweep process runs; ``cancel_sweep`` is called on stop."""
    import tune_magic
    from tune_magic.sweeping import store as sweepstore

    sweep = tune_magic.sweep(toy_args("start_loss=1,2,3", "steps=2", "step_s=0.1", nproc=None), scheduler="third",
                             label="array", cwd=tmp_path)
    record = sweepstore.read(sweep.dir)
    assert record.engine == {"array": f"third-{sweep.id}"}
    assert [t.status for t in record.trials] == ["started"] * 3 and all(t.job_id for t in record.trials)
    assert not processes_mentioning(sweep.id)  # no sweep process: the scheduler took the sweep
    jobs = sweep.jobs
    assert [j.scheduler for j in jobs] == ["third"] * 3 and [j.record.sweep["trial"] for j in jobs] == [0, 1, 2]
    assert sweep.wait(TIMEOUT) == {"succeeded": 3}
    sweep.stop(grace_s=1)
    assert (sweep.dir / "third-cancelled").read_text() == f"third-{sweep.id}"
