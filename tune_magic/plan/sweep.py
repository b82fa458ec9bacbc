"""Sweeps: the axes of a launch and the grid of trials they make. Pure: nothing is started.

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
:func:`tune_magic.plan.words.check_override` must accept unchanged; so the usual value checks
apply to each item (``lr=1e-4,yes`` is refused for ``yes``), never to the raw list.

A YAML cell body may hold a top-level ``sweep:`` mapping of keys (dotted, or nested mappings) to
lists of values, removed from the body before it becomes the config overlay
(:func:`split_sweep_section`)::

    sweep:
      optimizer.lr: [1.0e-4, 3.0e-4]
      model.lora_attn_modules: [[q_proj], [q_proj, v_proj]]

Trials are the cartesian product of the axes, first axis slowest (``itertools.product``): axes
in the order their words appear in the launch (the line, then override lines of the cell body),
then the body's ``sweep:`` axes in their order. Refused before anything starts
(:class:`~tune_magic.errors.PlanError`, naming the fix): sweep mode with no axis; an axis on a
directory the recipe writes (:func:`refused_axis_key`), or one ``output_dir`` shared by the
trials (allowed when it names every axis, ``output_dir=/runs/lr_${optimizer.lr}``); an empty
item (``1e-4,,3e-4``, a trailing comma); more than :data:`MAX_TRIALS` trials (``max_trials``
raises the cap); a key given twice (two axes, or an axis and a plain override or deletion); a
malformed or empty ``range()``; an item the recipe would not read as typed.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from tune_magic.errors import PlanError
from tune_magic.plan.shellwords import Word, as_word

#: Most trials one sweep may have unless the caller raises it (``--max-trials N``).
MAX_TRIALS = 1000

_RANGE = re.compile(r"range\((.*)\)", re.S)
_INT = re.compile(r"[+-]?[0-9]+")
_FLOATISH = re.compile(r"[+-]?(?:[0-9]*\.[0-9]*|[0-9.]+[eE][+-]?[0-9]+|inf|nan)", re.I)
_INDEX = re.compile(r"(?:\[[^\]]*\])+$")
_PLACEHOLDER = "tm_sweep_word_{}"
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
            ``"'a,b'"``); ``key=text`` passes :func:`~tune_magic.plan.words.check_override`.
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


def _axis_from_items(key: str, texts: Sequence[str], source: str, position: int | None,
                     shown: str) -> Axis:
    """Check each item as an override and read its value; ``shown`` is the axis as written."""
    from tune_magic.plan.words import check_override
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
    not checked as overrides yet (:func:`plan_sweep` does). A ``range(...)`` typed inside shell
    quotes is one (string) value, as a quoted comma is.

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


def _count(axes_items: Sequence[tuple[str, Sequence[str] | range]]) -> int:
    return math.prod(len(items) for _, items in axes_items)


# ---------------------------------------------------------------------------------------------
# A YAML body's sweep: section.


def _node_text(node, resolver) -> str:
    """An override value for one YAML node of a ``sweep:`` list, as typed where it can be."""
    import yaml

    from tune_magic.plan.overrides import yaml_quoted

    if isinstance(node, yaml.ScalarNode):
        kind = node.tag.rsplit(":", 1)[-1]
        implicit = resolver.resolve(yaml.ScalarNode, node.value, (True, False))
        if not node.style and node.tag == implicit:  # plain, untagged ("" from the C parser, None from PyYAML)
            return _plain_text(node.value)
        if kind == "str":
            return yaml_quoted("k", node.value)[2:]
        return f"!!{kind} {node.value}"
    if isinstance(node, yaml.SequenceNode):
        return "[" + ", ".join(_node_text(n, resolver) for n in node.value) + "]"
    if isinstance(node, yaml.MappingNode):
        return "{" + ", ".join(f"{_node_text(k, resolver)}: {_node_text(v, resolver)}" for k, v in node.value) + "}"
    raise PlanError(f"sweep: cannot read the YAML node {node!r}")  # pragma: no cover - compose makes only these


def _plain_text(text: str) -> str:
    """A plain YAML scalar of a body as an override value: as typed, unless an override refuses
    that text for reading as something else (``yes``, ``010``, ``~``, ``1:30``), where the body
    means that something else: then the value the body gives, written plainly (``true``, ``8``,
    ``null``, ``90``)."""
    from tune_magic.plan.overrides import check_value, recipe_value, yaml_quoted

    try:
        check_value("k", text)
        return text
    except PlanError:
        pass
    value = recipe_value("k", text)  # what OmegaConf reads in the body too: the same loader
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        return repr(value)
    return yaml_quoted("k", str(value))[2:]


def _mapping_axes(node, prefix: str, line_of, resolver) -> list[tuple[str, list[str]]]:
    import yaml

    out: list[tuple[str, list[str]]] = []
    for key_node, value in node.value:
        key = f"{prefix}{key_node.value}" if isinstance(key_node, yaml.ScalarNode) else prefix + "?"
        where = f"cell line {line_of(key_node)}: sweep: {key}"
        if isinstance(value, yaml.MappingNode):
            out += _mapping_axes(value, key + ".", line_of, resolver)
        elif isinstance(value, yaml.SequenceNode):
            if not value.value:
                raise PlanError(f"{where} has no values; give a list of at least one value, e.g. {key}: [1, 2]")
            out.append((key, [_node_text(n, resolver) for n in value.value]))
        else:
            raise PlanError(f"{where} must be a list of values, e.g. {key}: [1.0e-4, 3.0e-4] (a list value is a "
                            f"nested list: {key}: [[q_proj], [q_proj, v_proj]])")
    return out


def split_sweep_section(text: str) -> tuple[str | None, list[tuple[str, list[str]]]]:
    """Take the top-level ``sweep:`` mapping out of a YAML cell body.

    Args:
        text: a YAML body that is a mapping (already checked by
            :func:`tune_magic.plan.cellbody.parse_cell_body`).

    Returns:
        ``(rest, axes)``: ``rest`` is ``text`` without the ``sweep:`` key and its lines (other
        lines unchanged), or ``None`` when nothing else is left; ``axes`` is ``[(key, [item
        texts])]`` in the section's order, nested mappings joined with dots. Item texts are
        override values: plain scalars as typed (``1.0e-4``), quoted scalars YAML-quoted
        (``'a,b'``), lists and mappings in flow style (``[q_proj, v_proj]``). With no ``sweep:``
        key: ``(text, [])``.

    Raises:
        PlanError: ``sweep:`` is not a mapping of keys to non-empty lists, or the body is a flow
            mapping (``{...}``) from which the section cannot be cut as lines.
    """
    import yaml

    from tune_magic.plan.overrides import yaml_loader

    loader = yaml_loader()
    top = yaml.compose(text, Loader=loader)
    if not isinstance(top, yaml.MappingNode):
        return text, []
    found = [(k, v) for k, v in top.value if isinstance(k, yaml.ScalarNode) and k.value == "sweep"]
    if not found:
        return text, []
    key_node, value = found[0]
    line_of = lambda n: n.start_mark.line + 1  # noqa: E731 - cell lines count from 1
    if top.flow_style:
        raise PlanError("the cell body's sweep: is inside a flow mapping ({...}); write the body as key: value lines "
                        "with sweep: as a block")
    if isinstance(value, yaml.ScalarNode) and value.tag.endswith(":null"):
        axes: list[tuple[str, list[str]]] = []
    elif not isinstance(value, yaml.MappingNode):
        raise PlanError(f"cell line {line_of(key_node)}: sweep: must map keys to lists of values, e.g.\n"
                        "sweep:\n  optimizer.lr: [1.0e-4, 3.0e-4]")
    else:
        resolver = loader("")
        try:
            axes = _mapping_axes(value, "", line_of, resolver)
        finally:
            resolver.dispose()
    lines = text.splitlines(keepends=True)
    end = value.end_mark.line if value.end_mark.column == 0 else value.end_mark.line + 1
    rest = "".join(lines[:key_node.start_mark.line] + lines[end:])
    meaningful = [ln for ln in rest.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return (rest if meaningful else None), axes


# ---------------------------------------------------------------------------------------------
# Trials.


@dataclass(frozen=True)
class Trial:
    """One point of the grid.

    Attributes:
        index: 0-based, in :class:`SweepPlan` order (the array task index under a job array).
        values: ``{key: value}`` as the recipe reads each item, one per axis, in axis order.
        texts: ``{key: item text}`` as typed, in axis order.
        words: the trial's override words, ``key=text``, one per axis, in axis order.
        name: a label saying its values with short keys (``lr=3e-4,lora_rank=8``); not unique
            when two items read the same, and not an id.
    """

    index: int
    values: dict[str, Any]
    texts: dict[str, str]
    words: tuple[str, ...]
    name: str


@dataclass(frozen=True)
class SweepPlan:
    """The axes of a launch and its trials.

    Attributes:
        words: the launch words as given (``[TORCHRUN-OPTIONS] RECIPE --config CONFIG
            [overrides]``), texts only.
        axes: the axes, in trial order (first axis slowest).
        trials: every trial, ``len == prod(len(axis))``.
        short_keys: ``{key: short key}`` used in trial names.
    """

    words: tuple[str, ...]
    axes: tuple[Axis, ...]
    trials: tuple[Trial, ...] = field(repr=False)
    short_keys: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.trials)

    def args(self, trial: "Trial | int") -> list[str]:
        """Return the launch words of one trial: each axis word replaced in place by the
        trial's override word, and the body's ``sweep:`` axes appended at the end (so they
        override the config overlay, as every override does)."""
        t = self.trials[trial] if isinstance(trial, int) else trial
        out = list(self.words)
        extra = []
        for axis, word in zip(self.axes, t.words):
            if axis.position is None:
                extra.append(word)
            else:
                out[axis.position] = word
        return out + extra


def short_keys(keys: Sequence[str]) -> dict[str, str]:
    """Short names for keys: the last dotted segment, with parent segments added to the keys
    whose short names collide, until none do (``model.lora_rank`` -> ``lora_rank``;
    ``a.x.lr`` and ``b.x.lr`` -> ``a.x.lr`` and ``b.x.lr``).

    Args:
        keys: distinct override keys.
    """
    parts = {k: k.split(".") for k in keys}
    depth = {k: 1 for k in keys}
    while True:
        names = {k: ".".join(parts[k][-depth[k]:]) for k in keys}
        seen: dict[str, list[str]] = {}
        for k, name in names.items():
            seen.setdefault(name, []).append(k)
        grow = [k for group in seen.values() if len(group) > 1 for k in group if depth[k] < len(parts[k])]
        if not grow:
            return names
        for k in grow:
            depth[k] += 1


def _override_positions(texts: list[str]) -> list[int]:
    """Indexes of the words that the launch grammar reads as overrides (``key=value``/``~key``
    after the recipe), found with :func:`tune_magic.plan.words.tokenise` itself: every word
    that looks like ``key=value`` or ``~key`` is first replaced by a harmless placeholder, so an
    axis value (not yet a valid override) cannot fail it, and a torchrun option's value or the
    recipe stays what it was (a word, in its place). Its errors name the user's words."""
    from tune_magic.plan.words import tokenise as _tokenise

    stand_in: dict[str, int] = {}
    probe = []
    for i, t in enumerate(texts):
        if t.startswith("~") or ("=" in t and not t.startswith("-")):
            name = _PLACEHOLDER.format(i)
            placeholder = "~" + name if t.startswith("~") else name + "=0"
            stand_in[placeholder] = i
            probe.append(placeholder)
        else:
            probe.append(t)
    try:
        parsed = _tokenise(probe)
    except PlanError as exc:
        message = str(exc)
        for placeholder in sorted(stand_in, key=len, reverse=True):  # tm_..._12 before tm_..._1
            message = message.replace(placeholder, texts[stand_in[placeholder]])
        for placeholder in sorted(stand_in, key=len, reverse=True):  # a bare key in a message
            message = message.replace(placeholder.strip("~").removesuffix("=0"), texts[stand_in[placeholder]])
        raise PlanError(message) from None
    return sorted(stand_in[o] for o in parsed.overrides if o in stand_in)


