"""Check an override's value the way a torchtune 0.6.1 recipe will read it. Pure.

A recipe reads ``key=value`` overrides in ``torchtune.config._utils._merge_yaml_and_cli_args``
(torchtune 0.6.1): it splits each one with ``k, v = arg.split("=")`` (so a second ``=`` kills the
recipe), turns the value ``None`` into ``!!null``, puts ``!!str `` before the value of any key
containing ``max_filename``, and hands the list to ``OmegaConf.from_dotlist``, which reads every
value as YAML with OmegaConf's loader (YAML 1.1 resolvers plus ``1e3`` as a float).

YAML gives many characters a meaning, so some values fail only when every rank starts (a backtick,
``|x``, ``@x``, ``%x``, an unclosed ``[1,2``) and others silently become something else (``&x`` is
an anchor and the value becomes null, ``yes`` becomes ``True``, ``010`` the octal 8, ``1:30`` the
base-60 90, ``~`` null, ``a #b`` drops ``#b``, ``- a`` a list, ``a: b`` a mapping). This module
refuses both kinds before anything starts and says how to type the value instead; everything a
recipe would read as typed passes unchanged: numbers, ``true``/``false``, ``null``, an empty value
(null, as in torchtune), paths, ``${...}`` interpolations, quoted YAML strings and flow collections
(``[a,b]``, ``{x: 1}``).
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Iterable, Sequence

from tune_magic.errors import PlanError
from tune_magic.config.shellwords import Word, as_word

#: Explicit YAML tags a value may carry: the core scalar types (torchtune itself writes
#: ``!!null`` and ``!!str``). Anything else (``!tag``, ``!!binary``, ``!!set``, ``!!python/...``)
#: is refused.
ALLOWED_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null"))

_TT_MAX_FILENAME = "max_filename"  # torchtune 0.6.1 forces these values to strings
_OCTAL = re.compile(r"[-+]?0[0-7_]+")  # YAML 1.1 int: a leading 0 means octal
_NULL_WORDS = ("null", "Null", "NULL")
_BOOL_WORDS = ("true", "True", "TRUE", "false", "False", "FALSE")


def yaml_loader():
    """OmegaConf's own YAML loader class: the one ``from_dotlist`` uses (same resolvers)."""
    try:  # omegaconf >= 2.4 keeps it here; older releases in _utils
        from omegaconf._yaml import get_yaml_loader
    except ImportError:  # pragma: no cover - other omegaconf versions
        from omegaconf._utils import get_yaml_loader
    return get_yaml_loader()


def torchtune_text(key: str, value: str) -> str:
    """Return the YAML text torchtune 0.6.1 hands to OmegaConf for ``key=value``.

    ``None`` becomes ``!!null``; a key containing ``max_filename`` gets ``!!str `` before its value
    (``_merge_yaml_and_cli_args``, torchtune 0.6.1). Every other value is unchanged.
    """
    if value == "None":
        value = "!!null"
    if _TT_MAX_FILENAME in key:
        value = "!!str " + value
    return value


def recipe_value(key: str, value: str) -> Any:
    """Return what a torchtune 0.6.1 recipe gets for ``key=value`` (plain Python data).

    Runs ``OmegaConf.from_dotlist`` on :func:`torchtune_text`, as the recipe will, without
    resolving interpolations. Does not check the value: see :func:`check_value`.

    Raises:
        Whatever OmegaConf raises for a value it cannot read (``yaml.YAMLError``,
        ``omegaconf.errors.OmegaConfBaseException``, ``ValueError``).
    """
    from omegaconf import OmegaConf

    conf = OmegaConf.from_dotlist([f"{key}={torchtune_text(key, value)}"])
    node: Any = OmegaConf.to_container(conf, resolve=False)
    for part in re.split(r"\.|\[|\]\.?", key):
        if part:
            node = node[part]
    return node


def yaml_quoted(key: str, value: str) -> str:
    """Return ``key='value'``: the value as a single-quoted YAML string (``'`` doubled)."""
    return f"{key}='{value.replace(chr(39), chr(39) * 2)}'"


