"""Row 7: the demo's wall time (``scripts/demo``, warm venv) and the recipe's 20-step time.

(a) ``scripts/demo --out <tmp>`` with a fresh ``TUNE_MAGIC_HOME``: ``setup-venv`` (a no-op when the
venv is current), then ``tune-magic demo`` executes ``notebooks/quickstart.ipynb`` in a real Jupyter
kernel. Wall time from start to exit; the exit status must be 0. The cold time (a fresh venv) is
measured by hand with ``bench/cold_demo.py`` and shown beside it when recorded.
(b) ``bench/bench_recipe.py``: tune_magic's LoRA recipe, 2 processes, 20 steps, launched with plain
``python -m torch.distributed.run`` vs ``tune run`` of the same recipe and config, alternated.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from time import perf_counter

from bench import bench_recipe
from bench.common import REPO, leftovers, log, median, row, row_main, spread

KEY, NUMBER = "demo_recipe", "7"
METRIC = "Demo wall time (`scripts/demo`, warm venv)"
RECIPE_GOAL_S = 60.0
COLD_FILE = REPO / "bench" / "cold_demo.json"


def demo() -> dict:
    home = Path(os.environ["TUNE_MAGIC_HOME"])
    out_nb = home / "quickstart.executed.ipynb"
    t = perf_counter()
    proc = subprocess.run([str(REPO / "scripts" / "demo"), "--out", str(out_nb)], cwd=REPO, env=dict(os.environ),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    wall = perf_counter() - t
    (home / "demo.stdout").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    m = re.search(r"ran in (\d+) s", proc.stdout)
    from tune_magic.registry import store as jobstore

    records = jobstore.list_records(home / "jobs") if (home / "jobs").is_dir() else []
    left = leftovers([r.id for r in records])
    return {"wall_s": wall, "exit": proc.returncode, "notebook_s": int(m[1]) if m else None,
            "jobs": [(r.id, r.name, r.status) for r in records], "leftovers": left,
            "stdout_tail": proc.stdout[-1500:], "stderr_tail": proc.stderr[-1500:]}


def run(quick: bool) -> list[dict]:
    d = demo()
    log(f"demo: {d['wall_s']:.1f} s, exit {d['exit']}, notebook {d['notebook_s']} s, jobs {d['jobs']}")
    rec = bench_recipe.main(["--quick"] if quick else ["--pairs", "3"])
    cold = json.loads(COLD_FILE.read_text()) if COLD_FILE.exists() else None
    cold_text = (f"cold (fresh venv, measured by hand with bench/cold_demo.py on {cold['date']}): "
                 f"{cold['wall_s']:.0f} s, of which venv set-up {cold['setup_s']:.0f} s"
                 if cold else "cold: not measured (bench/cold_demo.py)")
    ok = d["exit"] == 0 and all(s in ("succeeded", "stopped") for _, _, s in d["jobs"]) and len(d["jobs"]) == 3
    torchrun, tune = rec["median_torchrun_s"], rec["median_tune_run_s"]
    return [
        row(KEY, NUMBER + "a", METRIC,
            project=f"{d['wall_s']:.1f} s (notebook {d['notebook_s']} s)",
            anchor=cold_text,
            ratio_text=(f"warm/cold {d['wall_s'] / cold['wall_s']:.2f}" if cold else "—"),
            goal="— (README: \"about a minute on 2 CPU cores\")", met=None if ok else False,
            how="`scripts/demo --out TMP`, fresh TUNE_MAGIC_HOME, venv already set up; 1 run",
            spread_text="one run",
            note=(f"Exit {d['exit']}; jobs {[(n, s) for _, n, s in d['jobs']]}; leftover processes: "
                  f"{len(d['leftovers'])}. The notebook trains two 8-step 2-process LoRA jobs side by side, then "
                  "starts a third and stops it after 3 steps; most of the time is the jobs' torch start-up on "
                  "2 shared cores."),
            data=d),
        row(KEY, NUMBER + "b", "Recipe: tune_magic's LoRA recipe, 2 processes, 20 steps (bench_recipe.py)",
            project=f"{torchrun:.2f} s median (`torchrun`)", anchor=f"{tune:.2f} s median (plain `tune run`)",
            ratio_text=f"{torchrun / tune:.3f} (lower is better)",
            goal=f"< {RECIPE_GOAL_S:.0f} s", met=torchrun < RECIPE_GOAL_S,
            how=f"`bench/bench_recipe.py{' --quick' if quick else ''}`: {rec['pairs']} alternated pair(s), start to exit",
            spread_text=f"torchrun {spread(rec['torchrun_s'], digits=2)}; tune run {spread(rec['tune_run_s'], digits=2)}",
            data=rec),
    ]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
