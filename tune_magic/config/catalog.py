"""Recipe and config names: torchtune's built-in registry plus the recipes this project ships.

This is the only module that touches torchtune's private registry (``torchtune._recipe_registry``,
0.6.1). Everything else asks :func:`recipes` / :func:`configs` / :func:`find_recipe` /
:func:`find_config`. The registry is read through :mod:`tune_magic.config.toolcache` (once per torchtune
install, in a subprocess), so a process that only builds plans never loads it.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from tune_magic.errors import UserError
from tune_magic.config import toolcache

#: ``source`` of entries that come from the installed torchtune.
TORCHTUNE = "torchtune"
#: ``source`` of entries shipped with tune_magic (the repo's ``recipes/`` folder).
TUNE_MAGIC = "tune_magic"

# Which shipped config belongs to which recipe, the way torchtune's registry pairs them.
# Shipped configs not listed here are still found by name; they just have no recipe to list under.
_SHIPPED_RECIPES: dict[str, tuple[str, ...]] = {
    "lora_finetune": ("tiny/lora",),
    "full_finetune": ("tiny/full",),
}
# Shipped configs written for torchtune's own recipes (builtin_lora for GPU nodes, *_single on CPU).
_SHIPPED_CONFIGS_FOR_BUILTIN: dict[str, tuple[str, ...]] = {
    "lora_finetune_distributed": ("tiny/builtin_lora",),
    "lora_finetune_single_device": ("tiny/builtin_lora_single",),
    "full_finetune_single_device": ("tiny/builtin_full_single",),
}


@dataclass(frozen=True)
class RecipeEntry:
    """A named recipe.

    Attributes:
        name: the name users type (``lora_finetune_distributed``, ``lora_finetune``).
        path: absolute path of the recipe's ``.py`` file.
        source: :data:`TORCHTUNE` or :data:`TUNE_MAGIC`.
        supports_distributed: whether the recipe may run under torchrun (torchtune's registry flag;
            the shipped recipes all do).
        configs: names of the configs listed for this recipe (``tune ls`` order).
    """

    name: str
    path: Path
    source: str
    supports_distributed: bool
    configs: tuple[str, ...]


@dataclass(frozen=True)
class ConfigEntry:
    """A named config.

    Attributes:
        name: the name users type, without ``.yaml`` (``llama3_2/1B_lora``, ``tiny/lora``).
        path: absolute path of the YAML file.
        source: :data:`TORCHTUNE` or :data:`TUNE_MAGIC`.
        recipe: the recipe it is listed under, or ``None``.
    """

    name: str
    path: Path
    source: str
    recipe: str | None


def _torchtune_root() -> Path:
    """Return the directory holding torchtune's ``recipes/`` folder (site-packages)."""
    spec = importlib.util.find_spec("torchtune")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("torchtune is not installed: pip install 'torchtune>=0.6,<0.7'")
    return Path(spec.origin).parent.parent


def _load_torchtune_registry() -> ModuleType:
    """Load ``torchtune/_recipe_registry.py`` without running ``torchtune/__init__.py``.

    Importing the torchtune package costs ~5 s (it imports torchao and torch); the registry file
    itself only needs ``dataclasses``. Loading it alone keeps the tool cache's subprocess
    (:mod:`tune_magic.config.toolcache`), which runs it, about as fast as torchrun's own ``import torch``.
    """
    path = _torchtune_root() / "torchtune" / "_recipe_registry.py"
    if "torchtune._recipe_registry" in sys.modules:
        return sys.modules["torchtune._recipe_registry"]
    spec = importlib.util.spec_from_file_location("_tune_magic_torchtune_registry", path)
    if spec is None or spec.loader is None or not path.is_file():
        import torchtune._recipe_registry as registry  # layout changed: fall back to the real import

        return registry
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shipped_root() -> Path:
    """Return the directory of the shipped recipes (the installed ``tune_magic.recipes`` package)."""
    spec = importlib.util.find_spec("tune_magic.recipes")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("tune_magic.recipes is missing: reinstall tune_magic")
    return Path(next(iter(spec.submodule_search_locations))).absolute()


