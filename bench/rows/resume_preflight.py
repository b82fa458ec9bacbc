"""Row 12: the resume pre-flight on a 70B-shaped ``output_dir``, vs ``os.stat`` of every file in it.

The ``output_dir`` is what torchtune 0.6.1's FullModelHFCheckpointer leaves after two of three
epochs of a Llama-3.1-70B fine-tune, with the real sizes, written sparsely (apparent sizes real,
almost nothing on disk):

- 12a, full fine-tune (``full_finetune_distributed``): ``epoch_0/`` and ``epoch_1/`` with 30
  safetensors shards each (``model-000NN-of-00030.safetensors``, Llama-3.1-70B's 723 tensors in
  bf16, ~4.7 GB a shard: a real header, then a hole where the data goes) and the weight index,
  and ``recipe_state/recipe_state.pt``: a real ``torch.save`` file (written under
  ``torch.serialization.skip_data`` from FakeTensors, so its storages are holes) holding AdamW's
  ``exp_avg`` and ``exp_avg_sq`` for every parameter in bf16 (~282 GB), the seed, epochs and the
  data-loader state. Reading it whole would take many minutes.
- 12b, LoRA (``lora_finetune_distributed``, torchtune's ``llama3_1/70B_lora`` adapters: rank 16 on
  q/k/v/output and the MLP): the same two ``epoch_K/`` folders with the merged shards plus
  ``adapter_model.pt`` (real torch file, sparse), ``adapter_model.safetensors`` and
  ``adapter_config.json``, and a recipe state with the adapters' optimizer state.

Project: a fresh ``python -c`` process per sample, timed inside it from before ``from
tune_magic.checkpoints.preflight import preflight`` to ``preflight(...)`` returning (imports included: the
first resume in a kernel pays them); it also checks the answer (epoch_1, the 30 shards pinned) and
that torch was never imported. Anchor: a fresh process timing ``os.stat`` of every file under the
``output_dir`` (``os.walk``), the least any look at the checkpoints costs. One warm-up of each, then
alternated rounds; medians. Goal: ≤ 0.5 s. Also reported: ``import torch`` +
``torch.load(recipe_state.pt, weights_only=True, mmap=True)`` in a fresh process (safe and lazy
too, but it needs torch, which a kernel must not import; and it maps the whole file at once, which
the kernel refuses for a file larger than the address space it allows: measured here with 23 GiB
of RAM, a 282 GB recipe state fails with ENOMEM).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from bench.common import REPO, fmt, log, median, ratio, row, row_main, spread

KEY, NUMBER = "resume_preflight", "12"
METRIC = "Resume pre-flight on a 70B-shaped output_dir (sparse shards of the real sizes, real recipe_state.pt)"
GOAL_S = 0.5
SHARDS = 30
# Llama-3.1-70B (HF names, bf16)
HIDDEN, KV, FFN, VOCAB, LAYERS = 8192, 1024, 28672, 128256, 80
LORA_RANK = 16

PROJECT = textwrap.dedent("""
    import json, sys, time
    t = time.perf_counter()
    from tune_magic.checkpoints.preflight import preflight
    p = preflight(sys.argv[1], sys.argv[2], config=sys.argv[3])
    s = time.perf_counter() - t
    print(json.dumps({"s": s, "epoch": p.epoch, "files": len(p.files), "case": p.case,
                      "optimizer_bytes": p.recipe_state.tensor_bytes, "torch": "torch" in sys.modules}))
""")

ANCHOR = textwrap.dedent("""
    import json, os, sys, time
    t = time.perf_counter()
    n = 0
    for root, dirs, files in os.walk(sys.argv[1]):
        for f in files:
            os.stat(os.path.join(root, f))
            n += 1
    print(json.dumps({"s": time.perf_counter() - t, "files": n}))
""")

TORCH_LOAD = textwrap.dedent("""
    import json, sys, time
    t = time.perf_counter()
    import torch
    try:
        sd = torch.load(sys.argv[1], weights_only=True, mmap=True)
        print(json.dumps({"s": time.perf_counter() - t, "error": None}))
    except Exception as exc:  # e.g. mmap of a file larger than the address space the kernel allows
        print(json.dumps({"s": time.perf_counter() - t, "error": f"{type(exc).__name__}: {exc}"[:200]}))
