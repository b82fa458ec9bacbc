"""tune_magic's override grammar against torchtune 0.6.1's own parse, value by value.

Each row is the words after ``--config`` on a real config (recipes/configs/tiny/lora.yaml). The
oracle is torchtune itself: ``torchtune.config._parse.TuneRecipeArgumentParser`` reads
``--config CONFIG WORDS`` and ``torchtune.config._utils._merge_yaml_and_cli_args`` merges them,
as every recipe decorated with ``torchtune.config.parse`` does. Ours is the launch plan
(``build_plan``: the override checks) and the config tune_magic resolves for it
(``tune_magic.config.tuneparse.recipe_config`` on the plan's words: what the dry run, the job's
directories and resume read). Both are compared with ``OmegaConf.to_container(resolve=False)``.
Where torchtune refuses a form, ours refuses it too, with a PlanError, before anything starts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tune_magic.errors import PlanError
from tune_magic.job.launch import build_plan
from tune_magic.plan.configview import resolve_dirs
from tune_magic.config.tuneparse import recipe_config

ROOT = Path(__file__).resolve().parents[2]
LORA = str(ROOT / "recipes" / "configs" / "tiny" / "lora.yaml")
RECIPE = str(ROOT / "recipes" / "lora_finetune.py")
# the argv torchtune 0.6.1's own recipe tests give (tests/recipes/test_lora_finetune_single_device.py)
TT_RECIPE_TEST = ["checkpointer=torchtune.training.FullModelTorchTuneCheckpointer",
                  "checkpointer.checkpoint_dir=/tmp/ckpt", "checkpointer.checkpoint_files=[model.pt]",
                  "checkpointer.output_dir=/tmp/out", "checkpointer.model_type=LLAMA2"]


@pytest.fixture
def env(tmp_path):
    return {"HOME": str(tmp_path / "home"), "PATH": os.environ.get("PATH", ""), "TUNE_MAGIC_HOME": str(tmp_path / "tm")}


def torchtune_parse(words: list[str]) -> dict:
    """torchtune 0.6.1's own parse of ``--config LORA words`` (what the recipe's main gets)."""
    from torchtune.config._parse import TuneRecipeArgumentParser
    from torchtune.config._utils import _merge_yaml_and_cli_args

    yaml_args, cli_args = TuneRecipeArgumentParser().parse_known_args(["--config", LORA, *words])
    return OmegaConf.to_container(_merge_yaml_and_cli_args(yaml_args, cli_args), resolve=False)


def ours(words: list[str], env) -> tuple[dict, list[str]]:
    """Our plan for the words (the override checks), our resolved config, and the words torchtune
    is compared on: the user's, plus the output_dir tune_magic adds (the recipe gets both)."""
    plan = build_plan([RECIPE, "--config", LORA, *words], env=env, job_id="j1")
    added = [f"output_dir={plan.output_dir}"] if plan.output_dir else []
    return OmegaConf.to_container(recipe_config(plan.config, plan.overrides), resolve=False), added


ACCEPTED = [
    # (id, words given to us, words torchtune gets when they differ: our +key is Hydra's, not torchtune's)
    ("shorthand before its keys", ["optimizer=torch.optim.SGD", "optimizer.lr=0.01"], None),
    ("shorthand after its keys", ["optimizer.lr=0.01", "optimizer=torch.optim.SGD"], None),
    ("shorthand between keys", ["optimizer.lr=0.01", "optimizer=torch.optim.SGD", "optimizer.weight_decay=0.1"], None),
    ("torchtune's recipe-test argv", TT_RECIPE_TEST, None),
    ("torchtune's recipe-test argv, reversed", TT_RECIPE_TEST[::-1], None),
    ("model shorthand and a nested key", ["model=torchtune.models.llama2.lora_llama2", "model.lora_rank=4"], None),
    ("shorthand then _component_: the last wins", ["optimizer=torch.optim.SGD", "optimizer._component_=torch.optim.Adam"], None),
    ("_component_ then shorthand: the last wins", ["optimizer._component_=torch.optim.Adam", "optimizer=torch.optim.SGD"], None),
    ("a new keyword argument of the new component", ["optimizer=torch.optim.SGD", "optimizer.momentum=0.9"], None),
    ("+ adds a key (torchtune gets it without +)", ["optimizer=torch.optim.SGD", "+optimizer.momentum=0.9"],
     ["optimizer=torch.optim.SGD", "optimizer.momentum=0.9"]),
    ("a deletion before the shorthand", ["~optimizer.fused", "optimizer=torch.optim.SGD"], None),
    ("a deletion after the shorthand", ["optimizer=torch.optim.SGD", "~optimizer.fused"], None),
    ("a nested deletion", ["~dataset.column_map.input"], None),
    ("a section emptied by deletions goes too", ["~dataset.column_map.input", "~dataset.column_map.output"], None),
    ("delete, then set again", ["~seed", "seed=3"], None),
    ("set, then delete: the deletion is from the file only", ["seed=3", "~seed"], None),
    ("a flow list", ["model.lora_attn_modules=[q_proj,v_proj]"], None),
    ("a flow list of files", ["checkpointer.checkpoint_files=[a.safetensors,b.safetensors]"], None),
    ("a flow mapping", ["dataset.column_map={input: q, output: a}"], None),
    ("key=null", ["tokenizer.max_seq_len=null"], None),
    ("key=None (torchtune's !!null)", ["clip_grad_norm=None", "tokenizer.prompt_template=None"], None),
    ("an empty value is null", ["tokenizer.max_seq_len="], None),
    ("a YAML-quoted value", ["dataset.split='train'", "metric_logger.name='my run'"], None),
    ("quoted digits stay text", ["seed='3'"], None),
    ("a !!str tag", ["dataset.split=!!str 007"], None),
    ("max_filename is text (torchtune's !!str)", ["checkpointer.output_max_filename=00003"], None),
    ("nested dotted keys", ["dataset.column_map.input=question", "model.lora_rank=4", "optimizer.lr=1e-4"], None),
    ("an integer for a float key", ["optimizer.lr=1", "model.lora_dropout=0"], None),
    ("a float tagged on purpose for an integer key", ["model.lora_alpha=!!float 16.5"], None),
    ("booleans for booleans", ["compile=true", "shuffle=False"], None),
    ("an interpolation", ["output_dir=${tune_magic_home}/runs/x", "metric_logger.log_dir=${output_dir}/l"], None),
    ("a new top-level key", ["profiler.enabled=True"], None),
    ("a component section the config lacks", ["+profiler._component_=torchtune.training.setup_torch_profiler",
                                                "profiler.enabled=False"],
     ["profiler._component_=torchtune.training.setup_torch_profiler", "profiler.enabled=False"]),
]


