"""Sweeps: one launch that runs a grid of trials, each a normal job, as slots free up.

Everything that is a sweep lives here, from the grid down to its record on disk:

- ``grid``: the axes of a launch and the grid of trials (the axes' syntax, comma lists and
  ranges, is :mod:`tune_magic.config.overrides`'s, shared with launches that are not sweeps);
  ``slots``: how trials share a pool of GPUs.
- ``record`` + ``store``: a sweep's record and its directory under ``$TUNE_MAGIC_HOME/sweeps``
  (the trials' own records are jobs'); the lowest layer here, below the schedulers, which write
  a job array's ids into it.
- ``create``: :func:`~tune_magic.sweeping.create.sweep` checks a sweep before anything starts,
  registers it and hands it to its scheduler; a dry run returns the trials and their commands.
- ``runner``: the sweep process (``python -m tune_magic.sweeping.runner SWEEP_DIR``), the queue
  outside the kernel; ``start``: starting it, and again for a sweep whose process died (a step
  of its own: listings have no side effects).
- ``sweep``: :class:`~tune_magic.sweeping.sweep.Sweep` (``jobs``, ``wait``, ``stop``, ``best``,
  ``frame``) and the listings; ``results``: the trials' losses, the one ranking of trials.

The package is named ``sweeping`` because ``tune_magic.sweep`` and ``tune_magic.sweeps`` are the
public functions. It imports nothing at import time, so its lower modules (``record``, ``store``)
load without its upper ones.
"""