""")


def hf_tensors() -> list[tuple[str, tuple[int, ...]]]:
    """Llama-3.1-70B's tensors in HF order (name, shape)."""
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (HIDDEN,)), (p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN)),
                (p + "self_attn.k_proj.weight", (KV, HIDDEN)), (p + "self_attn.v_proj.weight", (KV, HIDDEN)),
                (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)), (p + "post_attention_layernorm.weight", (HIDDEN,)),
                (p + "mlp.gate_proj.weight", (FFN, HIDDEN)), (p + "mlp.up_proj.weight", (FFN, HIDDEN)),
                (p + "mlp.down_proj.weight", (HIDDEN, FFN))]
    return out + [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def write_sparse_safetensors(path: Path, tensors: list[tuple[str, tuple[int, ...]]]) -> int:
    """A safetensors file with a real header and a hole for the bf16 data; returns its size."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        nbytes = _numel(shape) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads its header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
    return 8 + len(text) + offset


def write_shards(folder: Path) -> int:
    """30 sparse shards of the real sizes, split as evenly as whole tensors allow, plus the index."""
    folder.mkdir(parents=True)
    tensors = hf_tensors()
    total = sum(_numel(s) * 2 for _, s in tensors)
    per, groups, cur, acc = total / SHARDS, [], [], 0
    for t in tensors:
        cur.append(t)
        acc += _numel(t[1]) * 2
        if acc >= per * (len(groups) + 1) and len(groups) < SHARDS - 1:
            groups.append(cur)
            cur = []
    groups.append(cur)
    weight_map = {}
    size = 0
    for i, group in enumerate(groups, 1):
        name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        size += write_sparse_safetensors(folder / name, group)
        weight_map.update({n: name for n, _ in group})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                      "weight_map": weight_map}))
    for extra in ("config.json", "generation_config.json"):
        (folder / extra).write_text("{}")
    return size


def tune_names() -> list[tuple[str, tuple[int, ...]]]:
    """The same parameters under torchtune's names (optimizer state keys)."""
    out = [("tok_embeddings.weight", (VOCAB, HIDDEN))]
    for i in range(LAYERS):
        p = f"layers.{i}."
        out += [(p + "sa_norm.scale", (HIDDEN,)), (p + "attn.q_proj.weight", (HIDDEN, HIDDEN)),
                (p + "attn.k_proj.weight", (KV, HIDDEN)), (p + "attn.v_proj.weight", (KV, HIDDEN)),
                (p + "attn.output_proj.weight", (HIDDEN, HIDDEN)), (p + "mlp_norm.scale", (HIDDEN,)),
                (p + "mlp.w1.weight", (FFN, HIDDEN)), (p + "mlp.w3.weight", (FFN, HIDDEN)),
                (p + "mlp.w2.weight", (HIDDEN, FFN))]
    return out + [("norm.scale", (HIDDEN,)), ("output.weight", (VOCAB, HIDDEN))]


def lora_names() -> list[tuple[str, tuple[int, ...]]]:
    """torchtune's llama3_1/70B_lora adapters: rank 16 on q, k, v, output_proj and w1, w2, w3."""
    out = []
    dims = {"attn.q_proj": (HIDDEN, HIDDEN), "attn.k_proj": (HIDDEN, KV), "attn.v_proj": (HIDDEN, KV),
            "attn.output_proj": (HIDDEN, HIDDEN), "mlp.w1": (HIDDEN, FFN), "mlp.w3": (HIDDEN, FFN),
            "mlp.w2": (FFN, HIDDEN)}
    for i in range(LAYERS):
        for mod, (d_in, d_out) in dims.items():
            out += [(f"layers.{i}.{mod}.lora_a.weight", (LORA_RANK, d_in)),
                    (f"layers.{i}.{mod}.lora_b.weight", (d_out, LORA_RANK))]
    return out


def write_torch_sparse(path: Path, build) -> int:
    """``torch.save`` of ``build()`` (made of FakeTensors) with its storages left as holes."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        obj = build(torch)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.serialization.skip_data(materialize_fake_tensors=True):
        torch.save(obj, path)
    return path.stat().st_size


def recipe_state(params):
    def build(torch):
        state = {name: {"step": torch.tensor(2000.0), "exp_avg": torch.empty(shape, dtype=torch.bfloat16),
                        "exp_avg_sq": torch.empty(shape, dtype=torch.bfloat16)} for name, shape in params}
        return {"optimizer": {"state": state, "param_groups": [{"lr": 2e-5, "weight_decay": 0.01, "initial_lr": 2e-5,
                                                                "params": [n for n, _ in params]}]},
                "seed": 1234, "epochs_run": 2, "total_epochs": 3, "max_steps_per_epoch": None,
                "dataloader": {"_sampler_iter_yielded": 6500, "_num_yielded": 6500, "_iterator_finished": True}}
    return build


def make_output_dir(root: Path, kind: str) -> dict:
    """Write the 70B-shaped output_dir of ``kind`` (``"full"`` or ``"lora"``) and a config; return facts."""
    out = root / f"out_{kind}"
    base = root / "base"
    base.mkdir(exist_ok=True)
    (base / "config.json").write_text("{}")
    apparent = 0
    for k in (0, 1):
        apparent += write_shards(out / f"epoch_{k}")
        if kind == "lora":
            apparent += write_torch_sparse(out / f"epoch_{k}" / "adapter_model.pt",
                                           lambda torch: {n: torch.empty(s, dtype=torch.bfloat16) for n, s in lora_names()})
            apparent += write_sparse_safetensors(out / f"epoch_{k}" / "adapter_model.safetensors", lora_names())
            (out / f"epoch_{k}" / "adapter_config.json").write_text(json.dumps({"r": LORA_RANK, "peft_type": "LORA"}))
    params = tune_names() if kind == "full" else lora_names()
    state_size = write_torch_sparse(out / "recipe_state" / "recipe_state.pt", recipe_state(params))
    apparent += state_size
    (out / "logs").mkdir()
    config = root / f"{kind}.yaml"
    config.write_text(json.dumps({  # JSON is YAML
        "output_dir": str(out), "epochs": 3, "max_steps_per_epoch": None, "seed": 1234, "device": "cuda",
        "checkpointer": {"_component_": "torchtune.training.FullModelHFCheckpointer", "checkpoint_dir": str(base),
                         "checkpoint_files": {"filename_format": "model-{}-of-{}.safetensors", "max_filename": "00030"},
                         "recipe_checkpoint": None, "output_dir": "${output_dir}", "model_type": "LLAMA3"},
        "save_adapter_weights_only": False}))
    used = sum(f.stat().st_blocks * 512 for f in out.rglob("*") if f.is_file())
    return {"out": out, "config": config, "apparent": apparent, "disk": used, "state_size": state_size,
            "files": sum(1 for f in out.rglob("*") if f.is_file())}


def _child(code: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=dict(os.environ),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"child exited {proc.returncode}: {proc.stderr[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(quick: bool) -> list[dict]:
    n = 3 if quick else 9
    tt = Path(__import__("importlib").util.find_spec("torchtune").origin).parents[1] / "recipes"
    recipes = {"full": str(tt / "full_finetune_distributed.py"), "lora": str(tt / "lora_finetune_distributed.py")}
    root = Path(tempfile.mkdtemp(prefix="tune_magic_bench_70b_"))
    rows = []
    try:
        for kind, suffix in (("full", "a"), ("lora", "b")):
            facts = make_output_dir(root, kind)
            log(f"{kind}: {facts['files']} files, {facts['apparent'] / 1e9:.0f} GB apparent, "
                f"{facts['disk'] / 1e6:.1f} MB on disk; recipe_state.pt {facts['state_size'] / 1e9:.1f} GB")
            proj_args = (recipes[kind], str(facts["out"]), str(facts["config"]))
            samples: dict[str, list[dict]] = {"anchor": [], "project": []}
            for kind_ in samples:  # warm-up, discarded
                _child(ANCHOR if kind_ == "anchor" else PROJECT, *((str(facts["out"]),) if kind_ == "anchor" else proj_args))
            for i in range(n):
                samples["anchor"].append(_child(ANCHOR, str(facts["out"])))
                samples["project"].append(_child(PROJECT, *proj_args))
                log(f"round {i} {kind}: preflight {samples['project'][-1]['s']:.4f} s, "
                    f"stat walk {samples['anchor'][-1]['s']:.4f} s")
            alt = _child(TORCH_LOAD, str(facts["out"] / "recipe_state" / "recipe_state.pt"))
            p_s = [x["s"] for x in samples["project"]]
            a_s = [x["s"] for x in samples["anchor"]]
            pm, am = median(p_s), median(a_s)
            last = samples["project"][-1]
            right = all(x["epoch"] == 1 and not x["torch"] for x in samples["project"])
            right = right and (last["files"] == SHARDS + 1 if kind == "full" else last["files"] == 2)
            met = pm is not None and pm <= GOAL_S and right
            note = (f"{kind}: {facts['files']} files, {facts['apparent'] / 1e9:.0f} GB apparent "
                    f"({facts['disk'] / 1e6:.1f} MB on disk); recipe_state.pt {facts['state_size'] / 1e9:.1f} GB "
                    f"(optimizer tensors {last['optimizer_bytes'] / 1e9:.1f} GB, read: only its data.pkl). "
                    f"Answer checked every sample: epoch_1 pinned, {last['files']} files loaded by the resume, "
                    f"case {last['case']}, torch never imported: {right}. Alternative, `import torch` + "
                    f"`torch.load(recipe_state.pt, weights_only=True, mmap=True)` in a fresh process: "
                    + (f"{alt['s']:.3f} s (safe and lazy too, but it needs torch)." if not alt["error"] else
                       f"failed after {alt['s']:.3f} s: {alt['error']} (it maps the whole file at once)."))
            if not met:
                note += " Goal missed."
            rows.append(row(
                KEY, NUMBER + suffix, f"{METRIC}, {'full fine-tune' if kind == 'full' else 'LoRA'}",
                project=f"{fmt(pm, digits=4)} median", anchor=f"{fmt(am, digits=4)} median (`os.stat` of all {facts['files']} files)",
                ratio_text=f"{ratio(pm, am, 1)}", goal=f"≤ {GOAL_S} s", met=met,
                how=(f"fresh `python -c` per sample, timed inside from before `from tune_magic.checkpoints.preflight import "
                     f"preflight` to its return; anchor a fresh process walking and stat-ing the output_dir; "
                     f"1 warm-up each, then {n} alternated rounds"),
                spread_text=f"{spread(p_s, digits=4)}; anchor {spread(a_s, digits=4)}",
                note=note,
                data={"project_s": p_s, "anchor_s": a_s, "torch_load_s": alt["s"], "apparent_bytes": facts["apparent"],
                      "disk_bytes": facts["disk"], "files": facts["files"]},
            ))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


if __name__ == "__main__":
    row_main(run, KEY, NUMBER, METRIC)
