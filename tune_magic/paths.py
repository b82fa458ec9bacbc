"""Where tune_magic keeps its per-user state (assets, job records)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Mapping

#: Environment variable that overrides :func:`home`.
HOME_ENV = "TUNE_MAGIC_HOME"


def home(env: Mapping[str, str] | None = None) -> Path:
    """Return the tune_magic home directory (not created).

    ``$TUNE_MAGIC_HOME`` if set and non-empty, else ``$HOME/.cache/tune_magic``. The shipped
    configs compute the same path with OmegaConf's own resolvers
    (``${oc.env:TUNE_MAGIC_HOME,${oc.env:HOME}/.cache/tune_magic}``), so keep the two in step.

    Args:
        env: environment to read; defaults to ``os.environ``.

    Returns:
        An absolute :class:`~pathlib.Path`.
    """
    env = os.environ if env is None else env
    value = env.get(HOME_ENV)
    if value:
        return Path(value).expanduser().absolute()
    user_home = env.get("HOME") or str(Path.home())
    return Path(user_home).expanduser().absolute() / ".cache" / "tune_magic"


def assets_dir(env: Mapping[str, str] | None = None) -> Path:
    """Return the default directory of the tiny offline assets: ``home()/assets``."""
    return home(env) / "assets"


def file_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words (``"a FIFO"``, ``"a directory"``...), for
    messages about a path that is not the regular file expected."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"
