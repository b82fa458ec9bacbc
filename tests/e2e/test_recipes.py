"""The project's recipes, run for real on CPU: torchrun x 2 processes, one process, `tune run`.

Each run trains the tiny random-weight assets. The DiskLogger lines are parsed here with a plain
regex (torchtune 0.6.1 format: ``Step N | loss:X lr:Y tokens_per_second_per_gpu:Z `` + newline).
"""

from __future__ import annotations

import gc
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tune_magic.assets import make_assets

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
LORA_RECIPE = REPO / "recipes" / "lora_finetune.py"
FULL_RECIPE = REPO / "recipes" / "full_finetune.py"
LORA_CONFIG = REPO / "recipes" / "configs" / "tiny" / "lora.yaml"
FULL_CONFIG = REPO / "recipes" / "configs" / "tiny" / "full.yaml"
BUILTIN_LORA_CONFIG = REPO / "recipes" / "configs" / "tiny" / "builtin_lora.yaml"

DISK_LINE = re.compile(
    r"^Step (?P<step>\d+) \| loss:(?P<loss>\S+) lr:(?P<lr>\S+) "
    r"tokens_per_second_per_gpu:(?P<tps>\S+) $"
)
CHILD_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A TUNE_MAGIC_HOME holding the tiny assets (the configs find them with no override)."""
    path = tmp_path_factory.mktemp("tmh")
    make_assets(path / "assets")
    return path


def child_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TUNE_MAGIC_HOME"] = str(home)
    # Keep the datasets cache out of the user's ~/.cache and never try a hub.
    env["HF_HOME"] = str(home / "hf")
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_DATASETS_OFFLINE"] = "1"
    return env


def run_child(argv: list[str], home: Path, log: Path, cwd: Path | None = None) -> float:
    """Run ``argv`` with stdout+stderr to ``log``; assert exit 0; return wall seconds."""
    start = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env=child_env(home),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=CHILD_TIMEOUT_S,
        )
    wall = time.perf_counter() - start
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, f"exit {proc.returncode}; last output:\n{text[-4000:]}"
    print(f"{Path(argv[0]).name} ... {Path(argv[-1]).name}: {wall:.1f} s wall")
    return wall


def torchrun(recipe: Path, config: Path, *overrides: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(recipe), "--config", str(config), *overrides,
    ]  # fmt: skip


def only_log_file(log_dir: Path) -> Path:
    """The DiskLogger file in ``log_dir`` (default name ``log_<unix seconds>.txt``); exactly one."""
    files = sorted(log_dir.glob("log_*.txt"))
    assert len(files) == 1, files
    return files[0]


def disk_log(path: Path) -> list[dict[str, float]]:
    """Parse a DiskLogger file into one dict per line (step, loss, lr, tps)."""
    rows = []
    for line in path.read_text().splitlines():
        match = DISK_LINE.match(line)
        assert match, f"not a DiskLogger line: {line!r}"
        rows.append({k: float(v) for k, v in match.groupdict().items()})
    return rows


def parse_config(config: Path, *overrides: str):
    """Merge YAML and overrides exactly as ``torchtune.config.parse`` does for a recipe."""
    from torchtune.config._parse import TuneRecipeArgumentParser
    from torchtune.config._utils import _merge_yaml_and_cli_args

    yaml_args, cli_args = TuneRecipeArgumentParser().parse_known_args(
        ["--config", str(config), *overrides]
    )
    return _merge_yaml_and_cli_args(yaml_args, cli_args)


def assert_trained(rows: list[dict[str, float]], steps: int) -> None:
    assert [int(r["step"]) for r in rows] == list(range(1, steps + 1))
    losses = [r["loss"] for r in rows]
    first, last = statistics.mean(losses[:5]), statistics.mean(losses[-5:])
    # A random model starts near ln(vocab) = ln(512) ~ 6.24; memorising must clearly lower it.
    assert 5.5 < losses[0] < 7.0, losses
    assert last < 0.8 * first, losses
    assert all(r["tps"] > 0 for r in rows)
    assert rows[-1]["lr"] == 0.0  # the cosine schedule ends at zero on the last step


def test_lora_two_processes_20_steps(home: Path, tmp_path: Path):
    out = tmp_path / "out"
    logs = tmp_path / "custom_logs"
    argv = torchrun(
        LORA_RECIPE, LORA_CONFIG,
        f"output_dir={out}", "epochs=1", "max_steps_per_epoch=20", "seed=7", "batch_size=2",
        f"metric_logger.log_dir={logs}",
    )  # fmt: skip
    run_child(argv, home, tmp_path / "console.log")
    assert_trained(disk_log(only_log_file(logs)), steps=20)
    console = (tmp_path / "console.log").read_text(errors="replace")
    assert "1|20|Loss: " in console  # rank 0's tqdm description, torchtune's format
    assert console.count("Writing logs to ") == 1  # only rank 0 opens a metric logger

    epoch = out / "epoch_0"
    for name in ("model-00001-of-00001.safetensors", "adapter_model.safetensors", "adapter_config.json"):
        assert (epoch / name).stat().st_size > 0, name
    resolved = OmegaConf.load(out / "resolved_config.yaml")
    assert resolved.seed == 7
    assert resolved.batch_size == 2
    assert resolved.metric_logger.log_dir == str(logs)
    assert resolved.checkpointer.checkpoint_dir == str(home / "assets" / "model")
    assert "${" not in (out / "resolved_config.yaml").read_text()


def test_full_two_processes_20_steps(home: Path, tmp_path: Path):
    out = tmp_path / "out"
    argv = torchrun(
        FULL_RECIPE, FULL_CONFIG,
        f"output_dir={out}", "epochs=1", "max_steps_per_epoch=20", "seed=3",
        "metric_logger.filename=metrics.txt",
    )  # fmt: skip
    run_child(argv, home, tmp_path / "console.log")
    assert [p.name for p in (out / "logs").iterdir()] == ["metrics.txt"]
    assert_trained(disk_log(out / "logs" / "metrics.txt"), steps=20)

    from safetensors.torch import load_file

    trained = load_file(out / "epoch_0" / "model-00001-of-00001.safetensors")
    base = load_file(home / "assets" / "model" / "model.safetensors")
    assert trained.keys() == base.keys()
    assert not (trained["lm_head.weight"] == base["lm_head.weight"]).all()  # weights moved
    resolved = OmegaConf.load(out / "resolved_config.yaml")
    assert (resolved.seed, resolved.metric_logger.filename) == (3, "metrics.txt")


def test_lora_single_process_without_launcher(home: Path, tmp_path: Path):
    out = tmp_path / "out"
    argv = [
        sys.executable, str(LORA_RECIPE), "--config", str(LORA_CONFIG),
        f"output_dir={out}", "max_steps_per_epoch=3",
    ]  # fmt: skip
    run_child(argv, home, tmp_path / "console.log")
    rows = disk_log(only_log_file(out / "logs"))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert "1|3|Loss: " in (tmp_path / "console.log").read_text(errors="replace")
    assert (out / "epoch_0" / "adapter_model.safetensors").is_file()
    # Default output paths of the config are not used when output_dir is overridden.
    assert not (home / "runs").exists()


def test_lora_via_tune_run_from_repo_root(home: Path, tmp_path: Path):
    tune = Path(sys.executable).with_name("tune")
    if not tune.exists():
        pytest.skip(f"no tune executable next to {sys.executable}")
    out = tmp_path / "out"
    argv = [
        str(tune), "run", "--nproc_per_node", "2",
        "recipes/lora_finetune.py", "--config", "recipes/configs/tiny/lora.yaml",
        f"output_dir={out}", "max_steps_per_epoch=3",
    ]  # fmt: skip
    run_child(argv, home, tmp_path / "console.log", cwd=REPO)
    console = (tmp_path / "console.log").read_text(errors="replace")
    assert "Running with torchrun..." in console
    assert "1|3|Loss: " in console
    assert len(disk_log(only_log_file(out / "logs"))) == 3
    assert (out / "epoch_0" / "adapter_model.safetensors").is_file()


def test_builtin_lora_recipe_runs_builtin_config_on_cpu(home: Path, tmp_path: Path, monkeypatch):
    """torchtune's own lora_finetune_distributed, in-process on one CPU rank, with builtin_lora.yaml.

    Its recipe_main hard-codes nccl, so the recipe class is driven directly over a world-size-1
    gloo group, with the two CUDA-only helpers it calls (memory stats, empty_cache) stubbed.
    """
    import importlib.util

    import torch.distributed as dist
    import torchtune
    from torchtune import training

    path = Path(torchtune.__file__).resolve().parents[1] / "recipes" / "lora_finetune_distributed.py"
    if not path.is_file():
        pytest.skip(f"torchtune's built-in recipes are not at {path}")
    spec = importlib.util.spec_from_file_location("_tt_builtin_lora", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    monkeypatch.setenv("TUNE_MAGIC_HOME", str(home))
    monkeypatch.setattr(training, "get_memory_stats", lambda device: {})
    monkeypatch.setattr(training, "log_memory_stats", lambda stats, *a, **k: None)
    monkeypatch.setattr(training, "cleanup_before_training", gc.collect)
    out = tmp_path / "out"
    cfg = parse_config(
        BUILTIN_LORA_CONFIG, f"output_dir={out}", "device=cpu", "dtype=fp32", "max_steps_per_epoch=3"
    )
    cfg.dataset.cache_dir = str(tmp_path / "hf")

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        recipe = module.LoRAFinetuneRecipeDistributed(cfg=cfg)
        recipe.setup(cfg=cfg)
        recipe.train()
        recipe._metric_logger.close()
    finally:
        dist.destroy_process_group()
    rows = disk_log(only_log_file(out / "logs"))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert (out / "epoch_0" / "adapter_model.safetensors").is_file()
