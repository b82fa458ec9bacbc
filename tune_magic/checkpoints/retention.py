"""Which ``epoch_N/`` folders retention may remove now. Pure: a plan, nothing is deleted here.

Two policies (``--keep-checkpoints``): an int N keeps the newest N complete checkpoints; ``"best"``
keeps the best by validation loss and the newest (the one a resume continues from). Whatever
the policy, a checkpoint is never planned for removal when it is

- the newest complete one (a resume, a generation of "last", the next save's fallback need it);
- not complete (a folder being written, or one whose save died: reported, never touched);
- one a resume needs (``resume_needs``: :func:`tune_magic.checkpoints.catalog.resume_epoch`);
- in use (``in_use``: a generation or an evaluation is reading it);
- already pruned.

For ``"best"`` also: a checkpoint not evaluated yet is never removed (it may yet be the best); one
evaluated to NaN or inf is never the best (it may go like any other loser); and an older
checkpoint goes only once a newer one is complete *and evaluated*.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Literal, Mapping, Union

from tune_magic.checkpoints.catalog import Checkpoint, best_of, finite_loss


def _evaluated(value: object) -> bool:
    """A validation loss was recorded (NaN and inf included: evaluated, never best)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)

Keep = Union[int, Literal["best"]]


@dataclass(frozen=True)
class RetentionPlan:
    """What :func:`plan_retention` decided.

    Attributes:
        prune: the checkpoints to remove now, oldest first.
        kept: ``{epoch: reason}`` for every present checkpoint that stays (``"newest"``,
            ``"best (val_loss 0.812)"``, ``"in use"``, ``"resume needs it"``, ``"incomplete"``,
            ``"not evaluated"``, ``"no newer evaluated checkpoint yet"``, ``"among the newest 3"``).
    """

    prune: tuple[Checkpoint, ...]
    kept: dict[int, str]


def check_keep(keep: object) -> Keep:
    """``keep`` if it is a policy: an int >= 1 or ``"best"``.

    Raises:
        ValueError: anything else (the message says what is accepted).
    """
    if keep == "best" or (isinstance(keep, int) and not isinstance(keep, bool) and keep >= 1):
        return keep  # type: ignore[return-value]
    raise ValueError(f"keep must be a whole number >= 1 (the newest N) or 'best', not {keep!r}")


def _protected(c: Checkpoint, newest: Checkpoint | None, in_use: Collection[int],
               resume_needs: Collection[int]) -> str | None:
    if not c.complete:
        return "incomplete"
    if newest is not None and c.epoch == newest.epoch:
        return "newest"
    if c.epoch in in_use:
        return "in use"
    if c.epoch in resume_needs or c.needed_by_resume:
        return "resume needs it"
    return None


def plan_retention(
    checkpoints: list[Checkpoint],
    keep: Keep,
    *,
    val_losses: Mapping[int, float] | None = None,
    in_use: Collection[int] = (),
    resume_needs: Collection[int] = (),
) -> RetentionPlan:
    """Plan which checkpoints to remove under ``keep`` (rules: the module docstring).

    Args:
        checkpoints: the job's checkpoints (:func:`~tune_magic.checkpoints.catalog.list_checkpoints`,
            with pruned ones as records or left out).
        keep: an int >= 1 (the newest N complete) or ``"best"``.
        val_losses: ``{epoch: validation loss}``; a checkpoint's own :attr:`~Checkpoint.val_loss`
            counts where an epoch is missing here.
        in_use: epochs being read now (generation, evaluation).
        resume_needs: epochs a resume would load (a checkpoint's own ``needed_by_resume`` counts too).

    Returns:
        A :class:`RetentionPlan`.

    Raises:
        ValueError: ``keep`` is not a policy.
    """
    keep = check_keep(keep)
    present = sorted((c for c in checkpoints if c.pruned is None), key=lambda c: c.epoch)
    done = [c for c in present if c.complete]
    newest = done[-1] if done else None
    losses = {c.epoch: (val_losses or {}).get(c.epoch, c.val_loss) for c in present}
    best = best_of(done, {e: v for e, v in losses.items() if finite_loss(v) is not None}) if keep == "best" else None
    newest_n = {c.epoch for c in done[-keep:]} if keep != "best" else set()
    kept: dict[int, str] = {}
    prune = []
    for c in present:
        reason = _protected(c, newest, in_use, resume_needs)
        if reason is None and keep == "best":
            reason = _best_reason(c, best, losses, done)
        elif reason is None and c.epoch in newest_n:
            reason = f"among the newest {keep}"
        if reason is None:
            prune.append(c)
        else:
            kept[c.epoch] = reason
    return RetentionPlan(tuple(prune), kept)


def _best_reason(c: Checkpoint, best: Checkpoint | None, losses: Mapping[int, object],
                 done: list[Checkpoint]) -> str | None:
    if best is not None and c.epoch == best.epoch:
        return f"best (val_loss {losses[c.epoch]:.4g})"
    if not _evaluated(losses.get(c.epoch)):
        return "not evaluated"
    if not any(d.epoch > c.epoch and _evaluated(losses.get(d.epoch)) for d in done):
        return "no newer evaluated checkpoint yet"
    return None


def to_prune(
    checkpoints: list[Checkpoint],
    keep: Keep,
    *,
    val_losses: Mapping[int, float] | None = None,
    in_use: Collection[int] = (),
    resume_needs: Collection[int] = (),
) -> list[Checkpoint]:
    """The checkpoints to remove now, oldest first: :func:`plan_retention`'s ``prune``.

    Raises:
        ValueError: ``keep`` is not a policy.
    """
    plan = plan_retention(checkpoints, keep, val_losses=val_losses, in_use=in_use, resume_needs=resume_needs)
    return list(plan.prune)
