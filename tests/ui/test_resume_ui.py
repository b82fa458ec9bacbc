"""Resume in the front ends, without launching: the card's lineage chart and Resume control, a jobs-table
row's Resume button, ``%tune_resume`` and ``tune-magic resume`` (dry runs and refusals), and the
RESUME column of ``tune-magic jobs``. Jobs are records, logs and output_dirs written here (FAKE: no
process ran), in the formats real ones have. Real resumes through each: tests/e2e/test_resume_api.py
and tests/e2e/test_browser.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import tune_magic
from tune_magic.job import Job
from tune_magic.ui.resumeview import marker_steps
from tune_magic.ui.cards import JobCard
from tune_magic.ui.views import JobsTable

from resumehelpers import fake_job, metric_log, toy_checkpoint


@pytest.fixture
def root(job_registry):
    return job_registry




def test_a_resumed_jobs_card_draws_the_earlier_run_dimmed_and_a_marker_where_it_resumed(root, tmp_path):
    out = toy_checkpoint(tmp_path / "out")
    fake_job(root, "a", out, status="stopped", log=metric_log(out, [1, 2, 3]), started=100.0, resumed_by="b")
    fake_job(root, "b", out, status="succeeded", log=metric_log(out, [3, 4, 5, 6]), started=200.0, resumed_from="a",
             resume_point={"checkpoint": "epoch_0/", "epoch": 0, "step": 2, "case": "exact"})
    card = JobCard(Job(root / "b"), watch=False)
    snap = card.watcher.poll_once()
    assert (snap.steps, snap.earlier_steps, snap.resumed_at) == ((3, 4, 5, 6), (1, 2), (2,))
    assert list(card.loss_line.x) == [3, 4, 5, 6] and list(card.earlier_line.x) == [1, 2]
    assert list(card.earlier_line.y) == [10.0, 5.0] and list(card.earlier_line.opacities) == [0.3]
    assert marker_steps(card.resume_markers) == [[2, 2]] and card.resume_markers.line_style == "dashed"
    assert list(card.x_axis.tick_values) == [1, 2, 3, 4, 5, 6]  # one axis for the whole lineage
    assert "resumed job a from epoch_0/ at step 2" in card.text()
    assert card.resume_control.layout.display == "none"  # succeeded: nothing to resume
    old = JobCard(Job(root / "a"), watch=False)
    old.watcher.poll_once()
    assert "resumed by job b" in old.text() and old.resume_control.layout.display == "none"  # resumed already


def test_a_cards_resume_control_shows_the_preflight_before_anything_starts(root, tmp_path):
    out = toy_checkpoint(tmp_path / "out")
    fake_job(root, "f", out, log=metric_log(out, [1, 2, 3]))
    card = JobCard(Job(root / "f"), watch=False)
    card.watcher.poll_once()
    control = card.resume_control
    assert control.layout.display is None and control.confirm_button.layout.display == "none"
    control.resume_button.click()
    assert "Resume job f: toy_recipe from epoch_0/ (1 of 3 epochs done, global step 2)" in control.preview.value
    assert control.confirm_button.description == "Resume now" and control.confirm_button.layout.display is None
    assert [j.id for j in tune_magic.jobs()] == ["f"]  # nothing started
    control.cancel_button.click()
    assert control.preview.layout.display == "none" and control.confirm_button.layout.display == "none"


def test_nothing_saved_offers_start_again_and_a_refusal_says_why(root, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    fake_job(root, "n", empty)
    card = JobCard(Job(root / "n"), watch=False)
    card.resume_control.resume_button.click()
    assert card.resume_control.confirm_button.description == "Start again"
    assert "Start job n again from the beginning" in card.resume_control.preview.value
    fake_job(root, "x", tmp_path / "gone")  # its output_dir is gone, and a fresh start needs none
    card = JobCard(Job(root / "x"), watch=False)
    card.resume_control.resume_button.click()
    assert card.resume_control.confirm_button.description == "Start again"


def test_a_table_rows_resume_button_shows_the_preflight_then_asks_to_confirm(root, tmp_path):
    out = toy_checkpoint(tmp_path / "out")
    fake_job(root, "r", out)
    fake_job(root, "ok", tmp_path / "o2", status="succeeded")
    table = JobsTable(live=False)
    row = next(r for r in table._slots if r.job is not None and r.job.id == "r")
    assert row.stop_cell.children == (row.resume_button,)
    done = next(r for r in table._slots if r.job is not None and r.job.id == "ok")
    assert done.stop_cell.children == ()  # a succeeded job has nothing to resume
    row.resume_button.click()
    assert row.resume_button.description == "Confirm" and row.reason.layout.display is None
    assert "Resume job r: toy_recipe from epoch_0/" in row.reason.value
    assert [j.id for j in tune_magic.jobs()] == ["r", "ok"]  # nothing started yet


def test_the_magic_dry_run_prints_the_preflight_and_refusals_are_usage_errors(root, tmp_path, ip, capsys):
    from IPython.core.error import UsageError

    out = toy_checkpoint(tmp_path / "out")
    fake_job(root, "m", out)
    plan = ip.run_line_magic("tune_resume", "m --dry-run step_s=0.01")
    printed = capsys.readouterr().out
    assert printed.startswith("Resume job m: toy_recipe from epoch_0/") and "  your overrides: step_s=0.01" in printed
    assert "  command: " in printed and plan.extra == ("step_s=0.01",)
    with pytest.raises(UsageError, match="give the job to resume"):
        ip.run_line_magic("tune_resume", "--dry-run")
    with pytest.raises(UsageError, match="no job 'nope'"):
        ip.run_line_magic("tune_resume", "nope")
    ip.run_line_magic("tune_resume", "--help")
    assert "%tune_resume JOB [--dry-run] [--fresh]" in capsys.readouterr().out


def cli(*args):
    return subprocess.run([sys.executable, "-m", "tune_magic", *args], capture_output=True, text=True, timeout=120,
                          env=os.environ.copy())


def test_the_cli_resume_dry_run_help_refusals_and_the_jobs_column(root, tmp_path):
    out = toy_checkpoint(tmp_path / "out")
    fake_job(root, "a", out, status="stopped", resumed_by="b")
    fake_job(root, "b", out, resumed_from="a", resume_point={"checkpoint": "epoch_0/", "epoch": 0, "step": 2})
    r = cli("resume", "--dry-run", "b", "step_s=0.01")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Resume job b: toy_recipe from epoch_0/") and "  command: " in r.stdout
    r = cli("resume", "a")
    assert r.returncode == 2 and "job a was resumed already, by job b" in r.stderr
    r = cli("resume")
    assert r.returncode == 2 and "give the job to resume" in r.stderr
    r = cli("resume", "--help")
    assert r.returncode == 0 and "usage: tune-magic resume JOB [--dry-run] [--fresh]" in r.stdout
    assert "--max-resumes VALUE" in r.stdout
    listed = cli("jobs").stdout.splitlines()
    assert listed[0].split()[-1] == "RESUME"
    rows = {line.split()[0]: line for line in listed[1:]}
    assert rows["a"].endswith("resumed by b") and rows["b"].endswith("resume of a from epoch_0/")
    data = {j["id"]: j for j in json.loads(cli("jobs", "--json").stdout)}
    assert (data["b"]["resumed_from"], data["a"]["resumed_by"], data["b"]["attempts"]) == ("a", "b", [])
