"""Validation loss of a job: whether and how a run validates, its pre-flight checks, ``--val-split``,
and where its validation points come from. Pure: reads configs and files, starts nothing.

A run validates when its config (with its overrides) has a ``dataset_val`` node: torchtune's own
keys from the recipes after 0.6.1 (``dataset_val``, ``batch_size_val``, ``run_val_every_n_steps``,
pytorch/torchtune#2464), so a config written for those works unchanged. How it validates:

* :data:`IN_LOOP`: the recipe reads ``dataset_val`` itself (tune_magic's own recipes, and
  torchtune's later ones) and logs ``val_loss`` through its metric logger at the step it was
  computed (every ``run_val_every_n_steps`` steps and, in tune_magic's recipes, at each epoch's end).
* :data:`CHECKPOINTS`: any other recipe, torchtune 0.6.1's built-ins included, unmodified: each
  ``epoch_N/`` it saves is evaluated, once complete, by a small job of its own
  (``recipes/validate_checkpoint.py``, started by :mod:`tune_magic.job.evaluate`), whose result is
  recorded at the step the checkpoint was saved (:class:`SaveSteps`).

The value is defined in ``recipes/_validation.py``: the mean cross-entropy per label token over the
whole validation set, model in eval mode, no gradients.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tune_magic.config.checks import EXPECTED_KEYS
from tune_magic.errors import PlanError

#: :attr:`ValidationPlan.mode`: the recipe validates in its own loop.
IN_LOOP = "in_loop"
#: :attr:`ValidationPlan.mode`: each saved checkpoint is evaluated by a job of its own.
CHECKPOINTS = "checkpoints"
#: torchtune's validation keys (its recipes after 0.6.1), expected in any config.
KEYS = EXPECTED_KEYS
#: The metric name of a validation loss, as torchtune's later recipes log it.
VAL_LOSS = "val_loss"
#: The evaluation job's result file, in its ``output_dir`` (``recipes/validate_checkpoint.py``).
RESULT_FILE = "val_loss.json"
#: The evaluation recipe, in tune_magic's ``recipes/``.
EVALUATION_RECIPE = "validate_checkpoint"
#: Losses whose value is a mean cross-entropy per label token (what validation computes).
CROSS_ENTROPY_LOSSES = ("CEWithChunkedOutputLoss", "CrossEntropyLoss", "LinearCrossEntropyLoss")
#: torchtune 0.6.1's built-in recipes that save no ``epoch_N/`` checkpoints.
SAVES_NO_EPOCHS = ("generate", "eleuther_eval", "quantize", "generate_v2", "generate_v2_distributed")


@dataclass(frozen=True)
class ValidationPlan:
    """How a job validates (the record's ``validation`` field).

    Attributes:
        mode: :data:`IN_LOOP` or :data:`CHECKPOINTS`.
        every_n_steps: ``run_val_every_n_steps`` (in-loop validation only), or ``None``.
    """

    mode: str
    every_n_steps: int | None = None

    def to_record(self) -> dict[str, Any]:
        """The record's ``validation`` field."""
        return {"mode": self.mode, "every_n_steps": self.every_n_steps}

    @classmethod
    def from_record(cls, data: Any) -> "ValidationPlan | None":
        """The plan a record's ``validation`` field holds, or ``None`` (none, or not a known mode)."""
        if not isinstance(data, Mapping) or data.get("mode") not in (IN_LOOP, CHECKPOINTS):
            return None
        every = data.get("every_n_steps")
        return cls(data["mode"], every if isinstance(every, int) and not isinstance(every, bool) else None)


def _read_head(path: str | os.PathLike[str], limit: int = 1 << 20) -> str:
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return f.read(limit)
    except OSError:
        return ""


def recipe_reads_dataset_val(recipe: str | os.PathLike[str]) -> bool:
    """Whether the recipe file validates in its own loop: it reads ``dataset_val`` (tune_magic's
    recipes, torchtune's recipes after 0.6.1). A name (not a file) does not."""
    return os.path.isfile(recipe) and "dataset_val" in _read_head(recipe)


def can_validate(recipe: str | os.PathLike[str], recipe_name: str | None = None) -> bool:
    """Whether a job of the recipe can validate: in its own loop, or by the evaluation of the
    ``epoch_N/`` checkpoints it saves."""
    return recipe_reads_dataset_val(recipe) or saves_epoch_checkpoints(recipe, recipe_name)


def saves_epoch_checkpoints(recipe: str | os.PathLike[str], recipe_name: str | None = None) -> bool:
    """Whether the recipe saves ``epoch_N/`` checkpoints: its file calls ``save_checkpoint`` and it
    is none of torchtune's recipes that save none (:data:`SAVES_NO_EPOCHS`)."""
    stem = Path(recipe).stem
    if stem in SAVES_NO_EPOCHS or (recipe_name or "").rsplit("/", 1)[-1] in SAVES_NO_EPOCHS:
        return False
    return "save_checkpoint" in _read_head(recipe)


def _select(cfg: Any, key: str) -> Any:
    """``key``'s value in ``cfg`` (``None`` when absent), interpolations resolved.

    Raises:
        PlanError: the value (or one it interpolates, e.g. ``batch_size_val``'s default
            ``${batch_size}``) does not resolve.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
    except OmegaConfBaseException as exc:
        msg = str(exc).splitlines()[0]
        raise PlanError(f"{key} (or a key it interpolates) cannot be resolved: {msg}; fix the value (an interpolation ${{...}} must name "
                        "a key the config has)") from None


def _is_dataset_node(node: Any) -> bool:
    """A dataset node as torchtune's recipes instantiate one: a mapping with ``_component_``, or a
    non-empty list of them (concatenated)."""
    from omegaconf import DictConfig, ListConfig

    if isinstance(node, ListConfig):
        return len(node) > 0 and all(_is_dataset_node(n) for n in node)
    return isinstance(node, DictConfig) and isinstance(node.get("_component_"), str) and bool(node._component_.strip())


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def plan_validation(cfg: Any, recipe: str, recipe_name: str | None = None) -> ValidationPlan | None:
    """Whether and how a job validates, from its config with its overrides (module docstring).

    Args:
        cfg: the recipe's config, merged as the recipe gets it (an OmegaConf ``DictConfig``).
        recipe: the recipe file (absolute path) or name.
        recipe_name: the name the user typed, when known.

    Returns:
        The :class:`ValidationPlan`, or ``None`` when the config has no ``dataset_val``.

    Raises:
        PlanError: ``run_val_every_n_steps`` without ``dataset_val`` (torchtune's later recipes
            assert this only after loading the model), ``run_val_every_n_steps`` or
            ``batch_size_val`` not a positive number of steps or examples; for checkpoint
            evaluation, a recipe that saves no checkpoint or a loss that is not a cross-entropy.
            Each message names the fix.
    """
    every, batch = _select(cfg, "run_val_every_n_steps"), _select(cfg, "batch_size_val")
    dataset_val = _select(cfg, "dataset_val")
    if dataset_val is not None and not _is_dataset_node(dataset_val):
        from omegaconf import DictConfig

        what = (f"dataset_val._component_ is {dataset_val.get('_component_')!r}" if isinstance(dataset_val, DictConfig)
                else f"dataset_val={dataset_val!r}")
        raise PlanError(f"{what}, which is not a dataset: give a dataset node with a _component_, like "
                        "the config's dataset (e.g. dataset_val._component_=torchtune.datasets.instruct_dataset "
                        "with its source and data_files), a list of them, or --val-split F to hold out part of "
                        "the training data")
    if every is not None and dataset_val is None and not can_validate(recipe, recipe_name):
        raise PlanError(f"run_val_every_n_steps={every}: recipe {recipe_name or Path(recipe).stem} validates neither "
                        "in its loop nor by saving checkpoints (epoch_N/) that tune_magic could evaluate; remove "
                        "run_val_every_n_steps, or run a fine-tuning recipe")
    if every is not None and dataset_val is None:
        raise PlanError(f"run_val_every_n_steps={every} is set but dataset_val is not: add a dataset_val (a "
                        "dataset like `dataset`, or --val-split 0.1 to hold out the last 10% of the training data), "
                        "or remove run_val_every_n_steps. Nothing was started.")
    if every is not None and not _positive_int(every):
        raise PlanError(f"run_val_every_n_steps={every!r}: give a whole number of steps >= 1, e.g. "
                        "run_val_every_n_steps=50, or null to validate at each epoch's end only")
    if batch is not None and not _positive_int(batch):
        raise PlanError(f"batch_size_val={batch!r}: give a whole number of examples >= 1 (default: batch_size)")
    if dataset_val is None or Path(recipe).stem == EVALUATION_RECIPE:  # an evaluation validates itself
        return None
    if recipe_reads_dataset_val(recipe):
        return ValidationPlan(IN_LOOP, every)
    name = recipe_name or Path(recipe).stem
    if not saves_epoch_checkpoints(recipe, recipe_name):
        raise PlanError(f"the config has a dataset_val, and recipe {name} validates neither in its loop nor by "
                        "saving checkpoints (epoch_N/) that tune_magic could evaluate: remove dataset_val (and "
                        "--val-split), or run a fine-tuning recipe")
    loss = str(_select(cfg, "loss._component_") or "")
    if loss and loss.rsplit(".", 1)[-1] not in CROSS_ENTROPY_LOSSES:
        raise PlanError(f"the config has a dataset_val, and validation computes the cross-entropy per label token, "
                        f"which the job's loss {loss} is not: remove dataset_val (and --val-split) for this recipe")
    return ValidationPlan(CHECKPOINTS, None)


# -- --val-split -----------------------------------------------------------------------------------


def fraction_of(value: Any) -> float:
    """``--val-split F`` as given: a number, or its text as typed on a command line or in a magic
    (``"0.1"``); return F, checked by :func:`check_fraction`.

    Raises:
        PlanError: as :func:`check_fraction`; text that is not a number.
    """
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise PlanError(f"--val-split {value!r}: give the fraction of the training data to hold out, "
                            "between 0 and 1, e.g. --val-split 0.1") from None
        value = int(number) if number.is_integer() else number  # "1" reads as 1, not 1.0, in messages
    check_fraction(value)
    return float(value)


def check_fraction(fraction: Any) -> int:
    """``--val-split F`` read: return the whole percent 100·F. F is a number, or its text as the
    magic's and the CLI's option parser hand it on (``"0.1"``).

    Raises:
        PlanError: F not a number strictly between 0 and 1, or not a whole percent (Hugging Face
            slices datasets by whole percents).
    """
    if isinstance(fraction, str):
        try:
            fraction = float(fraction.strip())
        except ValueError:
            pass
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise PlanError(f"--val-split {fraction!r}: give the fraction of the training data to hold out, "
                        "between 0 and 1, e.g. --val-split 0.1")
    pct = round(fraction * 100)
    if not math.isclose(pct, fraction * 100, abs_tol=1e-9) or not 0 < pct < 100:
        raise PlanError(f"--val-split {fraction}: Hugging Face splits datasets by whole percents; give e.g. "
                        f"--val-split {max(pct, 1) / 100:g}")
    return pct

_PLAIN_SPLIT = re.compile(r"^[A-Za-z_][\w.-]*$")


def val_split_overrides(cfg: Any, fraction: Any) -> list[str]:
    """``--val-split F``: hold out the last F of the training data as ``dataset_val``.

    The training dataset gets ``split=<split>[:P%]`` and ``dataset_val`` becomes a copy of the
    ``dataset`` node with ``split=<split>[P%:]``, P = 100·(1 - F) (Hugging Face's slicing, the form
    torchtune's later configs use), as two overrides a dry run shows.

    Args:
        cfg: the recipe's config with its overrides (an OmegaConf ``DictConfig``).
        fraction: F, with 0 < F < 1 and 100·F a whole percent (Hugging Face slices by whole percents).

    Returns:
        ``["dataset.split=train[:90%]", "dataset_val={..., split: 'train[90%:]'}"]`` for F = 0.1.

    Raises:
        PlanError: F outside (0, 1) or not a whole percent; a config with a ``dataset_val`` already;
            a ``dataset`` that is not one node with a component (a list of datasets); a ``split``
            that is already a slice; a value a recipe's override parser would cut (``=``).
    """
    from omegaconf import DictConfig, OmegaConf

    pct = check_fraction(fraction)
    if _select(cfg, "dataset_val") is not None:
        raise PlanError(f"--val-split {fraction} and the config's dataset_val both say what to validate on: "
                        "drop --val-split (the config's dataset_val is used), or use a config without "
                        "dataset_val")
    node = cfg.get("dataset") if isinstance(cfg, DictConfig) else None
    if not isinstance(node, DictConfig) or "_component_" not in node:
        raise PlanError(f"--val-split {fraction}: the config's dataset is not one dataset with a _component_ "
                        "(a list of datasets cannot be split as one); give dataset_val yourself")
    data = OmegaConf.to_container(node, resolve=False)
    split = data.get("split", "train")
    if not isinstance(split, str) or not _PLAIN_SPLIT.match(split):
        raise PlanError(f"--val-split {fraction}: the dataset's split {split!r} is already a slice; give "
                        "dataset_val yourself (e.g. the same dataset with another slice), or split=train")
    data["split"] = f"{split}[{100 - pct}%:]"
    import yaml

    flow = yaml.safe_dump(data, default_flow_style=True, width=1 << 30, sort_keys=False).strip()
    if "=" in flow:
        raise PlanError(f"--val-split {fraction}: the dataset node holds an '=' ({flow}), which a recipe's "
                        "override parser cannot take; give dataset_val in the config or a YAML cell body")
    return [f"dataset.split={split}[:{100 - pct}%]", f"dataset_val={flow}"]


# -- where the points come from ----------------------------------------------------------------------


@dataclass(frozen=True)
class ValSummary:
    """What listings show of a job's validation losses (``Job.val_summary``).

    Attributes:
        latest, latest_step: the validation loss at the latest step it was computed, and that step.
        best, best_step: the lowest finite one, and its step (``None`` while none is finite).
        pending: checkpoints whose evaluation is queued or running (checkpoint evaluation only).
        failed: evaluations that failed or could not start (their job's card says why).
    """

    latest: float | None = None
    latest_step: int | None = None
    best: float | None = None
    best_step: int | None = None
    pending: int = 0
    failed: int = 0

    @classmethod
    def of_points(cls, points: list[tuple[int, float]], *, pending: int = 0, failed: int = 0) -> "ValSummary":
        """From ``(step, val_loss)`` pairs (any order); NaN and infinities are never best."""
        if not points:
            return cls(pending=pending, failed=failed)
        latest_step, latest = max(points, key=lambda p: p[0])
        finite = [p for p in points if math.isfinite(p[1])]
        best_step, best = min(finite, key=lambda p: (p[1], p[0])) if finite else (None, None)
        return cls(latest, latest_step, best, best_step, pending, failed)

_BAR_DESC = re.compile(r"(?<![\w.|])(\d+)\|(\d+)\|Loss: ")


class SaveSteps:
    """The global step at which each ``epoch_N/`` was saved, from the training log's progress bars
    (torchtune 0.6.1's description ``"{epoch}|{global_step}|Loss: ..."``, 1-based epochs): the save
    of ``epoch_N`` follows the last step of bar epoch N + 1. Fed the log incrementally."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}  # 1-based bar epoch -> its highest step seen
        self._tail = ""

    def feed(self, text: str) -> None:
        """Read more of the log (any cut: a description split across two reads is kept)."""
        text = self._tail + text
        cut = max(text.rfind("\n"), text.rfind("\r"))
        body, self._tail = (text[: cut + 1], text[cut + 1:][-4096:]) if cut >= 0 else ("", text[-4096:])
        for m in _BAR_DESC.finditer(body):
            epoch, step = int(m.group(1)), int(m.group(2))
            if step > self.last.get(epoch, -1):
                self.last[epoch] = step

    def feed_lines(self, lines) -> None:
        """Lines already split (a follower's last lines): each bar description in them is noted."""
        for line in lines:
            for m in _BAR_DESC.finditer(line):
                self.note(int(m.group(1)), int(m.group(2)))

    def note(self, epoch: int, step: int) -> None:
        """A step of 1-based bar epoch ``epoch`` seen elsewhere (a follower's progress points)."""
        if step > self.last.get(epoch, -1):
            self.last[epoch] = step

    def step_of(self, epoch_dir_index: int) -> int | None:
        """The step ``epoch_<epoch_dir_index>`` was saved at, or ``None`` before its epoch logged a step."""
        for m in _BAR_DESC.finditer(self._tail):  # the open line: tqdm redraws it without a newline
            epoch, step = int(m.group(1)), int(m.group(2))
            if step > self.last.get(epoch, -1):
                self.last[epoch] = step
        return self.last.get(epoch_dir_index + 1)


def read_result(output_dir: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """An evaluation's ``val_loss.json`` (``recipes/validate_checkpoint.py``), or ``None`` while it
    is not written (or not readable as that file)."""
    if not output_dir:
        return None
    try:
        with open(Path(output_dir) / RESULT_FILE, "r", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    value, step = data.get("val_loss") if isinstance(data, dict) else None, (data or {}).get("step")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not isinstance(step, int):
        return None
    return data
