"""Recipe and config names and paths -> files, through the catalog (torchtune's registry and the
shipped ones) or relative to the working directory. Pure apart from reading the config file.
"""

from __future__ import annotations

import difflib
import os
import stat
from pathlib import Path

from tune_magic.errors import PlanError
from tune_magic.paths import file_kind
from tune_magic.config import catalog


def _not_a_file(what: str, name: str, path: Path) -> None:
    """Refuse a path that exists but is not a regular file (a FIFO, a socket, a device), naming what it is.

    Raises:
        PlanError: it is one.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        fix = "give a .yaml file" if what == "config" else "give the recipe's .py file"
        raise PlanError(f"{what} {name!r} ({path}) is {file_kind(mode)}, not a regular file: the recipe could not "
                        f"read it as one (reading it could block, or never end); {fix}")


def resolve_recipe(name: str, cwd: Path) -> tuple[Path, str | None, str, bool | None]:
    """Return (path, registry name, source, supports_distributed or None for custom)."""
    try:
        entry = catalog.find_recipe(name)
    except catalog.AmbiguousNameError as exc:
        raise PlanError(str(exc)) from None
    if entry is not None:
        return entry.path, entry.name, entry.source, entry.supports_distributed if entry.source == catalog.TORCHTUNE else None
    path = cwd / Path(name).expanduser()
    _not_a_file("recipe", name, path)
    if path.is_file():
        if path.suffix != ".py":  # torchrun runs it with Python; tune run imports it as a module
            raise PlanError(f"recipe {name!r} ({path}) is not a Python file: a custom recipe must be a .py file; "
                            "give the recipe's .py file or a name from tune-magic ls")
        return path.absolute(), None, "path", None
    if path.is_dir():
        raise PlanError(f"recipe {name!r} is a directory ({path}); give the recipe's .py file")
    looks_like_path = name.endswith(".py") or "/" in name or os.sep in name
    if looks_like_path:
        raise PlanError(f"recipe file {name!r} not found (looked at {path}); check the path or use a name from tune-magic ls")
    close = difflib.get_close_matches(name, [r.name for r in catalog.recipes()], n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise PlanError(f"unknown recipe {name!r}.{hint} tune-magic ls lists the recipes; a custom recipe is a .py path")


def resolve_config(name: str, cwd: Path) -> tuple[Path, str | None]:
    """Resolve a config name or path (relative to ``cwd``) to (absolute file, registry name or None).

    Raises:
        PlanError: neither a known name nor an existing file; a name in both registries.
    """
    try:
        entry = catalog.find_config(name)
    except catalog.AmbiguousNameError as exc:
        raise PlanError(str(exc)) from None
    if entry is not None:
        return entry.path, entry.name
    path = cwd / Path(name).expanduser()
    _not_a_file("config", name, path)
    if path.is_file():
        return path.absolute(), None
    if path.is_dir():
        raise PlanError(f"config {name!r} is a directory ({path}); give a .yaml file")
    close = difflib.get_close_matches(name, [c.name for c in catalog.configs()], n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise PlanError(f"config {name!r} not found: not a config name and no file {path}.{hint} tune-magic ls lists the configs")


def config_output_dir(config: Path) -> str | None:
    """Return the config's ``output_dir`` exactly as written (interpolations unresolved).

    Raises:
        PlanError: the file cannot be read, is not UTF-8 YAML, or its document is not a non-empty
            mapping (empty, a list, or a scalar such as a plain text file).
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    import yaml

    from tune_magic.config.overrides import yaml_loader

    try:
        # OmegaConf.load turns a top-level scalar into {scalar: None}: look at the document itself
        with open(config, encoding="utf-8") as f:
            top = yaml.compose(f, Loader=yaml_loader())  # OmegaConf's loader, as torchtune reads it
        cfg = OmegaConf.load(config) if isinstance(top, yaml.MappingNode) else None
    except UnicodeDecodeError:
        raise PlanError(f"config {config} is not a text (UTF-8) YAML file; give a .yaml config") from None
    except OSError as exc:
        raise PlanError(f"config {config} cannot be read ({exc.strerror or exc}); give a readable .yaml config") from None
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PlanError(f"config {config} is not valid YAML ({first}); fix the file or give another config") from None
    if cfg is None or not OmegaConf.is_dict(cfg) or len(cfg) == 0:
        what = ("empty" if top is None or isinstance(top, yaml.MappingNode) else
                "a list" if isinstance(top, yaml.SequenceNode) else "a single scalar: plain text, not key: value lines")
        raise PlanError(f"config {config} is not a YAML mapping of keys to values (it is {what}); give a "
                        "torchtune config (key: value lines)")
    raw = OmegaConf.to_container(cfg, resolve=False).get("output_dir")
    # only a non-empty string is a directory we can give each job its own child of
    return raw if isinstance(raw, str) and raw.strip() else None