@pytest.mark.parametrize("words, tt_words", [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_every_form_torchtune_accepts_means_the_same_to_us(words, tt_words, env):
    got, added = ours(words, env)
    want = torchtune_parse((tt_words or words) + added)
    assert got == want


def test_the_shorthand_keeps_the_sections_other_keys(env):
    """The issue's own line, value by value (not only equal to torchtune: right)."""
    got, _ = ours(["optimizer=torch.optim.SGD", "optimizer.lr=0.01"], env)
    assert got["optimizer"] == {"_component_": "torch.optim.SGD", "fused": False, "weight_decay": 0.0, "lr": 0.01}
    got, _ = ours(TT_RECIPE_TEST, env)
    assert got["checkpointer"] == {"_component_": "torchtune.training.FullModelTorchTuneCheckpointer",
                                   "checkpoint_dir": "/tmp/ckpt", "checkpoint_files": ["model.pt"],
                                   "recipe_checkpoint": None, "output_dir": "/tmp/out", "model_type": "LLAMA2"}


def test_the_jobs_directories_are_read_through_the_shorthand(env):
    """configview (the dry run's and the launch's directory checks) reads checkpointer.output_dir
    from torchtune's meaning of the recipe-test argv, not from a section lost to a dotlist merge."""
    plan = build_plan([RECIPE, "--config", LORA, *TT_RECIPE_TEST[::-1]], env=env, job_id="j1")
    assert resolve_dirs(plan).checkpoint_dir == "/tmp/out"


REFUSED = [
    # (id, words): torchtune 0.6.1 stops the recipe on each (the oracle says so); ours refuses first
    ("two = in one word", ["dataset.split=a=b"]),
    ("no = at all", ["batch_size"]),
    ("a flag after the config", ["--foo=1"]),
    ("deleting a component section", ["~optimizer"]),
    ("deleting a _component_", ["~optimizer._component_"]),
    ("deleting a key the config lacks", ["~no_such_key"]),
    ("deleting one key twice", ["~seed", "~seed"]),
    ("deleting through a plain value", ["~seed.x"]),
    ("setting one item of a list", ["checkpointer.checkpoint_files.0=x"]),
    ("a list over a section", ["dataset.column_map=[a,b]"]),
]


@pytest.mark.parametrize("words", [c[1] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_what_torchtune_refuses_we_refuse_before_anything_starts(words, env):
    with pytest.raises(Exception):  # noqa: B017 - torchtune's own ValueError / TypeError / OmegaConf's
        torchtune_parse(words)
    with pytest.raises(PlanError):
        build_plan([RECIPE, "--config", LORA, *words], env=env, job_id="j1")
    with pytest.raises(Exception):  # noqa: B017 - our resolution (recipe_config) refuses them too
        recipe_config(LORA, words)


def test_resume_reads_the_jobs_config_through_the_shorthand():
    """Resume's checkpoint layout (plan.ckptlayout.load_config) reads the checkpointer a job ran
    with as torchtune did: the recipe-test argv's FullModelTorchTuneCheckpointer, its keys kept."""
    from tune_magic.checkpoints.layout import config_value, load_config

    cfg = load_config(LORA, TT_RECIPE_TEST)
    assert config_value(cfg, "checkpointer._component_") == "torchtune.training.FullModelTorchTuneCheckpointer"
    assert config_value(cfg, "checkpointer.output_dir") == "/tmp/out"
    assert config_value(cfg, "checkpointer.recipe_checkpoint") is None and "recipe_checkpoint" in cfg.checkpointer
