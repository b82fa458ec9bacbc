"""The checkpoint layout of a job's ``output_dir`` as torchtune 0.6.1 writes it, and the config it
is read with. Pure: reads files, never imports torch (:mod:`tune_magic.checkpoints.files` reads the
checkpoint files' small index parts only). Used by the resume pre-flight (:mod:`tune_magic.checkpoints.preflight`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tune_magic.errors import PlanError
from tune_magic.checkpoints.files import CheckpointFileError, TensorStub, read_safetensors_header, read_torch_file
from tune_magic.checkpoints.recipes import FULL, RecipeSupport

RECIPE_STATE = "recipe_state/recipe_state.pt"


ADAPTER_FILE = "adapter_model.pt"


EPOCH_DIR = re.compile(r"^epoch_(\d+)$")


DIST_EPOCH_DIR = re.compile(r"^dist_epoch_(\d+)$")


_SHARD = re.compile(r"^model-(\d{5})-of-(\d{5})\.(safetensors|bin)$")


_HF_CHECKPOINTER = "FullModelHFCheckpointer"


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


def load_config(config: str | os.PathLike[str] | None, overrides: Sequence[str]):
    """The job's config with its overrides, merged exactly as torchtune 0.6.1's parser does
    (:func:`tune_magic.config.tuneparse.recipe_config`, the component shorthand included); an empty
    config without one.

    Raises:
        PlanError: the config cannot be read or the overrides not applied (the message says which).
    """
    import yaml
    from omegaconf.errors import OmegaConfBaseException

    from tune_magic.config.tuneparse import recipe_config

    try:
        return recipe_config(config, overrides)
    except (OmegaConfBaseException, yaml.YAMLError, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PlanError(f"cannot read the job's config {config} with its overrides ({first}); "
                        "fix the config or the overrides, then resume again") from None


def config_value(cfg, key: str) -> Any:
    """``key``'s resolved value, or ``None`` when unset or not resolvable here."""
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
    except Exception:  # an interpolation this process cannot resolve (e.g. an unset ${oc.env:...})
        return None
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def raw_value(cfg, key: str) -> Any:
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


def int_or_none(value: Any) -> int | None:
    """``value`` as a whole number (not a bool), else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def rel_path(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` (as torchtune joins checkpoint paths onto ``output_dir``)."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def size_text(n: int) -> str:
    """``n`` bytes in words (``12.3 GB``)."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} bytes"  # pragma: no cover


def null_text(v: Any) -> str:
    """``v`` as a config shows it (``null`` for ``None``)."""
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
        return int_or_none(v)

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


def epoch_problems(folder: Path, support: RecipeSupport, cfg, *, for_resume: bool) -> tuple[list[str], list[str], list[str]]:
    """``(files to pin, blocking problems, other problems)`` of ``epoch_K/`` for this recipe kind."""
    hf = _HF_CHECKPOINTER in str(config_value(cfg, "checkpointer._component_") or _HF_CHECKPOINTER)
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
    if not (config_value(cfg, "save_adapter_weights_only") is True) and for_resume:
        _, shard_problems = _shards(folder)
        other += [f"merged weights: {p}" for p in shard_problems]
    return [f"{folder.name}/{ADAPTER_FILE}"], blocking, other


def numbered_dirs(root: Path, pattern: re.Pattern) -> dict[int, Path]:
    """The folders of ``root`` whose name matches ``pattern`` (``epoch_(\\d+)``), by their number."""
    try:
        names = os.listdir(root)
    except OSError:
        return {}
    return {int(m.group(1)): root / n for n in names for m in [pattern.match(n)] if m and (root / n).is_dir()}
