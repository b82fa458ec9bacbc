"""torchtune 0.6.1's component shorthand on a real job (issue 26): ``optimizer=torch.optim.SGD``
before ``optimizer.lr=...`` launches, runs to the end, and the recipe's own saved config names
torch.optim.SGD with the section's other keys kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

import tune_magic.job.launch as L

pytestmark = pytest.mark.e2e

TIMEOUT = 240


def test_a_job_launched_with_the_component_shorthand_runs_with_sgd(tiny_assets, cleanup_jobs):
    words = ["optimizer=torch.optim.SGD", "optimizer.lr=0.05"]
    job = L.launch(["lora_finetune", "--config", "tiny/lora", "max_steps_per_epoch=3", *words], name="sgd")
    cleanup_jobs.append(job)
    assert job.wait(TIMEOUT) == "succeeded", job.tail(40)
    record = job.record
    assert record.returncode == 0
    assert record.overrides[:3] == ["max_steps_per_epoch=3", *words]  # the record keeps the words as given
    saved = OmegaConf.load(Path(record.output_dir) / "resolved_config.yaml")  # written by the recipe itself
    assert OmegaConf.to_container(saved.optimizer) == {"_component_": "torch.optim.SGD", "fused": False,
                                                       "weight_decay": 0.0, "lr": 0.05}
    steps = [l for f in sorted(Path(record.metric_log_dir).glob("log_*.txt")) for l in f.read_text().splitlines()
             if l.startswith("Step ")]
    assert len(steps) == 3, steps
