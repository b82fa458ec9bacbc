"""The tests' one wait helper (tests/waiting.py): what it returns, when it gives up, what it says."""

from __future__ import annotations

import pytest

from waiting import wait_for


def test_returns_the_first_truthy_value_after_polling():
    answers = iter([None, 0, "", {"step": 3}, {"step": 4}])
    calls = []

    def predicate():
        calls.append(1)
        return next(answers)

    assert wait_for(predicate, timeout=60, interval=0) == {"step": 3}
    assert len(calls) == 4  # stops at the first truthy value


def test_times_out_with_what_the_last_value_and_the_description():
    described = []

    def describe():
        described.append(1)
        return "job tail: step 2"

    with pytest.raises(AssertionError) as info:
        wait_for(lambda: [], timeout=0.05, interval=0.01, what="step 3 on the card", describe=describe)
    message = str(info.value)
    assert message.startswith("timed out after 0.05 s waiting for step 3 on the card; last value: []")
    assert message.endswith("\njob tail: step 2")
    assert described == [1]  # read once, when the wait failed


def test_the_deadline_is_checked_after_each_call():
    calls = []

    def never():
        calls.append(1)
        return None

    assert wait_for(lambda: "ready", timeout=0) == "ready"  # a zero timeout still makes one call
    with pytest.raises(AssertionError, match="timed out after 0 s"):
        wait_for(never, timeout=0, interval=0.01)
    assert len(calls) == 1  # the deadline had passed after the first falsy result


def test_an_exception_in_the_predicate_ends_the_wait_at_once():
    calls = []

    def predicate():
        calls.append(1)
        assert False, "the job ended early"

    with pytest.raises(AssertionError, match="the job ended early"):
        wait_for(predicate, timeout=60)
    assert len(calls) == 1