def shell_typed(key: str, value: str) -> str:
    """Return how to type ``key=value`` as a YAML string on a command line or a ``%%tune_run`` line.

    Those lines are split like a shell (``shlex``), which removes one level of quotes, so the YAML
    quotes need shell quotes around them. Only the value is wrapped, so the form also works as a
    cell body line (which must start with the key): ``key="'v'"`` where double quotes are safe in
    bash and shlex alike (no ``" \\ $ ` !``), else ``key='"v"'`` (YAML double quotes inside shell
    single quotes), else ``key=`` and :func:`shlex.quote` of the single-quoted YAML string.
    """
    quoted = yaml_quoted(key, value)[len(key) + 1:]
    if not re.search(r'["\\$`!]', quoted):
        return f'{key}="{quoted}"'
    if not re.search(r"['\"\\]", value):
        return f"{key}='\"{value}\"'"
    return f"{key}={shlex.quote(quoted)}"


def _fix_text(key: str, value: str) -> str:
    return (f"to pass the text {value!r} as typed, quote it for YAML: {yaml_quoted(key, value)} (on a command "
            f"line or a %%tune_run line or cell line, whose quotes are removed, type {shell_typed(key, value)})")


def check_value(key: str, value: str) -> None:
    """Refuse an override value that a torchtune 0.6.1 recipe would not read as typed.

    Args:
        key: the override's key (``model.lora_rank``), already checked for shape by the caller.
        value: everything after the first ``=`` (no control characters other than tab).

    Raises:
        PlanError: the value contains ``=`` (torchtune splits at every ``=``); YAML cannot read it
            (a reserved character such as a backtick or ``@``, ``|``/``>`` block scalars, ``%``
            directives, an unclosed flow collection, a bad ``${`` interpolation); or YAML reads it as
            something other than what was typed (anchors, aliases, tags beyond the core scalar
            ones, ``~``, YAML 1.1 booleans other than true/false, octal and base-60 numbers, a
            comment or document marker that drops text, a block list or mapping). The message
            names the key and the quoted form (``key='&x'``) that passes the text unchanged.
    """
    problem, fix = _problem(key, value)
    if problem is None:
        return
    raise PlanError(f"override {key}={value}: {problem}; {fix or _fix_text(key, value)}. Nothing was started.")


def _problem(key: str, value: str) -> tuple[str | None, str | None]:
    """Return (what YAML does with the value, its fix or None for the quoting fix), or (None, None)."""
    import yaml

    if "=" in value:
        return ("torchtune 0.6.1 splits an override at every '=' and stops the recipe, so a value cannot "
                "contain '=' (quotes do not help)",
                "set it in the config file or in a %%tune_run YAML cell body instead")
    text = torchtune_text(key, value)
    loader = yaml_loader()
    try:
        events = list(yaml.parse(text, Loader=loader))
    except yaml.YAMLError as exc:
        return _unreadable(key, value, exc)
    top_index = next((i for i, e in enumerate(events) if isinstance(e, yaml.NodeEvent)), None)
    if top_index is None:  # no document at all: key= (null, as in torchtune), spaces, a comment
        if text == "":
            return None, None
        what = "a value of only spaces as null" if not text.strip() else f"{text.strip()!r} as a comment and gives null"
        return f"YAML reads {what} (the recipe would get None)", None
    top = events[top_index]
    lead = len(text) - len(text.lstrip())
    if top.start_mark.index > lead:  # "--- a": the marker is dropped
        marker = text[lead:top.start_mark.index].strip()
        return f"YAML reads {marker!r} as a document marker and drops it ({_shown(key, value)})", None
    if isinstance(top, yaml.CollectionStartEvent) and not top.flow_style:
        kind = "list" if isinstance(top, yaml.SequenceStartEvent) else "mapping"
        example = f"{key}=[a,b]" if kind == "list" else f"{key}={{x: 1}}"
        return (f"YAML reads it as a block {kind} ({_shown(key, value)})",
                f"for a {kind} write it in flow style, e.g. {example}; or {_fix_text(key, value)}")
    rest = text[_node_end(events, top_index):].strip()
    if rest:  # "a #b", "'a' #b": YAML ends the value early
        what = "a comment" if rest.startswith("#") else "the end of the YAML document"
        return f"YAML reads {rest!r} as {what} and drops it ({_shown(key, value)})", None
    resolver = loader("")
    try:
        for i, event in enumerate(events):
            why = _event_problem(event, i == top_index, text, resolver)
            if why:
                return f"{why} ({_shown(key, value)})", _event_fix(event, key, value)
    finally:
        resolver.dispose()
    try:
        recipe_value(key, value)
    except Exception as exc:  # noqa: BLE001 - whatever OmegaConf refuses, the recipe refuses too
        from omegaconf.errors import GrammarParseError

        fix = None
        if isinstance(exc, GrammarParseError):  # OmegaConf reads ${ in quoted strings too
            fix = (f"close the interpolation, e.g. {key}=${{output_dir}}/x, or write \\${{ for a literal "
                   f"'${{' ({key}={value.replace('${', chr(92) + '${')})")
        return f"OmegaConf cannot read it ({_yaml_problem(exc)})", fix
    return None, None


