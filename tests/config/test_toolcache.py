"""The tool cache: torchrun's option table and torchtune's registry, read once in a subprocess and
kept under ``$TUNE_MAGIC_HOME/cache/``.

Checked: the cached tables equal the live ones (torchrun's ``get_args_parser()``, torchtune's
``_recipe_registry`` imported for real here); every part of the key, when it changes, makes the next
read recompute; a stale or corrupt file is never used; an unwritable home still gives the tables, with
no file and no warning; and a fresh process that builds a plan imports neither torch nor torchtune.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from tune_magic.config import catalog

from tune_magic.config import toolcache

from tune_magic.config import torchrun_options

from jobhelpers import REPO


def _clear_process_caches() -> None:
    toolcache.tables.cache_clear()
    torchrun_options.options.cache_clear()
    catalog._builtin.cache_clear()


@pytest.fixture
def fresh_home(tmp_path, monkeypatch):
    """A TUNE_MAGIC_HOME of this test's own, and no table remembered by this process."""
    home = tmp_path / "tmhome"
    home.mkdir()  # the cache is written only inside an existing home
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(home))
    _clear_process_caches()
    yield home
    _clear_process_caches()  # later tests read the session home's cache again


@pytest.fixture(scope="module")
def real_tables():
    """The tables as one real subprocess reads them (shared: each read costs an ``import torch``)."""
    return toolcache.compute_in_subprocess()


