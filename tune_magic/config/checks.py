"""Overrides and YAML cell bodies checked against the config they change, before anything starts. Pure.

A torchtune 0.6.1 recipe merges ``key=value`` overrides into its config with
``OmegaConf.merge`` (``torchtune.config._utils._merge_yaml_and_cli_args``), which accepts any key:
a misspelled one (``optimzer.lr=1e-3``) becomes a new top-level section that no recipe reads, and
the job runs with the default learning rate. A value of the wrong kind (``optimizer.lr=abc``) is
merged too and fails seconds later on every rank, far from the key. This module reads the config
as torchtune does (``OmegaConf.load``, interpolations unresolved) and checks each override, and
each key of a YAML cell body merged over the config, against it:

* **Keys.** A key the config has passes. For one it lacks, the first missing segment is compared
  with the keys the config has at that level: a near miss (:func:`tune_magic.config.nearkeys.is_near_miss`, e.g. ``optimzer``
  for ``optimizer``) is refused with the nearest keys (``did you mean optimizer.lr?``). Any other
  missing key is a warning, not a refusal, because recipes read optional keys with defaults
  (``profiler``, ``compile``, ``clip_grad_norm``, ``lr_scheduler`` in
  ``full_finetune_single_device``...). A new key directly under a section that has a
  ``_component_`` gets no warning: it is a keyword argument of that component, and a wrong one is
  not silent (torchtune's ``instantiate`` fails with ``TypeError: ... unexpected keyword argument``
  naming it); a near miss of one of the component's keys there is still refused. Keys that go
  through a list (``dataset.0.source``, ``x[0]``) or through a plain value (``batch_size.x``) are
  refused: ``OmegaConf.merge`` fails on the first ("Cannot merge incompatible container types") and
  silently replaces the value with a section on the second.
* **Validation keys.** ``dataset_val``, ``batch_size_val`` and ``run_val_every_n_steps``
  (:data:`EXPECTED_KEYS`, torchtune's own from its recipes after 0.6.1) are expected in any config:
  setting them, or any key under ``dataset_val``, where the config has none is neither a warning nor
  a near miss of ``dataset``/``batch_size``.
* **``+key=value``** adds a key on purpose (Hydra's spelling): no refusal and no warning, and the
  recipe is handed ``key=value`` (torchtune 0.6.1 does not know ``+`` and would add a key named
  ``+key``).
* **``~key``** deletes a key (torchtune's own). torchtune refuses a key its YAML config does not
  have (``ValueError: Could not find key a.b in yaml config to remove``; the same message for a
  section holding a ``_component_``, which it cannot delete) and crashes with a ``TypeError`` on a
  path through a list or a plain value; each is refused here before launch. Deletions apply to
  the config file only, in order (torchtune deletes from the YAML, then merges the ``key=value``
  overrides), so ``~a`` twice, or ``~a`` of a key only an override sets, is refused too.
* **Values** are read as OmegaConf reads them (:func:`tune_magic.config.overrides.recipe_value`:
  ``1e-4`` is a number). Where the config holds a number or a boolean, text (unquoted) is refused,
  naming the key, what the config has, and how to pass text on purpose (quote it); a value that
  would be a sweep axis (:func:`tune_magic.config.overrides.looks_like_axis`, the one rule: a comma list
  such as ``1e-4,3e-4`` or ``range(1,4)``) is told to add ``--sweep`` or to quote it. A list or mapping where the
  config holds a number or a boolean, a list over a section or a section over a list (merge
  fails), and a plain value over a section (the section is lost) are refused too. A float where the
  config holds an integer (``model.lora_rank=8.5``; torch stops the job with a ``TypeError``) is
  refused unless tagged on purpose (``'model.lora_alpha=!!float 16.5'``); an integer where it holds a
  float passes, and a boolean is not an integer here. ``null``/``None``, ``${...}`` interpolations
  and quoted text always pass, and so does anything over a config value that is null or an
  interpolation.
* **The component shorthand** (torchtune 0.6.1's own, :func:`tune_magic.config.tuneparse.component_key`):
  ``optimizer=torch.optim.SGD``, where the config file's top-level ``optimizer`` is a section with a
  ``_component_``, is checked as ``optimizer._component_=torch.optim.SGD``: the section's other keys
  stay, so ``optimizer.lr=0.01`` may come before or after it. A ``_component_`` value that is a
  comma list (``torch.optim.SGD,torch.optim.AdamW``: never importable; add ``--sweep`` for one job
  each) or a number, boolean, list or mapping is refused.

Nothing here imports torch or starts anything.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

#: Top-level keys expected in any config though it lacks them: torchtune's validation keys (its
#: recipes after 0.6.1; :mod:`tune_magic.checkpoints.validation` reads them).
EXPECTED_KEYS = ("dataset_val", "batch_size_val", "run_val_every_n_steps")

from tune_magic.errors import PlanError
from tune_magic.config.overrides import looks_like_axis
from tune_magic.config.nearkeys import nearest_keys
from tune_magic.config.valuerules import component_problem as _component_problem
from tune_magic.config.valuerules import float_for_int as _float_for_int
from tune_magic.config.valuerules import takes_float as _takes_float
from tune_magic.config.valuerules import kind_of as _kind
from tune_magic.config.valuerules import shown as _shown

__all__ = ["CheckResult", "check_overrides", "check_axis_items", "split_override", "load_config"]

#: The key of an override, as ``tune_magic.config.launchwords`` accepts it (dotted names, ``[i]`` items).
KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+|\[[^\]]*\])*$")
_SEGMENT_SPLIT = re.compile(r"\.|\[|\]\.?")
_COMPONENT = "_component_"
_NOTHING_STARTED = "Nothing was started."


@dataclass(frozen=True)
class CheckResult:
    """What :func:`check_overrides` found.

    Attributes:
        overrides: the overrides to hand the recipe, in order: each as given, except that
            ``+key=value`` becomes ``key=value``.
        warnings: one line per key the config lacks that is neither a near miss nor added with
            ``+`` (keys of a YAML cell body start with ``cell line N:``).
    """

    overrides: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# -- override words -----------------------------------------------------------------------------


def split_override(token: str) -> tuple[str, str, str | None]:
    """Split one override into ``(kind, key, value)``.

    ``kind`` is ``"set"`` for ``key=value``, ``"add"`` for ``+key=value`` and ``"delete"`` for
    ``~key`` (``value`` ``None``). The value is everything after the first ``=``.

    Raises:
        PlanError: the key is not a dotted name (see :data:`KEY_RE`), ``+key`` has no ``=value``,
            ``~key`` has one, or ``+`` and ``~`` are combined.
    """
    if token.startswith("~"):
        key = token[1:]
        if "=" in key or not KEY_RE.match(key):
            raise PlanError(f"override {token!r}: a deletion is ~key with no value, e.g. ~model.lora_rank")
        return "delete", key, None
    kind, body = ("add", token[1:]) if token.startswith("+") else ("set", token)
    key, eq, value = body.partition("=")
    if not eq or not KEY_RE.match(key):
        if kind == "add":
            raise PlanError(f"override {token!r}: adding a key is +key=value with a key such as "
                            f"model.lora_dropout, e.g. +{key.lstrip('+~') or 'profiler.enabled'}=true")
        raise PlanError(f"override {token!r} is not key=value; write e.g. batch_size=4 or metric_logger.name=\"my run\" "
                        "(quote values with spaces)")
    return kind, key, value


def _segments(key: str) -> list[str]:
    return [s for s in _SEGMENT_SPLIT.split(key) if s]


# -- the config ---------------------------------------------------------------------------------


def load_config(path: str | os.PathLike) -> dict:
    """Read a config as torchtune 0.6.1 does (``OmegaConf.load``), interpolations unresolved.

    Returns:
        The config as plain Python data (``OmegaConf.to_container(resolve=False)``).

    Raises:
        PlanError: the file cannot be read, is not UTF-8 YAML, or is not a mapping.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    import yaml

    try:
        cfg = OmegaConf.load(path)
    except UnicodeDecodeError:
        raise PlanError(f"config {path} is not a text (UTF-8) YAML file; give a .yaml config") from None
    except OSError as exc:
        raise PlanError(f"config {path} cannot be read ({exc.strerror or exc}); give a readable .yaml config") from None
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise PlanError(f"config {path} is not valid YAML ({first}); fix the file or give another config") from None
    data = OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_dict(cfg) else None
    if not isinstance(data, dict):
        raise PlanError(f"config {path} is not a YAML mapping of keys to values; give a torchtune config "
                        "(key: value lines)")
    return data


