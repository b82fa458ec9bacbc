"""What an override's value is, in words, and two rules on values that no recipe can run with. Pure.

Used by :mod:`tune_magic.config.checks` for its refusals: a value's kind (``a number``, ``a
section``) and short form (``0.0003``, ``{input, output}``); a ``_component_`` that cannot be a
component; a float where the config holds an integer.
"""

from __future__ import annotations

from typing import Any

__all__ = ["kind_of", "shown", "component_problem", "float_for_int", "takes_float"]


def kind_of(value: Any) -> str:
    """A value's kind in words: ``a boolean``, ``a number``, ``a section``, ``a list`` or ``text``."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, dict):
        return "a section"
    if isinstance(value, list):
        return "a list"
    return "text"


def shown(value: Any) -> str:
    """A config value as a short YAML-ish text: ``0.0003``, ``true``, ``[a, b]``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "{" + ", ".join(map(str, list(value)[:4])) + (", ..." if len(value) > 4 else "") + "}"
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def component_problem(key: str, shorthand: bool, value: Any, typed: str) -> str | None:
    """Why ``value`` (as the recipe reads it) cannot be the ``_component_`` that ``key=typed`` sets,
    or ``None``. A component is a dotted Python path, so a comma list is never one: without
    ``--sweep`` the recipe would try to import ``torch.optim.SGD,torch.optim.AdamW`` and stop."""
    target = f"{key}._component_" if shorthand else key
    said = f" ({key}={typed} sets {target}, as torchtune 0.6.1 reads it)" if shorthand else ""
    if isinstance(value, str) and "," in value:
        items = value.split(",")
        return (f"{value!r} is a comma list, and a component is one dotted path{said}: the recipe would fail "
                f"to import it; to run one job per component add --sweep (a sweep over {key}), or pick one, "
                f"e.g. {key}={items[0].strip()}")
    if isinstance(value, (bool, int, float, list, dict)):
        return (f"the recipe would get {kind_of(value)} ({shown(value)}) as the component{said}, which is a dotted "
                f"path such as torch.optim.SGD; give one, e.g. {key}=torch.optim.SGD")
    return None


def takes_float(component: Any, name: str) -> bool:
    """Whether the component's keyword argument ``name`` is annotated to take a float (``float``,
    or a union with it): torchtune 0.6.1's LoRA builders take ``lora_alpha: float`` although its
    configs write ``lora_alpha: 16``. The component's module is imported only here, on the rare
    path of a float given for an integer (torchtune's model builders import torch, never CUDA);
    ``False`` when it cannot be imported or says nothing (the rule then refuses, as torch would).

    Args:
        component: the section's ``_component_`` (a dotted path), anything else gives ``False``.
        name: the keyword argument (the override's last key).
    """
    import importlib
    import logging
    import typing

    if not isinstance(component, str) or "." not in component.strip(".") or name.startswith("_"):
        return False
    module, _, attr = component.rpartition(".")
    quiet = logging.getLogger("torchao")  # its import-time "Detected no triton" is noise on a CPU machine
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        hint = typing.get_type_hints(getattr(importlib.import_module(module), attr)).get(name)
    except Exception:  # noqa: BLE001 - a component we cannot read says nothing; the recipe reports it
        return False
    finally:
        quiet.setLevel(level)
    return hint is float or (typing.get_origin(hint) is typing.Union and float in typing.get_args(hint))


def float_for_int(key: str, config_value: int, value: float, typed: str | None) -> str:
    """The refusal of a float where the config holds an integer (``model.lora_rank=8.5``): the
    recipe passes it on as a float and torch stops it on every rank (``TypeError: empty() received
    an invalid combination of arguments``), seconds after the start. A component's keyword argument
    that takes a float although the config writes it as an integer (``lora_alpha: 16``) is passed
    on purpose with YAML's ``!!float`` tag.

    Args:
        key: the override's key (or a cell body's key path); config_value: what the config holds;
        value: what the recipe would get; typed: the override's value as typed (``None`` for a
            YAML cell body, whose fixes are written as YAML lines).

    Returns:
        The reason and the fix, for the caller's message.
    """
    leaf = key.rsplit(".", 1)[-1]
    whole = int(value) if value == value and abs(value) != float("inf") else config_value
    if typed is not None:
        example, tagged = f"{key}={whole}", f"'{key}=!!float {typed.strip()}'"
    else:
        example, tagged = f"{leaf}: {whole}", f"{leaf}: !!float {value!r}"
    return (f"the config has {key}: {config_value} (an integer), and the recipe would get the float {value!r}, which "
            f"cannot stand for a size or a count (torch stops the job on every rank, e.g. with a TypeError); give an integer "
            f"(e.g. {example}), or, where this key takes a float on purpose, tag it: {tagged}")