def _yaml_problem(exc: Exception) -> str:
    """One line out of a YAML (or OmegaConf) error: its context and problem, without the marks."""
    problem = getattr(exc, "problem", None) or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    context = getattr(exc, "context", None)
    return f"{context.strip()}: {problem.strip()}" if context else problem.strip()


def _unreadable(key: str, value: str, exc: Exception) -> tuple[str, str | None]:
    problem = _yaml_problem(exc)
    first = value.lstrip()[:1]
    if first in ("[", "{"):
        kind, close = ("list", "]") if first == "[" else ("mapping", "}")
        return (f"YAML cannot read it ({problem})",
                f"a value starting with {first!r} is a flow {kind}: close it with {close!r} "
                f"(e.g. {key}={'[a,b]' if first == '[' else '{x: 1}'}); or {_fix_text(key, value)}")
    return f"YAML cannot read it ({problem})", None


def _node_end(events: list, start: int) -> int:
    """Return the end offset of the node whose first event is ``events[start]``."""
    import yaml

    depth = 0
    for event in events[start:]:
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        if depth == 0:
            return event.end_mark.index
    return events[-1].end_mark.index  # pragma: no cover - a parsed stream is balanced


def _shown(key: str, value: str) -> str:
    try:
        got = recipe_value(key, value)
    except Exception:  # noqa: BLE001
        return "the recipe would fail to start"
    return f"the recipe would get {got!r}"


def _event_problem(event, is_top: bool, text: str, resolver) -> str | None:
    """Return what is wrong with one parse event of the value, or None."""
    import yaml

    if isinstance(event, yaml.AliasEvent):
        return f"{'*' + event.anchor!r} is a YAML alias (a reference to an anchor), not text"
    if not isinstance(event, yaml.NodeEvent):
        return None
    if event.anchor is not None:
        return f"{'&' + event.anchor!r} is a YAML anchor, not text"
    tag = getattr(event, "tag", None)
    if tag is not None and tag not in ALLOWED_TAGS:
        return f"{tag.replace('tag:yaml.org,2002:', '!!')!r} is a YAML tag, not text"
    if not isinstance(event, yaml.ScalarEvent):
        return None
    if event.style in ("|", ">"):
        return f"{event.style!r} starts a YAML block scalar"
    if event.style or not event.implicit[0]:  # the C parser says "" for plain, PyYAML None
        return None  # quoted on purpose, or tagged with a core tag on purpose (!!str 007)
    raw = event.value
    typed = text[event.start_mark.index:event.end_mark.index]  # marks count characters
    if raw != typed:  # a plain scalar is the typed text itself; anything else was folded or cut
        return f"YAML reads {typed!r} as {raw!r}"
    kind = resolver.resolve(yaml.ScalarNode, raw, (True, False)).rsplit(":", 1)[-1]
    if kind == "null":
        if raw in _NULL_WORDS:
            return None
        if raw == "" and not is_top:  # {x: } is YAML's own empty value
            return None
        return f"YAML reads {raw!r} as null"
    if kind == "bool":
        return None if raw in _BOOL_WORDS else f"YAML 1.1 reads {raw!r} as a boolean"
    if kind in ("int", "float") and ":" in raw:
        return f"YAML 1.1 reads {raw!r} as a base-60 number"
    if kind == "int" and _OCTAL.fullmatch(raw):
        return f"YAML 1.1 reads {raw!r} (a leading 0) as an octal number"
    if kind in ("int", "float", "str"):
        return None
    return f"YAML gives {raw!r} a special meaning ({kind})"  # <<, =, timestamps


