"""The one status model: every move allowed or refused by one table, terminal states never left."""

import json

import pytest

from tune_magic.registry.status import STATUSES, Status, can_move, parse, transition

TERMINAL = {Status.SUCCEEDED, Status.FAILED, Status.STOPPED}


def test_values_are_json_strings_and_flags_are_right():
    assert [s.value for s in STATUSES] == ["pending", "running", "unknown", "succeeded", "failed", "stopped"]
    assert json.loads(json.dumps({"s": Status.UNKNOWN})) == {"s": "unknown"}
    assert Status("running") is Status.RUNNING and Status.RUNNING == "running"
    assert {s for s in Status if s.is_terminal} == TERMINAL
    assert {s for s in Status if s.is_live} == {Status.PENDING, Status.RUNNING}
    assert Status.UNKNOWN.label == "outcome unknown" and Status.FAILED.label == "failed"


@pytest.mark.parametrize("old", sorted(TERMINAL))
@pytest.mark.parametrize("new", list(Status))
def test_nothing_ever_leaves_a_terminal_state(old, new):
    assert transition(old, new) is old
    assert can_move(old, new) == (old is new)


@pytest.mark.parametrize("old,new,expected", [
    ("pending", "running", "running"), ("pending", "stopped", "stopped"), ("running", "succeeded", "succeeded"),
    ("running", "unknown", "unknown"), ("unknown", "succeeded", "succeeded"), ("unknown", "failed", "failed"),
    ("unknown", "running", "running"), ("running", "pending", "pending"), ("unknown", "pending", "pending"),
    ("running", "running", "running"),
])
def test_live_and_unknown_moves(old, new, expected):  # back to pending: a requeue the engine confirmed
    assert transition(old, new) == expected


def test_bad_names_are_errors():
    with pytest.raises(ValueError, match="unknown status 'exploded'"):
        parse("exploded")
    with pytest.raises(ValueError):
        transition("running", "exploded")
