"""What a job launches again when it is resumed, from the fields its record keeps. Pure.

Records written since resume exists keep the recipe's registry name, the torchrun options as the
user gave them and the recipe's overrides (with the per-job ``output_dir`` the launch added).
Records of earlier releases keep only the final command, ``argv`` (see
:class:`tune_magic.plan.model.LaunchPlan`: ``[python, "-m", "torch.distributed.run", <torchrun
options>, <recipe>, "--config", <config>, <overrides>]``, or ``[python, <recipe>, "--config", ...]``),
from which these functions read them back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

#: The folder under a job's directory that a launch makes torchrun's ``--log-dir`` (``--redirects``).
RANKS_DIR = "ranks"


def _config_end(argv: Sequence[str], config: str | None) -> int | None:
    """Index just after ``--config <config>`` in ``argv`` (the last such pair), or ``None``."""
    for i in range(len(argv) - 2, -1, -1):
        if argv[i] == "--config" and (config is None or argv[i + 1] == config):
            return i + 2
    return None


def original_overrides(argv: Sequence[str], config: str | None, recorded: Sequence[str] | None) -> list[str]:
    """The job's overrides in order: ``recorded`` when the record has them, else the words after
    ``--config <config>`` in ``argv`` (``[]`` when there is no such pair)."""
    if recorded is not None:
        return list(recorded)
    end = _config_end(argv, config)
    return list(argv[end:]) if end is not None else []


def given_torchrun_options(argv: Sequence[str], recipe: str | None, recorded: Sequence[str] | None, *,
                           rendezvous: str | None, job_dir: str | Path) -> list[str]:
    """The torchrun options as the user gave them: ``recorded`` when the record has them, else
    those in ``argv`` between ``torch.distributed.run`` and the recipe, without what the launch
    added there: ``--standalone`` (added when the user gave no rendezvous) and ``--log-dir`` pointing
    into the job's own directory (which a new job would not share). ``--nproc_per_node`` stays (the
    value the job ran with)."""
    if recorded is not None:
        return list(recorded)
    try:
        start = list(argv).index("torch.distributed.run") + 1
    except ValueError:
        return []
    end = list(argv).index(recipe, start) if recipe in argv[start:] else len(argv)
    words, out, i = list(argv[start:end]), [], 0
    own_logs = str(Path(job_dir) / RANKS_DIR)
    while i < len(words):
        word = words[i]
        if word == "--standalone" and rendezvous == "standalone":
            i += 1
            continue
        if word in ("--log-dir", "--log_dir") and i + 1 < len(words) and words[i + 1] == own_logs:
            i += 2
            continue
        if word.split("=", 1)[0] in ("--log-dir", "--log_dir") and word.split("=", 1)[-1] == own_logs:
            i += 1
            continue
        out.append(word)
        i += 1
    return out


def relaunch_argv(argv: Sequence[str], original: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """``argv`` with its trailing overrides ``original`` replaced by ``overrides``.

    Raises:
        ValueError: ``argv`` does not end with ``original`` (a command this module did not build).
    """
    n = len(original)
    if list(argv[len(argv) - n:]) != list(original) or len(argv) <= n:
        raise ValueError("the job's command does not end with its recorded overrides")
    return list(argv[:len(argv) - n]) + list(overrides)
