"""Sweep axes: which override values are axes, and their items. Pure: nothing is started.

Under sweep mode (``--sweep``) an override is an **axis** when its value is

- a comma list outside brackets and quotes: ``optimizer.lr=1e-4,3e-4,1e-3`` (three items);
  spaces around items are dropped (``lr=1e-4, 3e-4`` on a cell line is two items);
- ``range(start, stop[, step])`` as the whole value: whole numbers only, with Python's ``range``
  meaning (``epochs=range(1,4)`` is 1, 2, 3; negative steps count down). Floats are refused
  (``range(0.1, 1)`` says to list the values), as are an empty range, a step of 0 and anything
  that is not one to three whole numbers. On a ``%%tune_run`` line the shell splits words at
  spaces, so write ``range(1,4)`` there (a cell line may have spaces).

These are **one value**, never split:

- a flow collection: ``lora_attn_modules=[q_proj,v_proj]`` is one list (as torchtune reads it), so
  a list-valued axis is a comma list of lists, ``[q_proj],[q_proj,v_proj]``; ``{x: 1, y: 2}``;
  an OmegaConf interpolation ``${oc.env:A,b}``;
- a YAML-quoted string: ``tag='a,b'`` (the quotes are in the value the recipe reads);
- text typed inside shell quotes on a ``%%tune_run`` line or cell line: ``tag="a,b"`` (the shell
  removes the quotes; :mod:`tune_magic.plan.shellwords` remembers them). A Python list of
  arguments has no shell quotes, nor has ``tune-magic run`` (its shell removed them before the
  program starts): there quote the value for YAML (``"tag='a,b'"``, ``tag="'a,b'"``).
- ``~key`` deletions are never axes.

Each item becomes the override ``key=item``, the item text exactly as typed, which
:func:`tune_magic.plan.launchwords.check_override` must accept unchanged; so the usual value checks
apply to each item (``lr=1e-4,yes`` is refused for ``yes``), never to the raw list.

:mod:`tune_magic.plan.sweep` builds the grid of trials from the axes found here;
:mod:`tune_magic.plan.sweepsection` reads a YAML cell body's ``sweep:`` mapping.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from tune_magic.errors import PlanError
from tune_magic.plan.shellwords import Word, as_word

__all__ = [
    "Axis",
    "split_items",
    "looks_like_axis",
    "parse_range",
    "refused_axis_key",
    "word_axis",
    "axis_from_items",
]

_RANGE = re.compile(r"range\((.*)\)", re.S)
_INT = re.compile(r"[+-]?[0-9]+")
_FLOATISH = re.compile(r"[+-]?(?:[0-9]*\.[0-9]*|[0-9.]+[eE][+-]?[0-9]+|inf|nan)", re.I)
_INDEX = re.compile(r"(?:\[[^\]]*\])+$")
_OPEN, _CLOSE = "[{", "]}"


# ---------------------------------------------------------------------------------------------
# Items of one value.


def split_items(value: str, quoted: Iterable[int] = ()) -> list[str] | None:
    """Split an override value at its top-level commas; ``None`` when it has none.

    A comma splits when it is outside ``[]``/``{}`` (flow collections, ``${...}``), outside a YAML
    quoted scalar (``'...'``/``"..."`` starting an item or a collection element) and not at a
    position in ``quoted`` (typed inside shell quotes). Brackets and YAML quotes count wherever
    they were typed, because YAML sees them either way.

    Args:
        value: the text after ``key=``.
        quoted: positions in ``value`` typed inside shell quotes.

    Returns:
        The items with surrounding white space removed (an empty item stays ``""``: the caller
        refuses it), or ``None`` when no comma splits the value.
    """
    quoted = frozenset(quoted)
    cuts: list[int] = []
    depth = 0
    quote: str | None = None
    prev = ""  # last non-space character outside YAML quotes ("" at the start of an item)
    i, n = 0, len(value)
    while i < n:
        c = value[i]
        if quote == "'":
            if c == "'":
                if i + 1 < n and value[i + 1] == "'":  # '' is a quote inside a single-quoted scalar
                    i += 2
                    continue
                quote = None
        elif quote == '"':
            if c == "\\":
                i += 2
                continue
            if c == '"':
                quote = None
        elif c in "'\"" and prev in ("", ",", "[", "{", ":"):
            quote = c
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth = max(depth - 1, 0)
        elif c == "," and depth == 0 and i not in quoted:
            cuts.append(i)
            prev = ""
            i += 1
            continue
        if quote is None and not c.isspace():
            prev = c
        i += 1
    if not cuts:
        return None
    bounds = [-1, *cuts, n]
    return [value[a + 1:b].strip() for a, b in zip(bounds, bounds[1:])]


def looks_like_axis(value: str) -> bool:
    """Whether an override value would be an axis under sweep mode: a top-level comma list
    (:func:`split_items`) or ``range(...)``.

    For the config check of a launch *without* sweep mode, to word its refusal of
    ``optimizer.lr=1e-4,3e-4`` ("add --sweep to sweep over it, or quote it"). Shell quotes are
    not known here (the value is what the recipe would get).
    """
    return split_items(value) is not None or value.strip().startswith("range(")


def parse_range(text: str, key: str = "key") -> range | None:
    """Read ``range(start, stop[, step])`` (the whole value) as a Python ``range``.

    Args:
        text: an override value.
        key: its key, for messages.

    Returns:
        The range, or ``None`` when ``text`` does not start with ``range(``.

    Raises:
        PlanError: ``range(`` without the closing ``)`` at the end (or with more after it), not one
            to three whole numbers (floats included: list those values), a step of 0, or an
            empty range.
    """
    text = text.strip()
    if not text.startswith("range("):
        return None
    example = f"{key}=range(1,4) (1, 2, 3) or {key}=range(0,12,4) (0, 4, 8)"
    m = _RANGE.fullmatch(text)
    if m is None:
        raise PlanError(
            f"sweep axis {key}={text}: range(...) must be the whole value and closed, e.g. {example}; on a "
            f"%%tune_run line write it without spaces (the line is split at spaces), or put it on a cell line")
    args = [a.strip() for a in m[1].split(",")]
    if any(_FLOATISH.fullmatch(a) for a in args) and len(args) <= 3:
        raise PlanError(
            f"sweep axis {key}={text}: range() takes whole numbers, as Python's range does; for other values "
            f"list them: {key}=1e-4,3e-4,1e-3")
    if not 1 <= len(args) <= 3 or not all(_INT.fullmatch(a) for a in args):
        raise PlanError(f"sweep axis {key}={text}: write range(stop), range(start, stop) or "
                        f"range(start, stop, step) with whole numbers, e.g. {example}")
    nums = [int(a) for a in args]
    if len(nums) == 3 and nums[2] == 0:
        raise PlanError(f"sweep axis {key}={text}: the step of a range cannot be 0; e.g. {example}")
    r = range(*nums)
    if len(r) == 0:
        raise PlanError(f"sweep axis {key}={text} is empty (Python's range stops before stop, and counts down "
                        f"only with a negative step); e.g. {example}")
    return r


# ---------------------------------------------------------------------------------------------
# Axes.


@dataclass(frozen=True)
class Axis:
    """One axis of a sweep.

    Attributes:
        key: the override key (``optimizer.lr``).
        texts: each item as an override value, as typed (``"1e-4"``, ``"[q_proj,v_proj]"``,
            ``"'a,b'"``); ``key=text`` passes :func:`~tune_magic.plan.launchwords.check_override`.
        values: what a torchtune 0.6.1 recipe reads for each item (``1e-4`` -> ``0.0001``), as
            :func:`tune_magic.plan.overrides.recipe_value` gives it; same length as ``texts``.
        source: where it was written, for messages: ``"override"`` or ``"sweep: mapping"``.
        position: index of its word in the launch words, ``None`` for a body ``sweep:`` axis.
    """

    key: str
    texts: tuple[str, ...]
    values: tuple[Any, ...]
    source: str = "override"
    position: int | None = None

    def __len__(self) -> int:
        return len(self.texts)


def refused_axis_key(key: str) -> str | None:
    """Why ``key`` may not be an axis, or ``None`` when it may.

    Refused: a directory the recipe writes to, i.e. a last key segment (an index such as ``[0]``
    ignored) that is ``dir`` or ends in ``_dir`` (``output_dir``, ``metric_logger.log_dir``,
    ``profiler.output_dir``): every trial already writes to its own ``output_dir``
    (``<config's output_dir>/<job id>``) and the others follow it.

    Allowed: ``checkpointer.checkpoint_dir`` (torchtune 0.6.1's checkpointers only read it, and
    copy from it into ``output_dir``), and the keys that name files to read
    (``checkpointer.checkpoint_files``, ``tokenizer.path``, ``*_path``, ``*_file``): a sweep over
    base checkpoints or tokenizers is meaningful.
    """
    last = _INDEX.sub("", key.rsplit(".", 1)[-1])
    if (last == "dir" or last.endswith("_dir")) and last != "checkpoint_dir":
        return (f"sweep axis {key}: {key} names a directory the recipe writes to, and every trial already writes "
                "to its own output_dir (<the config's output_dir>/<job id>); drop this axis (directories and files "
                "the recipe only reads, such as checkpointer.checkpoint_dir or checkpointer.checkpoint_files, may "
                "be axes)")
    return None


def axis_from_items(key: str, texts: Sequence[str], source: str, position: int | None, shown: str) -> Axis:
    """Check each item as an override and read its value as the recipe would.

    Args:
        key: the override key.
        texts: the item texts, as typed.
        source: where the axis was written (:attr:`Axis.source`).
        position: its word's index in the launch words, ``None`` for a body ``sweep:`` axis.
        shown: the axis as written, for messages.

    Raises:
        PlanError: an item that :func:`~tune_magic.plan.launchwords.check_override` refuses (the
            message names the item).
    """
    from tune_magic.plan.launchwords import check_override
    from tune_magic.plan.overrides import recipe_value

    values = []
    for i, text in enumerate(texts, 1):
        try:
            check_override(f"{key}={text}")
        except PlanError as exc:
            raise PlanError(f"sweep axis {shown}, item {i} ({text}): {exc}") from None
        values.append(recipe_value(key, text))
    return Axis(key, tuple(texts), tuple(values), source, position)


def word_axis(word: "str | Word") -> "tuple[str, Sequence[str] | range] | None":
    """Return ``(key, items)`` when an override word is an axis, else ``None``.

    ``items`` is a list of item texts for a comma list, a ``range`` for ``range(...)``. Items are
    not checked as overrides yet (:func:`axis_from_items` does, for
    :func:`~tune_magic.plan.sweep.plan_sweep`). A ``range(...)`` typed inside shell quotes is one
    (string) value, as a quoted comma is.

    Raises:
        PlanError: an empty item, or a malformed or empty ``range()``.
    """
    w = as_word(word)
    if w.text.startswith("~") or "=" not in w.text:
        return None
    key, _, value = w.text.partition("=")
    offset = len(key) + 1
    quoted = {i - offset for i in w.quoted if i >= offset}
    stripped = value.lstrip()
    start = len(value) - len(stripped)
    if stripped.startswith("range(") and start not in quoted:
        return key, parse_range(value, key)
    items = split_items(value, quoted)
    if items is None:
        return None
    if any(not item for item in items):
        where = "a trailing comma" if not items[-1] else "a leading comma" if not items[0] else "two commas in a row"
        raise PlanError(f"sweep axis {key}={value} has an empty item ({where}); write each value once, separated "
                        f"by single commas, e.g. {key}=1e-4,3e-4 (quote a value that holds a comma: {key}=\"a,b\")")
    if any(item.startswith("range(") for item in items):
        raise PlanError(f"sweep axis {key}={value}: range(...) must be the whole value, not one item of a list; "
                        f"write {key}=range(1,4) alone, or list every value: {key}=1,2,3,5")
    return key, items
