"""tune_magic's exception tree. Imports nothing, so every module (and the supervisor) can use it.

::

    TuneMagicError                      anything tune_magic raises on purpose
    ├── UserError                       a mistake the user can fix; the message names the fix
    │   ├── PlanError (ValueError)      bad ``tune run`` input, bad options, clashes at launch
    │   │   ├── GpuError                GPU ids that do not exist, are not visible, or are busy
    │   │   ├── NothingToResume         a job's output_dir holds nothing a resume can continue from
    │   │   └── AttemptNotRun           a requeued SLURM attempt that runs nothing (refused, or done)
    │   ├── JobNotFound (LookupError)   no job with that id
    │   │   ├── AmbiguousJobName        a job name that several jobs have
    │   │   └── DamagedSweep            a sweep whose record and its backup cannot be read
    │   ├── StateDirError (ValueError)  ``$TUNE_MAGIC_HOME`` cannot hold job records
    │   ├── AmbiguousNameError          a recipe/config name in both torchtune and tune_magic
    │   │   (LookupError)
    │   ├── CheckpointError (ValueError)  a checkpoint unknown, pruned, incomplete, or a bad destination
    │   ├── GenerationError             the generation recipe refused or ended without answering
    │   │   (RuntimeError)
    │   ├── ControllerUnreachable       SLURM's controller did not take a cancel (the stop is recorded)
    │   │   (RuntimeError)
    │   └── CliError (ValueError)       a command-line mistake (``tune-magic``)
    ├── JobStartError (RuntimeError)    the job's supervisor did not start it
    ├── LaunchWarning (UserWarning)     what a launch warns about (a warning, not raised)
    ├── CorruptRecord (ValueError)      a job record missing, unreadable or invalid
    ├── CheckpointFileError (ValueError)  a checkpoint file truncated, damaged, or not its format
    └── SqueueParseError (ValueError)   the SLURM scheduler's: squeue answered in an unreadable form

The classes outside this module live with their code: ``GpuError`` in
:mod:`tune_magic.gpus`, ``AmbiguousNameError`` in :mod:`tune_magic.config.catalog`,
``CliError`` in :mod:`tune_magic.ui.clifiles`, ``CorruptRecord`` in :mod:`tune_magic.registry.record`,
``CheckpointError`` in :mod:`tune_magic.checkpoints.catalog`, ``CheckpointFileError`` in
:mod:`tune_magic.checkpoints.files`, ``GenerationError`` in :mod:`tune_magic.job.generate`, ``DamagedSweep`` in
:mod:`tune_magic.sweeping.sweep`, and
engine-specific ones in their scheduler's package (``SqueueParseError`` in
:mod:`tune_magic.schedulers.slurm.array`, ``ControllerUnreachable`` in
:mod:`tune_magic.schedulers.slurm`, ``AttemptNotRun`` in
:mod:`tune_magic.schedulers.slurm.requeue`). ``tests/test_errors_tree.py`` checks that every
exception class the package defines is in this tree.

Each public exception keeps a builtin base as well (``PlanError`` is still a ``ValueError``,
``JobNotFound`` a ``LookupError``), so code written against the builtins keeps working. The
magics and the CLI turn :class:`UserError` (and only that) into ``UsageError`` / exit 2; anything
else is a bug or a start failure and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings


class TuneMagicError(Exception):
    """Base of every exception tune_magic raises on purpose."""


class UserError(TuneMagicError):
    """A user mistake: the message says what is wrong and how to fix it; nothing was started."""


class PlanError(UserError, ValueError):
    """Bad ``tune run`` input. The message says what is wrong and how to fix it."""


class NothingToResume(PlanError):
    """A job's ``output_dir`` holds no checkpoint a resume can continue from (nothing saved yet, or
    training already finished). ``fresh_start`` is True when nothing was saved, so launching the
    job again with the same settings loses nothing; ``finished`` when the checkpoints say training
    ran to its last epoch (a requeue then ends the job ``succeeded``)."""

    def __init__(self, message: str, *, fresh_start: bool = False, finished: bool = False) -> None:
        super().__init__(message)
        self.fresh_start = fresh_start
        self.finished = finished


class JobNotFound(UserError, LookupError):
    """No job with that id (or, where a job may be named by its name, that name) in the registry."""


class AmbiguousJobName(JobNotFound):
    """A job was named by a name that several jobs have; the message lists their ids."""


class StateDirError(UserError, ValueError):
    """``$TUNE_MAGIC_HOME`` cannot hold job records (not a directory, not writable, a symlink
    where a real directory is needed, or the disk is full)."""


class JobStartError(TuneMagicError, RuntimeError):
    """The supervisor did not start the job (the message says why and where its log is)."""


class LaunchWarning(UserWarning, TuneMagicError):
    """What a launch warns about (a key the config lacks, a path only this node sees, ...). Each
    message is also kept where the user sees it: the job's record (``record.warnings``, the card's
    lines), a dry run's ``plan.warnings``, a sweep's record. The Python API issues them with
    :func:`warn_launch`, at the caller's own line; the magics, the CLI and the panel show them
    once themselves and silence this category (:func:`launch_warnings_shown_here`)."""


def warn_launch(messages) -> None:
    """Issue each distinct message of ``messages`` as a :class:`LaunchWarning` attributed to the
    first caller outside tune_magic (so the warning never starts with one of its files)."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    for message in dict.fromkeys(messages):
        warnings.warn(message, LaunchWarning, stacklevel=level)


@contextlib.contextmanager
def launch_warnings_shown_here():
    """Silence :class:`LaunchWarning` inside the block: the caller (a magic, the CLI) shows the
    same messages itself, as plain lines."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaunchWarning)
        yield
