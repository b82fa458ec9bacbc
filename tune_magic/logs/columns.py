"""The column-wise fast path for blocks of uniform torchtune DiskLogger lines. Pure.

A DiskLogger file (torchtune 0.6.1, ``Step N | loss:2.0853 lr:2e-05 ...``) repeats the same keys
in the same order on every line; such a block is converted column by column with C-level
``split``/``map``, several times faster than line by line, and gives the same points as the
record-by-record path of :class:`~tune_magic.logs.parse.LogParser`, which calls it.
"""

from __future__ import annotations

from operator import itemgetter

from tune_magic.logs.points import SOURCE_DISKLOGGER, MetricBatch

__all__ = ["parse_uniform_block"]


def parse_uniform_block(joined: str, n: int, batch: MetricBatch, names: dict[str, str]) -> int:
    """Parse ``n`` uniform DiskLogger lines joined by ``"\\n"`` column-wise into ``batch``.

    Sound because every line starts with ``Step ``: a line with more or fewer tokens than the
    first shifts a later ``Step`` token into a column that rejects it (column 1 must be an int,
    column 2 ``|``, field columns ``key:``), so passing every column check means each line has
    exactly the first line's tokens, in the same order.

    Args:
        joined: the lines (no ``\\r``, no ANSI), joined by ``"\\n"``.
        n: how many lines ``joined`` holds.
        batch: where the points go, in line order then field order.
        names: the parser's interned metric names (name -> the one ``str`` object kept for it);
            new names are added.

    Returns:
        The number of points added; 0, adding nothing, unless every line is a ``Step N | ...``
        line with the first line's keys in the same order and plain numeric values.
    """
    split = _split_uniform(joined, n)
    if split is None:
        return 0
    first, tokens, steps = split
    k = len(first)
    m = k - 3
    total = n * m
    all_steps: list = [None] * total
    all_names: list = [None] * total
    all_values: list = [None] * total
    for j in range(m):
        name, sep, _ = first[3 + j].rpartition(":")
        if not sep or not name:
            return 0
        col = tokens[3 + j :: k]
        prefix = name + ":"
        # Tokens hold no whitespace, so "\n" marks exactly the start of each token.
        if ("\n" + "\n".join(col)).count("\n" + prefix) != n:
            return 0
        try:
            values = list(map(float, map(itemgetter(slice(len(prefix), None)), col)))
        except ValueError:
            return 0
        name = names.get(name) or names.setdefault(name, name)
        all_steps[j::m] = steps
        all_names[j::m] = [name] * n
        all_values[j::m] = values
    batch.steps += all_steps
    batch.names += all_names
    batch.values += all_values
    batch.epochs += [None] * total
    batch.sources += [SOURCE_DISKLOGGER] * total
    return total


def _split_uniform(joined: str, n: int) -> tuple[list[str], list[str], list[int]] | None:
    """``(first line's tokens, all tokens, steps)`` when every line is ``Step <int> | ...`` with
    as many tokens as the first (at least one field), else ``None``."""
    # Lines hold no "\n", so this counts lines that start with "Step ".
    if not joined.startswith("Step ") or ("\n" + joined).count("\nStep ") != n:
        return None
    first_end = joined.find("\n")
    first = (joined if first_end < 0 else joined[:first_end]).split()
    k = len(first)
    if k < 4 or first[2] != "|":
        return None
    tokens = joined.split()
    if len(tokens) != n * k:
        return None
    if tokens[0::k].count("Step") != n or tokens[2::k].count("|") != n:
        return None
    try:
        steps = list(map(int, tokens[1::k]))
    except ValueError:
        return None
    return first, tokens, steps
