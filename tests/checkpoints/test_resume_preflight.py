"""The resume pre-flight (tune_magic.checkpoints.preflight) on real directory layouts written here.

Each layout is what torchtune 0.6.1's FullModelHFCheckpointer leaves under ``output_dir``:
``epoch_K/`` (``model-0000i-of-0000N.safetensors`` + ``model.safetensors.index.json``, LoRA's
``adapter_model.pt`` / ``adapter_model.safetensors`` / ``adapter_config.json``) and
``recipe_state/recipe_state.pt`` written with torch.save (the test process may import torch; the
pre-flight never does). The recipes are the real files: torchtune's installed recipes, this
project's, and recipe files written here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tune_magic.errors import NothingToResume, PlanError
from tune_magic.checkpoints import preflight as R

REPO = Path(__file__).resolve().parents[2]
TT_RECIPES = Path(__import__("importlib").util.find_spec("torchtune").origin).parents[1] / "recipes"
LORA_SINGLE = str(TT_RECIPES / "lora_finetune_single_device.py")
FULL_SINGLE = str(TT_RECIPES / "full_finetune_single_device.py")
FULL_DIST = str(TT_RECIPES / "full_finetune_distributed.py")
OUR_LORA = str(REPO / "recipes" / "lora_finetune.py")
OUR_FULL = str(REPO / "recipes" / "full_finetune.py")
BAR = "{e}|{s}|Loss: 2.5:  50%|█████     | {n}/{t} [00:01<00:01,  2.00it/s]"


def write_config(path: Path, base: Path, **keys) -> Path:
    """A config with the keys the pre-flight reads (as the tiny configs spell them)."""
    cfg = {
        "output_dir": str(path.parent / "unused"),
        "checkpointer": {"_component_": "torchtune.training.FullModelHFCheckpointer", "checkpoint_dir": str(base),
                         "checkpoint_files": ["model.safetensors"], "recipe_checkpoint": None,
                         "output_dir": "${output_dir}", "model_type": "LLAMA2"},
        "resume_from_checkpoint": False, "seed": 0, "epochs": 3, "max_steps_per_epoch": 4,
        "device": "cpu", "dtype": "fp32",
    }
    for k, v in keys.items():
        cfg[k] = v
    import yaml

    path.write_text(yaml.safe_dump(cfg))
    return path


def shards(folder: Path, n: int, ext: str = "safetensors") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i in range(1, n + 1):
        name = f"model-{i:05d}-of-{n:05d}.{ext}"
        if ext == "safetensors":
            save_file({f"w{i}": torch.ones(4, 4)}, folder / name, metadata={"format": "pt"})
        else:
            torch.save({f"w{i}": torch.ones(4, 4)}, folder / name)
        weight_map[f"w{i}"] = name
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 64 * n},
                                                                      "weight_map": weight_map}))


def adapter(folder: Path, merged: bool = True) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"layers.0.attn.q_proj.lora_a.weight": torch.ones(8, 64)}, folder / "adapter_model.pt")
    save_file({"base_model.model.layers.0.lora_A.weight": torch.ones(8, 64)}, folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    if merged:
        shards(folder, 1)


def recipe_state(out: Path, epochs_run: int, total: int = 3, max_steps: int | None = 4, seed: int = 0) -> Path:
    (out / "recipe_state").mkdir(parents=True, exist_ok=True)
    path = out / "recipe_state" / "recipe_state.pt"
    torch.save({"optimizer": {"state": {0: {"step": torch.tensor(8.0), "exp_avg": torch.zeros(64, 8)}},
                              "param_groups": [{"lr": 1e-3, "params": [0]}]},
                "seed": seed, "epochs_run": epochs_run, "total_epochs": total, "max_steps_per_epoch": max_steps,
                "dataloader": {"_iterator_finished": False}}, path)
    return path


@pytest.fixture
def base(tmp_path) -> Path:
    d = tmp_path / "base"
    d.mkdir()
    (d / "config.json").write_text("{}")
    save_file({"w": torch.ones(2)}, d / "model.safetensors")
    return d


@pytest.fixture
def lora_run(tmp_path, base):
    """A 3-epoch LoRA run stopped in epoch 3 (index 2): epoch_0/, epoch_1/, recipe state of epoch_1/."""
    out = tmp_path / "out"
    adapter(out / "epoch_0")
    adapter(out / "epoch_1")
    recipe_state(out, epochs_run=2)
    return out, write_config(tmp_path / "cfg.yaml", base)


@pytest.fixture
def full_run(tmp_path, base):
    out = tmp_path / "out"
    shards(out / "epoch_0", 3)
    shards(out / "epoch_1", 3)
    recipe_state(out, epochs_run=2)
    return out, write_config(tmp_path / "cfg.yaml", base)


# -- what a resume adds ---------------------------------------------------------------------------


def test_lora_pins_adapter_and_recipe_state_relative_to_output_dir(lora_run):
    out, cfg = lora_run
    p = R.preflight(LORA_SINGLE, out, config=cfg, overrides=["save_adapter_weights_only=True"])
    assert p.overrides == ("resume_from_checkpoint=True", "checkpointer.adapter_checkpoint=epoch_1/adapter_model.pt",
                           "checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt")
    assert (p.epoch, p.epochs_done, p.total_epochs, p.max_steps_per_epoch) == (1, 2, 3, 4)
    assert p.checkpoint == out / "epoch_1" and p.checkpoint_root == out
    assert p.recipe_state.seed == 0 and p.recipe_state.tensor_bytes == 4 + 64 * 8 * 4
    assert p.support.kind == R.LORA and p.support.source == "torchtune"
    assert p.files == ("epoch_1/adapter_model.pt", "recipe_state/recipe_state.pt")


def test_full_pins_every_shard_of_the_epoch_folder(full_run):
    out, cfg = full_run
    p = R.preflight(FULL_SINGLE, out, config=cfg)
    files = ",".join(f"epoch_1/model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))
    assert p.overrides == ("resume_from_checkpoint=True", f"checkpointer.checkpoint_files=[{files}]",
                           "checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt")
    assert p.case == R.CASE_CONTINUES and p.warnings == ()
    assert p.support.kind == R.FULL


def test_bin_shards_of_the_meta_checkpointer(tmp_path, base):
    out = tmp_path / "out"
    shards(out / "epoch_0", 1, ext="bin")
    recipe_state(out, epochs_run=1)
    cfg = write_config(tmp_path / "cfg.yaml", base)
    p = R.preflight(FULL_SINGLE, out, config=cfg,
                    overrides=["checkpointer._component_=torchtune.training.FullModelMetaCheckpointer"])
    assert "checkpointer.checkpoint_files=[epoch_0/model-00001-of-00001.bin]" in p.overrides


def test_our_recipes_are_exact_and_known_by_name_and_path(full_run):
    out, cfg = full_run
    for recipe in (OUR_FULL, "full_finetune"):
        p = R.preflight(recipe, out, config=cfg)
        assert p.case == R.CASE_EXACT and p.support.exact and p.support.source == "declared"
        assert p.support.kind == R.FULL
    assert R.recipe_support(OUR_LORA).kind == R.LORA


def test_a_resume_of_a_resume_replaces_the_earlier_resume_keys(full_run):
    out, cfg = full_run
    earlier = ["epochs=3", "resume_from_checkpoint=True", "checkpointer.checkpoint_files=[epoch_0/model-00001-of-00003.safetensors]",
               "checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt", "seed=0"]
    p = R.preflight(FULL_SINGLE, out, config=cfg, overrides=earlier)
    merged = p.resumed_overrides(earlier)
    assert merged[:2] == ["epochs=3", "seed=0"]
    assert merged[2:] == list(p.overrides)
    assert sum(o.startswith("checkpointer.checkpoint_files=") for o in merged) == 1


# -- the folder newer than the recipe state ---------------------------------------------------------


def test_a_newer_epoch_folder_is_never_picked(lora_run):
    out, cfg = lora_run
    adapter(out / "epoch_2")  # saved after the recipe state (a run of 4 epochs, died in its 4th)
    p = R.preflight(LORA_SINGLE, out, config=cfg, overrides=["epochs=4"])
    assert "checkpointer.adapter_checkpoint=epoch_1/adapter_model.pt" in p.overrides
    assert any("epoch_2/ is newer than the recipe state" in w and "holds no optimizer state" in w for w in p.warnings)


def test_a_complete_final_checkpoint_means_training_finished(lora_run):
    out, cfg = lora_run
    adapter(out / "epoch_2")
    with pytest.raises(NothingToResume, match="epoch_2/ is the final checkpoint of all 3 epochs .* training finished") as err:
        R.preflight(LORA_SINGLE, out, config=cfg)
    assert err.value.fresh_start is False


def test_a_final_checkpoint_cut_short_is_not_finished(lora_run):
    out, cfg = lora_run
    (out / "epoch_2").mkdir()
    (out / "epoch_2" / "adapter_model.pt").write_bytes(b"PK\x03\x04" + b"\0" * 100)  # the save died mid-file
    p = R.preflight(LORA_SINGLE, out, config=cfg)
    assert p.epoch == 1 and any("epoch_2/ is newer" in w for w in p.warnings)


# -- the checkpoint the recipe state pairs with ----------------------------------------------------


def test_a_missing_shard_refuses(full_run):
    out, cfg = full_run
    (out / "epoch_1" / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(PlanError, match="pairs it with epoch_1/, but epoch_1/ lacks shard\\(s\\) model-00002-of-00003"):
        R.preflight(FULL_SINGLE, out, config=cfg)


def test_a_truncated_shard_refuses(full_run):
    out, cfg = full_run
    shard = out / "epoch_1" / "model-00003-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(PlanError, match="model-00003-of-00003.safetensors is truncated"):
        R.preflight(FULL_SINGLE, out, config=cfg)


def test_a_missing_epoch_folder_refuses(full_run):
    out, cfg = full_run
    shutil.rmtree(out / "epoch_1")
    with pytest.raises(PlanError, match="epoch_1/ is missing"):
        R.preflight(FULL_SINGLE, out, config=cfg)


def test_a_lora_folder_without_merged_weights_only_warns(lora_run):
    out, cfg = lora_run
    (out / "epoch_1" / "model-00001-of-00001.safetensors").unlink()
    p = R.preflight(LORA_SINGLE, out, config=cfg)
    assert "merged weights: epoch_1/ holds no model-XXXXX-of-YYYYY shard" in p.warnings
    assert p.overrides[1] == "checkpointer.adapter_checkpoint=epoch_1/adapter_model.pt"


def test_a_damaged_adapter_refuses(lora_run):
    out, cfg = lora_run
    (out / "epoch_1" / "adapter_model.pt").write_text("not torch")
    with pytest.raises(PlanError, match="adapter_model.pt is not a torch file"):
        R.preflight(LORA_SINGLE, out, config=cfg)


# -- the recipe state ------------------------------------------------------------------------------


def test_truncated_recipe_state_is_reported_as_truncated(lora_run):
    out, cfg = lora_run
    rs = out / "recipe_state" / "recipe_state.pt"
    rs.write_bytes(rs.read_bytes()[: rs.stat().st_size // 2])
    with pytest.raises(PlanError, match=r"recipe_state.pt is truncated.*cannot continue from it"):
        R.preflight(LORA_SINGLE, out, config=cfg)


def test_garbage_recipe_state_is_not_a_torch_file(lora_run):
    out, cfg = lora_run
    (out / "recipe_state" / "recipe_state.pt").write_bytes(b"\x00" * 4096)
    with pytest.raises(PlanError, match="recipe_state.pt is not a torch file"):
        R.preflight(LORA_SINGLE, out, config=cfg)


def test_a_torch_file_that_is_no_recipe_state(lora_run):
    out, cfg = lora_run
    torch.save({"model": torch.ones(2)}, out / "recipe_state" / "recipe_state.pt")
    with pytest.raises(PlanError, match="not a torchtune recipe state .*'model'"):
        R.preflight(LORA_SINGLE, out, config=cfg)


def test_config_and_checkpoint_disagreements_are_named(lora_run):
    out, cfg = lora_run
    recipe_state(out, epochs_run=2, seed=5, max_steps=6)
    p = R.preflight(OUR_LORA, out, config=cfg, overrides=["epochs=5"])
    assert "the config says seed=0; the recipe uses the checkpoint's seed 5" in p.warnings
    assert "the config says max_steps_per_epoch=4; the recipe uses the checkpoint's 6" in p.warnings
    assert ("the checkpoint was saved by a run of 3 epochs; the resumed run trains to the config's epochs=5"
            in p.warnings)
    assert p.max_steps_per_epoch == 6 and p.total_epochs == 5


def test_fewer_epochs_than_done_means_finished(lora_run):
    out, cfg = lora_run
    with pytest.raises(PlanError, match="epoch_1/ is the final checkpoint of all 2 epochs"):
        R.preflight(OUR_LORA, out, config=cfg, overrides=["epochs=2"])


# -- refusals ---------------------------------------------------------------------------------------


def test_died_in_its_first_epoch(tmp_path, base):
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    cfg = write_config(tmp_path / "cfg.yaml", base)
    with pytest.raises(NothingToResume, match="stopped in its first epoch, before any save. A fresh start with the "
                                              "same settings is possible") as err:
        R.preflight(LORA_SINGLE, out, config=cfg)
    assert err.value.fresh_start is True


def test_an_epoch_folder_without_recipe_state_has_nothing_to_resume(tmp_path, base):
    # a 1-epoch run's final checkpoint, resumed with epochs=3: weights only, no optimizer state
    out = tmp_path / "out"
    shards(out / "epoch_0", 1)
    cfg = write_config(tmp_path / "cfg.yaml", base, epochs=3)
    with pytest.raises(NothingToResume, match="has epoch_0/ but no recipe_state/recipe_state.pt") as err:
        R.preflight(FULL_SINGLE, out, config=cfg)
    assert err.value.fresh_start is False


def test_output_dir_gone(tmp_path, base):
    cfg = write_config(tmp_path / "cfg.yaml", base)
    with pytest.raises(NothingToResume, match="output_dir .*/gone is gone") as err:
        R.preflight(LORA_SINGLE, tmp_path / "gone", config=cfg)
    assert err.value.fresh_start is True  # nothing is lost by starting again with the same settings


def test_base_checkpoint_gone(lora_run, base):
    out, cfg = lora_run
    shutil.rmtree(base)
    with pytest.raises(PlanError, match="base checkpoint directory .* is gone"):
        R.preflight(LORA_SINGLE, out, config=cfg)


def test_unknown_recipes_list_the_known_ones(lora_run, tmp_path):
    out, cfg = lora_run
    mine = tmp_path / "my_recipe.py"
    mine.write_text("print('hi')\n")
    with pytest.raises(PlanError, match="declares no TUNE_MAGIC_RESUME") as err:
        R.preflight(str(mine), out, config=cfg)
    for name in ("lora_finetune_single_device", "lora_finetune_distributed", "full_finetune_single_device",
                 "full_finetune_distributed", "lora_finetune", "full_finetune"):
        assert name in str(err.value)
    copy = tmp_path / "lora_finetune_single_device.py"  # tune cp of a built-in
    shutil.copy(LORA_SINGLE, copy)
    with pytest.raises(PlanError, match="is a copy"):
        R.preflight(str(copy), out, config=cfg)
    with pytest.raises(PlanError, match="not a recipe name the pre-flight knows"):
        R.preflight("lora_dpo_single_device", out, config=cfg)


def test_a_recipe_that_declares_its_layout_is_known(lora_run, tmp_path):
    out, cfg = lora_run
    mine = tmp_path / "my_lora.py"
    mine.write_text('"""My recipe."""\nimport sys\n\nTUNE_MAGIC_RESUME = "lora"  # same keys as torchtune\n')
    p = R.preflight(str(mine), out, config=cfg)
    assert p.support == R.RecipeSupport("my_lora", R.LORA, "declared", exact=True)


# -- the inexact cases of the built-in recipes ------------------------------------------------------


def test_lora_single_device_without_max_steps_restarts_its_steps(lora_run):
    out, cfg = lora_run
    recipe_state(out, epochs_run=2, max_steps=None)
    p = R.preflight(LORA_SINGLE, out, config=cfg, overrides=["max_steps_per_epoch=null", "save_adapter_weights_only=True"],
                    progress=BAR.format(e=3, s=20, n=4, t=8))
    assert p.case == R.CASE_STEPS_RESTART and p.first_step == 1
    text = p.summary()
    assert "steps restart" in text and "logs Step 1 again and restarts the LR schedule with its warm-up" in text
    assert p.steps_per_epoch == 8 and p.resume_step == 16 and p.lost_steps == 4


def test_lora_single_device_max_steps_not_below_the_epoch_restarts_too(lora_run):
    out, cfg = lora_run
    p = R.preflight(LORA_SINGLE, out, config=cfg, overrides=["save_adapter_weights_only=True"],
                    progress=BAR.format(e=3, s=7, n=1, t=3))  # 3 batches per epoch < max_steps_per_epoch=4
    assert p.case == R.CASE_STEPS_RESTART


def test_lora_single_device_with_truncating_max_steps_continues_with_a_caveat(lora_run):
    out, cfg = lora_run
    p = R.preflight(LORA_SINGLE, out, config=cfg, overrides=["save_adapter_weights_only=True"])
    assert p.case == R.CASE_CONTINUES and p.first_step == 9
    assert any("only if max_steps_per_epoch=4 is below the epoch's number of batches" in w for w in p.warnings)


def test_lora_single_device_on_cpu_names_its_in_place_merge(lora_run):
    out, cfg = lora_run
    p = R.preflight(LORA_SINGLE, out, config=cfg)
    assert any("merges the LoRA weights into the live model's base weights" in w for w in p.warnings)
    assert not any("merges" in w for w in R.preflight(LORA_SINGLE, out, config=cfg, overrides=["device=cuda"]).warnings)
    assert not any("merges" in w for w in R.preflight(OUR_LORA, out, config=cfg).warnings)


def test_async_checkpoints_of_full_finetune_distributed(tmp_path, base):
    out = tmp_path / "out"
    for k in (0, 1):
        d = out / f"dist_epoch_{k}"
        d.mkdir(parents=True)
        (d / "__0_0.distcp").write_bytes(b"\0" * 64)
    (out / "dist_epoch_0" / ".metadata").write_bytes(b"\x80\x02}q\x00.")  # dist_epoch_1 died before its metadata
    cfg = write_config(tmp_path / "cfg.yaml", base, enable_async_checkpointing=True)
    p = R.preflight(FULL_DIST, out, config=cfg, progress=BAR.format(e=2, s=6, n=2, t=4))
    assert p.case == R.CASE_ASYNC and p.epoch == 0 and p.epochs_done == 1
    assert p.overrides == ("resume_from_checkpoint=True", "enable_async_checkpointing=True")
    assert any("dist_epoch_1/ is incomplete" in w for w in p.warnings)
    assert p.lost_steps == 2 and p.first_step == 5
    assert "Training will start from the base checkpoint" in p.summary()
    with pytest.raises(PlanError, match="holds 1 epoch\\(s\\) and the config asks for epochs=1; add epochs=<more than 1>"):
        R.preflight(FULL_DIST, out, config=cfg, overrides=["epochs=1"])
    shutil.rmtree(out / "dist_epoch_0")
    with pytest.raises(NothingToResume, match="dist_epoch_1/ lack their .metadata") as err:
        R.preflight(FULL_DIST, out, config=cfg)
    assert err.value.fresh_start is True


def test_failed_resume_line():
    text = ("INFO:torchtune.utils._logging:Loss is initialized.\n"
            "[rank0]:WARNING:torchtune.utils._logging:Failed to load distributed checkpoint: boom. "
            "Training will start from the base checkpoint.\n1|1|Loss: 3.2\n")
    assert R.failed_resume_line(text).startswith("[rank0]:WARNING") and "boom" in R.failed_resume_line(text)
    assert R.failed_resume_line("1|1|Loss: 3.2\nall good\n") is None


# -- lost steps -----------------------------------------------------------------------------------


def test_lost_steps_from_the_log_tail(lora_run, tmp_path):
    out, cfg = lora_run
    log = tmp_path / "output.log"
    bars = "\r".join(BAR.format(e=3, s=8 + i, n=i, t=4) for i in (1, 2, 3))
    log.write_text("x" * 400_000 + "\n" + BAR.format(e=2, s=8, n=4, t=4) + "\r" + bars + "\nINFO:...Traceback\n")
    p = R.preflight(OUR_LORA, out, config=cfg, log_path=log)
    assert (p.resume_step, p.last_step, p.lost_steps) == (8, 11, 3)
    assert p.lost_text == "3 steps (steps 9-11), done again"
    assert "lost: 3 steps (steps 9-11)" in p.summary()


def test_lost_steps_unknown_without_a_log(lora_run):
    out, cfg = lora_run
    p = R.preflight(OUR_LORA, out, config=cfg)
    assert p.lost_steps is None and p.last_step is None and p.lost_text.startswith("unknown")
    assert p.resume_step == 8  # from the recipe state's max_steps_per_epoch


def test_died_while_saving_the_next_epoch_loses_that_whole_epoch(lora_run):
    out, cfg = lora_run
    p = R.preflight(OUR_LORA, out, config=cfg, progress=BAR.format(e=3, s=12, n=4, t=4))
    assert p.lost_steps == 4


# -- paths and purity ------------------------------------------------------------------------------


def test_checkpointer_output_dir_elsewhere_is_where_checkpoints_are_read(tmp_path, base):
    out, ck = tmp_path / "out", tmp_path / "ckpts"
    out.mkdir()
    shards(ck / "epoch_0", 1)
    recipe_state(ck, epochs_run=1)
    cfg = write_config(tmp_path / "cfg.yaml", base)
    p = R.preflight(FULL_SINGLE, out, config=cfg, overrides=[f"checkpointer.output_dir={ck}"])
    assert p.checkpoint_root == ck and p.checkpoint == ck / "epoch_0"
    assert any(f"checkpointer.output_dir is {ck}, not output_dir {out}" in w for w in p.warnings)


def test_the_preflight_never_imports_torch(full_run):
    out, cfg = full_run
    code = ("import sys\nfrom tune_magic.checkpoints.preflight import preflight\n"
            f"p = preflight({FULL_SINGLE!r}, {str(out)!r}, config={str(cfg)!r})\n"
            "assert p.epoch == 1\nassert 'torch' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
