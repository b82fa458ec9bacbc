"""Row 18: one checkpoint's evaluation as tune_magic runs it vs a hand-written loop (issue 28).

Set-up: torchtune 0.6.1's ``lora_finetune_single_device`` trains the tiny model for one epoch (no
validation), leaving ``epoch_0/`` (merged LoRA weights).

Project: :func:`tune_magic.job.evaluate.launch_evaluation` of that folder, the way the evaluator
launches it (a job of its own: ``recipes/validate_checkpoint.py`` with the job's config and
overrides, the held-out last 10% of the data as ``dataset_val``), to the job's end
(``Job.wait``): registration, the supervisor, the interpreter's start-up and imports, the model
and data built, the loop, the result written.

Anchor: a hand-written evaluation in one fresh process (``python -c``), timed from before the
process starts to its exit: torchtune's components built by hand (the llama2 builder, the
checkpointer reading ``epoch_0/``, the tokenizer, ``instruct_dataset`` on the same split,
``padded_collate_sft``, ``CEWithChunkedOutputLoss``), one loop over the same data in eval mode
without gradients, summing the loss times the label tokens. Both values must agree (1e-4
relative). Goal: ≤ 1.2× (start-up counted on both sides). 1 warm-up of each, then alternated rounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bench.common import REPO, alternated, log, median, ratio, row, row_main, spread

KEY, NUMBER = "eval_checkpoint", "18"
METRIC = "One checkpoint's evaluation (tune_magic's evaluation job, to its end) vs a hand-written loop in one process"
GOAL = 1.2
TRAIN = "lora_finetune_single_device --config tiny/builtin_lora_single epochs=1 max_steps_per_epoch=4"

ANCHOR = textwrap.dedent("""
    import json, sys, time
    import torch
    from functools import partial
    from torch.utils.data import DataLoader
    from torchtune.data import padded_collate_sft
    from torchtune.datasets import instruct_dataset
    from torchtune.models.llama2 import llama2_tokenizer, lora_llama2
    from torchtune.modules.loss import CEWithChunkedOutputLoss
    from torchtune.training import FullModelHFCheckpointer, MODEL_KEY
    folder, data, tok_path, out = sys.argv[1:5]
    tok = llama2_tokenizer(tok_path, max_seq_len=64, prompt_template=None)
    ds = instruct_dataset(tok, source="json", data_files=data, split="train[90%:]",
                          column_map={"input": "instruction", "output": "output"}, train_on_input=False)
    files = sorted(p.rsplit("/", 1)[-1] for p in __import__("glob").glob(folder + "/model-*.safetensors"))
    ckpt = FullModelHFCheckpointer(checkpoint_dir=folder, checkpoint_files=files, output_dir=out, model_type="LLAMA2")
    model = lora_llama2(lora_attn_modules=["q_proj", "v_proj", "output_proj"], apply_lora_to_mlp=True,
                        apply_lora_to_output=True, vocab_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
                        embed_dim=64, intermediate_dim=128, max_seq_len=256, norm_eps=1e-5, lora_rank=8,
                        lora_alpha=16, lora_dropout=0.0)
    state = ckpt.load_checkpoint()[MODEL_KEY]
    for name, p in model.named_parameters():
        if "lora_" in name:
            state[name] = torch.zeros_like(p)  # merged weights: the adapter adds nothing
    model.load_state_dict(state)
    loss_fn = CEWithChunkedOutputLoss()
    model.set_num_output_chunks(loss_fn.num_output_chunks)
    model.eval()
    collate = partial(padded_collate_sft, padding_idx=tok.pad_id, ignore_idx=loss_fn.ignore_index)
    total, tokens = 0.0, 0
    with torch.no_grad():
        for batch in DataLoader(ds, batch_size=2, collate_fn=collate):
            labels = torch.hstack((batch["labels"][..., 1:], torch.full_like(batch["labels"][..., :1], -100)))
            n = int((labels != -100).sum())
            total += float(loss_fn(model(batch["tokens"]), labels)) * n
            tokens += n
    print(json.dumps({"val_loss": total / tokens}))
""")


def _train(home: Path) -> tuple:
    """The training job whose ``epoch_0/`` is evaluated, and its record."""
    import tune_magic

    job = tune_magic.launch(TRAIN, cwd=REPO)
    assert job.wait(600) == "succeeded", job.tail(20)
    return job, job.record


def run(quick: bool) -> list[dict]:
    import tune_magic
    from tune_magic.job.evaluate import launch_evaluation

    rounds = 1 if quick else 5
    assets = tune_magic.make_assets()
    home = Path(os.environ["TUNE_MAGIC_HOME"])
    train, record = _train(home)
    folder = Path(record.output_dir) / "epoch_0"
    # the evaluator's launch, as for a job that had --val-split 0.1 (the same split by hand below)
    from tune_magic.checkpoints.validation import val_split_overrides
    from tune_magic.config.tuneparse import recipe_config
    from tune_magic.registry.record import overrides_of

    record.overrides = overrides_of(record) + val_split_overrides(recipe_config(record.config, overrides_of(record)), 0.1)
    values: dict[str, list[float]] = {"project": [], "anchor": []}

    def project(_i: int) -> dict:
        t = time.perf_counter()
        ev = launch_evaluation(record, str(folder), 0, 4, env=dict(os.environ), root=home / "jobs")
        status = ev.wait(600)
        s = time.perf_counter() - t
        assert status == "succeeded", ev.tail(20)
        values["project"].append(json.loads((Path(ev.record.output_dir) / "val_loss.json").read_text())["val_loss"])
        return {"s": s}

    def anchor(i: int) -> dict:
        out = home / f"anchor-{i}-{time.time_ns()}"
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", ANCHOR, str(folder), str(assets.dataset_path),
                            str(assets.tokenizer_path), str(out)], capture_output=True, text=True, cwd=str(home))
        s = time.perf_counter() - t
        assert r.returncode == 0, r.stderr[-2000:]
        values["anchor"].append(json.loads(r.stdout.strip().splitlines()[-1])["val_loss"])
        return {"s": s}

    if not quick:  # quick mode (CI) reports without a warm-up
        log("warm-up")
        project(-1), anchor(-1)
    p, a = alternated(rounds, project, anchor)
    ps, as_ = [x["s"] for x in p], [x["s"] for x in a]
    agree = all(abs(x - values["anchor"][0]) <= 1e-4 * abs(values["anchor"][0]) for x in values["project"] + values["anchor"])
    r = ratio(median(ps), median(as_))
    return [row(KEY, NUMBER, METRIC, f"{median(ps):.2f} s median (launch to the job's end)",
                f"{median(as_):.2f} s median (hand-written loop, fresh process)", f"{r:.3f}", f"≤ {GOAL}×",
                r is not None and r <= GOAL and agree,
                f"tiny LoRA epoch_0 (merged), 13 validation examples, batch 2; {rounds} alternated round(s) after a "
                f"warm-up of each; values agree within 1e-4: {agree}",
                f"{spread(ps)}; anchor {spread(as_)}", data={"project_s": ps, "anchor_s": as_, "values": values})]


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
