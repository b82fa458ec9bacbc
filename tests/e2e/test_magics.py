"""%%tune_run and friends in a real IPython shell (run_cell_magic), with real torchrun jobs.

Most jobs use the test-only toy recipe, whose step-N loss is start_loss / N by construction, so the
expected curve is known without parsing the log.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import yaml
from IPython.core.error import UsageError

import tune_magic.job as J
from tune_magic.registry import store as jobstore
from tune_magic.plan.model import LaunchPlan
from tune_magic.ui.cards import JobCard

import waiting
from jobhelpers import TOY_CONFIG, processes_mentioning, toy_args

TIMEOUT = 180


@pytest.fixture
def started():
    jobs = []
    yield jobs
    for job in jobs:
        job.stop(grace_s=2)


#: this file's waits: TIMEOUT s deadlines, polled every 100 ms
wait_for = partial(waiting.wait_for, timeout=TIMEOUT, interval=0.1)


def record_ids():
    return {r.id for r in jobstore.list_records()}


def test_help_comes_from_magic_arguments(ip):
    doc = ip.find_cell_magic("tune_run").__doc__
    assert "%tune_run [--name NAME] [--gpus GPUS] [--force] [--wait] [--dry-run]" in doc
    assert "GPU ids for this job" in doc and "the same words as `tune run`" in doc
    assert ip.find_line_magic("tune_run").__doc__ == doc  # %tune_run is the same magic
    assert "--all" in ip.find_line_magic("tune_stop").__doc__


def test_cell_returns_at_once_and_the_card_comes_to_show_the_losses(ip, started, capsys):
    job = ip.run_cell_magic("tune_run", "--name live " + toy_args("steps=5", "step_s=0.5"), "# defaults only\n")
    started.append(job)
    assert isinstance(job, J.Job)
    # the cell is done; the job has not logged a loss yet
    assert job.status == "running"
    assert all("Step" not in f.read_text() for f in Path(job.output_dir, "logs").glob("log_*.txt"))
    card = JobCard.for_job(job.id)
    assert card is not None and card.watcher._thread.name == f"tune_magic-watch-{job.id}"
    assert card.watcher._thread.daemon
    wait_for(lambda: card.snapshot is not None and len(card.snapshot.losses) == 5, what="5 losses on the card")
    assert list(card.loss_line.x) == [1, 2, 3, 4, 5]
    assert list(card.loss_line.y) == pytest.approx([10.0, 5.0, 10 / 3, 2.5, 2.0])
    wait_for(lambda: card.snapshot.status == "succeeded", what="succeeded on the card")
    assert card.stop_button.disabled
    assert "step 5" in card.progress.value and "loss 2" in card.progress.value
    assert job.record.rendezvous_endpoint in card.header.value
    # terminal IPython cannot render widgets: the card came out as text
    out = capsys.readouterr().out
    assert f"job {job.id} (live)" in out


def test_wait_streams_text_with_the_final_loss(ip, capsys):
    job = ip.run_cell_magic("tune_run", "--wait " + toy_args("steps=3"), "start_loss=9\n")
    assert job.status == "succeeded"
    out = capsys.readouterr().out
    assert "step 1 | loss 9\n" in out and "step 3 | loss 3\n" in out
    assert f"job {job.id} (toy_recipe): succeeded" in out
    assert "step 3 loss 3" in out


def test_override_body_reaches_the_recipe(ip, started):
    job = ip.run_cell_magic("tune_run", toy_args("steps=2"), "# overrides\nstart_loss=20\nstep_s=0.1  # faster\n")
    started.append(job)
    assert job.wait(TIMEOUT) == "succeeded"
    written = yaml.safe_load(Path(job.output_dir, "resolved_config.yaml").read_text())
    assert (written["start_loss"], written["step_s"], written["steps"]) == (20, 0.1, 2)


def test_yaml_body_merges_over_config_and_is_saved_with_the_job(ip, started):
    body = "steps: 2\nstart_loss: 30.0\nextra:\n  note: from the cell\n"
    job = ip.run_cell_magic("tune_run", f"--nproc_per_node 2 {toy_args(nproc=None)}", body)
    started.append(job)
    assert job.wait(TIMEOUT) == "succeeded"
    saved = job.dir / "config.yaml"
    assert job.argv[job.argv.index("--config") + 1] == str(saved)
    written = yaml.safe_load(Path(job.output_dir, "resolved_config.yaml").read_text())
    assert written["start_loss"] == 30.0 and written["extra"] == {"note": "from the cell"}
    assert written["step_s"] == yaml.safe_load(TOY_CONFIG.read_text())["step_s"]  # from --config
    assert "${oc.env:TUNE_MAGIC_HOME}" in saved.read_text()  # interpolations kept for the recipe


def test_yaml_body_alone_is_the_config(ip, started, tmp_path):
    body = f"output_dir: {tmp_path}/alone\nsteps: 1\nstep_s: 0.1\nstart_loss: 4.0\n"
    job = ip.run_cell_magic("tune_run", f"{toy_args(nproc=None).split(' --config')[0]}", body)
    started.append(job)
    assert job.wait(TIMEOUT) == "succeeded"
    assert Path(job.output_dir) == tmp_path / "alone" / job.id
    assert yaml.safe_load(Path(job.output_dir, "resolved_config.yaml").read_text())["start_loss"] == 4.0
    # what a resume launches again is recorded, for a body that is the whole config too
    assert (job.record.torchrun_options, job.record.overrides) == ([], [f"output_dir={tmp_path}/alone/{job.id}"])


def test_var_expansion_keeps_omegaconf_and_undefined_names_fail(ip):
    ip.user_ns["n_steps"] = 7
    before = record_ids()
    plan = ip.run_cell_magic("tune_run", "--dry-run " + toy_args("steps={n_steps}", "'note=${oc.env:HOME}'"), "# none\n")
    assert isinstance(plan, LaunchPlan)
    assert "steps=7" in plan.argv and "note=${oc.env:HOME}" in plan.argv
    with pytest.raises(UsageError, match="'undefined_thing' is not defined"):
        ip.run_cell_magic("tune_run", toy_args("steps={undefined_thing}"), "# none\n")
    # override lines in the body expand too (a literal {n_steps} would reach the recipe and fail there)
    plan = ip.run_cell_magic("tune_run", "--dry-run " + toy_args(), "steps={n_steps}\nnote=${oc.env:HOME}\n")
    assert "steps=7" in plan.argv and "note=${oc.env:HOME}" in plan.argv
    with pytest.raises(UsageError, match="'undefined_in_body' is not defined"):
        ip.run_cell_magic("tune_run", toy_args(), "steps={undefined_in_body}\n")
    assert record_ids() == before  # a dry run registers nothing; an error starts nothing


def test_yaml_syntax_error_reports_the_line_and_starts_nothing(ip):
    before = record_ids()
    with pytest.raises(UsageError, match="line 4, column 2"):
        ip.run_cell_magic("tune_run", toy_args(), "steps: 2\nextra:\n  - a\n b: [\n")
    assert record_ids() == before


def test_bad_input_is_a_usage_error(ip):
    with pytest.raises(UsageError, match="endpoint"):
        ip.run_cell_magic("tune_run", "--nnodes 2 " + toy_args(), "# x\n")
    with pytest.raises(UsageError, match="missing --config"):
        ip.run_line_magic("tune_run", "lora_finetune")
    with pytest.raises(UsageError, match="--gpus is an option of %%tune_run itself: put it first"):
        ip.run_line_magic("tune_run", "lora_finetune --config tiny/lora --gpus 0")
    with pytest.raises(UsageError, match="close every quote"):
        ip.run_line_magic("tune_logs", '"x')
    with pytest.raises(UsageError, match="--grace"):
        ip.run_line_magic("tune_stop", "--grace -1 20990101-000000-abcdef")


def test_dry_run_env_makes_every_launch_a_dry_run(ip, monkeypatch):
    monkeypatch.setenv("TUNE_MAGIC_DRY_RUN", "1")
    before = record_ids()
    plan = ip.run_line_magic("tune_run", "--gpus 2,3 --nproc_per_node 2 lora_finetune_distributed --config llama3_2/1B_lora")
    assert isinstance(plan, LaunchPlan) and plan.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert record_ids() == before


def test_stop_button_stops_the_job_with_no_orphans(ip, started):
    job = ip.run_line_magic("tune_run", toy_args("steps=1000", "step_s=0.1"))
    started.append(job)
    card = JobCard.for_job(job.id)
    wait_for(lambda: len(job.refresh().record.workers) == 2, what="workers")
    card.stop_button.click()
    assert card.stop_button.disabled
    wait_for(lambda: job.status == "stopped", what="stopped")
    wait_for(lambda: card.snapshot.status == "stopped", what="card shows stopped")
    assert card.stop_button.layout.display == "none"
    assert "stopped</b> by the user" in card.error.value and card.error.layout.display is None
    wait_for(lambda: processes_mentioning(job.id) == [], timeout=30, what="no processes left")


def test_card_text_while_its_thread_polls_is_always_complete(ip, started):
    # regression: text() polled the follower from the caller's thread while the watcher thread did
    job = ip.run_cell_magic("tune_run", toy_args("steps=3", "step_s=0.1"), "# x\n")
    started.append(job)
    assert job.wait(TIMEOUT) == "succeeded"
    for _ in range(100):
        card = JobCard(job, interval_s=0)
        text = card.text()
        assert "step 3/3 · loss 3.3333" in text and "toy recipe done" in text, text
        card.close()


def test_tune_jobs_and_tune_stop(ip, started, capsys):
    job = ip.run_line_magic("tune_run", "--name listed " + toy_args("steps=1000", "step_s=0.1"))
    started.append(job)
    capsys.readouterr()
    ip.run_line_magic("tune_jobs", "")
    table = capsys.readouterr().out
    row = next(l for l in table.splitlines() if l.startswith(job.id))
    assert row.split()[1:3] == ["listed", "running"]
    ip.run_line_magic("tune_stop", job.id)
    assert capsys.readouterr().out.strip() == f"{job.id} stopped"
    with pytest.raises(UsageError, match="no job"):
        ip.run_line_magic("tune_stop", "20990101-000000-abcdef")
    with pytest.raises(UsageError, match="not valid"):
        ip.run_line_magic("tune_logs", "../etc")


def test_case8_magics_never_touch_torch_cuda(ip, started, fake_gpus, monkeypatch):
    import torch

    def boom(*a, **k):
        raise AssertionError("torch.cuda touched in the kernel")

    for name in ("init", "_lazy_init", "is_available", "device_count", "current_device", "get_device_name"):
        monkeypatch.setattr(torch.cuda, name, boom)
    job = ip.run_line_magic("tune_run", "--gpus 1,2 " + toy_args("steps=2", nproc=None))
    started.append(job)
    assert job.gpus == [1, 2] and job.record.env["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert job.wait(TIMEOUT) == "succeeded"
    ip.run_line_magic("tune_jobs", "")
