"""A launch's validation: whether and how its job validates, ``--val-split``, and the build of
``dataset_val`` as the recipe would build it, before anything starts (the rules are
:mod:`tune_magic.checkpoints.validation`'s; a job that validates by checkpoints has them evaluated
by its keeper, :mod:`tune_magic.job.keeper`).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from tune_magic.checkpoints import validation
from tune_magic.checkpoints.validation import fraction_of  # noqa: F401 - --val-split read, for the sweep layer
from tune_magic.errors import PlanError

#: Seconds the pre-flight build of ``dataset_val`` may take.
CHECK_TIMEOUT_S = 600.0

_CHECKED: dict[str, int] = {}  # digest of what builds dataset_val -> its examples (this process)


def evaluation_recipe() -> str:
    """The absolute path of ``recipes/validate_checkpoint.py`` (installed as ``tune_magic.recipes``)."""
    import importlib.util

    spec = importlib.util.find_spec("tune_magic.recipes")
    return str(Path(next(iter(spec.submodule_search_locations))) / f"{validation.EVALUATION_RECIPE}.py")


_HINTS = {
    "FileNotFoundError": "check dataset_val's data_files / source (a path relative to the job's working "
                         "directory, or absolute)",
    "KeyError": "dataset_val's column_map names a column its data lacks: map the data's own columns",
    "InstantiationError": "check dataset_val._component_: a dotted path to a dataset builder, e.g. "
                          "torchtune.datasets.instruct_dataset",
    "TypeError": "a dataset_val key is not an argument of its component: check its keyword arguments",
}


def _check_key(cfg) -> str:
    """A digest of everything that builds ``dataset_val`` (the node, the tokenizer, the loss's
    ``ignore_index``, the batch sizes, the collate): trials of a sweep that differ elsewhere share it."""
    from omegaconf import OmegaConf

    parts = {}
    for key in ("dataset_val", "tokenizer", "loss", "batch_size_val", "batch_size", "collate_fn"):
        node = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        try:
            parts[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        except Exception:  # noqa: BLE001 - an interpolation only the recipe resolves: keep it as written
            parts[key] = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def check_dataset_val(plan, cfg, *, cwd: str, env: Mapping[str, str]) -> int:
    """Build the tokenizer and ``dataset_val`` as the recipe (and an evaluation) would, in a
    process of its own (torch is never imported here); return the validation examples.

    Args:
        plan: the job's :class:`~tune_magic.plan.model.LaunchPlan` (its config, overrides, env).
        cfg: its config with its overrides (to key the result: trials of a sweep build it once).
        cwd: the job's working directory.
        env: the caller's environment.

    Raises:
        PlanError: ``dataset_val`` cannot be built, or holds no example; the message gives the
            recipe's own error and what to check.
    """
    key = _check_key(cfg)
    if key in _CHECKED:
        return _CHECKED[key]
    words = [w for w in plan.overrides if not w.startswith("output_dir=")]
    argv = [sys.executable, evaluation_recipe(), "--config", plan.config, *words, "validate.check=true"]
    try:
        r = subprocess.run(argv, cwd=cwd, env={**env, **plan.env}, capture_output=True, text=True,
                           timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise PlanError(f"building dataset_val took over {CHECK_TIMEOUT_S:.0f} s; check that its data is "
                        "reachable from here. Nothing was started.") from None
    if r.returncode == 0:
        try:
            examples = int(json.loads(r.stdout.strip().splitlines()[-1])["examples"])
        except (ValueError, KeyError, IndexError, TypeError):
            examples = 0
        _CHECKED[key] = examples
        return examples
    line = next((ln for ln in reversed(r.stderr.splitlines()) if ln.startswith("validate_checkpoint: error:")), "")
    why = line.split(": error: ", 1)[1] if line else (r.stderr.strip().splitlines() or ["no output"])[-1]
    kind = why.split(":", 1)[0]
    hint = _HINTS.get(kind, "")
    if "'module' object is not callable" in why:  # torchtune's dataset_val=abc sets the _component_: a module
        hint = ("dataset_val._component_ names a module, not a dataset builder (torchtune 0.6.1 reads "
                "dataset_val=X as dataset_val._component_=X): give a builder's dotted path, e.g. "
                "torchtune.datasets.instruct_dataset")
    if "has no examples" in why or "corresponds to no data" in why:  # the recipe's check, or Hugging Face's slice
        hint = "the validation set is empty: give it data (with --val-split, a larger fraction or more data)"
    raise PlanError(f"dataset_val cannot be built as the recipe would build it: {why}" + (f"; {hint}" if hint else "")
                    + ". Nothing was started.")


def val_split_words(plan, fraction: float) -> list[str]:
    """The overrides of ``--val-split`` for the plan's config (see :func:`launch`)."""
    from tune_magic.checkpoints.validation import can_validate, check_fraction, val_split_overrides
    from tune_magic.config.tuneparse import recipe_config

    check_fraction(fraction)
    if not can_validate(plan.recipe, plan.recipe_name):
        raise PlanError(f"--val-split {fraction}: recipe {plan.recipe_name or Path(plan.recipe).stem} validates "
                        "neither in its loop nor by saving checkpoints (epoch_N/) that tune_magic could evaluate; "
                        "drop --val-split, or run a fine-tuning recipe")
    return val_split_overrides(recipe_config(plan.config, plan.overrides), fraction)


