"""Write ``epoch_N/`` folders as torchtune 0.6.1's checkpointers lay them out, small and real.

Weights are real safetensors files (numpy, no torch); ``adapter_model.pt`` is a real
``torch.save`` file (torch imported only when one is asked for). Used by the tests of
tune_magic.checkpoints.catalog / retention / diskspace / export.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

#: A two-tensor "model" in HF names, and a LoRA adapter of rank 2 on q_proj (torchtune names).
MODEL = {"model.layers.0.self_attn.q_proj.weight": (8, 8), "lm_head.weight": (16, 8)}
ADAPTER = {"layers.0.attn.q_proj.lora_a.weight": (2, 8), "layers.0.attn.q_proj.lora_b.weight": (8, 2)}
PEFT = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": (2, 8),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": (8, 2)}


def arrays(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def write_shards(folder: Path, shards: int = 1, ext: str = "safetensors", index: bool = True) -> list[str]:
    """The model split over ``shards`` files (one tensor per file, the rest in the last), and the index."""
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"model-{i:05d}-of-{shards:05d}.{ext}" for i in range(1, shards + 1)]
    tensors = arrays(MODEL)
    weight_map = {}
    for i, name in enumerate(names):
        part = dict(list(tensors.items())[i:i + 1] if i < shards - 1 else list(tensors.items())[i:])
        if ext == "safetensors":
            save_file(part, str(folder / name), metadata={"format": "pt"})
        else:
            torch_save({k: v for k, v in part.items()}, folder / name)
        weight_map.update({k: name for k in part})
    if index:
        index_name = "model.safetensors.index.json" if ext == "safetensors" else "pytorch_model.bin.index.json"
        (folder / index_name).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return names


def torch_save(tensors: dict[str, np.ndarray], path: Path) -> None:
    import torch

    torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, path)


def write_adapter(folder: Path, hf: bool = True) -> None:
    """adapter_model.pt (torchtune's names) and, HF, adapter_model.safetensors + adapter_config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    torch_save(arrays(ADAPTER, 1), folder / "adapter_model.pt")
    if hf:
        save_file(arrays(PEFT, 1), str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
        (folder / "adapter_config.json").write_text(json.dumps(
            {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], "peft_type": "LORA",
             "base_model_name_or_path": None}))


def write_copies(folder: Path) -> None:
    """What copy_files brings from the input checkpoint_dir: config.json and the tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(b"tok" * 100)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))


def write_epoch(output_dir: Path, epoch: int, kind: str = "full", *, shards: int = 1, hf: bool = True) -> Path:
    """A complete ``epoch_<epoch>/`` of ``kind`` (``full``, ``lora_merged``, ``adapter_only``)."""
    folder = output_dir / f"epoch_{epoch}"
    if kind != "adapter_only":
        write_shards(folder, shards, ext="safetensors" if hf else "bin", index=hf)
    if kind != "full":
        write_adapter(folder, hf)
    write_copies(folder) if hf else folder.mkdir(parents=True, exist_ok=True)
    return folder


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
