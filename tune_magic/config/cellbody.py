"""What a ``%%tune_run`` cell body means, and ``{name}`` expansion of the magic's line. Pure.

A body is either a YAML mapping (a config, or an overlay merged over ``--config``) or lines of
``key=value`` / ``+key=value`` (a key added on purpose, see :mod:`tune_magic.config.checks`) / ``~key``
overrides; ``#`` comments and blank lines are ignored; an empty body is fine.
An override line is several overrides when every word is one (``seed=1 epochs=2``), else one
override whose value is the rest of the line as typed (``metric_logger.name=my run``): see
:func:`override_line`.

Under sweep mode (``parse_cell_body(text, sweep=True)``) override lines keep where the shell
quotes were (:class:`~tune_magic.config.shellwords.Word`), so ``tag="a,b"`` stays one value while
``lr=1e-4,3e-4`` is an axis, and a YAML body's top-level ``sweep:`` mapping is taken out of the
config (:func:`split_sweep_section`). Without sweep mode a YAML body with a ``sweep:`` mapping is
refused: it would reach the recipe as an unknown key and one job would run.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping

from tune_magic.errors import PlanError
from tune_magic.config.overrides import word_axis
from tune_magic.config.shellwords import Word, split_words
from tune_magic.config.launchwords import check_override

_OVERRIDE_LINE = re.compile(r"^[~+]?[A-Za-z_][\w.\[\]\-]*(=|$)")
_KEY_EQ = re.compile(r"^\+?[A-Za-z_][\w.\[\]\-]*=")
# a comment after a plain YAML value: "#" preceded by white space
_PLAIN_COMMENT = re.compile(r"\s#")
# {name} or {name.attr}, but not ${...} (OmegaConf interpolation, which may nest)
_FIELD = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\}")


@dataclass(frozen=True)
class CellBody:
    """A parsed cell body.

    Attributes:
        overrides: ``key=value`` / ``~key`` arguments from an override body (else empty).
        config_yaml: the YAML text of a config body (a mapping), or ``None`` (also for a body that
            held nothing but a ``sweep:`` mapping).
        words: under sweep mode, ``overrides`` as :class:`~tune_magic.config.shellwords.Word`
            objects (where each line's shell quotes were); else empty.
        sweep: under sweep mode, the axes of a YAML body's ``sweep:`` mapping, ``[(key, [item
            texts])]`` (see :func:`split_sweep_section`); else empty.
    """

    overrides: list[str] = field(default_factory=list)
    config_yaml: str | None = None
    words: tuple[Word, ...] = ()
    sweep: tuple[tuple[str, tuple[str, ...]], ...] = ()


def parse_cell_body(text: str | None, *, sweep: bool = False) -> CellBody:
    """Parse a ``%%tune_run`` cell body.

    Args:
        text: the cell body (``None`` or blank for none).
        sweep: sweep mode (``--sweep``): override words that are axes
            (:func:`tune_magic.config.overrides.word_axis`) are not checked here (each of their items
            is, by :func:`tune_magic.sweeping.grid.plan_sweep`), ``words`` keeps the shell quotes,
            and a YAML body's top-level ``sweep:`` mapping goes to ``sweep``, out of
            ``config_yaml``.

    Returns:
        :class:`CellBody` with overrides, or with the YAML text of a config mapping.

    Raises:
        PlanError: a YAML syntax error (the message gives the cell line number), a YAML body that
            is not a mapping, an override line that is not ``key=value``, or an override value that a
            recipe would not read as typed (see :func:`tune_magic.config.overrides.check_value`);
            under sweep mode a malformed axis or ``sweep:`` mapping; without it, a ``sweep:``
            mapping.
    """
    if text is None:
        return CellBody()
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1)]
    meaningful = [(i, line.strip()) for i, line in lines if line.strip() and not line.strip().startswith("#")]
    if not meaningful:
        return CellBody()
    if all(_OVERRIDE_LINE.match(line) and (": " not in line.split("=", 1)[0]) for _, line in meaningful):
        return _override_body(meaningful, sweep)
    data = _load_yaml_body(text)
    if not sweep:
        if isinstance(data.get("sweep"), dict) and data["sweep"]:
            raise PlanError("the cell body has a sweep: mapping, which only a sweep reads: add --sweep to run its "
                            "trials, or remove it. Nothing was started.")
        return CellBody(config_yaml=text)
    rest, axes = split_sweep_section(text)
    return CellBody(config_yaml=rest, sweep=tuple((key, tuple(items)) for key, items in axes))


def _override_body(meaningful: list[tuple[int, str]], sweep: bool) -> CellBody:
    """An override body: each ``(cell line number, line)``'s words, checked (see :func:`parse_cell_body`)."""
    overrides: list[str] = []
    words: list[Word] = []
    for i, line in meaningful:
        for word in (override_line_words(line, i) if sweep else map(Word, override_line(line, i))):
            token = word.text
            try:
                # one with {name} is checked once expanded, when the plan is built; an axis item by item
                if not _FIELD.search(token) and not (sweep and word_axis(word) is not None):
                    check_override(token)
            except PlanError as exc:
                raise PlanError(f"cell line {i}: {exc}") from None
            overrides.append(token)
            words.append(word)
    return CellBody(overrides=overrides, words=tuple(words) if sweep else ())


