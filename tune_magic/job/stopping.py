"""Stopping several jobs together: every live job (``stop --all``) or a sweep's trials, one
thread per job, so that N stops take about as long as one (benchmark row 16)."""

from __future__ import annotations

from tune_magic.registry.status import Status


def stop_jobs(targets, grace_s: float = 10.0, errors: list | None = None) -> dict[str, Status]:
    """Stop several jobs together (one thread per job, so N jobs take about as long as one: each
    stop waits out its own grace period at the same time), e.g. every live job or a sweep's trials.

    Args:
        targets: the :class:`Job` objects to stop.
        grace_s: seconds between SIGTERM and SIGKILL for each (see :meth:`Job.stop`).
        errors: when given, ``(job, exception)`` of each stop that raised is appended to it (those
            jobs are left out of the result) instead of the first being raised.

    Returns:
        Job id -> its status afterwards, in the order given.

    Raises:
        ValueError: ``grace_s`` is not a number of seconds >= 0.
        TuneMagicError: without ``errors``, the first error a stop raised, once every other stop
            has finished (e.g. an engine that did not take the cancel).
    """
    from concurrent.futures import ThreadPoolExecutor

    targets = list(targets)
    if not targets:
        return {}
    with ThreadPoolExecutor(max_workers=min(64, len(targets)), thread_name_prefix="tune_magic-stop") as pool:
        futures = [pool.submit(job.stop, grace_s) for job in targets]
    failed = [(job, f.exception()) for job, f in zip(targets, futures) if f.exception() is not None]
    if failed and errors is None:
        raise failed[0][1]
    if errors is not None:
        errors.extend(failed)
    return {job.id: f.result() for job, f in zip(targets, futures) if f.exception() is None}
