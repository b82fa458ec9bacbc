"""torchrun's own option table, read from ``torch.distributed.run.get_args_parser()``.

Nothing here is hard-coded: the spellings, which options take a value and the ``PET_*`` variable of
each come from the installed torch, so a new torchrun flag is understood the day it ships.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


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


@functools.lru_cache(maxsize=1)
def options() -> dict[str, TorchrunOption]:
    """Return torchrun's options keyed by every spelling (``--x-y``, ``--x_y``, ``-r``).

    ``--help`` is left out: it is not something to launch with.
    """
    from torch.distributed.run import get_args_parser  # imports torch, not CUDA

    table: dict[str, TorchrunOption] = {}
    for action in get_args_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        opt = TorchrunOption(action.dest, tuple(action.option_strings), action.nargs != 0, action.type,
                             tuple(action.choices) if action.choices is not None else None)
        for spelling in action.option_strings:
            table[spelling] = opt
    return table


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
