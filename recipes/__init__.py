# The project's own torchtune recipes, installed as ``tune_magic.recipes``.
# This file also makes ``recipes/`` a regular package, so that `tune run recipes/x.py` from the repo
# root finds this folder instead of torchtune's top-level `recipes` package in site-packages.
