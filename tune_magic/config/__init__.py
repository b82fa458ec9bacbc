"""What the user wrote: configs, overrides, cell bodies and ``tune run`` words. Pure.

Owns torchtune's command-line grammar and its checks: ``launchwords`` (the words of a launch, as
``tune run`` reads them), ``tuneparse`` (``tune run``'s own parser, read from torchtune 0.6.1),
``torchrun_options`` + ``toolcache`` (torchrun's flags and torchtune's recipe registry, read once
per install), ``overrides`` (an override's value as a recipe reads it, and comma lists and ranges:
the axes of a sweep), ``shellwords`` (where the shell quotes were), ``cellbody`` (a ``%%tune_run``
cell body, with a YAML body's ``sweep:`` mapping), ``checks`` + ``nearkeys`` + ``valuerules``
(overrides against the config: unknown keys, did-you-mean, values a component would refuse),
``catalog`` + ``resolve`` (recipe and config names: the only user of torchtune's registry) and
``modelfiles`` (the model files a config reads). Nothing here builds a command or starts a process:
:mod:`tune_magic.plan` builds the command from what this package read.
"""
