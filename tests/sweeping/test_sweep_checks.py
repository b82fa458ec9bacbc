"""Sweeps checked before anything starts (tune_magic.sweeping.create): refusals, dry runs, slots, the
Weights & Biases group, the magic's and the CLI's dry runs, the panel's preview. Nothing here starts a
job: every refusal is also checked to leave nothing registered."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from IPython.core.error import UsageError

import tune_magic
from tune_magic.errors import PlanError
from tune_magic.sweeping import store as sweepstore
from tune_magic.sweeping.create import preview, sweep

from jobhelpers import TOY_CONFIG, TOY_RECIPE, write_fake_nvidia_smi

TOY = f"{TOY_RECIPE} --config {TOY_CONFIG}"


def registered() -> set[str]:
    return {d.name for d in sweepstore.list_dirs()}


@pytest.fixture
def nothing_registered(session_home):
    """Fails the test if a sweep (or a job) was registered during it."""
    before_sweeps, before_jobs = registered(), {j.id for j in tune_magic.jobs()}
    yield
    assert registered() == before_sweeps
    assert {j.id for j in tune_magic.jobs()} == before_jobs


@pytest.mark.parametrize("args, kwargs, parts", [
    (f"{TOY} steps=2", {}, ["--sweep found no axis", "optimizer.lr=1e-4,3e-4", "range(start,stop)"]),
    (f"{TOY} output_dir=/a,/b", {}, ["sweep axis output_dir", "writes to"]),
    (f"{TOY} start_loss=1 metric_logger.log_dir=a,b", {}, ["sweep axis metric_logger.log_dir"]),
    (f"{TOY} start_loss=1,,3", {}, ["empty item (two commas in a row)"]),
    (f"{TOY} steps=range(1,41) seed=range(0,30)", {},
     ["makes 1,200 trials (40 steps x 30 seed), more than the cap of 1,000", "--max-trials 1200"]),
    (f"{TOY} start_loss=1,2", {"gpus": "0,1", "gpus_per_trial": 4},
     ["--gpus-per-trial 4 is larger than the pool --gpus 0,1 (2 GPUs)"]),
    (f"{TOY} start_loss=1,2", {"max_parallel": 0}, ["--max-parallel 0 must be at least 1"]),
    (f"--nproc_per_node 1 --rdzv-endpoint localhost:29400 {TOY} start_loss=1,2", {},
     ["--rdzv-endpoint would give every trial the same rendezvous port", "Drop --rdzv-endpoint"]),
    (f"{TOY} start_loss=1,abc", {}, ["sweep axis start_loss, item 2 (abc)", "the config has start_loss: 10.0"]),
    (f"{TOY} strat_loss=1,2", {}, ["did you mean start_loss"]),
])
def test_bad_input_is_refused_before_anything_starts(args, kwargs, parts, nothing_registered):
    for dry_run in (True, False):
        with pytest.raises(PlanError) as info:
            sweep(args, dry_run=dry_run, **kwargs)
        for part in parts:
            assert part in str(info.value), (dry_run, str(info.value))


def test_a_rendezvous_endpoint_in_the_environment_is_refused_too(nothing_registered):
    env = {**os.environ, "PET_RDZV_ENDPOINT": "localhost:29400"}
    with pytest.raises(PlanError, match="PET_RDZV_ENDPOINT would give every trial the same rendezvous port"):
        sweep(f"--nproc_per_node 1 {TOY} start_loss=1,2", env=env, dry_run=False)


def test_max_trials_raises_the_cap(nothing_registered):
    dry = preview(f"{TOY} steps=range(1,41) seed=range(0,30)", max_trials=1200)
    assert len(dry) == 1200 and len(dry.plans) == 1
    assert "steps=1" in dry.plans[0].argv and "seed=0" in dry.plans[0].argv


def test_dry_run_shows_every_trial_and_its_command_with_quotes_kept(nothing_registered):
    dry = sweep(f'{TOY} start_loss=1,2 crash_message="a,b" seed=range(3,5)', max_parallel=2, dry_run=True,
                name="grid")
    assert len(dry) == 4 and dry.slots.max_parallel == 2 and dry.name == "grid"
    assert [t.name for t in dry.plan.trials] == ["start_loss=1,seed=3", "start_loss=1,seed=4",
                                                 "start_loss=2,seed=3", "start_loss=2,seed=4"]
    for trial, plan in zip(dry.plan.trials, dry.plans):
        assert "crash_message=a,b" in plan.argv  # typed inside shell quotes: one value, not an axis
        assert [w for w in plan.argv if w.startswith(("start_loss=", "seed="))] == list(trial.words)
    text = dry.text()
    assert text.startswith("sweep grid: 4 trials (2 start_loss x 2 seed), 2 at a time without GPUs")
    for trial, plan in zip(dry.plan.trials, dry.plans):
        assert f"trial {trial.index}: {trial.name}\n{plan.command_line()}" in text


def test_a_key_the_config_lacks_is_a_warning_as_for_overrides(nothing_registered):
    dry = sweep(f"{TOY} start_loss=1,2 tag=x,y", dry_run=True)
    assert len(dry) == 4
    assert any("override tag=x: the config has no key tag" in w for w in dry.warnings), dry.warnings
    assert "warning: override tag=x: the config has no key tag" in dry.text()


def test_a_yaml_body_sweep_mapping_adds_axes_and_the_rest_is_merged_over_the_config(nothing_registered):
    body = "steps: 2\nsweep:\n  start_loss: [1.0, 2.0]\n  seed: [3, 4]\n"
    dry = sweep(f"{TOY} epochs=1,2", config_overlay=body, dry_run=True)
    assert [a.key for a in dry.plan.axes] == ["epochs", "start_loss", "seed"] and len(dry) == 8
    first = dry.plans[0]
    assert first.argv[-4:-1] == ["epochs=1", "start_loss=1.0", "seed=3"]
    assert "steps: 2" in Path(first.config).read_text() and "sweep" not in Path(first.config).read_text()
    with pytest.raises(PlanError, match="sweep: start_loss has no values"):
        sweep(TOY, config_overlay="sweep:\n  start_loss: []\n", dry_run=True)


def test_trials_of_a_wandb_config_share_its_group(tmp_path, nothing_registered):
    config = tmp_path / "toy_wandb.yaml"
    config.write_text(TOY_CONFIG.read_text() + "metric_logger:\n  _component_: "
                      "torchtune.training.metric_logging.WandBLogger\n  project: tiny\n")
    dry = sweep(f"{TOY_RECIPE} --config {config} start_loss=1,2", name="lr grid", dry_run=True)
    assert dry.extra_overrides == ("metric_logger.group=lr grid",)
    assert all(p.argv[-2] == "metric_logger.group=lr grid" for p in dry.plans)
    assert "every trial gets metric_logger.group=lr grid" in dry.text()
    unnamed = sweep(f"{TOY_RECIPE} --config {config} start_loss=1,2", dry_run=True)
    assert unnamed.extra_overrides == (f"metric_logger.group={unnamed.id}",)
    assert sweep(f"{TOY} start_loss=1,2", dry_run=True).extra_overrides == ()  # no W&B: no group
    mine = sweep(f"{TOY_RECIPE} --config {config} start_loss=1,2 metric_logger.group=mine", dry_run=True)
    assert mine.extra_overrides == () and all("metric_logger.group=mine" in p.argv for p in mine.plans)


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """A FAKE nvidia-smi with 8 GPUs on PATH (there is no GPU here)."""
    write_fake_nvidia_smi(tmp_path / "bin", 8)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_a_gpu_pool_is_cut_into_slots_of_gpus_per_trial_with_FAKE_gpus(fake_gpus, nothing_registered):
    dry = sweep(f"{TOY} start_loss=1,2,3,4,5", gpus="0-7", gpus_per_trial=2, dry_run=True)
    assert dry.slots.gpus == ((0, 1), (2, 3), (4, 5), (6, 7)) and dry.slots.max_parallel == 4
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in dry.plans] == ["0,1", "2,3", "4,5", "6,7", "0,1"]
    assert all(p.nproc_per_node == "2" for p in dry.plans)
    capped = sweep(f"{TOY} start_loss=1,2,3", gpus="0-7", gpus_per_trial=2, max_parallel=2, dry_run=True)
    assert capped.slots.gpus == ((0, 1), (2, 3)) and "GPU 4,5,6,7 of the pool stay unused" in capped.text()
    # no --gpus on a machine with GPUs: the pool is every GPU this process may use
    implicit = sweep(f"--nproc_per_node 2 {TOY} start_loss=1,2,3,4", dry_run=True)
    assert implicit.slots.gpus == ((0, 1), (2, 3), (4, 5), (6, 7))


def test_a_gpu_id_this_process_may_not_use_is_refused_before_a_real_sweep_with_FAKE_gpus(fake_gpus,
                                                                                        nothing_registered):
    with pytest.raises(PlanError, match="GPU"):
        sweep(f"{TOY} start_loss=1,2", gpus="6-9", gpus_per_trial=2, dry_run=False)


def test_sweep_only_options_without_sweep_are_refused(ip, nothing_registered):
    for option in ("--max-parallel 2", "--gpus-per-trial 1", "--max-trials 5"):
        with pytest.raises(UsageError, match=f"{option.split()[0]} goes with --sweep"):
            ip.run_cell_magic("tune_run", f"{option} {TOY}", "start_loss=1\n")


def test_the_magics_dry_run_prints_every_trial_and_returns_it(ip, capsys, nothing_registered):
    ip.user_ns["losses"] = "1,2"
    dry = ip.run_cell_magic("tune_run", f"--sweep --dry-run --name g {TOY}", "start_loss={losses}\ncrash_message=\"x,y\"\n")
    out = capsys.readouterr().out
    assert len(dry) == 2 and out.startswith("sweep g: 2 trials (2 start_loss), 1 at a time without GPUs")
    assert all("crash_message=x,y" in p.argv for p in dry.plans)
    with pytest.raises(UsageError, match="empty item"):
        ip.run_cell_magic("tune_run", f"--sweep {TOY}", "start_loss=1,\n")


def test_cli_cmd_sweep_prints_the_trials_and_json(nothing_registered):
    env = {**os.environ}
    r = subprocess.run([sys.executable, "-m", "tune_magic", "cmd", "--sweep", "--max-parallel", "2", str(TOY_RECIPE),
                        "--config", str(TOY_CONFIG), "start_loss=1,2,3"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("sweep toy_recipe: 3 trials (3 start_loss), 2 at a time without GPUs")
    assert r.stdout.count("\ntrial ") == 3
    r = subprocess.run([sys.executable, "-m", "tune_magic", "cmd", "--sweep", "--json", str(TOY_RECIPE), "--config",
                        str(TOY_CONFIG), "start_loss=1,2"], capture_output=True, text=True, env=env, timeout=120)
    import json

    data = json.loads(r.stdout)
    assert [t["words"] for t in data["trials"]] == [["start_loss=1"], ["start_loss=2"]]
    assert data["max_parallel"] == 1 and "start_loss=2" in data["trials"][1]["plan"]["argv"]
    r = subprocess.run([sys.executable, "-m", "tune_magic", "run", "--sweep", str(TOY_RECIPE), "--config",
                        str(TOY_CONFIG), "steps=3"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "--sweep found no axis" in r.stderr


def test_the_panels_sweep_switch_previews_the_trial_count_and_the_first_command(tmp_path, nothing_registered):
    from tune_magic.ui.panel import Panel

    panel = Panel(cwd=tmp_path)
    panel.recipe.value = str(TOY_RECIPE)
    panel.config.value = str(TOY_CONFIG)
    panel.overrides.value = "start_loss=1,2\nseed=3,4\n"
    assert panel.launch_button.disabled and "--sweep" in panel.error.value  # a comma list without the switch
    panel.sweep_switch.value = True
    panel.max_parallel.value = 2
    assert not panel.launch_button.disabled, panel.error.value
    first = tune_magic.sweep(panel.args(), max_parallel=2, cwd=tmp_path, dry_run=True).plans[0]
    lines = panel.command_preview.value.splitlines()
    assert lines[0] == "# 4 trials (2 start_loss x 2 seed), 2 at a time; trial 0: start_loss=1,seed=3"
    assert lines[1] == first.command_line().replace(first.job_id, "<job-id>")
    assert panel.max_parallel.layout.display is None
    panel.overrides.value = "start_loss=1,,2\n"
    assert panel.launch_button.disabled and "empty item" in panel.error.value
    panel.close()


def test_warnings_of_a_dry_run_are_not_raised_as_python_warnings(nothing_registered):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sweep(f"{TOY} start_loss=1,2 tag=x", dry_run=True)


# -- torchtune's component shorthand as a sweep axis (issue 26) ------------------------------------

_ROOT = Path(__file__).resolve().parents[2]
LORA = f"{_ROOT / 'recipes' / 'lora_finetune.py'} --config {_ROOT / 'recipes' / 'configs' / 'tiny' / 'lora.yaml'}"


def test_a_component_axis_gives_one_trial_per_component_keeping_the_sections_keys(ip, capsys, nothing_registered):
    """``optimizer=torch.optim.SGD,torch.optim.AdamW`` under --sweep: each trial's config (read as
    torchtune 0.6.1 reads it) has optimizer._component_ set, and lr (set before or after the axis),
    fused and weight_decay kept."""
    from tune_magic.config.tuneparse import recipe_config

    for body in ("optimizer=torch.optim.SGD,torch.optim.AdamW\noptimizer.lr=0.05\n",
                 "optimizer.lr=0.05\noptimizer=torch.optim.SGD,torch.optim.AdamW\n"):
        dry = ip.run_cell_magic("tune_run", f"--sweep --dry-run {LORA}", body)
        capsys.readouterr()
        assert len(dry) == 2
        got = [OmegaConf.to_container(recipe_config(p.config, p.overrides), resolve=False)["optimizer"] for p in dry.plans]
        assert got == [{"_component_": c, "fused": False, "weight_decay": 0.0, "lr": 0.05}
                       for c in ("torch.optim.SGD", "torch.optim.AdamW")]


def test_a_wandb_logger_set_with_the_shorthand_gets_the_sweeps_group(nothing_registered):
    dry = sweep(f"{LORA} seed=1,2 metric_logger=torchtune.training.metric_logging.WandBLogger", dry_run=True)
    assert all(any(o.startswith("metric_logger.group=") for o in p.overrides) for p in dry.plans)


@pytest.mark.parametrize("axis, parts", [
    ("model.lora_rank=8,8.5", ["sweep axis model.lora_rank, item 2 (8.5)", "the recipe would get the float 8.5",
                               "give an integer (e.g. model.lora_rank=8)"]),
    ("optimizer=torch.optim.SGD,[1]", ["sweep axis optimizer, item 2 ([1])", "as the component"]),
])
def test_a_sweep_axis_item_no_recipe_can_run_is_refused_naming_it(axis, parts, ip, nothing_registered):
    for dry_run in (True, False):
        with pytest.raises(PlanError) as info:
            sweep(f"{LORA} {axis}", dry_run=dry_run)
        for part in parts:
            assert part in str(info.value), str(info.value)
    with pytest.raises(UsageError, match=r"item 2 \(8\.5\)" if "8.5" in axis else r"item 2 \(\[1\]\)"):
        ip.run_cell_magic("tune_run", f"--sweep {LORA}", axis + "\n")
