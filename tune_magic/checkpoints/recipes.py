"""Which recipes the resume pre-flight knows, and how each resumes (torchtune 0.6.1). Pure.

torchtune's built-in recipes are known by name or by their file inside an installed torchtune; any
other recipe file is known when it declares a top-level line ``TUNE_MAGIC_RESUME = "lora"`` or
``"full"`` (this project's ``lora_finetune`` and ``full_finetune`` do): "it writes torchtune 0.6.1's
checkpoint layout, takes its resume keys, and resumes exactly".
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from tune_magic.errors import PlanError

#: :attr:`RecipeSupport.kind` of LoRA recipes (adapter + recipe state pinned).
LORA = "lora"


#: :attr:`RecipeSupport.kind` of full fine-tunes (model shards + recipe state pinned).
FULL = "full"


_DECLARED = re.compile(r"""^TUNE_MAGIC_RESUME\s*=\s*["'](lora|full)["']\s*(?:#.*)?$""", re.MULTILINE)


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
