"""The launch panel built in the test process itself (no kernel): it works in any Python process."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from tune_magic import jobstore
from tune_magic.command import build_plan
from tune_magic.jobstore import JobRecord, ProcessRef
from tune_magic.panel import Panel

from jobhelpers import write_fake_nvidia_smi


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """A FAKE nvidia-smi with 4 GPUs on PATH (there is no GPU here)."""
    write_fake_nvidia_smi(tmp_path / "bin", 4)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def fake_running_job_on_gpu_1():
    """A FAKE running job record holding GPU 1, 'supervised' by this very process (so it is alive)."""
    me = psutil.Process()
    rec = JobRecord(id="20990101-000000-fake01", name="fake", argv=["python", "x.py"], env={}, cwd="/",
                    log_path="/dev/null", started_at=time.time(), gpus=[1],
                    supervisor=ProcessRef(me.pid, me.create_time()),
                    agent=ProcessRef(me.pid, 0.0))  # never matches: a stop() could not signal us
    d = jobstore.create(rec)
    yield rec.id
    jobstore.update(d, status="stopped")


def test_preview_is_exactly_the_builders_command(tmp_path):
    panel = Panel(cwd=tmp_path)
    assert panel.launch_button.disabled  # nothing chosen yet
    panel.recipe.value = "lora_finetune"
    assert panel.config.options[0] == "tiny/lora"
    panel.config.value = "tiny/lora"
    panel.nproc.value = 2
    panel.overrides.value = "max_steps_per_epoch=4\n# comment\nmetric_logger.name=\"my run\"\n"
    expected = build_plan(["--nproc_per_node", "2", "lora_finetune", "--config", "tiny/lora",
                           "max_steps_per_epoch=4", "metric_logger.name=my run"], cwd=tmp_path).command_line()
    assert panel.command_preview.value == expected
    assert not panel.launch_button.disabled and panel.error.value == ""


def test_invalid_choices_show_the_builders_error_and_disable_launch(tmp_path):
    panel = Panel(cwd=tmp_path)
    panel.recipe.value = "lora_finetune"
    panel.config.value = "tiny/lora"
    for endpoint, words in [("node0:99999", "outside 0-65535"), (":29400", "empty host"), ("fe80::1", "brackets")]:
        panel.endpoint.value = endpoint
        assert panel.launch_button.disabled, endpoint
        assert words in panel.error.value
        assert panel.command_preview.value == ""
    panel.endpoint.value = ""
    panel.overrides.value = "not an override"
    assert panel.launch_button.disabled and "key=value" in panel.error.value


def test_gpus_listed_with_busy_ones_marked(tmp_path, fake_gpus, fake_running_job_on_gpu_1):
    panel = Panel(cwd=tmp_path)
    assert panel.gpus.options == (("0", 0), (f"1 (busy: {fake_running_job_on_gpu_1})", 1), ("2", 2), ("3", 3))
    panel.recipe.value = "lora_finetune"
    panel.config.value = "tiny/lora"
    panel.gpus.value = (2, 3)
    assert "CUDA_VISIBLE_DEVICES=2,3" in panel.command_preview.value
    assert "--nproc_per_node 2" in panel.command_preview.value


def test_recipe_and_config_files_under_the_working_directory_are_offered(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "my_recipe.py").write_text("")
    (tmp_path / "my.yaml").write_text("output_dir: /tmp/x\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "hidden.py").write_text("")
    panel = Panel(cwd=tmp_path)
    assert "sub/my_recipe.py" in panel.recipe.options and ".venv/hidden.py" not in panel.recipe.options
    panel.recipe.value = "sub/my_recipe.py"
    assert panel.config.options == ("my.yaml",)