def _merged(base: dict, overlay: dict) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(overlay)), resolve=False)


def _is_interpolation(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def _has_component(node: Any) -> bool:
    return isinstance(node, dict) and _COMPONENT in node


@dataclass
class _Walk:
    """Where a key path ends in a config: ``found`` with its ``value`` (in ``parent``, the section
    holding it), or stopped at segment
    ``depth`` because ``parent`` (the node reached) is a dict without it (``why == "missing"``), a
    list (``"list"``) or a plain value (``"value"``)."""

    found: bool
    value: Any = None
    depth: int = 0
    parent: Any = None
    why: str = ""


def _walk(config: dict, segments: Sequence[str]) -> _Walk:
    node: Any = config
    for i, seg in enumerate(segments):
        if isinstance(node, list):
            return _Walk(False, depth=i, parent=node, why="list")
        if not isinstance(node, dict):
            return _Walk(False, depth=i, parent=node, why="value")
        if seg not in node:
            return _Walk(False, depth=i, parent=node, why="missing")
        parent, node = node, node[seg]
    return _Walk(True, value=node, depth=len(segments), parent=parent if segments else None)


def _path(segments: Sequence[str]) -> str:
    return ".".join(segments)


def _record(config: dict, segments: Sequence[str], value: Any) -> None:
    """Record a key an override sets, so later overrides see it (structure only; never raises)."""
    node = config
    for seg in segments[:-1]:
        nxt = node.get(seg)
        if not isinstance(nxt, dict):
            nxt = node[seg] = {}
        node = nxt
    node[segments[-1]] = value


# -- one rule each ------------------------------------------------------------------------------


def _suggestions(segments: Sequence[str], walk: _Walk, prefix: str = "") -> list[str]:
    keys = [k for k in walk.parent if isinstance(k, str)] if isinstance(walk.parent, dict) else []
    rest = list(segments[walk.depth + 1:])
    return [prefix + _path([*segments[:walk.depth], k, *rest]) for k in nearest_keys(segments[walk.depth], keys)]


def _did_you_mean(suggestions: Sequence[str]) -> str:
    return "did you mean " + " or ".join(suggestions) + "?"


def _structure_problem(segments: Sequence[str], walk: _Walk) -> str | None:
    """Why a key that goes through a list or a plain value cannot be set, or ``None``."""
    through = _path(segments[:walk.depth])
    if walk.why == "list":
        return (f"{through} is a list in the config, and torchtune 0.6.1 cannot set one item of a list "
                f"(OmegaConf.merge stops the recipe: \"Cannot merge incompatible container types\"); give the "
                f"whole list, e.g. {through}=[...], or change it in a YAML cell body")
    if walk.why == "value":
        return (f"{through} is {_kind(walk.parent)} in the config ({through}: {_shown(walk.parent)}), not a "
                f"section with keys, so {_path(segments)} would silently replace it; set {through} itself")
    return None


def _quoted_forms(key: str, value: str) -> str:
    """``key='value'`` as YAML text, and how to type it where quotes are removed."""
    from tune_magic.config.overrides import shell_typed, yaml_quoted

    return (f"{yaml_quoted(key, value)} (on a command line or a %%tune_run line, whose quotes are removed, "
            f"type {shell_typed(key, value)})")


def _type_problem(key: str, config_value: Any, value: Any, quoted: bool, *, typed: str | None,
                  section: Any = None) -> str | None:
    """Why ``value`` (as the recipe reads it) cannot stand where the config holds
    ``config_value``, or ``None``. ``typed`` is the override's text (``None`` for a cell body);
    ``section`` the config section holding the key (its ``_component_`` may take a float there)."""
    if value is None or config_value is None or _is_interpolation(value) or _is_interpolation(config_value):
        return None
    has = f"the config has {key}: {_shown(config_value)} ({_kind(config_value)})"
    if isinstance(config_value, (bool, int, float)):
        want = "true or false" if isinstance(config_value, bool) else "a number"
        example = f"{key}={_shown(config_value)}" if typed is not None else f"{key.rsplit('.', 1)[-1]}: {_shown(config_value)}"
        if isinstance(value, str) and not quoted:
            if typed is not None and looks_like_axis(typed):  # the sweep grammar's rule (plan.axes)
                what = "a range(...)" if typed.strip().startswith("range(") else "a comma list"
                return (f"{has}, and {typed} is {what}, which the recipe would get as the text {value!r}; "
                        f"to run one job per value add --sweep (a sweep over {key}), or to pass the text on "
                        f"purpose quote it: {_quoted_forms(key, typed)}")
            fix = (f"to pass the text on purpose, quote it: {_quoted_forms(key, typed)}" if typed is not None else
                   f"to pass the text on purpose, quote it: {key.rsplit('.', 1)[-1]}: '{value}'")
            return f"{has}, and the recipe would get the text {value!r}; give {want} (e.g. {example}), or {fix}"
        if isinstance(value, (list, dict)):
            return f"{has}, and the recipe would get {_kind(value)} ({_shown(value)}); give {want} (e.g. {example})"
        if type(config_value) is int and type(value) is float and not quoted:  # bools are not ints here
            component = section.get("_component_") if isinstance(section, dict) else None
            if not _takes_float(component, key.rsplit(".", 1)[-1]):
                return _float_for_int(key, config_value, value, typed)
        return None
    if isinstance(config_value, dict):
        if isinstance(value, list):
            return (f"{has}, and a list cannot replace a section (OmegaConf.merge stops the recipe: \"Cannot merge "
                    f"incompatible container types\"); set its keys, e.g. {key}.{next(iter(config_value), 'x')}=...")
        if isinstance(value, dict):
            return None
        first = next((k for k in config_value if k != _COMPONENT), _COMPONENT)
        how = (f"to change its component write {key}._component_=..." if _has_component(config_value)
               else "to replace the whole section write it as a mapping")
        return (f"{has}, and {_shown(value)} would replace the whole section; set one of its keys, e.g. "
                f"{key}.{first}=..., or {how}")
    if isinstance(config_value, list) and isinstance(value, dict):
        return (f"{has}, and a mapping cannot replace a list (OmegaConf.merge stops the recipe: \"Cannot merge "
                f"incompatible container types\"); give a list, e.g. "
                + (f"{key}=[...]" if typed is not None else f"{key.rsplit('.', 1)[-1]}: [...]"))
    return None


def _quoted_text(value: str) -> bool:
    """Whether an override's value has its type on purpose: quoted for YAML, or tagged (``!!str``,
    ``!!float``: a YAML core tag, :data:`tune_magic.config.overrides.ALLOWED_TAGS`)."""
    v = value.strip()
    return v[:1] in ("'", '"') or v.startswith("!!")


# -- overrides ----------------------------------------------------------------------------------


class _Checker:
    """The overrides of one launch, checked in order against one config."""

    def __init__(self, config: dict, result: CheckResult) -> None:
        import copy

        self.config = config
        self.yaml_doc = copy.deepcopy(config)  # what torchtune deletes from: the config file only
        self.known = copy.deepcopy(config)  # the config plus what earlier overrides set
        self.result = result

    def token(self, token: str) -> None:
        kind, key, value = split_override(token)
        if kind == "delete":
            self._delete(token, key)
            self.result.overrides.append(token)
            return
        if kind == "add":
            from tune_magic.config import overrides

            overrides.check_value(key, value)
        self._set(token, kind, key, value)
        self.result.overrides.append(f"{key}={value}")

    def _refuse(self, token: str, why: str) -> None:
        raise PlanError(f"override {token}: {why}. {_NOTHING_STARTED}")

    def _delete(self, token: str, key: str) -> None:
        segments = _segments(key)
        if _COMPONENT in segments:
            self._refuse(token, f"torchtune cannot remove a component; override it instead, e.g. {key}=torchtune.models.OTHER")
        walk = _walk(self.yaml_doc, segments)
        if walk.why in ("list", "value"):
            through = _path(segments[:walk.depth])
            what = "a list" if walk.why == "list" else f"{_kind(walk.parent)} ({through}: {_shown(walk.parent)})"
            self._refuse(token, f"{through} is {what} in the config, with no keys to delete (torchtune 0.6.1 stops the "
                                f"recipe with a TypeError); delete {through} itself (~{through}) or set it")
        if not walk.found:
            said = f"(torchtune 0.6.1 stops the recipe: \"Could not find key {key} in yaml config to remove\")"
            if _walk(self.config, segments).found:
                self._refuse(token, f"an earlier override already deleted {key} {said}; drop one of them")
            near = _suggestions(segments, walk, "~")
            fix = _did_you_mean(near) if near else f"drop {token}"
            self._refuse(token, f"the config has no key {_path(segments[:walk.depth + 1])} to delete {said}; {fix}")
        if _has_component(walk.value):
            self._refuse(token, f"{key} is a section with a _component_, which torchtune 0.6.1 cannot delete (it stops "
                                f"the recipe with \"Could not find key {key} in yaml config to remove\"); override "
                                f"{key}._component_ or its keys instead")
        self._remove(segments)

    def _remove(self, segments: list[str]) -> None:
        """Delete as torchtune's ``_remove_key_by_dotpath`` does: a section left empty goes too."""
        for doc in (self.yaml_doc, self.known):
            chain = [doc]
            for seg in segments[:-1]:
                nxt = chain[-1].get(seg)
                if not isinstance(nxt, dict):
                    break
                chain.append(nxt)
            else:
                chain[-1].pop(segments[-1], None)
                for depth in range(len(segments) - 1, 0, -1):
                    if chain[depth] == {}:
                        del chain[depth - 1][segments[depth - 1]]

    def _set(self, token: str, kind: str, key: str, value: str) -> None:
        from tune_magic.config.overrides import recipe_value
        from tune_magic.config.tuneparse import component_key

        shorthand = component_key(key, self.yaml_doc) != key  # optimizer=torch.optim.SGD sets its _component_
        segments = _segments(key) + ([_COMPONENT] if shorthand else [])
        walk = _walk(self.known, segments)
        problem = _structure_problem(segments, walk)
        if problem is not None:
            self._refuse(token, problem)
        try:
            read = recipe_value(key, value)
        except Exception:  # noqa: BLE001 - the value's own check (tune_magic.config.overrides) says why
            read = _UNREADABLE
        if segments[-1] == _COMPONENT and read is not _UNREADABLE:
            why = _component_problem(key, shorthand, read, value)
            if why is not None:
                self._refuse(token, why)
        if walk.found:
            if read is not _UNREADABLE:
                why = _type_problem(_path(segments), walk.value, read, _quoted_text(value), typed=value,
                                    section=walk.parent)
                if why is not None:
                    self._refuse(token, why)
        elif kind == "set" and not (segments[0] in EXPECTED_KEYS and segments[0] not in self.known):
            self._missing(token, key, value, segments, walk)
        _record(self.known, segments, None if read is _UNREADABLE else read)

    def _missing(self, token: str, key: str, value: str, segments: list[str], walk: _Walk) -> None:
        missing = _path(segments[:walk.depth + 1])
        near = _suggestions(segments, walk)
        if near:
            self._refuse(token, f"the config has no key {missing}; {_did_you_mean(near)} (to add {key} as a new key "
                                f"on purpose, write +{key}={value})")
        if _has_component(walk.parent) and walk.depth == len(segments) - 1:
            return  # a keyword argument of the component: a wrong one fails loudly when it is instantiated
        self.result.warnings.append(
            f"override {token}: the config has no key {missing} ({_nearby(walk)}); the recipe uses it only if it "
            f"reads that key, and ignores it silently otherwise (a misspelling runs with the default). To add it "
            f"on purpose without this warning, write +{key}={value}")


_UNREADABLE = object()


def _nearby(walk: _Walk) -> str:
    keys = [k for k in walk.parent if isinstance(k, str)]
    level = "top-level keys" if walk.depth == 0 else "its keys"
    shown = ", ".join(keys[:6]) + (", ..." if len(keys) > 6 else "")
    return f"{level}: {shown}" if keys else "that section is empty"


# -- YAML cell bodies ---------------------------------------------------------------------------


def _overlay_nodes(text: str) -> dict[tuple[str, ...], tuple[int, bool]]:
    """``{key path: (cell line, quoted)}`` for every key of a YAML cell body (mappings only)."""
    import yaml

    found: dict[tuple[str, ...], tuple[int, bool]] = {}

    def walk(node, prefix: tuple[str, ...]) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                continue
            path = (*prefix, k.value)
            quoted = isinstance(v, yaml.ScalarNode) and (
                v.style in ("'", '"', "|", ">") or text[v.start_mark.index:v.end_mark.index].startswith("!!"))
            found[path] = (k.start_mark.line + 1, quoted)
            walk(v, path)

    try:
        walk(yaml.compose(text, Loader=yaml.SafeLoader), ())
    except yaml.YAMLError:  # OmegaConf read it (the caller checked): lines are only for messages
        pass
    return found


def _check_overlay(base: dict, overlay: dict, text: str, result: CheckResult) -> None:
    """Check a YAML cell body's keys and values against the config it is merged over."""
    where = _overlay_nodes(text)

    def line(path: tuple[str, ...]) -> str:
        at = where.get(path)
        return f"cell line {at[0]}: " if at else "cell body: "

    def refuse(path: tuple[str, ...], why: str) -> None:
        raise PlanError(f"{line(path)}{_path(path)}: {why}. {_NOTHING_STARTED}")

    def visit(config: Any, node: dict, prefix: tuple[str, ...]) -> None:
        for k, value in node.items():
            path = (*prefix, str(k))
            if k in config:
                cv = config[k]
                if isinstance(cv, dict) and isinstance(value, dict):
                    visit(cv, value, path)
                    continue
                quoted = where.get(path, (0, False))[1]
                why = _type_problem(_path(path), cv, value, quoted, typed=None, section=config)
                if why is not None:
                    refuse(path, why)
                continue
            if not prefix and k in EXPECTED_KEYS:
                continue  # torchtune's validation keys: expected though the config lacks them
            walk = _Walk(False, depth=len(prefix), parent=config, why="missing")
            near = _suggestions(path, walk)
            if near:
                refuse(path, f"the config has no key {_path(path)}; {_did_you_mean(near)} (to add it as a new key on "
                             f"purpose, set it on the %%tune_run line as +{_path(path)}=...)")
            if _has_component(config) or _has_component(value):
                continue  # a component's keyword argument, or a whole new component section
            result.warnings.append(
                f"{line(path)}{_path(path)}: the config has no key {_path(path)} ({_nearby(walk)}); the recipe uses it "
                f"only if it reads that key, and ignores it silently otherwise. To add it on purpose without this "
                f"warning, set it on the %%tune_run line as +{_path(path)}=...")

    visit(base, overlay, ())


# -- the entry point ----------------------------------------------------------------------------


def check_overrides(config_path: str | os.PathLike | None, overrides: Sequence[str],
                    overlay_yaml: str | None = None) -> CheckResult:
    """Check overrides (and a YAML cell body) against the config they change (module docstring).

    Args:
        config_path: the config file the recipe gets with ``--config`` (torchtune 0.6.1's
            ``OmegaConf.load``), or ``None`` when a YAML cell body is the whole config.
        overrides: ``key=value``, ``+key=value`` and ``~key`` words, in the order the recipe
            gets them, each already checked for syntax and YAML by
            :func:`tune_magic.config.launchwords.check_override` (``+key=value`` is checked here).
        overlay_yaml: a ``%%tune_run`` YAML cell body merged over the config
            (:func:`tune_magic.plan.configview.write_overlaid_config`), or ``None``. Its keys are
            checked against the config; the overrides against the config with it merged.

    Returns:
        :class:`CheckResult`: the overrides to hand the recipe (``+key=value`` as ``key=value``)
        and one warning per key the config lacks that is not a near miss.

    Raises:
        PlanError: a key whose first missing segment is a near miss of a config key (the message
            says ``did you mean ...?``), a ``~key`` the config does not have (or a component, or
            inside a list), a key through a list or a plain value, a value whose type cannot be
            what the config holds, or a config that cannot be read. Nothing has been started.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    import yaml

    config = load_config(config_path) if config_path is not None else {}
    result = CheckResult()
    if overlay_yaml is not None and overlay_yaml.strip():
        try:
            overlay = OmegaConf.to_container(OmegaConf.create(overlay_yaml), resolve=False)
        except (yaml.YAMLError, OmegaConfBaseException) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise PlanError(f"the cell body is not a usable config: {first}. {_NOTHING_STARTED}") from None
        if not isinstance(overlay, dict):
            raise PlanError(f"the cell body must be a YAML mapping (a config). {_NOTHING_STARTED}")
        if config_path is not None:
            _check_overlay(config, overlay, overlay_yaml, result)
            config = _merged(config, overlay)
        else:
            config = overlay
    checker = _Checker(config, result)
    for token in overrides:
        checker.token(token)
    return result


def check_axis_items(config_path: str | os.PathLike, axes: Sequence[tuple[str, Sequence[str]]]) -> None:
    """Check each item of each sweep axis against the config, as the override ``key=item`` alone
    (a sweep's trials each set one item; the raw comma list is never checked).

    Args:
        config_path: the config the trials get (a YAML cell body already merged into it).
        axes: ``[(key, [item texts])]``.

    Raises:
        PlanError: an item whose type cannot be what the config holds, or a key that is a near
            miss of a config key; the message names the axis and the item. Nothing has been started.
    """
    config = load_config(config_path)
    for key, texts in axes:
        for i, text in enumerate(texts, 1):
            try:
                _Checker(config, CheckResult()).token(f"{key}={text}")
            except PlanError as exc:
                raise PlanError(f"sweep axis {key}, item {i} ({text}): {exc}") from None