@pytest.fixture
def computations(monkeypatch, real_tables):
    """Count the computations ``load()`` asks for; each returns the real tables."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return json.loads(json.dumps(real_tables))

    monkeypatch.setattr(toolcache, "compute_in_subprocess", counted)
    return calls


def _cache_file(home: Path) -> Path:
    files = list((home / "cache").glob("tools-*.json"))
    assert len(files) == 1, files
    return files[0]


# --- the cached tables are the live ones ----------------------------------------------------------


def test_cached_option_table_equals_the_one_read_live_from_get_args_parser(fresh_home):
    cached = torchrun_options.options()  # cache absent: computed in a subprocess, then written
    assert _cache_file(fresh_home).is_file()
    from torch.distributed.run import get_args_parser

    live_actions = [a for a in get_args_parser()._actions if a.option_strings and a.dest != "help"]
    assert sorted(cached) == sorted(s for a in live_actions for s in a.option_strings)
    non_builtin = 0
    for action in live_actions:
        for spelling in action.option_strings:
            opt = cached[spelling]
            assert (opt.dest, opt.spellings, opt.takes_value) == (
                action.dest, tuple(action.option_strings), action.nargs != 0), spelling
            assert opt.choices == (tuple(action.choices) if action.choices is not None else None), spelling
            if action.type in (None, str, int, float):
                assert opt.type is action.type, spelling
            else:  # a callable of torch's own (comma_separated_list): same name, same result
                non_builtin += 1
                assert isinstance(opt.type, torchrun_options.LiveType)
                assert opt.type.__name__ == action.type.__name__
                for value in ("a,b", "a,,b,c", "", "x"):
                    assert opt.type(value) == action.type(value)
    assert non_builtin > 0  # torch 2.13 has two such options: the branch above ran
    # read back from the file (this process forgets its table): the same table again
    _clear_process_caches()
    assert _described(torchrun_options.options()) == _described(cached)


def _described(table: dict) -> list[tuple]:
    return [(k, o.dest, o.spellings, o.takes_value, getattr(o.type, "__name__", None), o.choices)
            for k, o in table.items()]


def test_option_checks_give_the_same_verdicts_as_before(fresh_home):
    table = torchrun_options.options()
    assert table["--max-restarts"].check("3") is None
    assert table["--max-restarts"].check("three") == "--max-restarts 'three' is not an int"
    assert table["--monitor_interval"].check("0.5") is None
    assert table["--monitor_interval"].check("fast") == "--monitor-interval 'fast' is not a float"
    assert table["--start-method"].check("spawn") is None
    assert table["--start-method"].check("thread") == (
        "--start-method 'thread' is not one of spawn, fork, forkserver")
    assert table["--duplicate-stdout-filters"].check("a,b") is None
    assert table["--standalone"].takes_value is False


def test_cached_registry_equals_torchtunes_own(fresh_home):
    import torchtune._recipe_registry as registry  # the real package import, only in this test

    root = catalog._torchtune_root() / "recipes"
    want_recipes = [(r.name, root / r.file_path, r.supports_distributed, tuple(c.name for c in r.configs))
                    for r in registry.get_all_recipes()]
    want_configs = [(c.name, root / "configs" / c.file_path, r.name)
                    for r in registry.get_all_recipes() for c in r.configs]
    recipes, configs = catalog._builtin()
    assert [(e.name, e.path, e.supports_distributed, e.configs) for e in recipes] == want_recipes
    assert [(e.name, e.path, e.recipe) for e in configs] == want_configs
    assert {e.source for e in (*recipes, *configs)} == {catalog.TORCHTUNE}
    assert len(recipes) > 10 and catalog.find_config("llama3_2/1B_lora").path.is_file()


# --- key, staleness, corruption --------------------------------------------------------------------


def test_cache_present_is_read_without_computing(fresh_home, computations):
    first = toolcache.load()
    assert len(computations) == 1
    assert toolcache.load() == first
    assert len(computations) == 1
    doc = json.loads(_cache_file(fresh_home).read_text())
    assert doc["key"] == toolcache.current_key()
    assert doc["key"]["torch"] == "2.13.0+cpu" and doc["key"]["torchtune"] == "0.6.1"
    assert doc["key"]["executable"] == sys.executable


def _mutate_version(monkeypatch, dist):
    real = toolcache._version
    monkeypatch.setattr(toolcache, "_version", lambda d: "9.9.9" if d == dist else real(d))


def _mutate_watched_file(monkeypatch, tmp_path, package, rel, how):
    """Point ``package``'s directory at a copy whose watched file differs in mtime or size."""
    real_dir = toolcache._package_dir(package)
    copy = tmp_path / "copy" / package
    (copy / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(real_dir / rel, copy / rel)
    st = (real_dir / rel).stat()
    if how == "mtime":
        os.utime(copy / rel, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    else:  # same mtime, one byte more
        with open(copy / rel, "ab") as f:
            f.write(b"\n")
        os.utime(copy / rel, ns=(st.st_atime_ns, st.st_mtime_ns))
    real = toolcache._package_dir
    monkeypatch.setattr(toolcache, "_package_dir", lambda p: copy if p == package else real(p))


KEY_CHANGES = {
    "torch version": lambda mp, tmp: _mutate_version(mp, "torch"),
    "torchtune version": lambda mp, tmp: _mutate_version(mp, "torchtune"),
    "run.py mtime": lambda mp, tmp: _mutate_watched_file(mp, tmp, "torch", "distributed/run.py", "mtime"),
    "run.py size": lambda mp, tmp: _mutate_watched_file(mp, tmp, "torch", "distributed/run.py", "size"),
    "registry mtime": lambda mp, tmp: _mutate_watched_file(mp, tmp, "torchtune", "_recipe_registry.py", "mtime"),
    "registry size": lambda mp, tmp: _mutate_watched_file(mp, tmp, "torchtune", "_recipe_registry.py", "size"),
    "format": lambda mp, tmp: mp.setattr(toolcache, "FORMAT", toolcache.FORMAT + 1),
}


@pytest.mark.parametrize("change", sorted(KEY_CHANGES))
def test_a_changed_key_recomputes_and_rewrites(change, fresh_home, computations, monkeypatch, tmp_path):
    toolcache.load()
    old_key = json.loads(_cache_file(fresh_home).read_text())["key"]
    KEY_CHANGES[change](monkeypatch, tmp_path)
    new_key = toolcache.current_key()
    assert new_key != old_key
    toolcache.load()
    assert len(computations) == 2
    assert json.loads(_cache_file(fresh_home).read_text())["key"] == new_key
    toolcache.load()  # and the rewritten file is used from then on
    assert len(computations) == 2


def test_a_changed_executable_uses_its_own_file(fresh_home, computations, monkeypatch):
    toolcache.load()
    first = _cache_file(fresh_home)
    monkeypatch.setattr(sys, "executable", sys.executable + "-other")
    toolcache.load()
    assert len(computations) == 2
    files = sorted((fresh_home / "cache").glob("tools-*.json"))
    assert len(files) == 2 and first in files
    other = next(f for f in files if f != first)
    assert json.loads(other.read_text())["key"]["executable"] == sys.executable


def test_touching_torchs_run_py_recomputes(fresh_home, computations):
    """The real file, not a copy: a new mtime (torch reinstalled in place) makes the key differ."""
    run_py = toolcache._package_dir("torch") / "distributed" / "run.py"
    st = run_py.stat()
    toolcache.load()
    try:
        os.utime(run_py, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        toolcache.load()
    finally:
        os.utime(run_py, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert run_py.stat().st_mtime_ns == st.st_mtime_ns
    assert len(computations) == 2


def _poisoned(tables: dict) -> dict:
    """The real tables plus an option and a recipe that torch/torchtune do not have."""
    poisoned = json.loads(json.dumps(tables))
    poisoned["torchrun"].append({"dest": "poison", "spellings": ["--poison"], "takes_value": True,
                                 "type": "str", "choices": None})
    poisoned["registry"].append({"name": "poison_recipe", "file_path": "poison.py",
                                 "supports_distributed": True, "configs": []})
    return poisoned


@pytest.mark.parametrize("stale", ["torch", "torchtune", "executable", "files", "format", "no key"])
def test_a_stale_file_is_never_used(stale, fresh_home, real_tables):
    key = toolcache.current_key()
    if stale == "files":
        key["files"]["torch/distributed/run.py"][1] -= 1
    elif stale == "format":
        key["format"] = toolcache.FORMAT - 1
    elif stale == "no key":
        key = None
    else:
        key[stale] = "something else"
    path = toolcache.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": key, "tables": _poisoned(real_tables)}))
    assert toolcache.read(path, toolcache.current_key()) is None
    # through the public entry points, in this process (computed in a subprocess again)
    assert "--poison" not in torchrun_options.options()
    assert catalog.find_recipe("poison_recipe") is None
    doc = json.loads(path.read_text())
    assert doc["key"] == toolcache.current_key()
    assert "poison" not in json.dumps(doc["tables"])


def test_a_current_file_is_used_as_it_is(fresh_home, real_tables):
    """The counterpart of the stale test: the same poisoned file with the current key is read."""
    path = toolcache.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": toolcache.current_key(), "tables": _poisoned(real_tables)}))
    assert torchrun_options.lookup("--poison").dest == "poison"
    assert catalog.find_recipe("poison_recipe").path == catalog._torchtune_root() / "recipes" / "poison.py"


CORRUPT = {
    "empty": b"",
    "truncated": None,  # the first half of a real file
    "binary": b"\x00\xff\xfe garbage \x80",
    "json list": b"[1, 2, 3]",
    "no tables": None,  # current key, tables missing
    "tables not lists": None,  # current key, torchrun table is a string
}


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_a_corrupt_file_is_recomputed_without_error(kind, fresh_home, computations, real_tables):
    path = toolcache.cache_path()
    path.parent.mkdir(parents=True)
    key = toolcache.current_key()
    content = CORRUPT[kind]
    if kind == "truncated":
        full = json.dumps({"key": key, "tables": real_tables}).encode()
        content = full[: len(full) // 2]
    elif kind == "no tables":
        content = json.dumps({"key": key}).encode()
    elif kind == "tables not lists":
        content = json.dumps({"key": key, "tables": {"torchrun": "x", "registry": None}}).encode()
    path.write_bytes(content)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = toolcache.load()
    assert len(computations) == 1
    assert got == real_tables
    assert json.loads(path.read_text()) == {"key": key, "tables": real_tables}


def test_a_failing_subprocess_falls_back_to_reading_here_with_a_warning(fresh_home, monkeypatch, real_tables):
    """A child that cannot run (here: ``/bin/false`` as the interpreter) never blocks a launch."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match=r"in /bin/false failed \(exit status 1\)"):
        toolcache.compute_in_subprocess()
    with pytest.warns(RuntimeWarning, match="reading them in this process instead"):
        got = toolcache.load()
    assert got == real_tables


def test_a_child_printing_something_else_is_an_error_naming_it(monkeypatch):
    monkeypatch.setattr(sys, "executable", shutil.which("echo"))
    with pytest.raises(RuntimeError, match="failed .*Expecting value"):
        toolcache.compute_in_subprocess()


# --- fresh processes: no torch, and an unwritable home ---------------------------------------------

PROBE = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("error")
    import tune_magic
    plan = tune_magic.build_plan(sys.argv[1], job_id="probe")
    print(json.dumps({"argv": plan.argv, "heavy": sorted(m for m in ("torch", "torchtune", "torchao")
                      if m in sys.modules)}))
    if len(sys.argv) > 2:  # make the home after the plan, as a launch would
        import os
        os.makedirs(sys.argv[2])
""")


def _probe(args: str, home: Path, prefix: list[str] = (), make_home: bool = False) -> dict:
    env = {**os.environ, "TUNE_MAGIC_HOME": str(home)}
    proc = subprocess.run([*prefix, sys.executable, "-c", PROBE, args, *([str(home)] if make_home else [])],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no warning, no traceback
    return json.loads(proc.stdout)


LORA = "--nproc_per_node 2 --max-restarts 1 lora_finetune_distributed --config llama3_2/1B_lora"


def test_a_fresh_process_builds_plans_without_importing_torch(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    absent = _probe(LORA, home)  # cache absent: the child computes it in a grandchild
    assert absent["heavy"] == []
    assert _cache_file(home).is_file()
    present = _probe(LORA, home)
    assert present == absent
    assert present["argv"][1:3] == ["-m", "torch.distributed.run"]
    assert "--max-restarts" in present["argv"]


def _readonly_prefix(home: Path) -> list[str] | None:
    """A command prefix under which ``home`` cannot be written, as root: a read-only bind mount in a
    private mount namespace (gone with the process), else running as ``nobody``. ``None``: neither."""
    probe = ["sh", "-c", f'mount --bind -o ro "{home}" "{home}" && ! touch "{home}/w" 2>/dev/null']
    if shutil.which("unshare") and subprocess.run(["unshare", "--mount", *probe], capture_output=True).returncode == 0:
        # the mount command runs inside the namespace, then execs the real command
        return ["unshare", "--mount", "sh", "-c", f'mount --bind -o ro "{home}" "{home}" && exec "$@"', "sh"]
    if shutil.which("setpriv") and os.geteuid() == 0:
        prefix = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
        if subprocess.run([*prefix, "sh", "-c", f'! touch "{home}/w" 2>/dev/null'], capture_output=True).returncode == 0:
            return prefix
    return None


def test_an_unwritable_home_recomputes_each_time_without_error(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    tmp_path.chmod(0o755)
    prefix = _readonly_prefix(home)
    if prefix is None:
        pytest.skip("cannot make a read-only home here: no mount namespace (unshare) and no setpriv as root")
    want = _probe(LORA, tmp_path / "writable")
    for _ in range(2):
        got = _probe(LORA, home, prefix)
        assert got == want
        assert list(home.iterdir()) == []  # nothing written, so the next process computes again


def test_simultaneous_misses_compute_once(fresh_home, monkeypatch, real_tables):
    """Two readers miss at once: the second waits on the lock and reads what the first wrote."""
    import threading
    import time

    calls = []

    def slow(*args, **kwargs):
        calls.append(threading.current_thread().name)
        time.sleep(0.5)  # long enough for the other thread to reach the lock
        return json.loads(json.dumps(real_tables))

    monkeypatch.setattr(toolcache, "compute_in_subprocess", slow)
    results = {}
    threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, toolcache.load()), name=f"r{n}")
               for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(calls) == 1, calls
    assert results == {0: real_tables, 1: real_tables}
    assert (fresh_home / "cache" / (toolcache.cache_path().name + ".lock")).is_file()


# --- a home that does not exist is never created ---------------------------------------------------


def test_a_missing_home_and_its_parents_are_never_created(tmp_path):
    """Building plans (the CLI's dry run too) in a home that does not exist creates nothing: not
    the home, not its parents, not the cache; once the home exists, the next plan writes the cache."""
    home = tmp_path / "nonexistent" / "deep" / "home"
    (tmp_path / "other").mkdir()
    want = _probe(LORA, tmp_path / "other")  # the same plan from a home that gets its cache
    assert _probe(LORA, home) == want
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]
    env = {**os.environ, "TUNE_MAGIC_HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "tune_magic", "cmd", *LORA.split()], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-3:] == ["--config", str(catalog.find_config("llama3_2/1B_lora").path),
                                     next(w for w in r.stdout.split() if w.startswith("output_dir="))]
    assert not (tmp_path / "nonexistent").exists()
    # a process whose launch creates the home (here: by hand, as jobstore does) writes the cache as it exits
    assert _probe(LORA, home, make_home=True) == want
    assert [p.name for p in (home / "cache").iterdir() if p.suffix == ".json"] == [toolcache.cache_path().name]
    doc = json.loads(next((home / "cache").glob("tools-*.json")).read_text())
    assert doc["key"] == toolcache.current_key() and doc["tables"] == toolcache.compute_here()


def test_write_creates_only_the_cache_directory_inside_an_existing_home(tmp_path, real_tables):
    key = toolcache.current_key()
    missing = tmp_path / "no-home" / "cache" / "tools-x.json"
    assert toolcache.write(missing, key, real_tables) is False
    assert not (tmp_path / "no-home").exists()
    (tmp_path / "home").mkdir()
    present = tmp_path / "home" / "cache" / "tools-x.json"
    assert toolcache.write(present, key, real_tables) is True
    assert toolcache.read(present, key) == real_tables
