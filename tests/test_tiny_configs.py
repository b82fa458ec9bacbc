"""The tiny configs: parsed by torchtune's own parser, paths resolved from the environment,
shapes matching the assets, and builtin_lora.yaml usable by torchtune's built-in LoRA recipe."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from tune_magic import assets as A
from tune_magic.paths import home

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "recipes" / "configs" / "tiny"
NAMES = ("lora", "full", "builtin_lora", "builtin_lora_single", "builtin_full_single", "lora_val", "full_val",
         "fact")


def parse(name: str, *overrides: str) -> DictConfig:
    """Parse a config exactly as a recipe decorated with ``torchtune.config.parse`` would."""
    from torchtune.config._parse import TuneRecipeArgumentParser
    from torchtune.config._utils import _merge_yaml_and_cli_args

    parser = TuneRecipeArgumentParser()
    yaml_args, cli_args = parser.parse_known_args(
        ["--config", str(CONFIGS / f"{name}.yaml"), *overrides]
    )
    return _merge_yaml_and_cli_args(yaml_args, cli_args)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> A.AssetPaths:
    return A.make_assets(tmp_path_factory.mktemp("home") / "assets")


@pytest.mark.parametrize("name", NAMES)
def test_paths_follow_tune_magic_home(name: str, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path / "tmh"))
    cfg = parse(name)
    assets = A.AssetPaths.under(tmp_path / "tmh" / "assets")
    assert cfg.checkpointer.checkpoint_dir == str(assets.model_dir)
    assert cfg.tokenizer.path == str(assets.tokenizer_path)
    assert cfg.dataset.data_files == str(assets.fact_path if name == "fact" else assets.dataset_path)
    assert cfg.output_dir == str(tmp_path / "tmh" / "runs" / f"tiny_{name}")
    assert cfg.checkpointer.output_dir == cfg.output_dir
    assert cfg.metric_logger.log_dir == f"{cfg.output_dir}/logs"


@pytest.mark.parametrize("name", NAMES)
def test_paths_default_to_home_cache_without_env(name: str, tmp_path: Path, monkeypatch):
    # Nested ${oc.env:A,${oc.env:HOME}/...}: the inner default must resolve too.
    monkeypatch.delenv("TUNE_MAGIC_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    cfg = parse(name)
    expected_home = tmp_path / "user" / ".cache" / "tune_magic"
    assert home() == expected_home
    assert cfg.tokenizer.path == str(A.AssetPaths.under(expected_home / "assets").tokenizer_path)


def test_standard_overrides_apply(tmp_path: Path):
    cfg = parse(
        "lora",
        f"output_dir={tmp_path}/o",
        "epochs=2",
        "max_steps_per_epoch=7",
        "batch_size=4",
        "seed=11",
        "device=cuda",
        "dtype=bf16",
        f"assets_dir={tmp_path}/a",
        "metric_logger.filename=m.txt",
        "tokenizer.max_seq_len=32",
    )
    assert (cfg.epochs, cfg.max_steps_per_epoch, cfg.batch_size, cfg.seed) == (2, 7, 4, 11)
    assert (cfg.device, cfg.dtype) == ("cuda", "bf16")
    assert cfg.checkpointer.output_dir == f"{tmp_path}/o"
    assert cfg.metric_logger.log_dir == f"{tmp_path}/o/logs"
    assert cfg.metric_logger.filename == "m.txt"
    assert cfg.checkpointer.checkpoint_dir == f"{tmp_path}/a/model"
    assert cfg.dataset.data_files == f"{tmp_path}/a/data/tiny_instruct.json"
    assert cfg.tokenizer.max_seq_len == 32


@pytest.mark.parametrize("name", NAMES)
def test_model_section_matches_assets(name: str):
    cfg = parse(name)
    for key, value in A.TINY_MODEL.items():
        assert cfg.model[key] == value, key
    assert cfg.checkpointer.model_type == A.MODEL_TYPE
    assert list(cfg.checkpointer.checkpoint_files) == [A.CHECKPOINT_FILE]
    assert cfg.metric_logger._component_ == "torchtune.training.metric_logging.DiskLogger"
    assert cfg.log_every_n_steps == 1


def test_defaults_cpu_for_own_recipes_cuda_for_builtin():
    assert (parse("lora").device, parse("lora").dtype) == ("cpu", "fp32")
    assert (parse("full").device, parse("full").dtype) == ("cpu", "fp32")
    assert (parse("fact").device, parse("fact").dtype) == ("cpu", "fp32")
    assert (parse("builtin_lora").device, parse("builtin_lora").dtype) == ("cuda", "bf16")
    # the single-device built-ins run on CPU here (their end-to-end runs: tests/e2e/test_resume_builtin.py)
    for name in ("builtin_lora_single", "builtin_full_single"):
        cfg = parse(name)
        assert (cfg.device, cfg.dtype, cfg.log_peak_memory_stats) == ("cpu", "fp32", False)


@pytest.mark.parametrize("name", NAMES)
def test_components_bind_their_arguments(name: str):
    from torchtune.config import validate

    validate(parse(name))  # raises ConfigError listing every component whose kwargs do not bind
    assert OmegaConf.to_container(parse(name), resolve=True)["model"]["_component_"].startswith(
        "torchtune.models.llama2."
    )


def test_builtin_lora_config_instantiates_on_cpu(built: A.AssetPaths, tmp_path: Path):
    """Every component lora_finetune_distributed builds from builtin_lora.yaml, built on CPU."""
    import torch
    from torchtune import config, training
    from torchtune.data import padded_collate_sft

    cfg = parse(
        "builtin_lora",
        f"assets_dir={built.root}",
        f"output_dir={tmp_path}/out",
        "device=cpu",
        "dtype=fp32",
    )
    model = config.instantiate(cfg.model)
    ckpt = config.instantiate(cfg.checkpointer, should_load_recipe_state=False)
    result = model.load_state_dict(ckpt.load_checkpoint()[training.MODEL_KEY], strict=False)
    assert result.unexpected_keys == []
    assert result.missing_keys and all("lora" in k for k in result.missing_keys)

    tokenizer = config.instantiate(cfg.tokenizer)
    assert tokenizer.max_seq_len == 64
    cfg.dataset.cache_dir = str(tmp_path / "hf")
    ds = config.instantiate(cfg.dataset, tokenizer)
    assert len(ds) == 128
    batch = padded_collate_sft([ds[i] for i in range(cfg.batch_size)], padding_idx=0)
    loss_fn = config.instantiate(cfg.loss)
    model.set_num_output_chunks(loss_fn.num_output_chunks)
    with torch.no_grad():
        chunks = model(batch["tokens"])
    logits = torch.cat(chunks, dim=1)
    assert logits.shape == (cfg.batch_size, batch["tokens"].shape[1], A.TINY_MODEL["vocab_size"])
    optimizer = config.instantiate(cfg.optimizer, [p for p in model.parameters() if p.requires_grad])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)


@pytest.mark.parametrize("name", ["lora", "full"])
def test_val_configs_are_their_base_config_plus_a_held_out_split(name: str):
    """``<name>_val.yaml`` = ``<name>.yaml`` + torchtune's validation keys (issue 28): training on
    ``train[:90%]``, validating on ``train[90%:]``, everything else the same."""
    base = OmegaConf.to_container(parse(name), resolve=True)
    val = OmegaConf.to_container(parse(f"{name}_val"), resolve=True)
    assert (base["dataset"]["split"], val["dataset"]["split"]) == ("train", "train[:90%]")
    assert val["dataset_val"] == {**base["dataset"], "split": "train[90%:]"}
    assert (val["run_val_every_n_steps"], val["batch_size_val"]) == (None, base["batch_size"])
    for key in ("dataset_val", "run_val_every_n_steps", "batch_size_val"):
        assert key not in base
        del val[key]
    for cfg in (base, val):
        del cfg["dataset"]["split"], cfg["output_dir"], cfg["checkpointer"]["output_dir"], cfg["metric_logger"]
    assert val == base


def test_fact_config_is_the_full_config_on_the_fact_data():
    """fact.yaml differs from full.yaml only where the fact run needs it: its data, a batch of 4
    (64 copies -> 16 steps an epoch), 4 whole epochs (3 were measured to be the least that answers
    exactly), and its own output_dir."""
    full, fact = (OmegaConf.to_container(parse(n), resolve=True) for n in ("full", "fact"))
    differ = {k for k in full.keys() | fact.keys() if full.get(k) != fact.get(k)}
    assert differ == {"dataset", "batch_size", "epochs", "max_steps_per_epoch", "output_dir", "checkpointer",
                      "metric_logger"}
    assert (fact["batch_size"], fact["epochs"], fact["max_steps_per_epoch"]) == (4, 4, None)
    assert {k: v for k, v in fact["dataset"].items() if k != "data_files"} == \
        {k: v for k, v in full["dataset"].items() if k != "data_files"}
    assert fact["checkpointer"] == {**full["checkpointer"], "output_dir": fact["output_dir"]}