def plan_sweep(words: Sequence["str | Word"], *, body_axes: Sequence[tuple[str, Sequence[str]]] = (),
               max_trials: int | None = None) -> SweepPlan:
    """Find the axes of a launch and build its trials.

    Args:
        words: the launch's ``tune run`` words after its own options
            (``[TORCHRUN-OPTIONS] RECIPE --config CONFIG [overrides]``), with override words
            from an override-line cell body appended; :class:`~tune_magic.plan.shellwords.Word`
            objects where they came from a shell-split line (so quoted commas are known), plain
            strings otherwise.
        body_axes: ``[(key, [item texts])]`` from a YAML body's ``sweep:`` section
            (:func:`split_sweep_section`), applied after the words.
        max_trials: the cap on the number of trials (default :data:`MAX_TRIALS`).

    Returns:
        The :class:`SweepPlan`; ``plan.args(trial)`` are the words to build each trial's plan from.

    Raises:
        PlanError: no axis; an axis on a refused key (:func:`refused_axis_key`); an ``output_dir``
            override that does not name every axis (``${key}``), so trials would share it; a key
            given twice; an empty item; a malformed or empty
            ``range()``; more than ``max_trials`` trials (the message gives the count); an item
            that is not a valid override value; or whatever the launch grammar refuses (no
            recipe, no ``--config``, a misplaced torchrun option). Nothing has been started.
    """
    cap = MAX_TRIALS if max_trials is None else parse_max_trials(max_trials)
    ws = [as_word(w) for w in words]
    texts = [w.text for w in ws]
    for w in ws:  # before the grammar: `range(1, 4)` split at its space would fail there less clearly
        key, eq, value = w.text.partition("=")
        start = len(key) + 1 + len(value) - len(value.lstrip())
        if eq and not key.startswith("-") and value.lstrip().startswith("range(") and not w.is_quoted(start):
            parse_range(value, key)
    positions = _override_positions(texts)
    found: list[tuple[str, Sequence[str] | range, str, int | None, str]] = []  # key, items, source, pos, shown
    plain: dict[str, str] = {}
    for p in positions:
        hit = word_axis(ws[p])
        if hit is None:
            key = texts[p].lstrip("~").split("=", 1)[0]
            plain.setdefault(key, texts[p])
        else:
            found.append((hit[0], hit[1], "override", p, texts[p]))
    for key, items in body_axes:
        items = list(items)
        if not items:
            raise PlanError(f"sweep: {key} has no values; give a list of at least one value")
        found.append((key, items, "sweep: mapping", None, f"sweep: {key}: [{', '.join(items)}]"))
    if not found:
        raise PlanError("--sweep found no axis: give an override a comma list (optimizer.lr=1e-4,3e-4) or "
                        "range(start,stop) (epochs=range(1,4)), or a YAML cell body a sweep: mapping; or drop "
                        "--sweep to run one job")
    seen: dict[str, str] = {}
    for key, _, _, _, shown in found:
        why = refused_axis_key(key)
        if why:
            raise PlanError(why)
        if key in seen:
            raise PlanError(f"{key} is given as two axes ({seen[key]} and {shown}); merge them into one list")
        seen[key] = shown
        if key in plain:
            raise PlanError(f"{key} is an axis ({shown}) and is also given as {plain[key]}; keep one of them")
    if "output_dir" in plain:
        given = plain["output_dir"]
        missing = [key for key, *_ in found if "${" + key + "}" not in given]
        if missing:
            short = short_keys([k for k, *_ in found])
            example = "/".join(f"{short[k]}_${{{k}}}" for k, *_ in found)
            raise PlanError(f"--sweep with {given}: trials would share that directory, as it does not name "
                            f"{', '.join('${' + k + '}' for k in missing)}; drop it (each trial then writes to its "
                            f"own <the config's output_dir>/<job id>), or name every axis in it, e.g. "
                            f"output_dir=/runs/{example}")
    lengths = [(key, items) for key, items, *_ in found]
    count = _count(lengths)
    if count > cap:
        grid = " x ".join(f"{len(items)} {key}" for key, items in lengths)
        raise PlanError(f"--sweep makes {count:,} trials ({grid}), more than the cap of {cap:,}: narrow an axis, "
                        f"or raise the cap with --max-trials {count}")
    axes = tuple(_axis_from_items(key, [str(x) for x in items], source, pos, shown)
                 for key, items, source, pos, shown in found)
    short = short_keys([a.key for a in axes])
    trials = []
    for index, combo in enumerate(itertools.product(*(range(len(a)) for a in axes))):
        texts_ = {a.key: a.texts[j] for a, j in zip(axes, combo)}
        trials.append(Trial(
            index=index,
            values={a.key: a.values[j] for a, j in zip(axes, combo)},
            texts=texts_,
            words=tuple(f"{k}={t}" for k, t in texts_.items()),
            name=",".join(f"{short[k]}={t}" for k, t in texts_.items()),
        ))
    return SweepPlan(words=tuple(texts), axes=axes, trials=tuple(trials), short_keys=short)