def _event_fix(event, key: str, value: str) -> str | None:
    """Return a fix more specific than quoting for this event's problem, or None."""
    import yaml

    if not isinstance(event, yaml.ScalarEvent) or event.style:
        return None
    raw, text_fix = event.value, _fix_text(key, value)
    if raw == "~":
        return (f"write {key}=null for null, and a path in full (torchtune does not expand ~); or {text_fix}")
    if raw.lower() in ("yes", "no", "on", "off"):
        return f"write {key}=true or {key}=false for a boolean; or {text_fix}"
    if ":" in raw:
        return f"for a number write it in decimal; or {text_fix}"
    if _OCTAL.fullmatch(raw):
        return f"for a number write it in decimal without a leading 0; or {text_fix}"
    return None


# ---------------------------------------------------------------------------------------------
# Comma lists and ranges: the axes of a sweep.
#
# Under sweep mode (``--sweep``) an override is an **axis** when its value is
#
# - a comma list outside brackets and quotes: ``optimizer.lr=1e-4,3e-4,1e-3`` (three items);
#   spaces around items are dropped (``lr=1e-4, 3e-4`` on a cell line is two items);
# - ``range(start, stop[, step])`` as the whole value: whole numbers only, with Python's ``range``
#   meaning (``epochs=range(1,4)`` is 1, 2, 3; negative steps count down). Floats are refused
#   (``range(0.1, 1)`` says to list the values), as are an empty range, a step of 0 and anything
#   that is not one to three whole numbers. On a ``%%tune_run`` line the shell splits words at
#   spaces, so write ``range(1,4)`` there (a cell line may have spaces).
#
# These are **one value**, never split:
#
# - a flow collection: ``lora_attn_modules=[q_proj,v_proj]`` is one list (as torchtune reads it), so
#   a list-valued axis is a comma list of lists, ``[q_proj],[q_proj,v_proj]``; ``{x: 1, y: 2}``;
#   an OmegaConf interpolation ``${oc.env:A,b}``;
# - a YAML-quoted string: ``tag='a,b'`` (the quotes are in the value the recipe reads);
# - text typed inside shell quotes on a ``%%tune_run`` line or cell line: ``tag="a,b"`` (the shell
#   removes the quotes; :mod:`tune_magic.config.shellwords` remembers them). A Python list of
#   arguments has no shell quotes, nor has ``tune-magic run`` (its shell removed them before the
#   program starts): there quote the value for YAML (``"tag='a,b'"``, ``tag="'a,b'"``).
# - ``~key`` deletions are never axes.
#
# Each item becomes the override ``key=item``, the item text exactly as typed, which
# :func:`tune_magic.config.launchwords.check_override` must accept unchanged; so the usual value checks
# apply to each item (``lr=1e-4,yes`` is refused for ``yes``), never to the raw list.
#
# :mod:`tune_magic.sweeping.grid` builds the grid of trials from the axes found here;
# :func:`tune_magic.config.cellbody.split_sweep_section` reads a YAML cell body's ``sweep:`` mapping.

_RANGE = re.compile(r"range\((.*)\)", re.S)
_INT = re.compile(r"[+-]?[0-9]+")
_FLOATISH = re.compile(r"[+-]?(?:[0-9]*\.[0-9]*|[0-9.]+[eE][+-]?[0-9]+|inf|nan)", re.I)
_INDEX = re.compile(r"(?:\[[^\]]*\])+$")
_OPEN, _CLOSE = "[{", "]}"


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


def word_axis(word: "str | Word") -> "tuple[str, Sequence[str] | range] | None":
    """Return ``(key, items)`` when an override word is an axis, else ``None``.

    ``items`` is a list of item texts for a comma list, a ``range`` for ``range(...)``. Items are
    not checked as overrides yet (:func:`axis_from_items` does, for
    :func:`~tune_magic.sweeping.grid.plan_sweep`). A ``range(...)`` typed inside shell quotes is one
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
