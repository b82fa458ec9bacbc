"""Measure the demo cold, by hand: a copy of the working tree without ``.venv``, then ``scripts/demo``.

``git clone`` would drop uncommitted files, so the working tree is copied (without ``.venv``,
``.git``, caches and outputs) to a temporary directory. ``scripts/demo`` there does two things,
timed apart: ``scripts/setup-venv`` (create ``.venv``, pip install the pinned dependencies; pip's
own download cache is used if this machine has one, which is noted) and ``tune-magic demo``.
The result goes to ``bench/cold_demo.json``, which ``bench/run.py --write`` shows in BENCHMARKS.md.

Usage::

    .venv/bin/python bench/cold_demo.py [--keep]

Takes several minutes (torch is a large wheel). Not part of ``bench/run.py``: it needs the network
or a pip cache, and it is slow.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIP = {".venv", ".git", ".pytest_cache", ".hypothesis", "test-artifacts", "__pycache__", "out"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", action="store_true", help="keep the copy")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from bench.run import _exclusive

    lock = _exclusive()  # noqa: F841  (never overlap a benchmark run)
    tmp = Path(tempfile.mkdtemp(prefix="tune_magic_cold_"))
    copy = tmp / "repo"
    home = tmp / "home"
    shutil.copytree(REPO, copy, ignore=lambda d, names: [n for n in names if n in SKIP or n.endswith(".egg-info")])
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["TUNE_MAGIC_HOME"] = str(home)
    pip_cache = Path.home() / ".cache" / "pip"
    try:
        t0 = time.perf_counter()
        setup = subprocess.run([str(copy / "scripts" / "setup-venv")], cwd=copy, env=env, capture_output=True, text=True)
        t1 = time.perf_counter()
        if setup.returncode != 0:
            print(setup.stdout[-3000:], setup.stderr[-3000:], file=sys.stderr)
            return 1
        demo = subprocess.run([str(copy / "scripts" / "demo"), "--out", str(tmp / "nb.ipynb")], cwd=copy, env=env,
                              capture_output=True, text=True)
        t2 = time.perf_counter()
        print(demo.stdout[-3000:])
        result = {
            "date": time.strftime("%Y-%m-%d"), "wall_s": round(t2 - t0, 1), "setup_s": round(t1 - t0, 1),
            "demo_s": round(t2 - t1, 1), "demo_exit": demo.returncode, "cpus": os.cpu_count(),
            "note": (f"pip's download cache {'existed' if pip_cache.is_dir() else 'did not exist'} at the start "
                     f"({pip_cache}); wheels came from the machine's local wheel dirs/indexes "
                     f"(PIP_FIND_LINKS={os.environ.get('PIP_FIND_LINKS', '-')}); the demo exited {demo.returncode}."),
        }
        (REPO / "bench" / "cold_demo.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1))
        return 0 if demo.returncode == 0 else 1
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
