"""The outcome table: how jobs end, one row each, run against every scheduler it applies to (not a
test module; tests/e2e/test_outcome_table.py runs the rows locally, tests/slurm/test_slurm_outcome.py
on the test cluster). A shared row must give the same status and reason on both schedulers: the one
outcome rule (tune_magic.registry.outcome.decide) decides for both."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tune_magic.registry.outcome import CANCELLED_OUTSIDE, FAILED_RESUME, STOPPED_AFTER_END

from waiting import wait_for


@dataclass(frozen=True)
class Row:
    """One way a job ends.

    Attributes:
        name: the row's id.
        overrides: the toy recipe's overrides (tests/recipes/toy_recipe.py).
        action: what the test does while the job runs: ``None`` (let it end), ``"stop"`` (tune_magic's
            stop once a step was logged), ``"stop_after_end"`` (stop once it ended), ``"cancel_outside"``
            (someone else ends it: a SIGTERM to torchrun's agent, or scancel), ``"stop_after_save"``
            (stop once its log shows the last step and the save after it, while it lingers).
        status, reason: what the job must end as (the reason without a `` (on HOST)`` suffix).
        nproc: processes per node (``None``: one process without torchrun).
    """

    name: str
    overrides: tuple[str, ...]
    action: str | None
    status: str
    reason: str | None
    nproc: int | None = 2


LONG = ("steps=400", "step_s=0.2")
SHARED = (
    Row("exit_0", ("steps=3", "step_s=0.1"), None, "succeeded", None),
    Row("non_zero_exit", ("steps=5", "step_s=0.1", "crash_rank=1", "crash_step=2"), None, "failed",
        "rank 1: RuntimeError: toy recipe crashed on purpose"),
    Row("killed_by_a_signal", ("steps=5", "step_s=0.1", "kill_rank=0", "end_step=2"), None, "failed",
        "rank 0: killed by SIGKILL (signal 9)"),
    Row("stop_before_the_end", LONG, "stop", "stopped", None),
    Row("stop_before_the_end_and_the_recipe_exits_0", (*LONG, "sigterm_exit=0"), "stop", "stopped", None),
    Row("stop_after_the_end", ("steps=2", "step_s=0.1"), "stop_after_end", "succeeded", None),
    Row("cancelled_outside", LONG, "cancel_outside", "stopped", CANCELLED_OUTSIDE),
    # a resume whose recipe did not load its checkpoint and trained from the base model (exit 0)
    Row("failed_resume", ("steps=2", "step_s=0.1", "resume_from_checkpoint=True", "fail_resume=true"), None, "failed",
        f"{FAILED_RESUME}: WARNING:torchtune.utils._logging:Failed to load distributed checkpoint: no complete "
        "dist_epoch_<K>/ found. Training will start from the base checkpoint."),
)
#: Only where a recipe's own exit code is the job's: one process, no torchrun (torchrun's agent
#: exits 1 whenever a signal reached it, whatever its workers did).
LOCAL_ONLY = (
    Row("stop_after_the_last_step_and_its_save_and_the_recipe_exits_0",
        ("steps=3", "step_s=0.1", "checkpoint_s=0.2", "linger_s=60", "sigterm_exit=0"), "stop_after_save",
        "succeeded", STOPPED_AFTER_END, nproc=None),
    # the same under torchrun, whose agent exits 1 once the stop's SIGTERM reached it: training had
    # ended, so it succeeded all the same (a stopped job's Resume would find nothing to resume)
    Row("stop_after_the_last_step_and_its_save_under_torchrun",
        ("steps=3", "step_s=0.1", "checkpoint_s=0.2", "linger_s=60"), "stop_after_save", "succeeded",
        STOPPED_AFTER_END),
)

_ON_HOST = re.compile(r" \(on [^()]+\)$")


def reason_of(error: str | None) -> str | None:
    """The job's reason without the host a multi-node scheduler names (``... (on n1)``)."""
    return _ON_HOST.sub("", error) if error else error


def play(row: Row, job, cancel_outside, timeout: float = 240.0) -> None:
    """Do ``row``'s action on the running ``job`` and wait for its end. ``cancel_outside(job)``
    ends the job the way someone else would on this scheduler."""
    if row.action in ("stop", "cancel_outside"):
        wait_for(lambda: job.summary().step, timeout=timeout, interval=0.2, what="the first step")
        if row.action == "stop":
            job.stop(grace_s=10)
        else:
            cancel_outside(job)
    elif row.action == "stop_after_end":
        job.wait(timeout)
        job.stop(grace_s=5)
    elif row.action == "stop_after_save":
        wait_for(lambda: "toy recipe done" in "\n".join(job.tail(20)), timeout=timeout, interval=0.2,
                 what="the run's end and its save")
        job.stop(grace_s=10)
    job.wait(timeout)
