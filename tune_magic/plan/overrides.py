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
from typing import Any

from tune_magic.errors import PlanError

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
