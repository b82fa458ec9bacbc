"""Resume pre-flight: what a job's ``output_dir`` holds, and the exact overrides that continue it.

Pure: reads files, starts nothing, never imports torch (checkpoint files are read by
:mod:`tune_magic.plan.ckptfiles`, which touches only their small index parts). Call
:func:`preflight` with what the job record holds (recipe, resolved ``output_dir``, config path
and the overrides it ran with, plus any the user adds); it returns a :class:`ResumePreflight` or
raises :class:`~tune_magic.errors.PlanError` saying why the job cannot be resumed and what to do.

torchtune 0.6.1 semantics (read from its recipes and checkpointers, measured on CPU):

* Checkpoints are written only at epoch ends, as ``epoch_<K>/`` under ``checkpointer.output_dir``
  (K the 0-based epoch). Only the non-final ones also write ``recipe_state/recipe_state.pt``
  (optimizer state, ``seed``, ``epochs_run``, ``total_epochs``, ``max_steps_per_epoch``, the
  data-loader state), overwritten each time, last in the save. So ``epochs_run = K + 1`` pairs
  the recipe state with its ``epoch_K/``, and a larger ``epoch_*`` folder (the final save, or a
  save cut short) is newer than the recipe state: the files are always pinned, never left to the
  checkpointer's "largest epoch folder" search.
* LoRA recipes: ``resume_from_checkpoint=True checkpointer.adapter_checkpoint=epoch_K/adapter_model.pt
  checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt``; both paths are joined onto
  ``checkpointer.output_dir``. The base weights come from ``checkpoint_dir`` as before.
* Full fine-tunes: ``resume_from_checkpoint=True checkpointer.checkpoint_files=[epoch_K/model-00001-of-0000N.safetensors,
  ...]`` (0.6.1 reads a resumed full model from ``output_dir``, not ``checkpoint_dir``; the docs'
  form, which sidesteps torchtune#2927) plus the pinned ``recipe_checkpoint``.
* ``full_finetune_distributed`` with ``enable_async_checkpointing=True`` saves its non-final
  epochs as distributed checkpoints ``dist_epoch_<K>/`` (complete once ``.metadata`` is written)
  and resumes from the newest one by itself; if that load fails it logs "Training will start
  from the base checkpoint" and trains on from the base model: :func:`failed_resume_line` finds
  that line so the caller can treat such a run as a failed resume.
* The seed and ``max_steps_per_epoch`` of the checkpoint win over the config's; ``epochs`` comes
  from the config.

How exact each recipe's resume is (the :attr:`ResumePreflight.case`): see :data:`CASES`.

Recipes it knows: torchtune's ``lora_finetune_single_device``, ``lora_finetune_distributed``,
``qat_lora_finetune_distributed``, ``full_finetune_single_device``, ``full_finetune_distributed``
and ``qat_distributed`` (recognised by name, or by their file inside an installed torchtune), and
any recipe file that declares a line ``TUNE_MAGIC_RESUME = "lora"`` or ``"full"`` at top level:
this project's ``lora_finetune`` and ``full_finetune`` do (and the test suite's stand-in recipe).
The declaration means "writes torchtune 0.6.1's layout, takes its resume keys, and resumes
exactly"; a copy of a built-in recipe (``tune cp``) is unknown until its author adds it.

Not decided here (the caller's, from the job record and its scheduler, before calling): a job
that succeeded, a job whose outcome is unknown while its engine has not confirmed that nothing of
it runs, and a live job writing the same ``output_dir`` — each would make two runs share one
``output_dir``.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from tune_magic.errors import NothingToResume, PlanError
from tune_magic.plan.ckptfiles import (
    CheckpointFileError,
    TensorStub,
    read_safetensors_header,
    read_torch_file,
)

#: :attr:`RecipeSupport.kind` of LoRA recipes (adapter + recipe state pinned).
LORA = "lora"
#: :attr:`RecipeSupport.kind` of full fine-tunes (model shards + recipe state pinned).
FULL = "full"

#: The resumed run gives the same losses as an uninterrupted one (tune_magic's recipes, tested
#: step for step on CPU).
CASE_EXACT = "exact"
#: Global step and LR schedule continue from the checkpoint, each remaining epoch sees the data an
#: uninterrupted run would (0.6.1 never reloads its saved data-loader state; every epoch reshuffles
#: from its seed and epoch number). Measured step for step on CPU for full_finetune_single_device
#: and lora_finetune_single_device (when its CPU merge, below, is off); read from the code for the
#: distributed recipes.
CASE_CONTINUES = "continues"
#: lora_finetune_single_device when max_steps_per_epoch does not truncate the epoch (null, or not
#: below the epoch's batches): the recipe sets ``global_step`` only when it truncates, so the
#: resumed run logs ``Step 1`` again and restarts the LR schedule, warm-up included.
CASE_STEPS_RESTART = "steps_restart"
#: full_finetune_distributed with enable_async_checkpointing: the recipe picks the newest
#: ``dist_epoch_<K>/`` itself (no file can be pinned); a failed load is only a warning line.
CASE_ASYNC = "async_checkpoint"

#: What each case means for the resumed run, as :meth:`ResumePreflight.summary` says it.
CASES = {
    CASE_EXACT: "exact: the remaining steps give the same losses as an uninterrupted run",
    CASE_CONTINUES: ("continues: global step and LR schedule go on from the checkpoint, and each remaining "
                     "epoch sees the data an uninterrupted run would (torchtune 0.6.1 does not reload its "
                     "data-loader state; every epoch reshuffles from its seed and epoch number)"),
    CASE_STEPS_RESTART: ("steps restart: {recipe} sets its global step only when max_steps_per_epoch truncates an "
                         "epoch, so with max_steps_per_epoch={max_steps} the resumed run logs Step 1 again and "
                         "restarts the LR schedule with its warm-up over all {epochs} epochs: its losses and "
                         "learning rates differ from an uninterrupted run's, and its step numbers repeat the "
                         "earlier run's"),
    CASE_ASYNC: ("async checkpoint: the recipe loads the newest complete dist_epoch_<K>/ itself (it cannot be "
                 "pinned); if that load fails it logs \"Training will start from the base checkpoint\" and "
                 "trains on from the base model: treat that line as a failed resume"),
}

#: The line full_finetune_distributed (0.6.1) logs when its resume from an async checkpoint failed.
FAILED_RESUME_TEXT = "Training will start from the base checkpoint"

RECIPE_STATE = "recipe_state/recipe_state.pt"
ADAPTER_FILE = "adapter_model.pt"
_EPOCH_DIR = re.compile(r"^epoch_(\d+)$")
_DIST_EPOCH_DIR = re.compile(r"^dist_epoch_(\d+)$")
_SHARD = re.compile(r"^model-(\d{5})-of-(\d{5})\.(safetensors|bin)$")
_DECLARED = re.compile(r"""^TUNE_MAGIC_RESUME\s*=\s*["'](lora|full)["']\s*(?:#.*)?$""", re.MULTILINE)
_HF_CHECKPOINTER = "FullModelHFCheckpointer"
_LOG_TAIL_BYTES = 256 << 10


@dataclass(frozen=True)
class RecipeSupport:
    """How a recipe resumes.

    Attributes:
        name: the recipe's name (``lora_finetune_single_device``, ``lora_finetune``...).
        kind: :data:`LORA` or :data:`FULL`.
        source: ``"torchtune"`` (a built-in recipe) or ``"declared"`` (its file says
            ``TUNE_MAGIC_RESUME = ...``).
        steps_continue_only_when_truncated: the recipe sets its global step on resume only when
            ``max_steps_per_epoch`` truncates an epoch (lora_finetune_single_device, 0.6.1).
        async_checkpointing: the recipe supports ``enable_async_checkpointing`` (dist_epoch_K/).
        merges_lora_in_place_on_cpu: its save merges LoRA into the live model's base weights when
            the model is on CPU (lora_finetune_single_device, 0.6.1).
        exact: resumes step for step like an uninterrupted run.
    """

    name: str
    kind: str
    source: str
    steps_continue_only_when_truncated: bool = False
    async_checkpointing: bool = False
    merges_lora_in_place_on_cpu: bool = False
    exact: bool = False


#: torchtune 0.6.1's recipes the pre-flight knows, by name.
BUILTIN_RECIPES: dict[str, RecipeSupport] = {
    r.name: r
    for r in (
        RecipeSupport("lora_finetune_single_device", LORA, "torchtune", steps_continue_only_when_truncated=True,
                      merges_lora_in_place_on_cpu=True),
        RecipeSupport("lora_finetune_distributed", LORA, "torchtune"),
        RecipeSupport("qat_lora_finetune_distributed", LORA, "torchtune"),
        RecipeSupport("full_finetune_single_device", FULL, "torchtune"),
        RecipeSupport("full_finetune_distributed", FULL, "torchtune", async_checkpointing=True),
        RecipeSupport("qat_distributed", FULL, "torchtune"),
    )
}
#: tune_magic's own recipes (they declare ``TUNE_MAGIC_RESUME``; listed for messages and names).
SHIPPED_RECIPES = ("lora_finetune", "full_finetune")


@dataclass(frozen=True)
class RecipeState:
    """The small entries of ``recipe_state.pt`` (its tensors are never read).

    Attributes:
        path: the file.
        size: its size on disk (bytes; a sparse file's apparent size).
        epochs_run: epochs done when it was saved (torchtune's ``epochs_run``).
        total_epochs: ``total_epochs`` when it was saved, or ``None``.
        max_steps_per_epoch: ``max_steps_per_epoch`` when it was saved (``None``: not set).
        seed: the run's seed.
        tensor_bytes: bytes of tensor data in it (optimizer state, mostly).
        keys: its top-level keys.
    """

    path: Path
    size: int
    epochs_run: int
    total_epochs: int | None
    max_steps_per_epoch: int | None
    seed: int | None
    tensor_bytes: int
    keys: tuple[str, ...]


@dataclass(frozen=True)
class ResumePreflight:
    """What resuming a job will do. Produced by :func:`preflight`.

    Attributes:
        recipe: the recipe as given (path or name).
        support: how that recipe resumes (:class:`RecipeSupport`).
        output_dir: the job's ``output_dir``.
        checkpoint_root: where the checkpoints are (``checkpointer.output_dir``, normally
            ``output_dir``); the pinned paths are relative to it.
        epoch: K of the checkpoint resumed from (``epoch_K/`` or ``dist_epoch_K/``, 0-based).
        checkpoint: that folder.
        files: the checkpoint's files the resumed run loads, relative to ``checkpoint_root``.
        recipe_state: the recipe state read, or ``None`` (async checkpoints keep it inside
            ``dist_epoch_K/``).
        epochs_done: epochs the checkpoint holds (``epochs_run``).
        total_epochs: epochs the resumed run trains to (the config's ``epochs``), or ``None``.
        max_steps_per_epoch: the value the resumed run uses (the checkpoint's).
        steps_per_epoch: optimizer steps per epoch, from the job's progress bar, else
            ``max_steps_per_epoch`` (then an upper bound), else ``None``.
        resume_step: global step at the checkpoint (steps), or ``None`` when unknown.
        first_step: the step number the resumed run logs first, or ``None`` when unknown.
        last_step: the latest step the job reached, from its log, or ``None`` (unknown).
        lost_steps: steps done after the checkpoint, which the resumed run repeats; ``None``:
            unknown (no log given, or it shows no progress bar).
        overrides: the ``key=value`` overrides the resume adds, in order.
        case: one of :data:`CASES`' keys.
        warnings: consequences and oddities, one plain sentence each.
    """

    recipe: str
    support: RecipeSupport
    output_dir: Path
    checkpoint_root: Path
    epoch: int
    checkpoint: Path
    files: tuple[str, ...]
    recipe_state: RecipeState | None
    epochs_done: int
    total_epochs: int | None
    max_steps_per_epoch: int | None
    steps_per_epoch: int | None
    resume_step: int | None
    first_step: int | None
    last_step: int | None
    lost_steps: int | None
    overrides: tuple[str, ...]
    case: str
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def resumed_overrides(self, original: Sequence[str]) -> list[str]:
        """Return ``original`` without the keys the resume sets (a resume of a resume replaces
        them), followed by :attr:`overrides`.

        Args:
            original: the job's overrides (``key=value`` and ``~key``), plus any the user adds.
        """
        ours = {o.split("=", 1)[0] for o in self.overrides}
        kept = [o for o in original if o.split("=", 1)[0].lstrip("~") not in ours]
        return kept + list(self.overrides)

    @property
    def lost_text(self) -> str:
        """The lost work in words: ``"2 steps (steps 9-10)"``, ``"nothing"``, or ``"unknown ..."``."""
        if self.lost_steps is None:
            return "unknown (no progress of the job was read)"
        if self.lost_steps == 0:
            return "nothing (the job stopped at its checkpoint)"
        plural = "s" if self.lost_steps != 1 else ""
        if self.resume_step is not None:
            first, last = self.resume_step + 1, self.resume_step + self.lost_steps
            span = f"step {first}" if first == last else f"steps {first}-{last}"
            return f"{self.lost_steps} step{plural} ({span}), done again"
        return f"{self.lost_steps} step{plural}, done again"

    def summary(self) -> str:
        """A few plain lines: what was found, what is lost, what is added, the case, the warnings."""
        total = f" of {self.total_epochs}" if self.total_epochs is not None else ""
        at = f", global step {self.resume_step}" if self.resume_step is not None else ""
        lines = [f"Resume {self.support.name} from {self.checkpoint.name}/ ({self.epochs_done}{total} epochs done{at})"]
        lines.append(f"  output_dir: {self.output_dir}")
        rs = self.recipe_state
        if rs is not None:
            ms = rs.max_steps_per_epoch if rs.max_steps_per_epoch is not None else "null"
            lines.append(f"  recipe state: {_rel(rs.path, self.checkpoint_root)} (epochs_run {rs.epochs_run}, seed "
                         f"{rs.seed}, max_steps_per_epoch {ms}, {_size(rs.tensor_bytes)} of tensors)")
        lines.append(f"  loads: {', '.join(self.files)}")
        lines.append(f"  lost: {self.lost_text}")
        if self.first_step is not None:
            lines.append(f"  the resumed run starts at step {self.first_step}")
        lines.append(f"  adds: {' '.join(self.overrides)}")
        text = CASES[self.case].format(recipe=self.support.name, max_steps=_null(self.max_steps_per_epoch),
                                       epochs=self.total_epochs if self.total_epochs is not None else "the")
        lines.append(f"  case: {text}")
        lines.extend(f"  warning: {w}" for w in self.warnings)
        return "\n".join(lines)


def failed_resume_line(text: str) -> str | None:
    """Return the first line of ``text`` saying a resume fell back to the base checkpoint, or ``None``.

    Matches full_finetune_distributed's (0.6.1) ``Failed to load distributed checkpoint: ...
    Training will start from the base checkpoint.`` warning, with or without a logger or rank
    prefix. Such a run trains from the base model although it was asked to resume: a failure.
    """
    for line in text.splitlines():
        if FAILED_RESUME_TEXT in line:
            return line.strip()
    return None


# -- recipes ------------------------------------------------------------------------------------


def known_recipes() -> list[str]:
    """Names of the recipes the pre-flight knows (built-in ones, then tune_magic's)."""
    return [*BUILTIN_RECIPES, *SHIPPED_RECIPES]


def _unknown(recipe: str, why: str) -> PlanError:
    names = ", ".join(known_recipes())
    return PlanError(
        f"cannot resume recipe {recipe}: {why}. The resume pre-flight knows {names}, and any recipe file with a "
        f"top-level line TUNE_MAGIC_RESUME = \"lora\" or \"full\" (declaring that it writes torchtune 0.6.1's "
        f"checkpoint layout and resumes exactly with its keys)"
    )


def _declared_kind(path: Path) -> str | None:
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            text = f.read(256 << 10)
    except OSError:
        return None
    m = _DECLARED.search(text)
    return m.group(1) if m else None


def _shipped_recipe(name: str) -> Path | None:
    spec = importlib.util.find_spec("tune_magic.recipes")  # its __init__ is empty: nothing heavy runs
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / f"{name}.py"
    return path if path.is_file() else None


def recipe_support(recipe: str, recipe_name: str | None = None) -> RecipeSupport:
    """Say how ``recipe`` resumes.

    Args:
        recipe: the job's recipe: an absolute path (as job records hold it) or a name.
        recipe_name: the name the user typed, when known (e.g. ``lora_finetune_single_device``).

    Returns:
        Its :class:`RecipeSupport`.

    Raises:
        PlanError: a recipe the pre-flight does not know; the message lists those it knows.
    """
    looks_like_path = "/" in recipe or recipe.endswith(".py")
    path = Path(recipe) if looks_like_path else None
    if path is None:
        if recipe in BUILTIN_RECIPES:
            return BUILTIN_RECIPES[recipe]
        shipped = _shipped_recipe(recipe) if recipe in SHIPPED_RECIPES else None
        if shipped is None:
            raise _unknown(recipe, "it is not a recipe name the pre-flight knows")
        path = shipped
    if not path.is_file():
        if recipe_name in BUILTIN_RECIPES:
            return BUILTIN_RECIPES[recipe_name]
        raise _unknown(recipe, "the recipe file is gone")
    stem = path.stem
    # torchtune's wheel installs its recipes as site-packages/recipes/*.py beside site-packages/torchtune/
    if stem in BUILTIN_RECIPES and path.parent.name == "recipes" and (path.parent.parent / "torchtune").is_dir():
        return BUILTIN_RECIPES[stem]
    kind = _declared_kind(path)
    if kind is None:
        hint = (f" (it is named like torchtune's {stem}, but is a copy: copies may differ)"
                if stem in BUILTIN_RECIPES else "")
        raise _unknown(str(path), f"the file declares no TUNE_MAGIC_RESUME{hint}")
    return RecipeSupport(recipe_name or stem, kind, "declared", exact=True)


# -- the config ---------------------------------------------------------------------------------


def _load_config(config: str | os.PathLike[str] | None, overrides: Sequence[str]):
    """The job's config with its overrides, merged as torchtune 0.6.1's parser does; ``None`` without one."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from tune_magic.plan.overrides import torchtune_text

    try:
        cfg = OmegaConf.load(config) if config is not None else OmegaConf.create({})
        dotlist = []
        for o in overrides:
            if o.startswith("~") or "=" not in o:
                continue
            k, v = o.split("=", 1)
            dotlist.append(f"{k}={torchtune_text(k, v)}")
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(dotlist))
        for deletion in (o[1:] for o in overrides if o.startswith("~")):
            parent, _, leaf = deletion.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if node is not None and leaf in node:
                del node[leaf]
    except (OmegaConfBaseException, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PlanError(f"cannot read the job's config {config} with its overrides ({first}); "
                        "fix the config or the overrides, then resume again") from None
    return cfg


def _get(cfg, key: str) -> Any:
    """``key``'s resolved value, or ``None`` when unset or not resolvable here."""
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
    except Exception:  # an interpolation this process cannot resolve (e.g. an unset ${oc.env:...})
        return None
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _raw(cfg, key: str) -> Any:
    """``key``'s value as written (interpolations unresolved), or ``None``."""
    from omegaconf import OmegaConf

    parent, _, leaf = key.rpartition(".")
    try:
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if node is None or not OmegaConf.is_dict(node):
            return None
        return OmegaConf.to_container(node, resolve=False).get(leaf)
    except Exception:
        return None


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


# -- files --------------------------------------------------------------------------------------


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} bytes"  # pragma: no cover


