"""The config a torchtune 0.6.1 recipe runs with: its config file plus its overrides, merged exactly
as torchtune's own parser does. Pure (reads the config file; imports neither torch nor torchtune).

A recipe decorated with ``torchtune.config.parse`` reads its command line with
``TuneRecipeArgumentParser`` (``torchtune/config/_parse.py``: an unknown ``--flag`` is a
``ValueError``; the config file, loaded with ``OmegaConf.load``, becomes the argparse defaults)
and merges the rest with ``_merge_yaml_and_cli_args`` (``torchtune/config/_utils.py``), which
walks the overrides in order:

* ``~a.b`` deletes ``a.b`` from the *config file's* keys (never from another override's), and a
  section that is left empty goes too; a path naming ``_component_``, or a section holding one, is
  refused (``Removing components from CLI is not supported`` / ``Could not find key ... to remove``).
* every other word must split into exactly two parts at ``=`` (``k, v = arg.split("=")``).
* the **component shorthand**: where ``k`` is a top-level key of the config file whose value is a
  section with a ``_component_``, ``k=pkg.fn`` means ``k._component_=pkg.fn``; the section's other
  keys stay (``b=other_model b.c=4`` gives ``{_component_: other_model, c: 4, ...}``, in either order).
* ``None`` becomes ``!!null``; a key containing ``max_filename`` gets ``!!str `` before its value.
* the words go to ``OmegaConf.from_dotlist`` and that is merged over the config (``OmegaConf.merge``).

:func:`recipe_config` re-does exactly this, so what tune_magic shows and checks (dry runs, the
directories a job writes to, resume's checkpoint layout, a sweep's trial configs) is the config the
recipe gets. ``tests/plan/test_grammar_oracle.py`` compares it with torchtune's own parse.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Mapping, Sequence

__all__ = ["recipe_config", "component_key", "has_component"]

_COMPONENT = "_component_"


def has_component(node: Any) -> bool:
    """Whether ``node`` is a section (a mapping) with a ``_component_`` key (torchtune 0.6.1's
    ``_has_component``)."""
    return isinstance(node, Mapping) and _COMPONENT in node


def component_key(key: str, config: Mapping[str, Any]) -> str:
    """The key torchtune 0.6.1 sets for an override ``key=value`` over the config file ``config``:
    ``key + "._component_"`` when ``key`` is a top-level key of ``config`` holding a section with a
    ``_component_`` (the component shorthand, ``optimizer=torch.optim.SGD``), else ``key``.

    ``config`` is the config file's keys after the deletions (``~key``) before this override; no
    deletion can remove a component or its ``_component_``, so the answer never depends on them.
    """
    return key + "." + _COMPONENT if key in config and has_component(config[key]) else key


def _remove_key_by_dotpath(doc: dict, dotpath: str) -> None:
    """torchtune 0.6.1's ``_remove_key_by_dotpath``: delete ``a.b.c``, then every section left
    empty on the way up; a section holding a ``_component_`` is never deleted (``ValueError``)."""
    path = dotpath.split(".")

    def delete_non_component(d: dict, key: str) -> None:
        if has_component(d[key]):
            raise ValueError(f"Removing components from CLI is not supported: ~{dotpath}")
        del d[key]

    def recurse(d: dict, rest: list[str]) -> None:
        if len(rest) == 1:
            delete_non_component(d, rest[0])
        else:
            recurse(d[rest[0]], rest[1:])
            if not d[rest[0]]:
                delete_non_component(d, rest[0])

    recurse(doc, path)


def recipe_config(config: "str | os.PathLike | Mapping[str, Any] | None", overrides: Sequence[str]):
    """Return the ``DictConfig`` a torchtune 0.6.1 recipe gets for ``--config config`` and ``overrides``.

    Args:
        config: the config file (read with ``OmegaConf.load``, as torchtune reads it), its data as
            a mapping (copied, never changed), or ``None`` for an empty config.
        overrides: the words after ``--config CONFIG`` exactly as the recipe gets them
            (``key=value`` and ``~key``; a ``+`` is not torchtune's and is kept in the key).

    Returns:
        The merged config, interpolations unresolved (``OmegaConf.merge`` of the config after its
        deletions and ``OmegaConf.from_dotlist`` of the rest, with the component shorthand).

    Raises:
        ValueError: where torchtune 0.6.1 stops the recipe before it runs, with torchtune's own
            message: an unknown ``--flag``, a word that is not exactly one ``key=value``, a
            deletion of a missing key or of a component, a deletion through a list or a plain value.
        OSError: the config file cannot be read.
        omegaconf.errors.OmegaConfBaseException, yaml.YAMLError: OmegaConf cannot read the config,
            a value, or merge them ("Cannot merge incompatible container types").
    """
    from omegaconf import OmegaConf

    from tune_magic.config.overrides import torchtune_text

    flags = [w for w in overrides if w.startswith("--")]
    if flags:  # TuneRecipeArgumentParser.parse_known_args
        raise ValueError(f"Additional flag arguments not supported: {flags}. Please use --config or key=value overrides")
    if config is None:
        doc: dict = {}
    elif isinstance(config, Mapping):
        doc = copy.deepcopy(dict(config))
    else:
        doc = OmegaConf.to_container(OmegaConf.load(config), resolve=False)
    dotlist = []
    for word in overrides:
        if word.startswith("~"):
            dotpath = word[1:].split("=")[0]
            if _COMPONENT in dotpath:
                raise ValueError(f"Removing components from CLI is not supported: ~{dotpath}")
            try:
                _remove_key_by_dotpath(doc, dotpath)
            except (KeyError, ValueError):
                raise ValueError(f"Could not find key {dotpath} in yaml config to remove") from None
            except TypeError as exc:  # torchtune stops here too, with this TypeError uncaught
                raise ValueError(f"cannot remove {dotpath} (torchtune 0.6.1 stops with TypeError: {exc})") from None
            continue
        parts = word.split("=")
        if len(parts) != 2:
            raise ValueError(f"Command-line overrides must be in the form of key=value, got {word}")
        key, value = parts
        key = component_key(key, doc)
        dotlist.append(f"{key}={torchtune_text(key, value)}")
    return OmegaConf.merge(OmegaConf.create(doc), OmegaConf.from_dotlist(dotlist))
