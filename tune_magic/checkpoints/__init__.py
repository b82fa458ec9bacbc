"""Checkpoints: what torchtune 0.6.1 saved in a job's ``output_dir``, and what continues from it.

A checkpoint is an ``epoch_N/`` folder of model files (``.safetensors`` or ``.bin``/``.pt``, read by
:mod:`~tune_magic.checkpoints.files` without torch) plus, for a run that can continue, the recipe
state torchtune writes beside it (:mod:`~tune_magic.checkpoints.layout`). The modules:

- :mod:`~tune_magic.checkpoints.recipes`: which recipes can resume, and how;
- :mod:`~tune_magic.checkpoints.preflight`: resume's pre-flight, the exact overrides that continue
  a job from its last checkpoint, or the reason it cannot;
- :mod:`~tune_magic.checkpoints.relaunch`: what a resume or a requeue launches again, from a
  job's record;
- :mod:`~tune_magic.checkpoints.lineage`: the jobs that resumed one another in one ``output_dir``,
  and their metrics as one run.

Pure: files are read, nothing is started and torch is never imported. The resume itself (a new
job) is :mod:`tune_magic.job.resume`; schedulers use :mod:`~tune_magic.checkpoints.relaunch` for
their automatic resumes. Checkpoints as things of their own (listing, retention, the disk
pre-flight, export) and what is evaluated from them (validation loss, generation) belong here too.
"""
