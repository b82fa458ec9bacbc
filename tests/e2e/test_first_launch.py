"""The whole launch path in a fresh process imports neither torch nor torchtune (issue 14, target 1).

A new interpreter runs ``import tune_magic``, ``build_plan``, a real ``launch()`` of the toy recipe
(real torchrun), then ``wait()``; after each step it reports which heavy modules it holds. Once with
the tool cache absent (the table is then read in a grandchild) and once with it present.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from jobhelpers import processes_mentioning, toy_args

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "torchtune", "torchao")

CHILD = textwrap.dedent("""
    import json, sys
    heavy = lambda: sorted(m for m in %r if m in sys.modules)
    seen = {}
    import tune_magic
    seen["import"] = heavy()
    tune_magic.build_plan(sys.argv[1], job_id="plan-only")
    seen["build_plan"] = heavy()
    job = tune_magic.launch(sys.argv[1])
    seen["launch"] = heavy()
    status = job.wait(timeout=120)
    seen["wait"] = heavy()
    print(json.dumps({"id": job.id, "status": str(status), "seen": seen}))
""" % (HEAVY,))


def _first_launch(home: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, toy_args("steps=2")], cwd=REPO,
                          env={**os.environ, "TUNE_MAGIC_HOME": str(home)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_fresh_process_launch_imports_neither_torch_nor_torchtune(tmp_path):
    home = tmp_path / "home"
    for cache in ("absent", "present"):
        assert any((home / "cache").glob("tools-*.json")) == (cache == "present")
        got = _first_launch(home)
        assert got["status"] == "succeeded", (cache, got)
        assert got["seen"] == {"import": [], "build_plan": [], "launch": [], "wait": []}, cache
        assert processes_mentioning(got["id"]) == []


MAGIC_CHILD = textwrap.dedent("""
    import contextlib, io, json, sys
    from IPython.testing.globalipapp import start_ipython
    ip = start_ipython()
    ip.run_line_magic("load_ext", "tune_magic")
    with contextlib.redirect_stdout(io.StringIO()):  # the terminal shell prints the card's text form
        job = ip.run_cell_magic("tune_run", sys.argv[1], "# first cell\\n")
    heavy = sorted(m for m in %r if m in sys.modules)
    status = job.wait(timeout=120)
    print(json.dumps({"id": job.id, "status": str(status), "heavy": heavy,
                      "after_wait": sorted(m for m in %r if m in sys.modules)}))
""" % (HEAVY, HEAVY))


def test_first_tune_run_cell_in_a_fresh_shell_imports_neither_torch_nor_torchtune(tmp_path):
    """The notebook's path: ``%load_ext``, then a ``%%tune_run`` cell (card displayed), cache absent."""
    proc = subprocess.run([sys.executable, "-c", MAGIC_CHILD, toy_args("steps=2")], cwd=REPO,
                          env={**os.environ, "TUNE_MAGIC_HOME": str(tmp_path / "home")}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["status"], got["heavy"], got["after_wait"]) == ("succeeded", [], [])
    assert processes_mentioning(got["id"]) == []
