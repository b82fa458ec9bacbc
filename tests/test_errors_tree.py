"""Every exception class tune_magic defines subclasses TuneMagicError (and keeps a builtin base).

Imports every module of the package (found on disk, so a new module is covered without editing
this test), collects the Exception subclasses each one defines, and checks their bases. The
recipes (``tune_magic.recipes``, installed from ``recipes/``) run inside torchrun, not in the
package's callers, and import torch: they are left out.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

import tune_magic
from tune_magic.errors import TuneMagicError

PACKAGE = Path(tune_magic.__file__).parent


def package_modules() -> list[str]:
    """Dotted names of every module under tune_magic/ (``__main__`` left out: it runs the CLI)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


def defined_exceptions() -> dict[str, type]:
    """``{"module.Class": class}`` for each Exception subclass defined (not imported) in the package."""
    found = {}
    for name in package_modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__ == module.__name__):
                found[f"{name}.{attr}"] = value
    return found


def test_the_walk_finds_the_package_and_its_known_exceptions():
    modules = package_modules()
    assert "tune_magic.errors" in modules and "tune_magic.logs.parse" in modules and len(modules) > 50
    found = defined_exceptions()
    # the tree's own classes, and one engine-specific and one scheduler-local error, are seen
    for name in ("tune_magic.errors.PlanError", "tune_magic.schedulers.slurm.array.SqueueParseError",
                 "tune_magic.gpus.GpuError", "tune_magic.config.catalog.AmbiguousNameError"):
        assert name in found, name


@pytest.mark.parametrize("name, cls", sorted(defined_exceptions().items()))
def test_every_exception_subclasses_tune_magic_error(name, cls):
    assert issubclass(cls, TuneMagicError), f"{name} must subclass tune_magic.errors.TuneMagicError"


@pytest.mark.parametrize("name, cls", sorted(defined_exceptions().items()))
def test_every_exception_keeps_a_builtin_base(name, cls):
    """Code written against the builtins (``except ValueError``) keeps working."""
    if cls in (TuneMagicError, tune_magic.errors.UserError):
        return  # the roots: nothing to be compatible with
    builtin = [b for b in cls.__mro__ if b.__module__ == "builtins" and b not in (object, BaseException, Exception)]
    assert builtin, f"{name} has no builtin base besides Exception (e.g. ValueError, LookupError)"


def test_the_tree_in_errors_docstring_names_every_public_exception():
    """The tree atop tune_magic/errors.py is where a user looks up what can be raised: each public
    class (no leading underscore) the package defines is in it, and each names its module."""
    doc = tune_magic.errors.__doc__
    tree = doc.split("::", 1)[1]
    for name, cls in sorted(defined_exceptions().items()):
        short = name.rsplit(".", 1)[1]
        if short.startswith("_"):
            continue
        assert f" {short}" in tree, f"{short} ({name}) is missing from the tree in tune_magic/errors.py"
        if cls.__module__ != "tune_magic.errors":
            assert f":mod:`{cls.__module__}`" in doc, f"errors.py does not say {short} lives in {cls.__module__}"