def _load_yaml_body(text: str) -> dict:
    """A YAML body read as a mapping, refused as :func:`parse_cell_body` says when it is not a
    usable config (the YAML error's cell line, OmegaConf's refusal, not a mapping, an empty path)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PlanError(f"YAML error in the cell body at {where}: {problem}. Nothing was started.") from None
    if isinstance(data, dict):
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        try:  # what torchtune's parser will do with it (e.g. it refuses duplicate keys)
            OmegaConf.create(text)
        except (OmegaConfBaseException, yaml.YAMLError) as exc:
            first = str(exc).strip().splitlines()[0]
            raise PlanError(f"the cell body is not a usable config: {first}. Nothing was started.") from None
    if not isinstance(data, dict):
        raise PlanError(
            "the cell body must be a YAML mapping (a config) or key=value lines (overrides); "
            f"got a YAML {type(data).__name__}"
        )
    _refuse_empty_paths(yaml.compose(text, Loader=yaml.SafeLoader))
    return data


def _refuse_empty_paths(node, prefix: str = "") -> None:
    """Refuse ``output_dir:`` with nothing after it (and other keys naming a path), as
    :func:`tune_magic.config.launchwords.check_override` refuses ``output_dir=``: the recipe reads null."""
    import yaml

    from tune_magic.config.launchwords import empty_path_fix, is_path_key

    if not isinstance(node, yaml.MappingNode):
        return
    for key, value in node.value:
        name = f"{prefix}{key.value}" if isinstance(key, yaml.ScalarNode) else prefix + "?"
        # nothing after the colon (null), or a quoted empty or blank string; an explicit null is kept
        if (isinstance(value, yaml.ScalarNode) and not value.value.strip() and is_path_key(name)
                and value.tag in ("tag:yaml.org,2002:null", "tag:yaml.org,2002:str")):
            read = None if value.tag.endswith(":null") else value.value
            raise PlanError(f"cell line {key.start_mark.line + 1}: {name} is empty: "
                            + empty_path_fix(key.value, read, ": ", "line"))
        _refuse_empty_paths(value, name + ".")


def override_line(line: str, lineno: int = 1) -> list[str]:
    """Split one override line into the arguments the recipe gets (not yet checked as YAML).

    The rule, in order:

    1. Read the line as a shell would (quotes removed, ``#`` starting a word outside quotes begins a
       comment). When every word is ``key=value`` or ``~key``, each word is one override:
       ``seed=1 epochs=2`` gives two, ``name="my run"`` gives ``name=my run``.
    2. Otherwise, when the line starts with ``key=``, the whole line is one override, its value
       taken as typed (quotes kept, runs of spaces kept) up to a comment (``#`` after a space, as
       YAML reads a plain value): ``metric_logger.name=my run`` gives ``metric_logger.name=my run``,
       ``name=Bob's run`` gives ``name=Bob's run``.

    Args:
        line: one line of a cell body or of the panel's overrides box (stripped, not a comment).
        lineno: its line number, for messages.

    Returns:
        The override arguments (``key=value`` or ``~key`` strings).

    Raises:
        PlanError: the line does not start with ``key=`` (nor is made of override words), or its
            value starts with a quote that is never closed.
    """
    try:
        words = shlex.split(_cut_comment(line))
    except ValueError as exc:
        words, unbalanced = None, exc
    else:
        unbalanced = None
        if words and all(_is_override_word(w) for w in words):
            return words
    head = _KEY_EQ.match(line)
    if head is None:
        first = (words or line.split() or [""])[0]
        raise PlanError(f"cell line {lineno}: {first!r} is not key=value; write one override per line, "
                        "e.g. batch_size=4 or metric_logger.name=my run")
    value = _PLAIN_COMMENT.split(line[head.end():], 1)[0].strip()
    if unbalanced is not None and value[:1] in ("'", '"'):
        raise PlanError(f"cell line {lineno}: {unbalanced}; close the quote")
    return [head.group(0) + value]


def override_line_words(line: str, lineno: int = 1) -> list[Word]:
    """:func:`override_line` keeping where the shell quotes were: the same texts, as
    :class:`~tune_magic.config.shellwords.Word` objects.

    Under rule 1 (every word an override) a character typed inside quotes is marked quoted
    (``tag="a,b"`` -> ``tag=a,b`` with ``a,b`` quoted); under rule 2 (the value as typed) nothing
    is, the quotes being part of the value (YAML quotes).

    Raises:
        PlanError: as :func:`override_line`.
    """
    try:
        words = split_words(_cut_comment(line))
    except ValueError:
        words = None
    if words and all(_is_override_word(w.text) for w in words):
        return words
    return [Word(text) for text in override_line(line, lineno)]


def _is_override_word(word: str) -> bool:
    return bool(_OVERRIDE_LINE.match(word)) and (word.startswith("~") or "=" in word)


def _cut_comment(line: str) -> str:
    """``line`` up to a ``#`` that starts a word outside quotes (the shell's rule; a ``#`` inside a
    word, as in ``name=run#1``, is text)."""
    quote, escaped, prev = None, False, " "
    for i, c in enumerate(line):
        if escaped:
            escaped = False
        elif quote is not None:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"':
                escaped = True
        elif c == "\\":
            escaped = True
        elif c in ("'", '"'):
            quote = c
        elif c == "#" and prev.isspace():
            return line[:i]
        prev = c
    return line


