"""Presentation: the magics, the CLI, the panel, cards and tables, and the demo.

The only importers of IPython and ipywidgets. Everything here calls the public API
(:func:`tune_magic.launch`, :class:`tune_magic.Job`, ...) and displays what it returns.
"""
