"""Where a plan's job will write and what it reads, checked before anything starts."""

import pytest

import tune_magic.job as J
import tune_magic.job.launch as L
from tune_magic.registry import store as jobstore
from tune_magic.errors import PlanError
from tune_magic.job.launch import build_plan
from tune_magic.plan.configview import resolve_dirs


def test_shipped_config_dirs_fall_inside_the_job_output_dir(session_home):
    plan = build_plan("lora_finetune --config tiny/lora", job_id="j1")
    dirs = resolve_dirs(plan)
    assert dirs.output_dir == f"{session_home}/runs/tiny_lora/j1"
    assert dirs.metric_log_dir == f"{session_home}/runs/tiny_lora/j1/logs"
    assert dirs.checkpoint_dir == dirs.output_dir
    assert dirs.warnings == []


def test_hard_coded_log_dir_elsewhere_warns(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"output_dir: {tmp_path}/out\nmetric_logger:\n  log_dir: /tmp/shared_logs\n")
    (tmp_path / "r.py").write_text("")
    dirs = resolve_dirs(build_plan("r.py --config c.yaml", cwd=tmp_path, job_id="j2"))
    assert dirs.output_dir == f"{tmp_path}/out/j2"
    assert len(dirs.warnings) == 1 and "metric_logger.log_dir is /tmp/shared_logs" in dirs.warnings[0]


def test_deletion_override_and_missing_inputs(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"output_dir: {tmp_path}/out\ntokenizer:\n  path: {tmp_path}/nope.model\n"
                   f"checkpointer:\n  checkpoint_dir: {tmp_path}\n")
    (tmp_path / "r.py").write_text("")
    dirs = resolve_dirs(build_plan("r.py --config c.yaml", cwd=tmp_path))
    assert dirs.missing_inputs == [("tokenizer.path", f"{tmp_path}/nope.model")]
    dirs = resolve_dirs(build_plan("r.py --config c.yaml ~tokenizer.path", cwd=tmp_path))
    assert dirs.missing_inputs == []


def test_launch_refuses_missing_assets_before_starting_anything(tmp_path):
    before = {r.id for r in jobstore.list_records()}
    with pytest.raises(PlanError, match="tune-magic assets"):
        L.launch(f"lora_finetune --config tiny/lora assets_dir={tmp_path}/no_assets")
    assert {r.id for r in jobstore.list_records()} == before
    assert [p for p in jobstore.jobs_root().iterdir() if p.name not in before and p.is_dir()] == []  # no half-made job dir


def test_relative_output_dir_is_taken_from_the_jobs_cwd(tmp_path):
    (tmp_path / "r.py").write_text("")
    (tmp_path / "c.yaml").write_text("output_dir: runs/mine\n")
    dirs = resolve_dirs(build_plan("r.py --config c.yaml", cwd=tmp_path, job_id="j3"), cwd=tmp_path)
    assert dirs.output_dir == f"{tmp_path}/runs/mine/j3"


def test_no_output_dir_but_shared_log_dir_warns(tmp_path):
    (tmp_path / "r.py").write_text("")
    (tmp_path / "c.yaml").write_text("metric_logger:\n  log_dir: /tmp/shared\n")
    dirs = resolve_dirs(build_plan("r.py --config c.yaml", cwd=tmp_path), cwd=tmp_path)
    assert dirs.output_dir is None and "has no output_dir" in dirs.warnings[0]


def test_unresolvable_interpolation_refused_before_start(tmp_path, monkeypatch):
    monkeypatch.delenv("TM_SURELY_NOT_SET", raising=False)
    (tmp_path / "r.py").write_text("")
    (tmp_path / "c.yaml").write_text("output_dir: ${oc.env:TM_SURELY_NOT_SET}/x\n")
    before = {r.id for r in jobstore.list_records()}
    with pytest.raises(PlanError, match="output_dir cannot be resolved.*nothing was started"):
        L.launch("r.py --config c.yaml", cwd=tmp_path)
    assert {r.id for r in jobstore.list_records()} == before


def test_dry_run_registers_nothing_and_leaves_no_temp_dir(tmp_path, monkeypatch):
    import glob
    import tempfile

    home_file = tmp_path / "not_a_dir"
    home_file.write_text("")
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(home_file))  # a dry run never touches the job registry
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    plan = L.launch("--nproc_per_node 2 lora_finetune_distributed --config llama3_2/1B_lora", dry_run=True)
    assert plan.rendezvous == "standalone"
    assert glob.glob(str(tmp_path / "tune_magic_dry_run_*")) == []