def _null(v: Any) -> str:
    return "null" if v is None else str(v)


def read_recipe_state(path: str | os.PathLike[str]) -> RecipeState:
    """Read ``recipe_state.pt``'s small entries (never its tensors, never with torch).

    Raises:
        FileNotFoundError: no such file.
        PlanError: truncated, damaged, not a torch file, or not a recipe state (the message names
            which, and what to do).
    """
    p = Path(path)
    try:
        tf = read_torch_file(p)
    except CheckpointFileError as exc:
        raise PlanError(f"cannot resume: {exc}. The recipe state (optimizer, epochs done) is lost, so the job "
                        "cannot continue from it; start a fresh run (or one from the last epoch_<K>/ weights)") from None
    obj = tf.obj
    if not isinstance(obj, dict) or not isinstance(obj.get("epochs_run"), int) or isinstance(obj.get("epochs_run"), bool):
        keys = sorted(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
        raise PlanError(f"cannot resume: {p} is a torch file but not a torchtune recipe state (no integer epochs_run; "
                        f"it holds {keys})")

    def plain_int(key: str) -> int | None:
        v = obj.get(key)
        if isinstance(v, TensorStub):  # a 0-d tensor: the value is in bytes not read here
            return None
        return _int_or_none(v)

    return RecipeState(p, tf.size, obj["epochs_run"], plain_int("total_epochs"), plain_int("max_steps_per_epoch"),
                       plain_int("seed"), tf.storage_bytes, tuple(map(str, obj)))


def _check(path: Path) -> str | None:
    """Why a checkpoint file is unusable (missing, truncated, damaged), or ``None`` when it is whole."""
    if not path.is_file():
        return f"{path.name} is missing"
    try:
        if path.suffix == ".safetensors":
            read_safetensors_header(path)
        elif path.suffix in (".pt", ".bin", ".pth"):
            read_torch_file(path)
    except (CheckpointFileError, OSError) as exc:
        return str(exc)
    return None


def _shards(folder: Path) -> tuple[list[str], list[str]]:
    """``(shard names, problems)`` of the model shards in ``folder`` (``model-XXXXX-of-YYYYY.*``)."""
    try:
        names = sorted(n for n in os.listdir(folder) if _SHARD.match(n))
    except OSError as exc:
        return [], [f"{folder} cannot be listed ({exc.strerror})"]
    if not names:
        return [], [f"{folder.name}/ holds no model-XXXXX-of-YYYYY shard"]
    problems = []
    by_total: dict[tuple[int, str], set[int]] = {}
    for n in names:
        m = _SHARD.match(n)
        by_total.setdefault((int(m.group(2)), m.group(3)), set()).add(int(m.group(1)))
    if len(by_total) > 1:
        problems.append(f"{folder.name}/ mixes shard sets ({', '.join(sorted(names))})")
    (total, ext), have = max(by_total.items(), key=lambda kv: len(kv[1]))
    missing = [i for i in range(1, total + 1) if i not in have]
    if missing:
        problems.append(f"{folder.name}/ lacks shard(s) " + ", ".join(f"model-{i:05d}-of-{total:05d}.{ext}" for i in missing))
    chosen = [f"model-{i:05d}-of-{total:05d}.{ext}" for i in sorted(have)]
    problems += [p for p in (_check(folder / n) for n in chosen) if p]
    return chosen, problems


def _epoch_problems(folder: Path, support: RecipeSupport, cfg, *, for_resume: bool) -> tuple[list[str], list[str], list[str]]:
    """``(files to pin, blocking problems, other problems)`` of ``epoch_K/`` for this recipe kind."""
    hf = _HF_CHECKPOINTER in str(_get(cfg, "checkpointer._component_") or _HF_CHECKPOINTER)
    if not folder.is_dir():
        return [], [f"{folder.name}/ is missing"], []
    if support.kind == FULL:
        shards, problems = _shards(folder)
        if hf and not problems and not any((folder / i).is_file() for i in
                                           ("model.safetensors.index.json", "pytorch_model.bin.index.json")):
            problems.append(f"{folder.name}/ lacks its weight index (model.safetensors.index.json): the save was cut short")
        return [f"{folder.name}/{s}" for s in shards], problems, []
    adapter = _check(folder / ADAPTER_FILE)
    blocking = [adapter] if adapter else []
    other = []
    if hf and not (folder / "adapter_config.json").is_file():
        other.append(f"{folder.name}/adapter_config.json is missing")
    if not (_get(cfg, "save_adapter_weights_only") is True) and for_resume:
        _, shard_problems = _shards(folder)
        other += [f"merged weights: {p}" for p in shard_problems]
    return [f"{folder.name}/{ADAPTER_FILE}"], blocking, other


def _numbered(root: Path, pattern: re.Pattern) -> dict[int, Path]:
    try:
        names = os.listdir(root)
    except OSError:
        return {}
    return {int(m.group(1)): root / n for n in names for m in [pattern.match(n)] if m and (root / n).is_dir()}


# -- the job's progress -------------------------------------------------------------------------


def _latest_bar(progress: str | None, log_path: str | os.PathLike[str] | None):
    from tune_magic.logs.progress import parse_bar

    if progress:
        bar = parse_bar(progress)
        if bar is not None:
            return bar
    if log_path is None:
        return None
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _LOG_TAIL_BYTES))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for record in reversed(re.split(r"\r\n|\r|\n", tail)):
        bar = parse_bar(record)
        if bar is not None:
            return bar
    return None


