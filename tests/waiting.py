"""The tests' one way to wait for something: poll a predicate until it holds or a deadline passes.

Tests never assert on elapsed time (speed targets are benchmarks); a wait's ``timeout`` is a
generous bound that ends a stuck test with a message, and the wait returns as soon as the awaited
thing happened. The SLURM test cluster's own waits (tests/slurmcluster.py) raise its
``ClusterError``/``TimeoutError`` instead, which its fixture turns into a skip or a failure.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 60.0, interval: float = 0.1, *,
             what: str = "the condition", describe: Callable[[], object] | None = None) -> T:
    """Call ``predicate()`` until it returns a truthy value, and return that value.

    The predicate is called at once, then every ``interval`` seconds; after each falsy result the wait
    gives up if ``timeout`` seconds have passed since it began (so even ``timeout=0`` makes one call).
    An exception the predicate raises (e.g. an ``assert`` that the job is still running) ends the
    wait at once.

    Args:
        predicate: what to wait for; its truthy result is returned (e.g. the record that appeared).
        timeout: seconds until the wait fails (a bound for a stuck test, never a speed check).
        interval: seconds between calls.
        what: what is awaited, for the failure message ("job X to end").
        describe: called once on timeout; its result is added to the message (e.g. the job's tail),
            so the state is read when the wait failed, not when it began.

    Returns:
        The predicate's first truthy value.

    Raises:
        AssertionError: no truthy value within ``timeout`` seconds; the message names ``what``,
            the timeout, the predicate's last value and ``describe()``.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            message = f"timed out after {timeout:g} s waiting for {what}; last value: {value!r}"
            if describe is not None:
                message += f"\n{describe()}"
            raise AssertionError(message)
        time.sleep(interval)
