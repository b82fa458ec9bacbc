"""The disk a job's checkpoints will take, against the free space of its ``output_dir``. Pure.

The estimate, per torchtune 0.6.1's checkpointers (:mod:`tune_magic.checkpoints.catalog` lists
what an ``epoch_N/`` holds)::

    one checkpoint = model  (full fine-tune and merged LoRA: the input checkpoint's parameters
                             x bytes of the training dtype; the recipe saves its own dtype)
                   + adapter (LoRA: adapter parameters x dtype bytes, twice with the HF
                              checkpointer: adapter_model.pt and adapter_model.safetensors)
                   + copies  (every other file of checkpoint_dir under 100 MB: config, tokenizer)
    recipe state   = moments x trainable parameters x dtype bytes  (AdamW: 2 moments, kept in the
                     parameters' dtype; trainable = all parameters, or the adapter's); one file,
                     overwritten after each non-final epoch, so it counts once; none for 1 epoch
    needed         = peak x one checkpoint + recipe state

where ``peak`` is how many checkpoints are on disk at once: all of them without retention; the
newest N plus the one being written with ``keep=N``; three with ``"best"`` (the best, the newest
and the next, which must be evaluated before the previous newest goes). Adapter parameters come
from the input checkpoint's tensor shapes (read from the files' headers, never with torch):
``rank x (in + out)`` per adapted linear layer, ``+ out`` with DoRA.

The files' own format bytes (a torch zip entry ~340 B, a safetensors header entry ~120 B per
tensor) are left out: noise for a real model, a few percent of the tiny test model's adapter.

Verdict: ``refuse`` when not even one checkpoint (and the recipe state) fits, ``warn`` when
``needed`` exceeds the free space, else ``fits``.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from tune_magic.checkpoints.catalog import (ADAPTER_ONLY, FULL, LORA_MERGED, CheckpointError, SaveSettings)
from tune_magic.checkpoints.files import CheckpointFileError, read_safetensors_header, read_torch_file
from tune_magic.checkpoints.layout import size_text
from tune_magic.checkpoints.retention import Keep, check_keep

#: Bytes per element of the recipes' ``dtype`` values.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8}
_ST_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
             "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_TORCH_BYTES = {"Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
                "Char": 1, "Byte": 1, "Bool": 1}
#: torchtune's copy_files: what it leaves out of each epoch folder, and its size cap.
_NOT_COPIED = (".pt", ".pth", ".bin", ".safetensors", "model.safetensors.index.json",
               "pytorch_model.bin.index.json", "adapter_config", "adapter_model")
_COPY_MAX_BYTES = 100 * 1024 * 1024

# Weight names of each LoRA target, as the HF, torchtune and Meta formats spell them.
_LORA_TARGETS = {
    "q_proj": (".self_attn.q_proj.weight", ".attn.q_proj.weight", ".attention.wq.weight"),
    "k_proj": (".self_attn.k_proj.weight", ".attn.k_proj.weight", ".attention.wk.weight"),
    "v_proj": (".self_attn.v_proj.weight", ".attn.v_proj.weight", ".attention.wv.weight"),
    "output_proj": (".self_attn.o_proj.weight", ".attn.output_proj.weight", ".attention.wo.weight"),
    "w1": (".mlp.gate_proj.weight", ".mlp.w1.weight", ".feed_forward.w1.weight"),
    "w2": (".mlp.down_proj.weight", ".mlp.w2.weight", ".feed_forward.w2.weight"),
    "w3": (".mlp.up_proj.weight", ".mlp.w3.weight", ".feed_forward.w3.weight"),
    "output": ("lm_head.weight", "output.weight"),
}


@dataclass(frozen=True)
class ModelFiles:
    """The input checkpoint, as its files' headers describe it.

    Attributes:
        files: the weight files read.
        tensor_bytes: bytes of tensor data as stored.
        elements: parameters (tensor elements), summed.
        shapes: ``{tensor name: shape}``.
        copied_bytes: bytes of the other files torchtune copies into every ``epoch_N/``.
    """

    files: tuple[Path, ...]
    tensor_bytes: int
    elements: int
    shapes: dict[str, tuple[int, ...]]
    copied_bytes: int


def checkpoint_file_names(checkpoint_files: Any) -> list[str]:
    """``checkpointer.checkpoint_files`` as names: a list as is, or torchtune's
    ``{filename_format, max_filename}`` form expanded (``model-{}-of-{}.safetensors``, ``"00004"``).

    Raises:
        CheckpointError: neither form.
    """
    if isinstance(checkpoint_files, Mapping):
        fmt, top = checkpoint_files.get("filename_format"), str(checkpoint_files.get("max_filename", ""))
        if isinstance(fmt, str) and top.isdigit():
            return [fmt.format(str(i).zfill(len(top)), top) for i in range(1, int(top) + 1)]
    elif isinstance(checkpoint_files, Sequence) and not isinstance(checkpoint_files, str):
        return [str(f) for f in checkpoint_files]
    raise CheckpointError(f"checkpointer.checkpoint_files is neither a list of names nor "
                          f"{{filename_format, max_filename}}: {checkpoint_files!r}")


def copied_bytes(checkpoint_dir: Path) -> int:
    """Bytes of the files torchtune 0.6.1's ``copy_files`` copies from ``checkpoint_dir`` into each
    ``epoch_N/`` (all but weights, indexes and adapters; hidden ones and those over 100 MiB skipped)."""
    total = 0
    for root, dirs, files in os.walk(checkpoint_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith(".") or any(name.endswith(s) for s in _NOT_COPIED):
                continue
            try:
                size = (Path(root) / name).stat().st_size
            except OSError:
                continue
            total += size if size <= _COPY_MAX_BYTES else 0
    return total


def read_model_files(checkpoint_dir: str | os.PathLike[str], checkpoint_files: Any) -> ModelFiles:
    """Describe the input checkpoint from its weight files' headers (never their data).

    Args:
        checkpoint_dir: ``checkpointer.checkpoint_dir``.
        checkpoint_files: ``checkpointer.checkpoint_files`` (either form torchtune takes).

    Raises:
        CheckpointError: a file is missing, truncated or not a checkpoint file.
    """
    root = Path(checkpoint_dir)
    paths, total, elements, shapes = [], 0, 0, {}
    for name in checkpoint_file_names(checkpoint_files):
        path = root / name
        try:
            if path.suffix == ".safetensors":
                for tensor, (dtype, shape) in read_safetensors_header(path).tensors.items():
                    n = _numel(shape)
                    shapes[tensor], elements, total = shape, elements + n, total + n * _ST_BYTES.get(dtype, 4)
            else:
                for tensor, stub in _torch_tensors(read_torch_file(path).obj):
                    n = stub.numel
                    size = _TORCH_BYTES.get(stub.storage.dtype, 4) if stub.storage else 4
                    shapes[tensor], elements, total = stub.shape, elements + n, total + n * size
        except (OSError, CheckpointFileError) as exc:
            raise CheckpointError(f"cannot read the input checkpoint {path}: {exc}") from None
        paths.append(path)
    return ModelFiles(tuple(paths), total, elements, shapes, copied_bytes(root))


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _torch_tensors(obj: Any):
    """(name, TensorStub) of a torch-saved state dict, also one nested under ``"model"``."""
    from tune_magic.checkpoints.files import TensorStub

    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]
    if isinstance(obj, dict):
        yield from ((str(k), v) for k, v in obj.items() if isinstance(v, TensorStub))


def lora_params(shapes: Mapping[str, Sequence[int]], *, rank: int, attn_modules: Sequence[str],
                mlp: bool, output: bool, dora: bool = False) -> int | None:
    """Parameters a LoRA adapter adds: ``rank x (in + out)`` per adapted weight (``+ out`` with DoRA).

    Args:
        shapes: the base checkpoint's ``{name: shape}`` (``[out, in]`` linear weights).
        rank: ``lora_rank``.
        attn_modules: ``lora_attn_modules`` (``q_proj``, ``k_proj``, ``v_proj``, ``output_proj``).
        mlp: ``apply_lora_to_mlp`` (w1, w2, w3).
        output: ``apply_lora_to_output``.
        dora: ``use_dora``.

    Returns:
        The count, or ``None`` when a target has no weight of a known name in ``shapes`` (a fused
        or unknown layout: the estimate then leaves the adapter out, and says so).
    """
    targets = list(attn_modules) + (["w1", "w2", "w3"] if mlp else []) + (["output"] if output else [])
    total = 0
    for target in targets:
        suffixes = _LORA_TARGETS.get(target, ())
        found = [s for name, s in shapes.items() if len(s) == 2 and
                 any(name.endswith(x) or name == x.lstrip(".") for x in suffixes)]
        if not found:
            return None
        total += sum(rank * (int(s[0]) + int(s[1])) + (int(s[0]) if dora else 0) for s in found)
    return total


@dataclass(frozen=True)
class CheckpointSize:
    """What one checkpoint and the recipe state of a job will take (bytes).

    Attributes:
        kind: :data:`~tune_magic.checkpoints.catalog.FULL`, ``LORA_MERGED`` or ``ADAPTER_ONLY``.
        model_bytes: the model shards of one checkpoint (0 for adapter-only).
        adapter_bytes: the adapter files of one checkpoint (0 for a full fine-tune).
        copied_bytes: the copied files of one checkpoint (config, tokenizer).
        recipe_state_bytes: the one ``recipe_state.pt`` (0 when the recipe never writes it).
        trainable_params: parameters the optimizer updates.
        notes: what the estimate could not know (e.g. an adapter of an unknown layout).
    """

    kind: str
    model_bytes: int
    adapter_bytes: int
    copied_bytes: int
    recipe_state_bytes: int
    trainable_params: int
    notes: tuple[str, ...] = ()

    @property
    def per_checkpoint(self) -> int:
        """Bytes of one ``epoch_N/``."""
        return self.model_bytes + self.adapter_bytes + self.copied_bytes


def checkpoint_bytes(model: ModelFiles, *, kind: str, dtype_bytes: int | None = None, adapter_params: int | None = None,
                     hf: bool = True, saves_recipe_state: bool = True, optimizer_moments: int = 2) -> CheckpointSize:
    """The size of one checkpoint and of the recipe state (formula: the module docstring).

    Args:
        model: the input checkpoint (:func:`read_model_files`).
        kind: the kind the job saves.
        dtype_bytes: bytes per element of the training dtype; ``None``: as the input files store them.
        adapter_params: LoRA parameters (:func:`lora_params`); ``None`` for a full fine-tune or unknown.
        hf: the HF checkpointer (LoRA weights written twice: torchtune's and PEFT's names).
        saves_recipe_state: the run writes a recipe state (more than one epoch).
        optimizer_moments: optimizer tensors per trainable parameter (AdamW and Adam: 2; SGD: 0 or 1).

    Raises:
        ValueError: ``kind`` is not a checkpoint kind.
    """
    if kind not in (FULL, LORA_MERGED, ADAPTER_ONLY):
        raise ValueError(f"kind must be one of {FULL}, {LORA_MERGED}, {ADAPTER_ONLY}, not {kind!r}")
    per = dtype_bytes or (model.tensor_bytes // max(model.elements, 1)) or 4
    notes = []
    model_bytes = model.elements * per if dtype_bytes else model.tensor_bytes
    if hf:  # the shards' index: one '"name": "model-0000K-of-0000N.safetensors",' line per tensor
        model_bytes += sum(len(name) + 48 for name in model.shapes)
    adapter = 0
    if kind != FULL:
        if adapter_params is None:
            notes.append("the adapter's size is unknown (a layout without q_proj/v_proj... weights): left out")
        adapter = (adapter_params or 0) * per * (2 if hf else 1)
    trainable = model.elements if kind == FULL else (adapter_params or 0)
    state = trainable * per * optimizer_moments if saves_recipe_state else 0
    return CheckpointSize(kind, 0 if kind == ADAPTER_ONLY else model_bytes, adapter, model.copied_bytes, state,
                          trainable, tuple(notes))


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes free to this user on the file system that holds (or will hold) ``path``: the nearest
    existing folder at or above it (``shutil.disk_usage``'s ``free``, i.e. ``f_bavail``)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def peak_checkpoints(epochs: int, keep: Keep | None) -> tuple[int, int]:
    """``(kept at the end, on disk at once)`` for a run of ``epochs`` under ``keep``."""
    if keep is None:
        return epochs, epochs
    if keep == "best":
        return min(epochs, 2), min(epochs, 3)
    return min(epochs, keep), min(epochs, keep + 1)


@dataclass(frozen=True)
class DiskVerdict:
    """The disk pre-flight's answer.

    Attributes:
        verdict: ``"fits"``, ``"warn"`` (more than the free space at the peak) or ``"refuse"``
            (not even one checkpoint and the recipe state fit).
        size: the per-checkpoint estimate.
        kept: checkpoints left at the end; peak: checkpoints on disk at once.
        needed: ``peak x per checkpoint + recipe state`` (bytes).
        free: free bytes of ``output_dir``'s file system.
        message: the numbers in words (GB = 10^9 bytes).
    """

    verdict: Literal["fits", "warn", "refuse"]
    size: CheckpointSize
    kept: int
    peak: int
    needed: int
    free: int
    message: str


def disk_preflight(size: CheckpointSize, *, epochs: int, keep: Keep | None, free: int,
                   where: str = "output_dir") -> DiskVerdict:
    """Compare what the checkpoints will take with the free space.

    Args:
        size: :func:`checkpoint_bytes`'s estimate.
        epochs: epochs the run saves (one checkpoint each).
        keep: the retention policy (``None``: all kept).
        free: free bytes (:func:`free_bytes`).
        where: how the message names the place (e.g. the path of ``output_dir``).

    Raises:
        ValueError: ``keep`` is not a policy, or ``epochs`` < 1.
    """
    if keep is not None:
        keep = check_keep(keep)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a whole number >= 1, not {epochs!r}")
    kept, peak = peak_checkpoints(epochs, keep)
    one, state = size.per_checkpoint, size.recipe_state_bytes
    needed = peak * one + state
    parts = [f"each checkpoint ({size.kind}) takes {size_text(one)}"]
    if state:
        parts.append(f"the recipe state {size_text(state)} ({size.trainable_params:,} trainable parameters' "
                     "optimizer moments)")
    policy = "all kept" if keep is None else f"keep {keep}"
    head = (f"{'; '.join(parts)}; {policy}: {peak} on disk at once need {size_text(needed)}, "
            f"{where} has {size_text(free)} free")
    if one + state > free:
        verdict, tail = "refuse", (": not even one checkpoint fits. Free space there, or point output_dir at a "
                                   "larger file system")
    elif needed > free:
        verdict, tail = "warn", (": the run will fill the disk before it ends. Keep fewer checkpoints "
                                 "(keep 1, or best), or free space")
    else:
        verdict, tail = "fits", ""
    notes = "".join(f" ({n})" for n in size.notes)
    return DiskVerdict(verdict, size, kept, peak, needed, free, head + tail + notes)


def _moments(optimizer: Any) -> tuple[int, str | None]:
    name = str(optimizer.get("_component_", "")) if isinstance(optimizer, Mapping) else ""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("AdamW", "Adam"):
        return 2, None
    if leaf == "SGD":
        return (1 if optimizer.get("momentum") else 0), None
    return 2, f"optimizer {leaf or 'unknown'}: its state counted as AdamW's two moments"


def estimate_for_config(cfg: Mapping[str, Any], *, keep: Keep | None, free: int | None = None) -> DiskVerdict:
    """The disk pre-flight of a job from its config (a plain mapping with interpolations resolved,
    e.g. ``OmegaConf.to_container(cfg, resolve=True)``).

    Reads ``checkpointer.checkpoint_dir`` / ``checkpoint_files`` / ``_component_``, ``model``
    (``lora_rank``, ``lora_attn_modules``, ``apply_lora_to_mlp``, ``apply_lora_to_output``,
    ``use_dora``), ``save_adapter_weights_only``, ``dtype``, ``epochs``, ``optimizer`` and
    ``output_dir``.

    Args:
        cfg: the job's config.
        keep: the retention policy (``None``: all kept).
        free: free bytes; default :func:`free_bytes` of ``output_dir``.

    Raises:
        CheckpointError: the input checkpoint cannot be read, or the config lacks its keys.
        ValueError: ``keep`` is not a policy.
    """
    ckpt = cfg.get("checkpointer")
    if not isinstance(ckpt, Mapping) or "checkpoint_dir" not in ckpt or "checkpoint_files" not in ckpt:
        raise CheckpointError("the config has no checkpointer.checkpoint_dir and checkpoint_files to estimate from")
    files = read_model_files(ckpt["checkpoint_dir"], ckpt["checkpoint_files"])
    settings = SaveSettings.from_config(cfg)
    kind = settings.expected_kind or FULL
    model = cfg.get("model") if isinstance(cfg.get("model"), Mapping) else {}
    adapter = None
    if kind != FULL:
        adapter = lora_params(files.shapes, rank=int(model.get("lora_rank") or 0),
                              attn_modules=list(model.get("lora_attn_modules") or ()),
                              mlp=bool(model.get("apply_lora_to_mlp")), output=bool(model.get("apply_lora_to_output")),
                              dora=bool(model.get("use_dora")))
    moments, note = _moments(cfg.get("optimizer"))
    epochs = int(cfg.get("epochs") or 1)
    size = checkpoint_bytes(files, kind=kind, dtype_bytes=DTYPE_BYTES.get(str(cfg.get("dtype"))), adapter_params=adapter,
                            hf=settings.hf is not False, saves_recipe_state=epochs > 1, optimizer_moments=moments)
    if note:
        size = CheckpointSize(**{**size.__dict__, "notes": size.notes + (note,)})
    out = str(cfg.get("output_dir") or ".")
    return disk_preflight(size, epochs=epochs, keep=keep, free=free_bytes(out) if free is None else free, where=out)
