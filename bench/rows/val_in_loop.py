"""Row 20: in-loop validation every N steps costs no more than the forward passes it needs (issue 28).

tune_magic's ``lora_finetune`` recipe, one process, ``tiny/lora_val`` (trains on the first 90% of the
tiny data), 20 steps:

- with validation: ``run_val_every_n_steps=5`` (passes at steps 5, 10, 15, 20; the epoch's end
  falls on step 20, validated once), each over the 13 held-out examples;
- without: ``tiny/lora`` (the same config without the validation keys) with
  ``dataset.split=train[:90%]``: the same training data, the same steps.

Both wall times are the recipe's process from start to exit (imports included). The floor is what
the passes themselves take: 1 + (the seconds the recipe spent inside its validation passes, from
its own ``Validation loss: X (S s)`` lines) / (the run without validation). Goal: the ratio with /
without is at most the floor plus 0.05 (nothing but the passes: building the val loader is once,
its share is in the 0.05). Alternated rounds after a warm-up of each; medians.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO, alternated, log, median, row, row_main, spread

KEY, NUMBER = "val_in_loop", "20"
METRIC = "In-loop validation every 5 steps (tune_magic's LoRA recipe, 20 steps): wall with / without, vs the floor"
RECIPE = REPO / "recipes" / "lora_finetune.py"
CONFIG = REPO / "recipes" / "configs" / "tiny" / "lora_val.yaml"
PLAIN = REPO / "recipes" / "configs" / "tiny" / "lora.yaml"
PASS = re.compile(r"Validation loss: \S+ \((\d+\.\d+) s\)")


def _run(home: Path, config: Path, extra: list[str], tag: str) -> tuple[float, float, int]:
    """(wall seconds, seconds inside validation passes, passes) of one recipe run."""
    out = home / f"{tag}-{time.time_ns()}"
    argv = [sys.executable, str(RECIPE), "--config", str(config), f"output_dir={out}", "max_steps_per_epoch=20",
            "epochs=1", *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    t = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, cwd=str(REPO), env=env)
    s = time.perf_counter() - t
    assert r.returncode == 0, r.stderr[-3000:]
    passes = [float(x) for x in PASS.findall(r.stderr + r.stdout)]
    return s, sum(passes), len(passes)


def run(quick: bool) -> list[dict]:
    import tune_magic

    tune_magic.make_assets()
    home = Path(os.environ["TUNE_MAGIC_HOME"])
    rounds = 1 if quick else 5
    inside: list[float] = []
    counts: list[int] = []

    def project(_i: int) -> dict:
        s, val_s, n = _run(home, CONFIG, ["run_val_every_n_steps=5"], "val")
        inside.append(val_s)
        counts.append(n)
        return {"s": s}

    def anchor(_i: int) -> dict:
        s, _, n = _run(home, PLAIN, ["dataset.split=train[:90%]"], "plain")
        assert n == 0
        return {"s": s}

    if not quick:  # quick mode (CI) reports without a warm-up
        log("warm-up")
        project(-1), anchor(-1)
    inside.clear(), counts.clear()
    p, a = alternated(rounds, project, anchor)
    ps, as_ = [x["s"] for x in p], [x["s"] for x in a]
    r = median(ps) / median(as_)
    floor = 1 + median(inside) / median(as_)
    met = r <= floor + 0.05 and set(counts) == {4}
    return [row(KEY, NUMBER, METRIC, f"{median(ps):.2f} s median (4 validations of 13 examples)",
                f"{median(as_):.2f} s median (no validation)", f"{r:.3f} (floor {floor:.3f})",
                "≤ floor + 0.05", met,
                f"`recipes/lora_finetune.py`, 1 process, tiny/lora_val, 20 steps; the floor is 1 + the seconds inside "
                f"the validation passes (the recipe's own lines: median {median(inside):.3f} s per run) / the run "
                f"without; {rounds} alternated round(s) after a warm-up of each",
                f"{spread(ps)}; anchor {spread(as_)}; passes {spread(inside)}",
                data={"with_s": ps, "without_s": as_, "passes_s": inside, "passes": counts})]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
