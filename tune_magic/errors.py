"""tune_magic's exception tree. Imports nothing, so every module (and the supervisor) can use it.

::

    TuneMagicError                      anything tune_magic raises on purpose
    ├── UserError                       a mistake the user can fix; the message names the fix
    │   ├── PlanError (ValueError)      bad ``tune run`` input, bad options, clashes at launch
    │   │   ├── GpuError                GPU ids that do not exist, are not visible, or are busy
    │   │   └── NothingToResume         a job's output_dir holds nothing a resume can continue from
    │   ├── JobNotFound (LookupError)   no job with that id
    │   ├── StateDirError (ValueError)  ``$TUNE_MAGIC_HOME`` cannot hold job records
    │   ├── AmbiguousNameError          a recipe/config name in both torchtune and tune_magic
    │   │   (LookupError)
    │   └── CliError (ValueError)       a command-line mistake (``tune-magic``)
    ├── JobStartError (RuntimeError)    the job's supervisor did not start it
    ├── CorruptRecord (ValueError)      a job record missing, unreadable or invalid
    └── SqueueParseError (ValueError)   the SLURM scheduler's: squeue answered in an unreadable form

The classes outside this module live with their code: ``GpuError`` in
:mod:`tune_magic.gpus`, ``AmbiguousNameError`` in :mod:`tune_magic.plan.catalog`,
``CliError`` in :mod:`tune_magic.ui.clifiles`, ``CorruptRecord`` in :mod:`tune_magic.registry.record`,
and engine-specific ones in their scheduler's package (``SqueueParseError`` in
:mod:`tune_magic.schedulers.slurm.squeue`). ``tests/test_errors_tree.py`` checks that every
exception class the package defines is in this tree.

Each public exception keeps a builtin base as well (``PlanError`` is still a ``ValueError``,
``JobNotFound`` a ``LookupError``), so code written against the builtins keeps working. The
magics and the CLI turn :class:`UserError` (and only that) into ``UsageError`` / exit 2; anything
else is a bug or a start failure and keeps its traceback.
"""

from __future__ import annotations


class TuneMagicError(Exception):
    """Base of every exception tune_magic raises on purpose."""


class UserError(TuneMagicError):
    """A user mistake: the message says what is wrong and how to fix it; nothing was started."""


class PlanError(UserError, ValueError):
    """Bad ``tune run`` input. The message says what is wrong and how to fix it."""


class NothingToResume(PlanError):
    """A job's ``output_dir`` holds no checkpoint a resume can continue from (nothing saved yet, or
    training already finished). ``fresh_start`` is True when nothing was saved, so launching the
    job again with the same settings loses nothing."""

    def __init__(self, message: str, *, fresh_start: bool = False) -> None:
        super().__init__(message)
        self.fresh_start = fresh_start


class JobNotFound(UserError, LookupError):
    """No job with that id in the registry."""


class StateDirError(UserError, ValueError):
    """``$TUNE_MAGIC_HOME`` cannot hold job records (not a directory, not writable, a symlink
    where a real directory is needed, or the disk is full)."""


class JobStartError(TuneMagicError, RuntimeError):
    """The supervisor did not start the job (the message says why and where its log is)."""
