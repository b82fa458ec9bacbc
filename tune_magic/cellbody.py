"""What a ``%%tune_run`` cell body means, and ``{name}`` expansion of the magic's line. Pure.

A body is either a YAML mapping (a config, or an overlay merged over ``--config``) or lines of
``key=value`` / ``~key`` overrides; ``#`` comments and blank lines are ignored; an empty body is fine.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping

from .command import PlanError, check_override

_OVERRIDE_LINE = re.compile(r"^~?[A-Za-z_][\w.\[\]\-]*(=|$)")
# {name} or {name.attr}, but not ${...} (OmegaConf interpolation, which may nest)
_FIELD = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\}")


@dataclass(frozen=True)
class CellBody:
    """A parsed cell body.

    Attributes:
        overrides: ``key=value`` / ``~key`` arguments from an override body (else empty).
        config_yaml: the YAML text of a config body (a mapping), or ``None``.
    """

    overrides: list[str] = field(default_factory=list)
    config_yaml: str | None = None


def parse_cell_body(text: str | None) -> CellBody:
    """Parse a ``%%tune_run`` cell body.

    Args:
        text: the cell body (``None`` or blank for none).

    Returns:
        :class:`CellBody` with overrides, or with the YAML text of a config mapping.

    Raises:
        PlanError: a YAML syntax error (the message gives the cell line number), a YAML body that
            is not a mapping, an override line that is not ``key=value``, or an override value that a
            recipe would not read as typed (see :func:`tune_magic.overrides.check_value`).
    """
    if text is None:
        return CellBody()
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1)]
    meaningful = [(i, line.strip()) for i, line in lines if line.strip() and not line.strip().startswith("#")]
    if not meaningful:
        return CellBody()
    if all(_OVERRIDE_LINE.match(line) and (": " not in line.split("=", 1)[0]) for _, line in meaningful):
        overrides: list[str] = []
        for i, line in meaningful:
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError as exc:
                raise PlanError(f"cell line {i}: {exc}; close the quote") from None
            for token in tokens:
                if not _OVERRIDE_LINE.match(token) or (not token.startswith("~") and "=" not in token):
                    raise PlanError(f"cell line {i}: {token!r} is not key=value; write one override per line, e.g. batch_size=4")
                if not _FIELD.search(token):  # one with {name} is checked once expanded, when the plan is built
                    try:
                        check_override(token)
                    except PlanError as exc:
                        raise PlanError(f"cell line {i}: {exc}") from None
                overrides.append(token)
        return CellBody(overrides=overrides)
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
    return CellBody(config_yaml=text)


def expand_fields(token: str, namespace: Mapping[str, Any]) -> str:
    """Expand ``{name}`` (and ``{name.attr}``) in one argument from ``namespace``.

    ``${...}`` is left for OmegaConf, nested ones included.

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

    return _FIELD.sub(value, token)
