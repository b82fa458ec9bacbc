"""What a job launches again when it is resumed or started again, from the fields its record keeps.

Records written since resume exists keep the recipe's registry name, the torchrun options as the
user gave them and the recipe's overrides (with the per-job ``output_dir`` the launch added).
Records of earlier releases keep only the final command, ``argv`` (see
:class:`tune_magic.plan.model.LaunchPlan`: ``[python, "-m", "torch.distributed.run", <torchrun
options>, <recipe>, "--config", <config>, <overrides>]``, or ``[python, <recipe>, "--config", ...]``),
from which these functions read them back.

:func:`next_attempt` is the entry point for starting a job's command again as the same job (another
attempt, :mod:`tune_magic.registry.attempts`): the local supervisor's ``--max-resumes``, and a batch
script that its engine started again (a requeue), which runs it as::

    python -m tune_magic.checkpoints.relaunch JOB_DIR [--from-start-if-none]

and reads one JSON object from stdout: ``argv`` (the command for the next attempt), ``overrides``,
``resumed_from`` (``{"checkpoint", "epoch", "step"}`` in the attempts' format, or ``null``: from the
beginning), ``summary`` (the pre-flight's, or why there is nothing to resume from). Exit status 0;
3 when nothing can be resumed and ``--from-start-if-none`` was not given (then ``summary`` says why);
2 when the record cannot be read. Reads files only (the pre-flight never imports torch).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tune_magic.registry.record import original_overrides  # noqa: F401  (the job's overrides: one rule)

#: The folder under a job's directory that a launch makes torchrun's ``--log-dir`` (``--redirects``).
RANKS_DIR = "ranks"


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
        PlanError: ``argv`` does not end with ``original`` (a command a launch did not build, e.g. a
            hand-edited record): it cannot be continued.
    """
    from tune_magic.errors import PlanError

    n = len(original)
    if list(argv[len(argv) - n:]) != list(original) or len(argv) <= n:
        raise PlanError("the job's command does not end with its recorded overrides, so it cannot be continued "
                        "from a checkpoint; start it again with tune-magic resume")
    return list(argv[:len(argv) - n]) + list(overrides)


@dataclass(frozen=True)
class NextAttempt:
    """How a job's command starts again, as the same job. Made by :func:`next_attempt`.

    Attributes:
        argv: the command for the next attempt.
        overrides: its overrides (the job's, with the resume's keys when it resumes).
        resumed_from: the checkpoint it continues from, in the attempts' format
            (``{"checkpoint": "epoch_0/", "epoch": 0, "step": 2}``), or ``None``: from the beginning.
        summary: the pre-flight's summary, or why there is nothing to resume from.
    """

    argv: list[str]
    overrides: list[str]
    resumed_from: dict[str, Any] | None
    summary: str

    def to_json(self) -> str:
        """The object ``python -m tune_magic.checkpoints.relaunch`` prints."""
        return json.dumps({"argv": self.argv, "overrides": self.overrides, "resumed_from": self.resumed_from,
                           "summary": self.summary})


def next_attempt(record, *, from_start_if_none: bool = False) -> NextAttempt:
    """The command that continues ``record``'s job from its last checkpoint (the resume
    pre-flight, :func:`tune_magic.checkpoints.preflight.preflight`, on its ``output_dir`` with its recipe,
    config and overrides), or, with ``from_start_if_none``, from the beginning when there is nothing
    to resume from.

    Args:
        record: the job's :class:`~tune_magic.registry.record.JobRecord` (its ``argv``, ``config``,
            ``overrides``, ``recipe``, ``recipe_name``, ``output_dir``, ``log_path``, ``cwd``).
        from_start_if_none: start over when the pre-flight finds nothing to resume from (a requeue
            before the first checkpoint); else that is an error.

    Raises:
        PlanError: nothing to resume from (and not ``from_start_if_none``), the checkpoint cannot
            be used (damaged, an unknown recipe), or the record's command does not end with its
            overrides; the message says why.
    """
    from tune_magic.errors import NothingToResume
    from tune_magic.checkpoints.preflight import preflight

    original = original_overrides(record.argv, record.config, record.overrides)
    try:
        pre = preflight(record.recipe or "", record.output_dir or "", config=record.config, overrides=original,
                        recipe_name=record.recipe_name, log_path=record.log_path, cwd=record.cwd)
    except NothingToResume as exc:
        if not (from_start_if_none and exc.fresh_start):
            raise
        return NextAttempt(list(record.argv), original, None, f"from the beginning: {exc}")
    overrides = pre.resumed_overrides(original)
    source = {"checkpoint": f"{pre.checkpoint.name}/", "epoch": pre.epoch, "step": pre.resume_step}
    return NextAttempt(relaunch_argv(record.argv, original, overrides), overrides, source, pre.summary())


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tune_magic.checkpoints.relaunch JOB_DIR [--from-start-if-none]`` (see the module docstring)."""
    from tune_magic.errors import PlanError
    from tune_magic.registry import store as jobstore

    args = list(sys.argv[1:] if argv is None else argv)
    start = "--from-start-if-none" in args
    rest = [a for a in args if a != "--from-start-if-none"]
    if len(rest) != 1:
        print("usage: python -m tune_magic.checkpoints.relaunch JOB_DIR [--from-start-if-none]", file=sys.stderr)
        return 2
    try:
        record = jobstore.read(Path(rest[0]))
    except jobstore.CorruptRecord as exc:
        print(f"cannot read the job's record: {exc}", file=sys.stderr)
        return 2
    try:
        print(next_attempt(record, from_start_if_none=start).to_json())
    except PlanError as exc:
        print(json.dumps({"argv": None, "overrides": None, "resumed_from": None, "summary": str(exc)}))
        return 3
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
