"""Fault-injection points: named moments at which a test makes this process die (SIGKILL).

The fault tests (``tests/e2e/test_faults*.py``, ``tests/slurm``) set :data:`KILL_ENV` to a step
name and check that whatever the process left behind is still listed, followed and stopped
correctly. Without the variable, :func:`reached` costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

#: Environment variable: the step at which the process SIGKILLs itself.
KILL_ENV = "TUNE_MAGIC_TEST_KILL_LAUNCHER_AT"
#: The steps of a local launch, in order (:func:`tune_magic.launch`). Schedulers add their own
#: (the SLURM scheduler: ``sbatch-returned``, after sbatch answered and before its id is recorded;
#: ``array-sbatch-returned``, the same for a sweep's job array).
LAUNCH_STEPS = ("staging", "planned", "staged", "registered", "submitted")
#: The steps of a resume (:func:`tune_magic.resume`): the old job locked, the new job's launch
#: (:data:`LAUNCH_STEPS`), then the old record linked to it (``resumed_by``).
RESUME_STEPS = ("resume-locked", *LAUNCH_STEPS, "resume-linked")


def reached(step: str) -> None:
    """Mark that this process reached ``step``; SIGKILL it there if :data:`KILL_ENV` names it."""
    if os.environ.get(KILL_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)