# -- the pre-flight -----------------------------------------------------------------------------


def preflight(
    recipe: str,
    output_dir: str | os.PathLike[str],
    *,
    config: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    recipe_name: str | None = None,
    progress: str | None = None,
    log_path: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> ResumePreflight:
    """Read a job's ``output_dir`` and say how to resume it, before anything starts.

    Reads directory listings, the checkpoint files' headers and ``recipe_state.pt``'s small entries
    (never its tensors; see :mod:`tune_magic.plan.ckptfiles`), the config, and at most the last
    256 KiB of ``log_path``. Never imports torch.

    Args:
        recipe: the job's recipe (job records hold its absolute path) or a recipe name.
        output_dir: the job's resolved ``output_dir``.
        config: the job's config file (absolute path), or ``None``.
        overrides: the job's overrides in order (``key=value``, ``~key``), then any the user adds
            for the resumed run; read as torchtune 0.6.1 reads them.
        recipe_name: the recipe name as the user typed it, when known.
        progress: the job's latest progress-bar text (torchtune's tqdm line, e.g. the job
            summary's ``progress``), to count the lost steps.
        log_path: the job's combined log, read from its end when ``progress`` gives nothing.
        cwd: the job's working directory, against which relative paths of its config are taken
            (default: this process's).

    Returns:
        A :class:`ResumePreflight`.

    Raises:
        NothingToResume: (a PlanError) nothing to resume from: no checkpoint yet (the job died in its
            first epoch; ``fresh_start`` is True), only a final checkpoint, or training finished.
        PlanError: the ``output_dir`` is gone, the recipe is unknown, the
            recipe state is truncated, damaged or not a torch file, the checkpoint it pairs with is
            missing or incomplete, the base checkpoint is gone, or the config cannot be read. The
            message says why and what to do.
    """
    support = recipe_support(recipe, recipe_name)
    cwd = os.fspath(cwd) if cwd is not None else os.getcwd()
    out = Path(os.path.normpath(os.path.join(cwd, os.fspath(output_dir))))
    if not out.is_dir():
        raise PlanError(f"cannot resume: the job's output_dir {out} is gone, and with it every checkpoint; "
                        "start a fresh run with the same settings")
    cfg = _load_config(config, overrides)
    warnings: list[str] = []

    # "${output_dir}" (every torchtune config) is the job's output_dir: never re-resolved here, where the
    # environment its interpolations read may differ from the job's
    ckpt_out = None if _raw(cfg, "checkpointer.output_dir") == "${output_dir}" else _get(cfg, "checkpointer.output_dir")
    root = Path(os.path.normpath(os.path.join(cwd, ckpt_out))) if isinstance(ckpt_out, str) and ckpt_out else out
    if root != out:
        warnings.append(f"checkpointer.output_dir is {root}, not output_dir {out}: the checkpoints are read there")
        if not root.is_dir():
            raise PlanError(f"cannot resume: checkpointer.output_dir {root} is gone, and with it every checkpoint; "
                            "start a fresh run with the same settings")
    epochs = _int_or_none(_get(cfg, "epochs"))
    device = str(_get(cfg, "device") or "")
    async_ckpt = support.async_checkpointing and _get(cfg, "enable_async_checkpointing") is True

    base_dir = _get(cfg, "checkpointer.checkpoint_dir")
    if isinstance(base_dir, str) and base_dir and not Path(cwd, base_dir).is_dir():
        raise PlanError(f"cannot resume: the base checkpoint directory {base_dir} (checkpointer.checkpoint_dir) is "
                        "gone; the resumed run reads the model's config (and for LoRA the base weights) from it. "
                        "Restore it, or override checkpointer.checkpoint_dir=<where it is now>")

    epochs_dirs = _numbered(root, _EPOCH_DIR)
    if epochs is not None and (epochs - 1) in epochs_dirs:
        final = epochs_dirs[epochs - 1]
        _, blocking, _ = _epoch_problems(final, support, cfg, for_resume=False)
        if not blocking:
            raise NothingToResume(f"nothing to resume: {final.name}/ is the final checkpoint of all {epochs} epochs and it is "
                            "complete, so training finished (anything that failed came after the last save). To train "
                            "longer, start a new run from its weights")

    if async_ckpt:
        return _async(support, recipe, out, root, cfg, epochs, progress, log_path, warnings)

    state_path = root / RECIPE_STATE
    if not state_path.is_file():
        if epochs_dirs:
            last = max(epochs_dirs)
            raise NothingToResume(
                f"nothing to resume from: {root} has {epochs_dirs[last].name}/ but no {RECIPE_STATE}. torchtune writes the "
                "recipe state (optimizer, epochs done) only at the end of a non-final epoch, so that checkpoint holds "
                "weights only: start a new run (from its weights if you like)")
        raise NothingToResume(f"nothing to resume from: {root} holds no checkpoint (no epoch_<K>/, no {RECIPE_STATE}): "
                              "the job stopped in its first epoch, before any save. A fresh start with the same "
                              "settings is possible: launch it again", fresh_start=True)
    state = read_recipe_state(state_path)
    k = state.epochs_run - 1
    if k < 0:
        raise PlanError(f"cannot resume: {state_path} says {state.epochs_run} epochs were run; it pairs with no "
                        "checkpoint. Start a fresh run")
    folder = root / f"epoch_{k}"
    files, blocking, other = _epoch_problems(folder, support, cfg, for_resume=True)
    if blocking:
        raise PlanError(
            f"cannot resume: {RECIPE_STATE} says {state.epochs_run} epoch(s) were done, which pairs it with "
            f"{folder.name}/, but " + "; ".join(blocking) + ". An older epoch's weights would not match the optimizer "
            "state, so there is nothing consistent to continue from: start a new run")
    warnings += other
    if epochs is not None and state.epochs_run >= epochs:
        raise NothingToResume(f"nothing to resume: the recipe state says {state.epochs_run} epochs were done and the config "
                        f"asks for epochs={epochs}; add epochs=<more than {state.epochs_run}> to train longer")
    newer = sorted(n for n in epochs_dirs if n > k)
    if newer:
        names = ", ".join(f"{epochs_dirs[n].name}/" for n in newer)
        one = len(newer) == 1
        warnings.append(f"{names} {'is' if one else 'are'} newer than the recipe state (which pairs with "
                        f"{folder.name}/) and {'holds' if one else 'hold'} no optimizer state: resuming from "
                        f"{folder.name}/ (pinned); {names} will be written again")

    max_steps = state.max_steps_per_epoch
    cfg_max_steps = _get(cfg, "max_steps_per_epoch")
    if "max_steps_per_epoch" in cfg and _int_or_none(cfg_max_steps) != max_steps:
        warnings.append(f"the config says max_steps_per_epoch={_null(cfg_max_steps)}; the recipe uses the checkpoint's "
                        f"{_null(max_steps)}")
    cfg_seed = _int_or_none(_get(cfg, "seed"))
    if state.seed is not None and cfg_seed is not None and cfg_seed != state.seed:
        warnings.append(f"the config says seed={cfg_seed}; the recipe uses the checkpoint's seed {state.seed}")
    if state.total_epochs is not None and epochs is not None and epochs != state.total_epochs:
        warnings.append(f"the checkpoint was saved by a run of {state.total_epochs} epochs; the resumed run trains to "
                        f"the config's epochs={epochs}")

    bar = _latest_bar(progress, log_path)
    steps_per_epoch = bar.total if bar is not None and bar.total else max_steps
    case = CASE_EXACT if support.exact else CASE_CONTINUES
    if support.steps_continue_only_when_truncated:
        if max_steps is None or (bar is not None and bar.total and bar.total < max_steps):
            case = CASE_STEPS_RESTART
        elif bar is None or not bar.total or bar.total == max_steps:
            warnings.append(f"{support.name} continues its step count and LR schedule only if max_steps_per_epoch="
                            f"{max_steps} is below the epoch's number of batches; if it is not, the resumed run logs "
                            "Step 1 again and restarts the LR warm-up")
    if support.merges_lora_in_place_on_cpu and device == "cpu" and _get(cfg, "save_adapter_weights_only") is not True:
        warnings.append(
            f"on CPU, {support.name}'s checkpoint save (torchtune 0.6.1) merges the LoRA weights into the live model's "
            "base weights (its .cpu() copy of a CPU tensor is the tensor itself, and the merge adds in place): after "
            "each save the run trains on a changed base. The resumed run starts from the clean base plus the saved "
            "adapter, so its losses differ from the interrupted run's (and its own later saves do the same); "
            "save_adapter_weights_only=True avoids it")

    resume_step = state.epochs_run * steps_per_epoch if steps_per_epoch else None
    first_step = 1 if case == CASE_STEPS_RESTART else (resume_step + 1 if resume_step is not None else None)
    last_step, lost = _lost(bar, state.epochs_run, resume_step)

    pinned = tuple(files) + (RECIPE_STATE,)
    if support.kind == LORA:
        adds = ("resume_from_checkpoint=True", f"checkpointer.adapter_checkpoint={files[0]}",
                f"checkpointer.recipe_checkpoint={RECIPE_STATE}")
    else:
        adds = ("resume_from_checkpoint=True", f"checkpointer.checkpoint_files=[{','.join(files)}]",
                f"checkpointer.recipe_checkpoint={RECIPE_STATE}")
    return ResumePreflight(recipe, support, out, root, k, folder, pinned, state, state.epochs_run, epochs, max_steps,
                           steps_per_epoch, resume_step, first_step, last_step, lost, adds, case, tuple(warnings))


def _lost(bar, epochs_run: int, resume_step: int | None) -> tuple[int | None, int | None]:
    """``(last step, steps done after the checkpoint)`` from the job's latest progress bar."""
    if bar is None:
        return None, None
    done_epochs = bar.epoch - 1  # epochs finished before the bar's one
    if bar.n is not None and bar.total:
        whole = max(0, done_epochs - epochs_run) * bar.total
        return bar.step, whole + (bar.n if done_epochs >= epochs_run else 0)
    if resume_step is not None:
        return bar.step, max(0, bar.step - resume_step)
    return bar.step, None


def _async(support: RecipeSupport, recipe: str, out: Path, root: Path, cfg, epochs: int | None,
           progress: str | None, log_path, warnings: list[str]) -> ResumePreflight:
    """The async-checkpoint case: full_finetune_distributed resumes from its newest ``dist_epoch_K/``."""
    dists = _numbered(root, _DIST_EPOCH_DIR)
    complete = {n: p for n, p in dists.items() if (p / ".metadata").is_file() and (p / ".metadata").stat().st_size > 0}
    if not complete:
        why = (f"{', '.join(p.name + '/' for p in dists.values())} lack their .metadata (saves cut short)"
               if dists else "there is no dist_epoch_<K>/")
        raise NothingToResume(f"nothing to resume from: with enable_async_checkpointing the recipe resumes from a "
                              f"complete dist_epoch_<K>/ under {root}, and {why}: the job stopped before its first "
                              "checkpoint was written. A fresh start with the same settings is possible: launch it "
                              "again", fresh_start=True)
    k = max(complete)
    for n in sorted(n for n in dists if n > k):
        warnings.append(f"{dists[n].name}/ is incomplete (no .metadata); the recipe skips it and loads {complete[k].name}/")
    epochs_run = k + 1  # the recipe saves dist_epoch_<curr_epoch> after counting that epoch as run
    if epochs is not None and epochs_run >= epochs:
        raise NothingToResume(f"nothing to resume: {complete[k].name}/ holds {epochs_run} epoch(s) and the config asks for "
                        f"epochs={epochs}; add epochs=<more than {epochs_run}> to train longer")
    max_steps = _int_or_none(_get(cfg, "max_steps_per_epoch"))
    bar = _latest_bar(progress, log_path)
    steps_per_epoch = bar.total if bar is not None and bar.total else max_steps
    resume_step = epochs_run * steps_per_epoch if steps_per_epoch else None
    last_step, lost = _lost(bar, epochs_run, resume_step)
    files = tuple(sorted(_rel(p, root) for p in complete[k].iterdir() if p.is_file()))
    adds = ("resume_from_checkpoint=True", "enable_async_checkpointing=True")
    return ResumePreflight(recipe, support, out, root, k, complete[k], files, None, epochs_run, epochs, max_steps,
                           steps_per_epoch, resume_step, resume_step + 1 if resume_step is not None else None,
                           last_step, lost, adds, CASE_ASYNC, tuple(warnings))