def validation_of(plan):
    """How the plan's job validates (:func:`tune_magic.checkpoints.validation.plan_validation`), and
    the config it was read from; ``(None, config)`` without a ``dataset_val``.

    Raises:
        PlanError: validation keys that cannot work (the message names the fix).
    """
    from tune_magic.checkpoints.validation import plan_validation
    from tune_magic.config.tuneparse import recipe_config

    if not plan.config:
        return None, None
    try:
        cfg = recipe_config(plan.config, plan.overrides)
    except (OSError, ValueError):
        return None, None  # a config the recipe cannot read: its own checks said why already
    return plan_validation(cfg, plan.recipe, plan.recipe_name), cfg


def keep_checks(keep, validation_plan, plan) -> None:
    """Refuse a retention policy the job cannot follow: any, for a recipe that saves no
    ``epoch_N/`` checkpoints; ``best``, for a run that does not validate.

    Raises:
        PlanError: naming the fix.
    """
    if keep is None:
        return
    if not validation.saves_epoch_checkpoints(plan.recipe, plan.recipe_name):
        name = plan.recipe_name or Path(plan.recipe).stem
        raise PlanError(f"--keep-checkpoints {keep}: recipe {name} saves no epoch_N/ checkpoints to keep; drop "
                        "--keep-checkpoints. Nothing was started.")
    if keep == "best" and validation_plan is None:
        raise PlanError("--keep-checkpoints best keeps the checkpoint with the lowest validation loss, and this run "
                        "does not validate: add --val-split 0.1 (or a dataset_val), or keep the newest N "
                        "(--keep-checkpoints 2). Nothing was started.")


def disk_warning(plan, cfg, keep, *, refuse: bool = False) -> str | None:
    """The disk pre-flight of a launch (:func:`tune_magic.checkpoints.diskspace.estimate_for_config`):
    ``None`` when the checkpoints fit (or cannot be estimated: an input checkpoint not readable
    here, a config without a checkpointer), else a warning with the numbers.

    Args:
        plan: the job's plan (its recipe).
        cfg: its config with its overrides (an OmegaConf ``DictConfig``), or ``None``.
        keep: its retention policy (``None``: all kept).
        refuse: raise when not even one checkpoint fits (a launch); a dry run says it would.

    Raises:
        PlanError: with ``refuse``, not even one checkpoint and the recipe state fit.
    """
    if cfg is None or not validation.saves_epoch_checkpoints(plan.recipe, plan.recipe_name):
        return None
    from omegaconf import OmegaConf

    from tune_magic.checkpoints.diskspace import estimate_for_config

    try:
        resolved = OmegaConf.to_container(cfg, resolve=True)
        verdict = estimate_for_config(resolved, keep=keep)
    except Exception:  # noqa: BLE001 - an estimate that cannot be made stops no launch
        return None
    if verdict.verdict == "fits":
        return None
    message = f"disk: {verdict.message}"
    if verdict.verdict == "refuse":
        if refuse:
            raise PlanError(f"{message}. Nothing was started.")
        return f"a launch here would refuse this: {message}"
    return message


def sweep_disk_warning(plan, cfg, keep, n_trials: int, *, refuse: bool = False) -> str | None:
    """The disk pre-flight of a sweep: every trial's checkpoints counted (``n_trials`` x the
    checkpoints each keeps at its end, plus each one's recipe state) against the free space of
    the first trial's ``output_dir`` file system; ``None`` when they fit or cannot be estimated.

    Raises:
        PlanError: with ``refuse``, not even one trial's first checkpoint fits.
    """
    if cfg is None or n_trials < 2 or not validation.saves_epoch_checkpoints(plan.recipe, plan.recipe_name):
        return disk_warning(plan, cfg, keep, refuse=refuse) if cfg is not None else None
    from omegaconf import OmegaConf

    from tune_magic.checkpoints.diskspace import estimate_for_config
    from tune_magic.checkpoints.layout import size_text

    try:
        v = estimate_for_config(OmegaConf.to_container(cfg, resolve=True), keep=keep)
    except Exception:  # noqa: BLE001 - an estimate that cannot be made stops no sweep
        return None
    if v.verdict == "refuse":
        return disk_warning(plan, cfg, keep, refuse=refuse)
    each = v.kept * v.size.per_checkpoint + v.size.recipe_state_bytes
    needed = n_trials * each
    if needed <= v.free:
        return None
    return (f"disk: {n_trials} trials keep {v.kept} checkpoint(s) of {size_text(v.size.per_checkpoint)} each "
            f"(plus {size_text(v.size.recipe_state_bytes)} of recipe state): {size_text(needed)} in all, and "
            f"{size_text(v.free)} is free where the first trial writes: the sweep will fill the disk before it ends. "
            "Keep fewer checkpoints (--keep-checkpoints 1, or best), or free space")
