"""torchrun's own option table, read from ``torch.distributed.run.get_args_parser()``.

Nothing here is hard-coded: the spellings, which options take a value and the ``PET_*`` variable of
each come from the installed torch, so a new torchrun flag is understood the day it ships. The table
is read through :mod:`tune_magic.config.toolcache` (a subprocess reads it once per torch install), so
building a plan does not import torch into the notebook kernel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from tune_magic.config import toolcache

# argparse ``type=`` callables that a cached row names and this process maps back without torch.
_BUILTIN_TYPES: dict[str, Callable[[str], Any]] = {t.__name__: t for t in (str, int, float, complex)}


@dataclass(frozen=True)
class TorchrunOption:
    """One torchrun option.

    Attributes:
        dest: argparse destination (``nproc_per_node``); also names its env var ``PET_<DEST>``.
        spellings: every option string (``("--nproc-per-node", "--nproc_per_node")``).
        takes_value: ``False`` for switches such as ``--standalone``.
    """

    dest: str
    spellings: tuple[str, ...]
    takes_value: bool
    type: object = None
    choices: tuple | None = None

    def check(self, value: str) -> str | None:
        """Return why torchrun's parser would reject ``value`` for this option, or ``None``."""
        if self.type not in (None, str):
            try:
                self.type(value)
            except (TypeError, ValueError):
                name = getattr(self.type, "__name__", "the right type")
                return f"{self.display} {value!r} is not {'an ' if name[0] in 'aeiou' else 'a '}{name}"
        if self.choices is not None and value not in self.choices:
            return f"{self.display} {value!r} is not one of {', '.join(map(str, self.choices))}"
        return None

    @property
    def env_var(self) -> str:
        """The ``PET_*`` variable torchrun reads as this option's default."""
        return "PET_" + self.dest.upper()

    @property
    def display(self) -> str:
        """The spelling shown in messages (the first long one)."""
        return next((s for s in self.spellings if s.startswith("--")), self.spellings[0])


class LiveType:
    """Stands for an argparse ``type=`` of torchrun's that is not a builtin (torch 2.13's
    ``comma_separated_list``): it cannot be rebuilt from a name, so calling it fetches the real
    callable from ``get_args_parser()`` (importing torch, only when such an option is given).

    Attributes:
        dest: the option whose type this is.
        __name__: the callable's own name, for messages.
    """

    def __init__(self, dest: str, name: str) -> None:
        self.dest = dest
        self.__name__ = name

    def __call__(self, value: str) -> Any:
        return _live_parser_types()[self.dest](value)

    def __repr__(self) -> str:
        return f"LiveType({self.dest!r}, {self.__name__!r})"


@functools.lru_cache(maxsize=1)
def _live_parser_types() -> dict[str, Callable[[str], Any]]:
    return {a.dest: a.type for a in _live_actions() if a.type is not None}


def _live_actions() -> list:
    """torchrun's argparse actions with an option string, ``--help`` left out (imports torch)."""
    from torch.distributed.run import get_args_parser  # imports torch, not CUDA

    return [a for a in get_args_parser()._actions if a.option_strings and a.dest != "help"]


def _type_name(value: object) -> str | None:
    if value is None:
        return None
    name = getattr(value, "__name__", None)
    if name in _BUILTIN_TYPES and _BUILTIN_TYPES[name] is value:
        return name
    return "live:" + (getattr(value, "__qualname__", None) or name or type(value).__name__)


def _type_from_name(dest: str, name: str | None) -> object:
    if name is None:
        return None
    if name in _BUILTIN_TYPES:
        return _BUILTIN_TYPES[name]
    return LiveType(dest, name.removeprefix("live:").rsplit(".", 1)[-1])


def live_rows() -> list[dict[str, Any]]:
    """Read torchrun's options from ``get_args_parser()`` as JSON-able rows (imports torch).

    Returns:
        One dict per option, in the parser's order: ``dest``, ``spellings`` (list), ``takes_value``,
        ``type`` (``None``, a builtin's name such as ``"int"``, or ``"live:<qualname>"``) and
        ``choices`` (list or ``None``). This is what :mod:`tune_magic.config.toolcache` stores.
    """
    rows = []
    for action in _live_actions():
        # JSON keeps str/int/float choices as they are (torch 2.13 has only str ones); anything
        # else is kept as its str(), which is what :meth:`TorchrunOption.check` compares a token to
        choices = None if action.choices is None else [
            c if isinstance(c, (str, int, float)) else str(c) for c in action.choices]
        rows.append({"dest": action.dest, "spellings": list(action.option_strings),
                     "takes_value": action.nargs != 0, "type": _type_name(action.type), "choices": choices})
    return rows


def table_from_rows(rows: list[dict[str, Any]]) -> dict[str, TorchrunOption]:
    """Build the spelling -> option table from :func:`live_rows`' rows (cached or fresh)."""
    table: dict[str, TorchrunOption] = {}
    for r in rows:
        choices = tuple(r["choices"]) if r["choices"] is not None else None
        opt = TorchrunOption(r["dest"], tuple(r["spellings"]), bool(r["takes_value"]),
                             _type_from_name(r["dest"], r["type"]), choices)
        for spelling in opt.spellings:
            table[spelling] = opt
    return table


@functools.lru_cache(maxsize=1)
def options() -> dict[str, TorchrunOption]:
    """Return torchrun's options keyed by every spelling (``--x-y``, ``--x_y``, ``-r``).

    ``--help`` is left out: it is not something to launch with. Read through
    :func:`tune_magic.config.toolcache.tables`, so this process imports no torch when the cache is current.
    """
    return table_from_rows(toolcache.tables()["torchrun"])


def lookup(token: str) -> TorchrunOption | None:
    """Find the option a token names exactly (``--nproc-per-node``, ``--nproc_per_node``, ``-r``).

    ``token`` is the part before any ``=``. Abbreviations are not resolved here: argparse's
    handling of them differs between Python versions (3.11 calls ``--nproc`` ambiguous between the
    two spellings of one option), so :func:`abbreviation_of` is used to name the full spelling.

    Returns:
        The option, or ``None``.
    """
    return options().get(token)


def abbreviation_of(token: str) -> list[str]:
    """Return the long spellings that ``token`` abbreviates (``--nproc`` -> both nproc spellings)."""
    if not token.startswith("--") or len(token) <= 2:
        return []
    return sorted(s for s in options() if s.startswith("--") and s.startswith(token))