# ---------------------------------------------------------------------------------------------
# Options of a sweep that are plain numbers, and the rendezvous.


def parse_max_trials(value: "int | str") -> int:
    """Read ``--max-trials N`` (a whole number >= 1). Raises :class:`PlanError` otherwise."""
    from tune_magic.plan.pool import parse_count

    return parse_count(value, "--max-trials", "--max-trials 2000")


_USER_RDZV = (("rdzv_endpoint", "--rdzv-endpoint"), ("master_addr", "--master-addr"),
              ("master_port", "--master-port"))


def check_sweep_rendezvous(torchrun: Mapping[str, "str | bool"], env: Mapping[str, str]) -> None:
    """Refuse a rendezvous of the user's own under sweep mode.

    Trials run side by side, each its own torchrun; an endpoint (or master address/port) given
    once would be the same for all of them, so the second trial to start would bind the port
    the first holds, or join the first trial's rendezvous as if it were more nodes of it. Without
    one, every trial gets ``--standalone`` (a free port of its own) locally, and its own head
    node and port as an array task.

    Args:
        torchrun: the launch's torchrun options as the launch grammar parsed them (dest -> value,
            e.g. ``{"nproc_per_node": "2", "rdzv_endpoint": "h:29400"}``).
        env: the job's environment; ``PET_RDZV_ENDPOINT``, ``PET_MASTER_ADDR`` and
            ``PET_MASTER_PORT`` count like the flags.

    Raises:
        PlanError: naming what was given and to drop it.
    """
    given = [flag for dest, flag in _USER_RDZV if torchrun.get(dest) not in (None, "", False)]
    given += [f"PET_{dest.upper()}" for dest, _ in _USER_RDZV if env.get(f"PET_{dest.upper()}")]
    if given:
        what = " and ".join(given)
        raise PlanError(f"--sweep runs its trials side by side, each its own torchrun, and {what} would give every "
                        "trial the same rendezvous port: the second trial would fail to bind it or join the first "
                        f"trial's rendezvous. Drop {what}: each trial then gets a free port of its own")
