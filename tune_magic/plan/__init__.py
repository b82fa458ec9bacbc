"""What to run: a checked launch -> the exact ``torchrun`` command of one job. Pure.

``build`` (the command and its placement on this machine), ``torchrun`` (torchrun's values and the
rendezvous policy), ``model`` (:class:`~tune_magic.plan.model.LaunchPlan`), ``options`` (a launch's
own options, one table for the magic, the CLI and the panel), ``configview`` (the directories a
plan's config will write) and ``argsize`` (a command Linux would not start). The words, overrides
and configs it builds from are :mod:`tune_magic.config`'s. Nothing here starts a process or
knows where a job runs.
"""
