"""tune_magic.checkpoints.retention: which epoch_N/ folders may go now, as a table of cases and as
properties that hold for any history (hypothesis)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tune_magic.checkpoints.catalog import FULL, Checkpoint, Pruned
from tune_magic.checkpoints.retention import plan_retention, to_prune

NAN, INF = math.nan, math.inf


def ck(epoch: int, complete: bool = True, *, val=None, resume=False, pruned=False) -> Checkpoint:
    return Checkpoint(epoch, Path(f"/out/epoch_{epoch}"), (), 100, 100, FULL, complete,
                      () if complete else ("being written",), val_loss=val, needed_by_resume=resume,
                      pruned=Pruned(1.0, 100) if pruned else None)


def epochs(cs):
    return [c.epoch for c in cs]


# (case, checkpoints, keep, keyword arguments, epochs to prune)
CASES = [
    ("keep 1 of 3", [ck(0), ck(1), ck(2)], 1, {}, [0, 1]),
    ("keep 2 of 3", [ck(0), ck(1), ck(2)], 2, {}, [0]),
    ("keep more than there are", [ck(0), ck(1)], 5, {}, []),
    ("the newest complete stays while the next is written", [ck(0), ck(1), ck(2, False)], 1, {}, [0]),
    ("an incomplete old folder is never touched", [ck(0, False), ck(1), ck(2)], 1, {}, [1]),
    ("in use", [ck(0), ck(1), ck(2)], 1, {"in_use": {0}}, [1]),
    ("resume needs it (argument)", [ck(0), ck(1), ck(2)], 1, {"resume_needs": {1}}, [0]),
    ("resume needs it (field)", [ck(0), ck(1, resume=True), ck(2)], 1, {}, [0]),
    ("already pruned", [ck(0, pruned=True), ck(1), ck(2)], 1, {}, [1]),
    ("nothing complete yet", [ck(0, False)], 1, {}, []),
    ("best: losers go once a newer one is evaluated", [ck(0, val=.9), ck(1, val=.5), ck(2, val=.7), ck(3, val=.6)],
     "best", {}, [0, 2]),
    ("best: wait for the newer evaluation", [ck(0, val=.9), ck(1, val=.5), ck(2, val=.7), ck(3)], "best", {}, [0]),
    ("best: an unevaluated old one may yet be best", [ck(0), ck(1, val=.5), ck(2, val=.4)], "best", {}, [1]),
    ("best: the newest is the best", [ck(0, val=.9), ck(1, val=.8), ck(2, val=.5)], "best", {}, [0, 1]),
    ("best: NaN and inf are never best, and may go", [ck(0, val=NAN), ck(1, val=INF), ck(2, val=.9), ck(3, val=.95)],
     "best", {}, [0, 1]),
    ("best: ties keep the earliest", [ck(0, val=.5), ck(1, val=.5), ck(2, val=.6)], "best", {}, [1]),
    ("best: val_losses argument wins over the field", [ck(0, val=.1), ck(1, val=.5), ck(2, val=.6)], "best",
     {"val_losses": {0: .9}}, [0]),
    ("best: never in use", [ck(0, val=.9), ck(1, val=.5), ck(2, val=.6)], "best", {"in_use": [0]}, []),
    ("best: nothing evaluated keeps everything", [ck(0), ck(1), ck(2)], "best", {}, []),
]


@pytest.mark.parametrize("case, checkpoints, keep, kwargs, expected", CASES, ids=[c[0] for c in CASES])
def test_what_is_pruned(case, checkpoints, keep, kwargs, expected):
    assert epochs(to_prune(checkpoints, keep, **kwargs)) == expected


def test_the_plan_says_why_each_one_stays():
    plan = plan_retention([ck(0, val=.5), ck(1, val=NAN), ck(2, val=.7), ck(3), ck(4, False)], "best",
                          in_use={2})
    assert epochs(plan.prune) == [1]  # NaN: evaluated, never best, and epoch 2 is evaluated
    assert plan.kept == {0: "best (val_loss 0.5)", 2: "in use", 3: "newest", 4: "incomplete"}
    plan = plan_retention([ck(0, val=.5), ck(1, val=.6), ck(2)], "best")
    assert plan.kept == {0: "best (val_loss 0.5)", 1: "no newer evaluated checkpoint yet", 2: "newest"}
    assert plan_retention([ck(0), ck(1), ck(2)], 2).kept == {1: "among the newest 2", 2: "newest"}


@pytest.mark.parametrize("keep", [0, -1, True, 1.5, "worst", None])
def test_a_bad_policy_is_refused(keep):
    with pytest.raises(ValueError, match="whole number >= 1"):
        to_prune([ck(0)], keep)


history = st.lists(st.tuples(st.booleans(), st.one_of(st.none(), st.floats(0.01, 5), st.sampled_from([NAN, INF])),
                             st.booleans(), st.booleans()), min_size=0, max_size=8)


@settings(max_examples=300, deadline=None)
@given(history, st.one_of(st.integers(1, 4), st.just("best")), st.sets(st.integers(0, 7)), st.sets(st.integers(0, 7)))
def test_the_rules_hold_for_any_history(rows, keep, in_use, resume):
    cs = [ck(i, complete, val=val, resume=res, pruned=gone) for i, (complete, val, res, gone) in enumerate(rows)]
    pruned = set(epochs(to_prune(cs, keep, in_use=in_use, resume_needs=resume)))
    present = [c for c in cs if c.pruned is None]
    done = [c for c in present if c.complete]
    assert pruned <= {c.epoch for c in done}  # never an incomplete, never one already gone
    assert not pruned & (in_use | resume | {c.epoch for c in cs if c.needed_by_resume})
    if done:
        assert done[-1].epoch not in pruned
    if keep == "best":
        finite = [c for c in done if c.val_loss is not None and math.isfinite(c.val_loss)]
        if finite:
            assert min(finite, key=lambda c: (c.val_loss, c.epoch)).epoch not in pruned
        assert all(c.val_loss is not None for c in done if c.epoch in pruned)
    else:
        assert len([c for c in done if c.epoch not in pruned]) >= min(keep, len(done))
