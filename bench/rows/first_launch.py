"""Row 8: first launch in a fresh process (``import tune_magic``, then ``launch()`` returns), vs a warm
``import torch`` in a fresh process.

Each sample is a new ``python -c`` process. Timed inside it with ``perf_counter``, so interpreter
start-up counts on neither side:
- project: from before ``import tune_magic`` to ``tune_magic.launch(toy args)`` returning (the
  supervisor has recorded the torchrun pid; a real 2-process torchrun job of the test-only toy
  recipe). The child then records which of torch/torchtune/torchao it holds and stops the job.
  (a) with the tool cache (``$TUNE_MAGIC_HOME/cache/``) present; (b) with it deleted first, so the
  plan's torchrun option table and torchtune registry are read in a subprocess that imports torch.
- anchor: ``import torch`` alone.
One warm-up of each kind is discarded (it fills the page cache), then rounds of anchor, absent,
present, so drift in machine load hits all three alike. Median of N = 5 each (quick: 2).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from bench.common import REPO, fmt, leftovers, log, median, ratio, row, row_main, spread, toy_args

KEY, NUMBER = "first_launch", "8"
METRIC = "First launch in a fresh process (import tune_magic, then `launch()` returns)"
GOAL_PRESENT, GOAL_ABSENT = 0.25, 1.2
HEAVY = ("torch", "torchtune", "torchao")

ANCHOR = textwrap.dedent("""
    import json, time
    t = time.perf_counter()
    import torch
    print(json.dumps({"s": time.perf_counter() - t}))
""")

PROJECT = textwrap.dedent("""
    import json, sys, time
    t = time.perf_counter()
    import tune_magic
    t_import = time.perf_counter()
    job = tune_magic.launch(sys.argv[1])
    t_launch = time.perf_counter()
    heavy = sorted(m for m in %r if m in sys.modules)
    job.stop(grace_s=5)
    print(json.dumps({"s": t_launch - t, "import_s": t_import - t, "launch_s": t_launch - t_import,
                      "heavy": heavy, "id": job.id, "status": str(job.status)}))
""" % (HEAVY,))


def _child(code: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=dict(os.environ),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"child exited {proc.returncode}: {proc.stderr[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(quick: bool) -> list[dict]:
    n = 2 if quick else 5
    args = toy_args("steps=5")
    cache = Path(os.environ["TUNE_MAGIC_HOME"]) / "cache"
    samples: dict[str, list[dict]] = {"anchor": [], "absent": [], "present": []}
    ids: list[str] = []

    def one(kind: str) -> dict:
        if kind == "anchor":
            got = _child(ANCHOR)
        else:
            if kind == "absent":
                shutil.rmtree(cache, ignore_errors=True)
            elif not any(cache.glob("tools-*.json")):
                raise RuntimeError("the tool cache is missing before a 'present' sample")
            got = _child(PROJECT, args)
            ids.append(got["id"])
        return got

    for kind in samples:  # warm-up, discarded
        got = one(kind)
        log(f"warm-up {kind}: {got['s']:.3f} s")
    for i in range(n):
        for kind in samples:
            got = one(kind)
            samples[kind].append(got)
            log(f"round {i} {kind}: {got['s']:.3f} s" + (f" (import {got['import_s']:.3f} s, launch() "
                f"{got['launch_s']:.3f} s, heavy modules {got['heavy']})" if kind != "anchor" else ""))
    left = leftovers(ids)

    anchor_s = [s["s"] for s in samples["anchor"]]
    a_med = median(anchor_s)
    rows = []
    for kind, suffix, goal in (("present", "a", GOAL_PRESENT), ("absent", "b", GOAL_ABSENT)):
        s = samples[kind]
        secs = [x["s"] for x in s]
        med = median(secs)
        r = ratio(med, a_med, 3)
        heavy = sorted({m for x in s for m in x["heavy"]})
        met = r is not None and r <= goal and not heavy
        note = (f"cache {kind}: `import tune_magic` median {fmt(median([x['import_s'] for x in s]))}, "
                f"`launch()` median {fmt(median([x['launch_s'] for x in s]))}; heavy modules in the process after "
                f"`launch()` returned: {heavy or 'none'} (torch, torchtune, torchao checked). Job statuses after "
                f"stop: {sorted({x['status'] for x in s})}. Leftover processes: {len(left)}.")
        if kind == "absent":
            note += (" Without the cache the first plan reads torchrun's options and torchtune's registry in a "
                     "subprocess that imports torch, then writes the cache.")
        if not met:
            note += " Goal missed" + (f": {heavy} imported." if heavy else ".")
        rows.append(row(
            KEY, NUMBER + suffix, f"{METRIC}, tool cache {kind}",
            project=f"{fmt(med)} median",
            anchor=f"{fmt(a_med)} median (warm `import torch` in a fresh process)",
            ratio_text=f"{r}",
            goal=f"≤ {goal}× and no torch/torchtune imported", met=met,
            how=(f"new `python -c` per sample, timed inside it from before `import tune_magic` to `launch()` "
                 f"returning (toy recipe, 2 processes, real torchrun; stopped at once); 1 warm-up of each kind, "
                 f"then {n} rounds of anchor/absent/present"),
            spread_text=f"{spread(secs)}; anchor {spread(anchor_s)}",
            note=note,
            data={"samples": s, "anchor_s": anchor_s, "leftovers": left},
        ))
    return rows


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
