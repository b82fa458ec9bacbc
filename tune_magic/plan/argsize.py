"""Whether Linux would start a job's command at all: each argument and environment string, and all
of them together, against the kernel's limits (``MAX_ARG_STRLEN``, ``ARG_MAX``). Pure: reads
only the plan and ``sysconf``. Checked before a job is registered, so a refusal leaves nothing.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping

from tune_magic.errors import PlanError
from tune_magic.plan.model import LaunchPlan

#: Linux's limit on one argument or environment string of a new program, with its NUL
#: (``MAX_ARG_STRLEN``: 32 pages, 128 KiB with 4 KiB pages); execve refuses more with E2BIG.
MAX_ARG_STRLEN = 32 * os.sysconf("SC_PAGE_SIZE")


def check_command_size(plan: LaunchPlan, env: Mapping[str, str]) -> None:
    """Refuse a command Linux would not start: an argument or environment string longer than
    :data:`MAX_ARG_STRLEN`, or all of them together over ``ARG_MAX`` (``sysconf``; with the
    pointers to them, as execve counts). Checked before the job is registered, so nothing is left.

    Raises:
        PlanError: naming the long override (a long value belongs in a YAML cell body, which the
            recipe reads from a file) or the variable, and the sizes in bytes.
    """
    strings = [*plan.argv, *(f"{k}={v}" for k, v in {**env, **plan.env}.items())]
    check_word_sizes(plan.argv, overrides=set(plan.overrides))
    check_word_sizes([f"{k}={v}" for k, v in {**env, **plan.env}.items()], variables=True)
    total = sum(len(os.fsencode(text)) + 1 + 8 for text in strings)  # each string, its NUL and its pointer
    limit = os.sysconf("SC_ARG_MAX")
    if total > limit:
        raise PlanError(f"the job's command and environment take {total:,} bytes, more than Linux passes to a new "
                        f"program ({limit:,} bytes, ARG_MAX): move long override values into a YAML cell body, or "
                        "unset large environment variables. Nothing was started")


def check_word_sizes(words: Iterable[str], overrides: set[str] | None = None, variables: bool = False) -> None:
    """Refuse a word longer than :data:`MAX_ARG_STRLEN` (with its NUL), naming it: an override
    (``key=value`` among the launch's words, or in ``overrides``) with the fix, a variable, or an argument.

    Raises:
        PlanError: the first such word.
    """
    for text in words:
        size = len(os.fsencode(text)) + 1
        if size <= MAX_ARG_STRLEN:
            continue
        name = text.split("=", 1)[0]
        if not variables and "=" in text and (overrides is None or text in overrides):
            raise PlanError(f"the override {name}=... is {size - 1:,} bytes long, more than Linux passes as one "
                            f"argument ({MAX_ARG_STRLEN:,} bytes, MAX_ARG_STRLEN): a long value belongs in a YAML cell "
                            f"body (the %%tune_run cell, or config_overlay=), which the recipe reads from a file. "
                            "Nothing was started")
        what = f"the environment variable {name}" if variables else f"the argument {text[:60]!r}..."
        raise PlanError(f"{what} is {size - 1:,} bytes long, more than Linux passes to a new program "
                        f"({MAX_ARG_STRLEN:,} bytes, MAX_ARG_STRLEN); shorten it. Nothing was started")
