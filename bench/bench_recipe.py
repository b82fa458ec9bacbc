"""Time a 2-process, 20-step tiny LoRA run: plain torchrun vs ``tune run``, alternated.

Both launch the same recipe and config from the repo root (cwd), with the same overrides:

    A  python -m torch.distributed.run --standalone --nproc_per_node 2 <abs recipes/lora_finetune.py> ...
    B  tune run --nproc_per_node 2 recipes/lora_finetune.py --config recipes/configs/tiny/lora.yaml ...

Runs alternate (A B, B A, A B, ...) so drift in machine load hits both sides alike. Each run's
wall time covers process start to exit (imports, rendezvous, training, checkpoint, teardown).
A run counts only if it exits 0 and its DiskLogger file has one line per step.

Usage::

    .venv/bin/python bench/bench_recipe.py            # 3 pairs
    .venv/bin/python bench/bench_recipe.py --quick    # 1 pair

Prints one JSON object on stdout (times in seconds, ``ratio_tune_run_over_torchrun`` > 1 means
``tune run`` is slower) with the machine's CPU count. Assets and run outputs go to a temporary
TUNE_MAGIC_HOME that is removed afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE_REL = "recipes/lora_finetune.py"
CONFIG_REL = "recipes/configs/tiny/lora.yaml"


def _argv(kind: str, steps: int, output_dir: Path) -> list[str]:
    overrides = [f"output_dir={output_dir}", "epochs=1", f"max_steps_per_epoch={steps}"]
    if kind == "torchrun":
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            str(REPO / RECIPE_REL), "--config", str(REPO / CONFIG_REL), *overrides,
        ]  # fmt: skip
    tune = Path(sys.executable).with_name("tune")
    return [str(tune), "run", "--nproc_per_node", "2", RECIPE_REL, "--config", CONFIG_REL, *overrides]


def _run_once(kind: str, steps: int, home: Path, index: int) -> float:
    """Run one job; return its wall time in seconds. Raises RuntimeError if it did not train."""
    output_dir = home / "runs" / f"{index:02d}_{kind}"
    env = dict(os.environ, TUNE_MAGIC_HOME=str(home), HF_HOME=str(home / "hf"))
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    log = home / f"{index:02d}_{kind}.log"
    start = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.run(
            _argv(kind, steps, output_dir),
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=600,
        )
    wall = time.perf_counter() - start
    logs = sorted((output_dir / "logs").glob("log_*.txt"))
    lines = logs[0].read_text().splitlines() if len(logs) == 1 else []
    if proc.returncode != 0 or len(lines) != steps:
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{kind} run {index}: exit {proc.returncode}, {len(lines)} log lines\n{tail}")
    return wall


def _machine() -> dict:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": metadata.version("torch"),
        "torchtune": metadata.version("torchtune"),
    }


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark and print (and return) the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="alternated pairs of runs (default 3)")
    parser.add_argument("--quick", action="store_true", help="one pair")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run (default 20)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary TUNE_MAGIC_HOME")
    args = parser.parse_args(argv)
    pairs = 1 if args.quick else args.pairs

    sys.path.insert(0, str(REPO))
    from tune_magic.assets import make_assets

    machine = _machine()
    home = Path(tempfile.mkdtemp(prefix="tune_magic_bench_"))
    try:
        make_assets(home / "assets")
        times: dict[str, list[float]] = {"torchrun": [], "tune_run": []}
        index = 0
        for pair in range(pairs):
            order = ("torchrun", "tune_run") if pair % 2 == 0 else ("tune_run", "torchrun")
            for kind in order:
                times[kind].append(round(_run_once(kind, args.steps, home, index), 3))
                index += 1
    finally:
        if args.keep:
            print(f"kept {home}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)

    med_a, med_b = statistics.median(times["torchrun"]), statistics.median(times["tune_run"])
    result = {
        "benchmark": "tiny LoRA, 2 processes, CPU, gloo",
        "steps": args.steps,
        "pairs": pairs,
        "machine": machine,
        "torchrun_s": times["torchrun"],
        "tune_run_s": times["tune_run"],
        "median_torchrun_s": round(med_a, 3),
        "median_tune_run_s": round(med_b, 3),
        "ratio_tune_run_over_torchrun": round(med_b / med_a, 3),
        "loadavg_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
