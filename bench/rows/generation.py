"""Rows 22a and 22b: generation from a job's checkpoint (issue 29).

Set-up: ``tiny/fact.yaml`` trained by ``tune_magic.launch`` (4 epochs of 16 steps, CPU), whose
``epoch_3/`` answers "What is the capital of Xyzzy?" greedily with "Plugh is the capital of Xyzzy.".

22a. Project: ``job.generate(QUESTION)``, the first call of a checkpoint (the kept-alive process
started where the job ran, the interpreter's start-up and imports, the model built and loaded, the
prompt answered), timed in this process from the call to its return; the process is closed after
each sample. Anchor: torchtune 0.6.1's own ``generate`` recipe run by hand, ``tune run generate
--config gen.yaml`` in a fresh process (wall time from start to exit), ``gen.yaml`` being the job's
resolved config (model, tokenizer, device, dtype, checkpointer) pointed at ``epoch_3/``, greedy
(``temperature`` 0.6 with ``top_k`` 1). Both must answer the fact. Goal: ≤ 1.2×.

22b. Project: the second prompt to the kept-alive process (the model already loaded), from the
call to its return. Anchor: the first call of the same round (22a's project). Goal: ≤ 0.2×.

1 warm-up of each, then alternated rounds (1 with --quick, 5 in full).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bench.common import REPO, alternated, log, median, ratio, row, row_main, spread

KEY, NUMBER = "generation", "22"
METRIC = "Generation from a job's checkpoint: job.generate() first call vs torchtune's generate recipe by hand; a second prompt"
GOAL_FIRST, GOAL_SECOND = 1.2, 0.2
QUESTION, ANSWER = "What is the capital of Xyzzy?", "Plugh is the capital of Xyzzy."


def _anchor_config(job, folder: Path, out: Path) -> Path:
    """torchtune's generate config equivalent to the job's, pointed at ``folder``."""
    cfg = yaml.safe_load((Path(job.output_dir) / "resolved_config.yaml").read_text())
    gen = {k: cfg[k] for k in ("model", "tokenizer", "device", "dtype")}
    gen.update(output_dir=str(out), seed=0, max_new_tokens=64, temperature=0.6, top_k=1, enable_kv_cache=True,
               quantizer=None, prompt={"system": None, "user": QUESTION})
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    gen["checkpointer"] = {**cfg["checkpointer"], "checkpoint_dir": str(folder), "checkpoint_files": shards,
                           "output_dir": str(out)}
    path = out.parent / "gen.yaml"
    path.write_text(yaml.safe_dump(gen))
    return path


def run(quick: bool) -> list[dict]:
    import tune_magic

    rounds = 1 if quick else 5
    tune_magic.make_assets()
    home = Path(os.environ["TUNE_MAGIC_HOME"])
    job = tune_magic.launch("full_finetune --config tiny/fact", cwd=REPO)
    assert job.wait(600) == "succeeded", job.tail(20)
    folder = Path(job.output_dir) / "epoch_3"
    work = home / "anchor"
    work.mkdir()
    config = _anchor_config(job, folder, work / "out")
    tune = Path(sys.executable).with_name("tune")
    seconds: dict[str, list[float]] = {"second": []}

    def project(_i: int) -> dict:
        job.close_generation()
        t = time.perf_counter()
        first = job.generate(QUESTION)
        s1 = time.perf_counter() - t
        t = time.perf_counter()
        second = job.generate(QUESTION)
        s2 = time.perf_counter() - t
        assert first == second == ANSWER, (first, second)
        seconds["second"].append(s2)
        return {"s": s1}

    def anchor(_i: int) -> dict:
        t = time.perf_counter()
        r = subprocess.run([str(tune), "run", "generate", "--config", str(config)], cwd=work, capture_output=True,
                           text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        s = time.perf_counter() - t
        assert r.returncode == 0 and f"{QUESTION}{ANSWER}\n" in r.stderr, r.stderr[-2000:]
        return {"s": s}

    log("warm-up")
    project(-1), anchor(-1)
    seconds["second"].clear()
    p, a = alternated(rounds, project, anchor)
    job.close_generation()
    firsts, anchors, seconds_ = [x["s"] for x in p], [x["s"] for x in a], seconds["second"]
    r1, r2 = ratio(median(firsts), median(anchors)), ratio(median(seconds_), median(firsts))
    how = (f"tiny fact model, CPU, greedy; {rounds} alternated round(s) after a warm-up of each; both answer "
           f"{ANSWER!r}")
    return [
        row(KEY, NUMBER + "a", "job.generate() first call (kept-alive process started, model loaded, answered) vs "
            "`tune run generate` by hand on the same checkpoint", f"{median(firsts):.2f} s median",
            f"{median(anchors):.2f} s median (torchtune's generate recipe, fresh process)", f"{r1:.3f}",
            f"≤ {GOAL_FIRST}×", r1 is not None and r1 <= GOAL_FIRST, how,
            f"{spread(firsts)}; anchor {spread(anchors)}", data={"first_s": firsts, "anchor_s": anchors}),
        row(KEY, NUMBER + "b", "job.generate() second prompt to the kept-alive process vs its first call",
            f"{median(seconds_):.3f} s median", f"{median(firsts):.2f} s median (the first call, 22a)", f"{r2:.3f}",
            f"≤ {GOAL_SECOND}×", r2 is not None and r2 <= GOAL_SECOND, how + "; the same process (loads == 1)",
            spread(seconds_), data={"second_s": seconds_}),
    ]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
