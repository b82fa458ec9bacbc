"""What to run: ``tune run``-style words -> the exact command of one job. Pure.

The command builder (``build``), torchrun's options and their cache, overrides and cell bodies,
configs, the recipe/config catalog (the only user of torchtune's registry), a launch's own
options, and sweeps (``axes``: which overrides are axes; ``sweepsection``: a YAML body's
``sweep:`` mapping; ``sweep``: the grid of trials; ``pool``: GPUs shared by trials). Nothing here
starts a process or knows where a job runs.
"""
