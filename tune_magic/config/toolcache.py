"""A cache of what tune_magic reads from the installed torch and torchtune: torchrun's option table
and torchtune's recipe registry.

Both change only when those packages change, yet reading them live imports torch (~1-4 s, more on a
CUDA machine) into whatever process builds a plan: the notebook kernel, the CLI. So they are read once
in a subprocess (``python -c ...`` running :func:`child_main`) and kept as JSON in
``$TUNE_MAGIC_HOME/cache/tools-<hash of sys.executable>.json``; a process with the cache present
imports neither torch nor torchtune to build a plan.

The file is used only when its key equals the current one (:func:`current_key`): ``sys.executable``,
the torch and torchtune versions (``importlib.metadata``), and the mtime and size of
``torch/distributed/run.py`` and ``torchtune/_recipe_registry.py`` (located from the top-level
packages' specs, which imports nothing), plus :data:`FORMAT`. Anything else (missing, stale key,
unreadable, corrupt) means: compute again and rewrite it atomically (tempfile + ``os.replace``). A home
that cannot be written is not an error: the table is then computed in a subprocess once per process.
Nor is a home that does not exist: this module creates only ``cache/`` inside an existing home,
never the home or its parents (building a plan, a dry run, must not make directories). A process
that computed the tables while its home was missing writes them when it exits, if by then the
home exists (a launch in that process created it), so the next process finds them.

The readers themselves live with their users: :func:`tune_magic.config.torchrun_options.live_rows` and
:func:`tune_magic.config.catalog.live_registry_rows`. Only this module's stdlib imports run in the caller.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

from tune_magic.paths import home

#: Version of the file's layout; bump it when the rows' shape changes, so old files count as stale.
FORMAT = 1
#: Seconds the subprocess may take (a cold ``import torch`` on a slow network filesystem is slow).
CHILD_TIMEOUT_S = 600.0

# (top-level package, file inside it whose change means the table may have changed)
_WATCHED = (("torch", ("distributed", "run.py")), ("torchtune", ("_recipe_registry.py",)))


def _package_dir(name: str) -> Path | None:
    """Directory of the top-level package ``name``, without importing it (``None`` if absent).

    ``find_spec`` of a top-level name only searches ``sys.path``; of a dotted name it would import
    the parent package, which is what this cache avoids.
    """
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None) if module is not None else None
    if spec is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _version(dist: str) -> str | None:
    from importlib import metadata  # stdlib; reads dist-info files, imports no package

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def current_key() -> dict[str, Any]:
    """Return the key the cache file must carry to be used (JSON-able).

    Returns:
        ``{"format", "executable", "torch", "torchtune", "files"}``; ``files`` maps each watched
        file (``torch/distributed/run.py``, ``torchtune/_recipe_registry.py``) to
        ``[absolute path, mtime in ns, size in bytes]``, or ``None`` where it is missing.
    """
    files: dict[str, Any] = {}
    for package, rel in _WATCHED:
        base = _package_dir(package)
        path = base.joinpath(*rel) if base is not None else None
        try:
            st = path.stat() if path is not None else None
        except OSError:
            st = None
        files["/".join((package, *rel))] = [str(path), st.st_mtime_ns, st.st_size] if st else None
    return {"format": FORMAT, "executable": sys.executable, "torch": _version("torch"),
            "torchtune": _version("torchtune"), "files": files}


def cache_dir() -> Path:
    """Return ``home()/cache`` (not created)."""
    return home() / "cache"


def cache_path(executable: str | None = None) -> Path:
    """Return the cache file of one interpreter: ``home()/cache/tools-<sha1 of its path, 12 hex>.json``.

    Several virtualenvs may share one ``TUNE_MAGIC_HOME``; one file each keeps them from evicting
    each other's table.
    """
    exe = sys.executable if executable is None else executable
    return cache_dir() / f"tools-{hashlib.sha1(exe.encode()).hexdigest()[:12]}.json"


def read(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """Return the cached tables in ``path`` if its key equals ``key``, else ``None``.

    Never raises for a missing, unreadable, truncated or foreign file: all of these mean "compute".
    """
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != key:
        return None
    tables = doc.get("tables")
    if not isinstance(tables, dict) or not isinstance(tables.get("torchrun"), list):
        return None
    if tables.get("registry") is not None and not isinstance(tables.get("registry"), list):
        return None
    return tables


def write(path: Path, key: dict[str, Any], tables: dict[str, Any]) -> bool:
    """Write ``{"key", "tables"}`` to ``path`` atomically (a reader sees the old file or the new one).

    Only ``path``'s own directory is created, and only inside an existing one: the home and its
    parents never are.

    Returns:
        ``True`` if written, ``False`` if the directory or file cannot be written (read-only home,
        another user's home, full disk, a home that does not exist): the caller just goes on with
        ``tables``.
    """
    tmp = None
    try:
        path.parent.mkdir(exist_ok=True)  # FileNotFoundError where the home itself is missing
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"key": key, "tables": tables}, f)
        os.replace(tmp, path)
        return True
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


def compute_in_subprocess(timeout_s: float = CHILD_TIMEOUT_S) -> dict[str, Any]:
    """Read the tables live in a fresh ``sys.executable`` (which imports torch; this process does not).

    The child imports this very copy of tune_magic (its parent directory goes first on its path).

    Returns:
        ``{"torchrun": [option rows], "registry": [recipe rows] or None}`` (``None``: torchtune absent).

    Raises:
        RuntimeError: the child failed or printed something that is not the tables (its stderr's end
            is in the message).
    """
    package_parent = str(Path(__file__).resolve().parents[2])
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from tune_magic.config.toolcache import child_main; child_main()")
    try:
        proc = subprocess.run([sys.executable, "-c", code, package_parent], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"could not run {sys.executable}: {exc}") from exc
    try:
        if proc.returncode != 0:
            raise ValueError(f"exit status {proc.returncode}")
        tables = json.loads(proc.stdout)
        if not isinstance(tables, dict) or not isinstance(tables.get("torchrun"), list):
            raise ValueError("no option table in its output")
        return tables
    except ValueError as exc:
        tail = proc.stderr.decode(errors="replace").strip()[-800:]
        raise RuntimeError(f"reading torchrun's options and torchtune's registry in {sys.executable} "
                           f"failed ({exc}): {tail or 'no output'}") from None


#: table name -> "module:function" that reads it live. Named, not imported: the readers' modules use
#: this cache, and this module never imports them back.
READERS = {
    "torchrun": "tune_magic.config.torchrun_options:live_rows",
    "registry": "tune_magic.config.catalog:live_registry_rows",
}


def compute_here() -> dict[str, Any]:
    """Read the tables live in this process (imports torch). Same result as :func:`compute_in_subprocess`."""
    import importlib

    out = {}
    for table, target in READERS.items():
        module, _, function = target.partition(":")
        out[table] = getattr(importlib.import_module(module), function)()
    return out


def child_main() -> None:
    """Body of the subprocess: print the tables as JSON on stdout, and nothing else there; then exit
    at once (status 0), skipping the interpreter's shutdown, which with torch loaded takes longer
    than reading the tables (0.5-1 s measured on 2 cores, torch 2.13) while the caller waits."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything torch prints while importing goes to stderr, not into the JSON
    json.dump(compute_here(), out)
    out.close()
    sys.stderr.flush()
    os._exit(0)


@functools.lru_cache(maxsize=1)
def tables() -> dict[str, Any]:
    """:func:`load`, once per process (torchrun's options and the registry both come from one call)."""
    return load()


def load() -> dict[str, Any]:
    """Return torchrun's option rows and torchtune's registry rows, from the cache when it is current.

    On a miss the tables are computed in a subprocess and written back (if the home is writable).
    Processes that miss at the same time (ten launches at once after an upgrade) take turns on a
    lock file next to the cache, so one computes and the others read its result. Should the
    subprocess fail, the tables are read in this process instead (importing torch here), with a
    warning: a launch is never refused because of the cache.

    Returns:
        ``{"torchrun": [...], "registry": [...] or None}``; see :func:`compute_in_subprocess`.
    """
    key = current_key()
    path = cache_path()
    found = read(path, key)
    if found is not None:
        return found
    with _compute_lock(path):
        found = read(path, key)  # written by whoever held the lock before us
        if found is not None:
            return found
        try:
            computed = compute_in_subprocess()
        except RuntimeError as exc:
            warnings.warn(f"tune_magic: {exc}; reading them in this process instead (this imports torch here)",
                          RuntimeWarning, stacklevel=3)
            computed = compute_here()
        if not write(path, key, computed) and not path.parent.parent.is_dir():
            _write_at_exit(path, key, computed)
    return computed


def _write_at_exit(path: Path, key: dict[str, Any], tables: dict[str, Any]) -> None:
    """Write the tables when this process exits, if the home (``path``'s grandparent) exists by
    then; never create it. Registered at most once per cache file."""
    if path in _AT_EXIT:
        return
    _AT_EXIT.add(path)

    def flush() -> None:
        if path.parent.parent.is_dir() and read(path, key) is None:
            write(path, key, tables)

    atexit.register(flush)


_AT_EXIT: set[Path] = set()


@contextlib.contextmanager
def _compute_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<cache file>.lock`` if it can be had; go on without it
    where the home cannot be written or does not exist (each process then computes on its own, as
    it must anyway)."""
    try:
        path.parent.mkdir(exist_ok=True)
        lock = open(path.with_name(path.name + ".lock"), "a")
    except OSError:
        yield
        return
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:
            pass  # a filesystem without flock: compute unlocked
        yield


if __name__ == "__main__":  # ``python -m tune_magic.config.toolcache``: print the tables (for a look by hand)
    child_main()
