"""Which key of a config a mistyped key was meant to be. Pure.

Used by :mod:`tune_magic.config.checks` to refuse ``optimzer.lr=1e-3`` with ``did you mean
optimizer.lr?`` while letting through keys a config lacks on purpose (recipes read optional keys
with defaults). The rule is :func:`is_near_miss`; tests/plan/test_override_checks.py measures it
on every key of torchtune 0.6.1's shipped configs.
"""

from __future__ import annotations

import difflib
from typing import Sequence

__all__ = ["edit_distance", "is_near_miss", "nearest_keys"]

_MAX_SUGGESTIONS = 3


def edit_distance(a: str, b: str) -> int:
    """Return the optimal-string-alignment distance between ``a`` and ``b``: the fewest
    insertions, deletions, substitutions and swaps of two adjacent characters (each counts 1)
    that turn one into the other, no substring edited twice."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[len(b)]


def _fold(key: str) -> str:
    return key.lower().replace("-", "_")


def is_near_miss(typed: str, existing: str) -> bool:
    """Whether the key segment ``typed`` is a likely misspelling of the config's ``existing``.

    The rule (measured on every key of torchtune 0.6.1's 156 shipped configs and of the project's
    tiny ones, see tests/plan/test_override_checks.py): the two differ only in case or ``-``/``_``;
    or their :func:`edit_distance` is at most 1 for keys of up to 4 characters, 2 up to 10, 3
    beyond (the shorter of the two decides), and when it is more than 1 both start with the same
    letter. Every deletion, doubling and swap of adjacent characters of a shipped key is a near
    miss of it; no key that recipes read with a default (``cfg.get``) is a near miss of a key of
    a config that lacks it; the first-letter rule keeps apart real siblings such as
    ``encoder_trainable``/``decoder_trainable``, the length rule ``num_heads``/``num_kv_heads``
    and ``tensor_parallel_dim``/``tensor_parallel_plan``.
    """
    if typed == existing:
        return False
    if _fold(typed) == _fold(existing):
        return True
    shorter = min(len(typed), len(existing))
    allowed = 1 if shorter <= 4 else 2 if shorter <= 10 else 3
    if abs(len(typed) - len(existing)) > allowed:  # each edit changes the length by one at most
        return False
    distance = edit_distance(typed, existing)
    if distance > allowed:
        return False
    return distance == 1 or typed[:1].lower() == existing[:1].lower()


def nearest_keys(typed: str, keys: Sequence[str]) -> list[str]:
    """The keys of ``keys`` that ``typed`` is a near miss of (:func:`is_near_miss`), nearest first
    (by edit distance, then by ``difflib`` similarity, then by name), at most 3."""
    found = [k for k in keys if isinstance(k, str) and is_near_miss(typed, k)]
    found.sort(key=lambda k: (edit_distance(_fold(typed), _fold(k)),
                              -difflib.SequenceMatcher(None, typed, k).ratio(), k))
    return found[:_MAX_SUGGESTIONS]
