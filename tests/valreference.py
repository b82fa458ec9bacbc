"""An independent reference for ``val_loss`` (issue 28): shares no code with ``recipes/``.

From a checkpoint folder's files alone: the HF safetensors weights (converted to torchtune's names
by torchtune's own ``hf_to_tune``), or for an adapter-only folder the base weights plus the adapter
merged by hand (``W + (alpha / rank) * B @ A``), loaded into the plain ``llama2`` builder (never a
LoRA model); the validation examples tokenized one by one with the tokenizer and torchtune's
``instruct_dataset``; one forward pass per example (no batching, no padding), eval mode, no
gradients; ``F.cross_entropy(..., ignore_index=-100, reduction="sum")`` over the shifted labels,
summed in float64, divided by the number of label tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from tune_magic.assets import AssetPaths, TINY_MODEL

IGNORE = -100
#: The tiny validation split of the *_val configs and the tests' overrides.
VAL_SPLIT = "train[90%:]"
TRAIN_SPLIT = "train[:90%]"


def dataset_val_overrides(assets: AssetPaths) -> list[str]:
    """``dataset_val`` as key=value overrides (the built-in configs have none)."""
    return [
        "dataset_val._component_=torchtune.datasets.instruct_dataset",
        "dataset_val.source=json",
        f"dataset_val.data_files={assets.dataset_path}",
        f"dataset_val.split={VAL_SPLIT}",
        "dataset_val.column_map.input=instruction",
        "dataset_val.column_map.output=output",
        "dataset_val.train_on_input=False",
    ]


def val_examples(assets: AssetPaths, cache_dir: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The validation split as (tokens, labels) pairs, as the tiny configs tokenize it."""
    from torchtune.datasets import instruct_dataset
    from torchtune.models.llama2 import llama2_tokenizer

    tokenizer = llama2_tokenizer(str(assets.tokenizer_path), max_seq_len=64, prompt_template=None)
    ds = instruct_dataset(
        tokenizer, source="json", data_files=str(assets.dataset_path), split=VAL_SPLIT,
        column_map={"input": "instruction", "output": "output"}, train_on_input=False,
        cache_dir=str(cache_dir),
    )  # fmt: skip
    return [(torch.tensor(ds[i]["tokens"]), torch.tensor(ds[i]["labels"])) for i in range(len(ds))]


def hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every ``*.safetensors`` model file of ``folder`` (not the adapter), in torchtune's names."""
    from safetensors.torch import load_file
    from torchtune.models.convert_weights import hf_to_tune

    hf = {}
    for path in sorted(folder.glob("*.safetensors")):
        if not path.name.startswith("adapter"):
            hf.update(load_file(path))
    assert hf, f"no model weights in {folder}"
    m = TINY_MODEL
    return hf_to_tune(hf, num_heads=m["num_heads"], num_kv_heads=m["num_kv_heads"], dim=m["embed_dim"])


def merge_adapter(base: dict[str, torch.Tensor], adapter_pt: Path) -> dict[str, torch.Tensor]:
    """``W + (alpha / rank) * B @ A`` for every LoRA pair of torchtune's ``adapter_model.pt``;
    alpha and rank from the folder's PEFT ``adapter_config.json``."""
    adapter = torch.load(adapter_pt, map_location="cpu", weights_only=True)
    cfg = json.loads((adapter_pt.parent / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / cfg["r"]
    merged = {k: v.clone() for k, v in base.items()}
    pairs = [k for k in adapter if k.endswith(".lora_a.weight")]
    assert pairs, adapter.keys()
    for a_key in pairs:
        prefix = a_key[: -len(".lora_a.weight")]
        a, b = adapter[a_key], adapter[prefix + ".lora_b.weight"]
        merged[prefix + ".weight"] += scale * (b @ a)
    return merged


def reference_val_loss(weights: dict[str, torch.Tensor], examples: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean cross-entropy per label token of the plain tiny llama2 holding ``weights``."""
    from torchtune.models.llama2 import llama2

    model = llama2(**TINY_MODEL)
    model.load_state_dict(weights, strict=True)
    model.eval()
    total = torch.zeros((), dtype=torch.float64)
    count = 0
    with torch.no_grad():
        for tokens, labels in examples:
            logits = model(tokens[None])[0]  # [seq, vocab]
            target = labels[1:]
            total += F.cross_entropy(logits[:-1].double(), target, ignore_index=IGNORE, reduction="sum")
            count += int((target != IGNORE).sum())
    return total.item() / count


def reference_for_folder(folder: Path, assets: AssetPaths, examples) -> float:
    """The reference for an ``epoch_N`` folder: its model weights, or the base merged with its adapter."""
    if any(folder.glob("model-*.safetensors")):
        return reference_val_loss(hf_weights(folder), examples)
    return reference_val_loss(merge_adapter(hf_weights(assets.model_dir), folder / "adapter_model.pt"), examples)