def expand_fields(token: "str | Word", namespace: Mapping[str, Any]) -> "str | Word":
    """Expand ``{name}`` (and ``{name.attr}``) in one argument from ``namespace``.

    ``${...}`` is left for OmegaConf, nested ones included. A
    :class:`~tune_magic.config.shellwords.Word` gives a ``Word``: the expanded text of a field
    typed inside shell quotes is quoted too (``tag="{t}"`` with ``t = "a,b"`` stays one value),
    the rest keeps its marks.

    Raises:
        PlanError: a name is not defined in the namespace (IPython's own expansion would silently
            give up on the whole line instead).
    """

    def value(match: re.Match) -> str:
        head, *attrs = match[1].split(".")
        if head not in namespace:
            raise PlanError(f"{{{match[1]}}}: name {head!r} is not defined in the notebook; define it first")
        obj = namespace[head]
        for attr in attrs:
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                raise PlanError(f"{{{match[1]}}}: {head!r} has no attribute {attr!r}") from None
        return str(obj)

    if not isinstance(token, Word):
        return _FIELD.sub(value, token)
    text: list[str] = []
    quoted: set[int] = set()
    pos = 0

    def keep(a: int, b: int) -> None:
        for j in range(a, b):
            if token.is_quoted(j):
                quoted.add(len(text))
            text.append(token.text[j])

    for match in _FIELD.finditer(token.text):
        keep(pos, match.start())
        for ch in value(match):
            if token.is_quoted(match.start()):
                quoted.add(len(text))
            text.append(ch)
        pos = match.end()
    keep(pos, len(token.text))
    return Word("".join(text), frozenset(quoted))

# ---------------------------------------------------------------------------------------------
# A YAML cell body's ``sweep:`` mapping: the sweep axes written as a mapping, taken out of the body.
# 
# A YAML cell body may hold a top-level ``sweep:`` mapping of keys (dotted, or nested mappings) to
# lists of values, removed from the body before it becomes the config overlay
# ::
# 
#     sweep:
#       optimizer.lr: [1.0e-4, 3.0e-4]
#       model.lora_attn_modules: [[q_proj], [q_proj, v_proj]]
# 
# Item texts become override values , checked like any axis item by
# :func:`tune_magic.sweeping.grid.axis_from_items` when :func:`tune_magic.sweeping.grid.plan_sweep`
# builds the trials. PyYAML and OmegaConf are imported only when a body is read.


def _node_text(node, resolver) -> str:
    """An override value for one YAML node of a ``sweep:`` list, as typed where it can be."""
    import yaml

    from tune_magic.config.overrides import yaml_quoted

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
    from tune_magic.config.overrides import check_value, recipe_value, yaml_quoted

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
            :func:`tune_magic.config.cellbody.parse_cell_body`).

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

    from tune_magic.config.overrides import yaml_loader

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
