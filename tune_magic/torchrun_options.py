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
        opt = TorchrunOption(action.dest, tuple(action.option_strings), action.nargs != 0)
        for spelling in action.option_strings:
            table[spelling] = opt
    return table


def lookup(token: str) -> TorchrunOption | None:
    """Find the option a token names, as torchrun's parser would.

    Accepts exact spellings and unambiguous prefixes of long options (argparse's ``allow_abbrev``,
    which torchrun keeps on). ``token`` is the part before any ``=``.

    Returns:
        The option, or ``None`` if the token names no torchrun option (or an ambiguous prefix).
    """
    table = options()
    if token in table:
        return table[token]
    if token.startswith("--") and len(token) > 2:
        hits = {opt for spelling, opt in table.items() if spelling.startswith(token)}
        if len(hits) == 1:
            return hits.pop()
    return None