def live_registry_rows() -> list[dict[str, Any]] | None:
    """Read torchtune's recipe registry as JSON-able rows (loads ``_recipe_registry.py``).

    Returns:
        One dict per recipe in ``get_all_recipes()`` order: ``name``, ``file_path`` (relative to
        torchtune's ``recipes/`` folder), ``supports_distributed`` and ``configs`` (a list of
        ``{"name", "file_path"}``, file paths relative to ``recipes/configs/``); ``None`` when
        torchtune is not installed. This is what :mod:`tune_magic.config.toolcache` stores.
    """
    if importlib.util.find_spec("torchtune") is None:
        return None
    return [{"name": r.name, "file_path": r.file_path, "supports_distributed": bool(r.supports_distributed),
             "configs": [{"name": c.name, "file_path": c.file_path} for c in r.configs]}
            for r in _load_torchtune_registry().get_all_recipes()]


@functools.lru_cache(maxsize=1)
def _builtin() -> tuple[tuple[RecipeEntry, ...], tuple[ConfigEntry, ...]]:
    root = _torchtune_root() / "recipes"  # raises the install hint when torchtune is missing
    rows = toolcache.tables()["registry"]
    if rows is None:  # cached while torchtune was missing, yet the key says it is there now: a bug
        raise RuntimeError("tune_magic's tool cache has no torchtune registry although torchtune is installed")
    recipes, configs = [], []
    for r in rows:
        names = tuple(c["name"] for c in r["configs"])
        recipes.append(RecipeEntry(r["name"], root / r["file_path"], TORCHTUNE, bool(r["supports_distributed"]), names))
        for c in r["configs"]:
            configs.append(ConfigEntry(c["name"], root / "configs" / c["file_path"], TORCHTUNE, r["name"]))
    return tuple(recipes), tuple(configs)


@functools.lru_cache(maxsize=1)
def _shipped() -> tuple[tuple[RecipeEntry, ...], tuple[ConfigEntry, ...]]:
    root = shipped_root()
    owner = {c: r for table in (_SHIPPED_RECIPES, _SHIPPED_CONFIGS_FOR_BUILTIN) for r, cs in table.items() for c in cs}
    config_files = sorted((root / "configs").rglob("*.yaml"))
    configs = tuple(
        ConfigEntry(name, path, TUNE_MAGIC, owner.get(name))
        for path in config_files
        for name in [path.relative_to(root / "configs").with_suffix("").as_posix()]
    )
    recipes = tuple(
        RecipeEntry(path.stem, path, TUNE_MAGIC, True, _SHIPPED_RECIPES.get(path.stem, ()))
        for path in sorted(root.glob("*.py"))
        if not path.name.startswith("_")
    )
    return recipes, configs


def recipes() -> list[RecipeEntry]:
    """Return all named recipes: torchtune's first, then the shipped ones."""
    return [*_builtin()[0], *_shipped()[0]]


def configs() -> list[ConfigEntry]:
    """Return all named configs: torchtune's first, then the shipped ones."""
    return [*_builtin()[1], *_shipped()[1]]


class AmbiguousNameError(UserError, LookupError):
    """A name exists both in torchtune's registry and among the shipped recipes/configs (the
    message says to pass the file path instead)."""


def _find(name: str, entries: list, kind: str):
    hits = [e for e in entries if e.name == name]
    if len(hits) > 1:
        where = " and ".join(f"{e.source} ({e.path})" for e in hits)
        raise AmbiguousNameError(
            f"{kind} name {name!r} exists in both {where}; pass the file path instead of the name"
        )
    return hits[0] if hits else None


def find_recipe(name: str) -> RecipeEntry | None:
    """Look a recipe name up: torchtune's registry, then the shipped recipes.

    Returns:
        The entry, or ``None`` when the name is in neither (it may then be a file path).

    Raises:
        AmbiguousNameError: the name is in both registries.
    """
    return _find(name, recipes(), "recipe")


def find_config(name: str) -> ConfigEntry | None:
    """:func:`find_recipe` for a config name (no ``.yaml``): the entry, ``None``, or
    :class:`AmbiguousNameError`."""
    return _find(name, configs(), "config")


def shipped_configs_for(recipe: str) -> tuple[str, ...]:
    """Return the shipped config names that belong to ``recipe`` (built-in or shipped)."""
    return tuple(c.name for c in _shipped()[1] if c.recipe == recipe)
