"""Validation loss for every run (issue 28), real recipes on the tiny assets, CPU.

Every value is compared with :mod:`valreference` (an independent computation from the checkpoint
folder's files; it shares no code with ``recipes/``) within 1e-4 relative:

* our recipes validate in the loop (``run_val_every_n_steps``) and at each epoch's end, before the
  save: the epoch-end ``val_loss`` equals the reference of that epoch's saved checkpoint;
* ``recipes/validate_checkpoint.py`` evaluates each ``epoch_N/`` of torchtune 0.6.1's unmodified
  single-device recipes (full, LoRA merged, LoRA adapter-only, and the adapter in PEFT's form only),
  writing nothing into the training job's folder;
* ``run_val_every_n_steps`` without ``dataset_val`` fails at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tune_magic.assets import AssetPaths, make_assets
from valreference import TRAIN_SPLIT, dataset_val_overrides, reference_for_folder, val_examples

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
CONFIGS = RECIPES / "configs" / "tiny"
VALIDATE = RECIPES / "validate_checkpoint.py"
REL = 1e-4
EPOCHS, STEPS = 3, 4  # 3 epochs of 4 optimizer steps: checkpoints at steps 4, 8, 12
STEP_LINE = re.compile(r"^Step (\d+) \| (.*)$")


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tmh")
    make_assets(path / "assets")
    return path


@pytest.fixture(scope="module")
def assets(home) -> AssetPaths:
    return AssetPaths.under(home / "assets")


@pytest.fixture(scope="module")
def examples(assets, tmp_path_factory):
    return val_examples(assets, tmp_path_factory.mktemp("hf"))


def run(argv: list[str], home: Path, log: Path, ok: bool = True) -> subprocess.CompletedProcess:
    """Run ``argv`` (cwd: the repo) with output to ``log``; assert its exit status; print its wall time."""
    env = dict(os.environ, TUNE_MAGIC_HOME=str(home), HF_HOME=str(home / "hf"), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1")
    start = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.run(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT, timeout=300)
    text = log.read_text(errors="replace")
    assert (proc.returncode == 0) is ok, f"exit {proc.returncode}; last output:\n{text[-4000:]}"
    print(f"{' '.join(Path(a).name for a in argv[:3])}: {time.perf_counter() - start:.1f} s")
    return proc


def metric_lines(log_dir: Path) -> list[tuple[int, dict[str, float]]]:
    """The DiskLogger file of ``log_dir`` as (step, {name: value}) per line (torchtune 0.6.1 format)."""
    (path,) = sorted(log_dir.glob("log_*.txt"))
    rows = []
    for line in path.read_text().splitlines():
        m = STEP_LINE.match(line)
        assert m and line.endswith(" "), line
        rows.append((int(m[1]), {k: float(v) for k, v in (f.split(":") for f in m[2].split())}))
    return rows


def val_points(rows) -> dict[int, float]:
    steps = [s for s, fields in rows if "val_loss" in fields]
    assert len(steps) == len(set(steps)), f"a step validated twice: {steps}"
    for _, fields in rows:
        assert "val_loss" not in fields or set(fields) == {"val_loss"}, fields  # a line of its own
    return {s: fields["val_loss"] for s, fields in rows if "val_loss" in fields}


def assert_close(got: float, want: float, what: str) -> None:
    assert abs(got - want) <= REL * abs(want), f"{what}: {got} vs reference {want} (rel {abs(got - want) / want:.2e})"


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def validate(config: Path, overrides: list[str], folder: Path, step: int, out: Path, home: Path, tmp: Path) -> dict:
    """Run validate_checkpoint.py on one folder as its own process; return val_loss.json, checked
    against the DiskLogger line it printed and wrote."""
    argv = [sys.executable, str(VALIDATE), "--config", str(config), *overrides,
            f"validate.checkpoint_dir={folder}", f"validate.step={step}", f"validate.output_dir={out}"]
    log = tmp / f"validate_{out.name}.log"
    run(argv, home, log)
    result = json.loads((out / "val_loss.json").read_text())
    line = f"Step {step} | val_loss:{result['val_loss']} "
    assert line in log.read_text().splitlines()
    assert metric_lines(out / "logs") == [(step, {"val_loss": result["val_loss"]})]
    assert (result["step"], result["examples"], result["checkpoint_dir"]) == (step, 13, str(folder))
    assert result["tokens"] > 0 and result["seconds"] > 0
    return result


def test_full_two_processes_validates_in_the_loop_and_at_each_epoch_end(home, assets, examples, tmp_path):
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            str(RECIPES / "full_finetune.py"), "--config", str(CONFIGS / "full_val.yaml"), f"output_dir={out}",
            f"epochs={EPOCHS}", f"max_steps_per_epoch={STEPS}", "run_val_every_n_steps=3",
            # 13 examples in batches of 3 on 2 ranks: rank 0 makes 3 passes (3+3+1), rank 1 two and a filler
            "batch_size_val=3"]
    run(argv, home, tmp_path / "console.log")
    rows = metric_lines(out / "logs")
    assert [s for s, f in rows if "loss" in f] == list(range(1, 13))  # the loss series is untouched
    val = val_points(rows)
    assert sorted(val) == [3, 4, 6, 8, 9, 12]  # every 3 steps, and the epoch ends 4, 8, 12 (12 once)
    for epoch in range(EPOCHS):
        ref = reference_for_folder(out / f"epoch_{epoch}", assets, examples)
        assert_close(val[STEPS * (epoch + 1)], ref, f"epoch {epoch}")
    assert val[12] < val[3]  # it learns the held-out facts' format


def test_lora_one_process_validates_and_the_evaluation_recipe_agrees(home, assets, examples, tmp_path):
    out = tmp_path / "out"
    ov = [f"output_dir={out}", f"epochs={EPOCHS}", f"max_steps_per_epoch={STEPS}"]
    argv = [sys.executable, str(RECIPES / "lora_finetune.py"), "--config", str(CONFIGS / "lora_val.yaml"), *ov,
            "run_val_every_n_steps=2"]
    run(argv, home, tmp_path / "console.log")
    rows = metric_lines(out / "logs")
    assert [s for s, f in rows if "loss" in f] == list(range(1, 13))
    val = val_points(rows)
    assert sorted(val) == [2, 4, 6, 8, 10, 12]
    for epoch in range(EPOCHS):  # merged weights: the reference loads them into the plain llama2
        ref = reference_for_folder(out / f"epoch_{epoch}", assets, examples)
        assert_close(val[STEPS * (epoch + 1)], ref, f"epoch {epoch}")
    result = validate(CONFIGS / "lora_val.yaml", ov, out / "epoch_1", 8, tmp_path / "val1", home, tmp_path)
    assert result["kind"] == "lora_merged" and result["epoch"] == 1
    assert_close(result["val_loss"], val[8], "validate_checkpoint vs the in-loop value")


BUILTINS = [
    ("full_finetune_single_device", "builtin_full_single.yaml", [], "full"),
    ("lora_finetune_single_device", "builtin_lora_single.yaml", [], "lora_merged"),
    ("lora_finetune_single_device", "builtin_lora_single.yaml", ["save_adapter_weights_only=True"], "adapter_only"),
]


# The three kinds through the product (a job's evaluation jobs, each value against the reference):
# tests/e2e/test_validation_jobs.py. Here the recipe alone, on the kind with the most to read (the
# adapter beside the base weights, and PEFT's file without torchtune's own).
@pytest.mark.parametrize("recipe,config,extra,kind", BUILTINS[2:], ids=[b[3] for b in BUILTINS[2:]])
def test_validate_checkpoint_on_torchtune_builtin_recipes(recipe, config, extra, kind, home, assets, examples,
                                                          tmp_path):
    out = tmp_path / "job"
    ov = [f"output_dir={out}", f"epochs={EPOCHS}", f"max_steps_per_epoch={STEPS}", f"dataset.split={TRAIN_SPLIT}",
          *dataset_val_overrides(assets), *extra]
    tune = Path(sys.executable).with_name("tune")
    run([str(tune), "run", recipe, "--config", str(CONFIGS / config), *ov], home, tmp_path / "train.log")
    before = tree_digest(out)
    values = []
    for epoch in range(EPOCHS):
        folder = out / f"epoch_{epoch}"
        assert any(folder.glob("model-*")) is (kind != "adapter_only")
        result = validate(CONFIGS / config, ov, folder, STEPS * (epoch + 1), tmp_path / "val" / f"epoch_{epoch}",
                          home, tmp_path)
        assert (result["kind"], result["epoch"]) == (kind, epoch)
        assert_close(result["val_loss"], reference_for_folder(folder, assets, examples), f"epoch {epoch}")
        values.append(result["val_loss"])
    assert values[2] < values[0]
    assert tree_digest(out) == before  # nothing written into the training job's folder
    if kind == "adapter_only":  # PEFT's adapter_model.safetensors alone (no adapter_model.pt) gives the same
        peft_only = tmp_path / "peft" / "epoch_2"
        shutil.copytree(out / "epoch_2", peft_only, ignore=shutil.ignore_patterns("adapter_model.pt"))
        result = validate(CONFIGS / config, ov, peft_only, 12, tmp_path / "val_peft", home, tmp_path)
        assert result["kind"] == "adapter_only"
        assert abs(result["val_loss"] - values[2]) <= 1e-6 * values[2]


def test_run_val_every_n_steps_without_dataset_val_fails_at_once(home, tmp_path):
    out = tmp_path / "out"
    argv = [sys.executable, str(RECIPES / "full_finetune.py"), "--config", str(CONFIGS / "full.yaml"),
            f"output_dir={out}", "run_val_every_n_steps=2"]
    run(argv, home, tmp_path / "console.log", ok=False)
    text = (tmp_path / "console.log").read_text(errors="replace")
    assert "run_val_every_n_steps=2 is set but dataset_val is not: add a dataset_val node" in text
    assert not list(out.glob("epoch_*")) and "1|1|Loss" not in text  # no step ran


def test_validate_checkpoint_without_dataset_val_names_the_fix(home, tmp_path):
    folder = tmp_path / "job" / "epoch_0"  # any folder: the missing key is reported first
    folder.mkdir(parents=True)
    argv = [sys.executable, str(VALIDATE), "--config", str(CONFIGS / "full.yaml"), f"output_dir={tmp_path}/job",
            f"validate.checkpoint_dir={folder}", "validate.step=4", f"validate.output_dir={tmp_path}/val"]
    run(argv, home, tmp_path / "console.log", ok=False)
    text = (tmp_path / "console.log").read_text(errors="replace")
    assert "the job's config has no dataset_val: add a dataset_val node" in text
    assert not (tmp_path / "val" / "val_loss.json").exists()
