"""Sweeps: one launch that runs a grid of trials, each a normal job, as slots free up.

- ``create``: :func:`~tune_magic.sweeping.create.sweep` checks a sweep before anything starts (the
  axes and trials of :mod:`tune_magic.plan.sweep`, the GPU slots of :mod:`tune_magic.plan.pool`,
  each item against the config, the rendezvous), registers it and hands it to its scheduler
  (``Scheduler.submit_sweep``); a dry run returns the trials and each one's command.
- ``runner``: the sweep process (``python -m tune_magic.sweeping.runner SWEEP_DIR``), the queue
  outside the kernel: it starts queued trials through :func:`tune_magic.launch` as slots free up.
- ``process``: starting that process, and starting it again for a sweep whose process died
  (every listing does, under the sweep's lock: never two).
- ``handle``: :class:`~tune_magic.sweeping.sweep.Sweep` (``jobs``, ``wait``, ``stop``, ``best``,
  ``frame``) and the listings :func:`~tune_magic.sweeping.sweep.sweeps`,
  :func:`~tune_magic.sweeping.sweep.get_sweep`.
- ``results``: the trials' losses (final and minimum), the best trial, the frame, the metrics.

The record on disk is :mod:`tune_magic.registry.sweeprecord` (in :mod:`tune_magic.registry.sweepstore`).
This package imports nothing at import time: ``tune_magic.job`` uses ``process`` for its listing.
"""
