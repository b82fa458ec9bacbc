"""What a ``%%tune_run`` cell body means, and ``{name}`` expansion of the magic's line. Pure.

A body is either a YAML mapping (a config, or an overlay merged over ``--config``) or lines of
``key=value`` / ``+key=value`` (a key added on purpose, see :mod:`tune_magic.plan.checks`) / ``~key``
overrides; ``#`` comments and blank lines are ignored; an empty body is fine.
An override line is several overrides when every word is one (``seed=1 epochs=2``), else one
override whose value is the rest of the line as typed (``metric_logger.name=my run``): see
:func:`override_line`.

Under sweep mode (``parse_cell_body(text, sweep=True)``) override lines keep where the shell
quotes were (:class:`~tune_magic.plan.shellwords.Word`), so ``tag="a,b"`` stays one value while
``lr=1e-4,3e-4`` is an axis, and a YAML body's top-level ``sweep:`` mapping is taken out of the
config (:mod:`tune_magic.plan.sweepsection`). Without sweep mode a YAML body with a ``sweep:`` mapping is
refused: it would reach the recipe as an unknown key and one job would run.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping

from tune_magic.errors import PlanError
from tune_magic.plan.shellwords import Word, split_words
from tune_magic.plan.axes import word_axis
from tune_magic.plan.sweepsection import split_sweep_section
from tune_magic.plan.launchwords import check_override

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
        words: under sweep mode, ``overrides`` as :class:`~tune_magic.plan.shellwords.Word`
            objects (where each line's shell quotes were); else empty.
        sweep: under sweep mode, the axes of a YAML body's ``sweep:`` mapping, ``[(key, [item
            texts])]`` (see :func:`tune_magic.plan.sweepsection.split_sweep_section`); else empty.
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
            (:func:`tune_magic.plan.axes.word_axis`) are not checked here (each of their items
            is, by :func:`tune_magic.plan.sweep.plan_sweep`), ``words`` keeps the shell quotes,
            and a YAML body's top-level ``sweep:`` mapping goes to ``sweep``, out of
            ``config_yaml``.

    Returns:
        :class:`CellBody` with overrides, or with the YAML text of a config mapping.

    Raises:
        PlanError: a YAML syntax error (the message gives the cell line number), a YAML body that
            is not a mapping, an override line that is not ``key=value``, or an override value that a
            recipe would not read as typed (see :func:`tune_magic.plan.overrides.check_value`);
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
    :func:`tune_magic.plan.launchwords.check_override` refuses ``output_dir=``: the recipe reads null."""
    import yaml

    from tune_magic.plan.launchwords import empty_path_fix, is_path_key

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
    :class:`~tune_magic.plan.shellwords.Word` objects.

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
    :class:`~tune_magic.plan.shellwords.Word` gives a ``Word``: the expanded text of a field
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
