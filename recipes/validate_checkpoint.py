"""Evaluate ONE saved checkpoint folder (``epoch_N/``) of a training job on its ``dataset_val``.

For any recipe that saves torchtune's checkpoint folders, torchtune 0.6.1's built-ins included,
unmodified: run as a small job of its own with the training job's config and overrides, plus this
recipe's keys under ``validate.`` (plain overrides: torchtune's parser adds keys absent from the
YAML; the recipe takes the whole ``validate`` node out of the config before anything else reads it,
and no torchtune config has a top-level ``validate`` key)::

    python recipes/validate_checkpoint.py --config <the job's config> <the job's overrides> \\
        validate.checkpoint_dir=/abs/run/epoch_2 validate.step=12 validate.output_dir=/abs/val/epoch_2
    PYTHONPATH=. tune run recipes/validate_checkpoint.py --config ...   # the same, via tune run

Keys:
    ``validate.checkpoint_dir`` (required): the ``epoch_N`` folder to evaluate.
    ``validate.step`` (required): the global step at which the training job saved it (the caller
        knows it: for torchtune's recipes, the step of the last ``Step`` line before the save).
    ``validate.output_dir`` (optional): this evaluation's own folder (default: the config's
        ``output_dir``, which tune_magic gives each evaluation job of its own); neither the
        training job's ``output_dir`` (the checkpoint folder's parent) nor any folder inside it
        (an ``epoch_*`` there would confuse torchtune's resume), nor inside the checkpoint folder.
    ``validate.epoch`` (optional): N; by default read from the folder's name ``epoch_N``.
    ``validate.check`` (optional, ``true``): check only, as a launch's pre-flight does: build the
        tokenizer and ``dataset_val`` as an evaluation would, print ``{"examples": N}`` and exit 0
        (no other key is needed); a ``dataset_val`` that cannot be built exits 2 with one line
        ``validate_checkpoint: error: ...`` on stderr.

The job's own components are used: ``model``, ``tokenizer``, ``checkpointer`` (re-pointed at the
epoch folder, its ``output_dir`` set to ``validate.output_dir``), ``loss``, ``dataset_val``,
``batch_size_val`` (default ``batch_size``), ``collate_fn``, ``device`` and ``dtype``. What is
loaded depends on the folder (torchtune 0.6.1's checkpointers write these files):

* ``model-XXXXX-of-YYYYY.safetensors`` / ``.bin`` present: the model's full weights. With a plain
  model builder: kind ``full``. With a LoRA builder: kind ``lora_merged`` (torchtune merged the
  adapter in): the LoRA model is loaded with those weights and ``lora_b`` (and ``lora_a``) at zero,
  which computes exactly the merged model (DoRA: the magnitude is set to the merged weight's norm).
* no model weights, ``adapter_model.pt`` (torchtune's keys) or else ``adapter_model.safetensors`` /
  ``.bin`` (PEFT's keys, mapped back with the exact inverse of torchtune's conversion): kind
  ``adapter_only`` (``save_adapter_weights_only=True``): base weights from the job's
  ``checkpointer.checkpoint_dir`` / ``checkpoint_files``, adapter from the folder.

Output: ``<validate.output_dir>/val_loss.json`` (written atomically)::

    {"epoch": N, "step": S, "val_loss": v, "tokens": T, "examples": E,
     "checkpoint_dir": "/abs/.../epoch_N", "kind": "full" | "lora_merged" | "adapter_only",
     "seconds": wall seconds from this module's first import to the result, interpreter start excluded}

and the DiskLogger line ``Step S | val_loss:v `` both on stdout and in a DiskLogger file of its own,
``<validate.output_dir>/logs/log_<unix seconds>.txt`` (torchtune prints ``Writing logs to ...``), so
any reader of torchtune logs sees the point. ``val_loss`` is defined in ``recipes/_validation.py``
(the exact mean cross-entropy per label token). One process, CPU or one GPU, no process group.
Nothing is written into the training job's ``output_dir``.
"""

import time

_T0 = time.perf_counter()  # before the heavy imports: "seconds" counts them

import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from torch import nn  # noqa: E402
from torchtune import config, training, utils  # noqa: E402

from tune_magic.recipes import _validation  # noqa: E402

log = utils.get_logger("INFO")

#: The result file, in ``validate.output_dir``.
RESULT_NAME = "val_loss.json"
KIND_FULL, KIND_MERGED, KIND_ADAPTER = "full", "lora_merged", "adapter_only"
# torchtune 0.6.1's names in an epoch folder (training/checkpointing/_utils.py: SHARD_FNAME,
# ADAPTER_MODEL_FNAME), for the HF, Meta and torchtune checkpointers alike.
_WEIGHTS_RE = re.compile(r"^model-\d{5}-of-\d{5}\.(safetensors|bin)$")
_ADAPTER_TUNE = "adapter_model.pt"
_ADAPTER_PEFT = ("adapter_model.safetensors", "adapter_model.bin")
_PEFT_PREFIX = "base_model.model."
_OPTION_KEYS = {"checkpoint_dir", "step", "output_dir", "epoch", "check"}


@dataclass(frozen=True)
class Options:
    """The ``validate.*`` keys, checked (see the module docstring)."""

    checkpoint_dir: Path
    step: int
    output_dir: Path
    epoch: int


def read_options(cfg: DictConfig) -> Options:
    """Take the ``validate`` node out of ``cfg`` and check it.

    Raises:
        ValueError: a key is missing, unknown or of the wrong type; the folder is missing;
            ``validate.output_dir`` is the job's ``output_dir``, inside it or inside the folder.
    """
    node = cfg.get("validate", None)
    usage = ("give validate.checkpoint_dir=<the epoch_N folder> validate.step=<the step it was saved at> "
             "[validate.output_dir=<this evaluation's own folder>]")
    if not isinstance(node, DictConfig):
        raise ValueError(f"validate_checkpoint needs its validate.* keys: {usage}")
    opts = OmegaConf.to_container(node, resolve=True)  # resolved while still in the config
    cfg.pop("validate")
    unknown = sorted(set(opts) - _OPTION_KEYS)
    missing = sorted({"checkpoint_dir", "step"} - set(opts))
    if unknown or missing:
        raise ValueError(f"validate.* keys: unknown {unknown}, missing {missing}; {usage}")
    ckpt = Path(str(opts["checkpoint_dir"])).expanduser().resolve()
    if not ckpt.is_dir():
        raise ValueError(f"validate.checkpoint_dir={ckpt} is not a folder")
    step, epoch = opts["step"], opts.get("epoch")
    if epoch is None:
        m = re.fullmatch(r"epoch_(\d+)", ckpt.name)
        if m is None:
            raise ValueError(f"{ckpt.name} is not named epoch_N: give validate.epoch=N")
        epoch = int(m.group(1))
    for name, value in (("step", step), ("epoch", epoch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"validate.{name} must be a non-negative int, got {value!r}")
    if opts.get("output_dir") is None and cfg.get("output_dir") is None:
        raise ValueError(f"validate.output_dir is not given and the config has no output_dir; {usage}")
    out = Path(str(opts.get("output_dir") or cfg.output_dir)).expanduser().resolve()
    for inside, what in ((ckpt, "the checkpoint folder"), (ckpt.parent, "the training job's output_dir")):
        if _within(out, inside):
            raise ValueError(f"validate.output_dir={out} is inside {what} ({inside}): give the evaluation "
                             "a folder of its own, outside the job's output_dir")
    return Options(checkpoint_dir=ckpt, step=step, output_dir=out, epoch=epoch)


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def checkpoint_kind(folder: Path, is_lora: bool) -> tuple[str, list[str]]:
    """The kind of checkpoint in ``folder`` and its model weight files (sorted names).

    Raises:
        ValueError: no weights and no adapter; an adapter without weights for a non-LoRA model.
    """
    names = sorted(p.name for p in folder.iterdir())
    weights = [n for n in names if _WEIGHTS_RE.match(n)]
    if weights:
        return (KIND_MERGED if is_lora else KIND_FULL), weights
    if any(n in names for n in (_ADAPTER_TUNE, *_ADAPTER_PEFT)):
        if not is_lora:
            raise ValueError(f"{folder} holds only adapter weights, but the config's model is not a LoRA model")
        return KIND_ADAPTER, []
    raise ValueError(f"{folder} holds no model-*-of-*.safetensors/.bin weights and no adapter_model.* file: "
                     "is it a torchtune epoch_N checkpoint folder?")


def load_weights(cfg_checkpointer: DictConfig, opts: Options, kind: str, files: list[str]) -> dict[str, Any]:
    """Load the (torchtune-format) model state dict with the job's own checkpointer.

    For ``full``/``lora_merged`` the checkpointer reads the epoch folder's weight files; for
    ``adapter_only`` the job's base checkpoint. Its ``output_dir`` is the evaluation's own folder
    (the checkpointer creates it; it writes nothing on load).
    """
    node = OmegaConf.create(OmegaConf.to_container(cfg_checkpointer, resolve=True))
    node.output_dir = str(opts.output_dir)
    node.pop("resume_from_checkpoint", None)  # deprecated alias of should_load_recipe_state
    node.pop("adapter_checkpoint", None)
    node.pop("recipe_checkpoint", None)
    if kind != KIND_ADAPTER:
        node.checkpoint_dir = str(opts.checkpoint_dir)
        node.checkpoint_files = files
    checkpointer = config.instantiate(node, should_load_recipe_state=False)
    return checkpointer.load_checkpoint()[training.MODEL_KEY]


def read_adapter(folder: Path, adapter_shapes: dict[str, torch.Size], hf_config: dict[str, Any]) -> dict[str, Any]:
    """The adapter of an epoch folder in torchtune's keys: ``adapter_model.pt`` as saved, else PEFT's file
    (``adapter_model.safetensors`` / ``.bin``) mapped back (:func:`peft_to_tune`).

    Args:
        folder: the epoch folder.
        adapter_shapes: the model's adapter parameter names (torchtune's) and shapes.
        hf_config: the checkpoint's ``config.json`` (heads, dims), for the PEFT file only.
    """
    if (folder / _ADAPTER_TUNE).is_file():
        return torch.load(folder / _ADAPTER_TUNE, map_location="cpu", weights_only=True)
    path = next(folder / n for n in _ADAPTER_PEFT if (folder / n).is_file())
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        peft = load_file(path)
    else:
        peft = torch.load(path, map_location="cpu", weights_only=True)
    return peft_to_tune(peft, adapter_shapes, hf_config)


def peft_to_tune(peft: dict[str, torch.Tensor], adapter_shapes: dict[str, torch.Size],
                 hf_config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Invert torchtune 0.6.1's ``convert_weights.tune_to_peft_adapter_weights`` exactly.

    torchtune has no PEFT-to-torchtune conversion; instead its forward conversion is applied to
    tensors holding each element's own index, which gives both the key mapping and the element
    permutation (the q/k ``lora_b`` rows are permuted for HF's rotary layout) to undo.

    Raises:
        KeyError: the PEFT file lacks an adapter parameter of the model.
    """
    from torchtune.models.convert_weights import tune_to_peft_adapter_weights

    probes = {k: torch.arange(torch.Size(s).numel()).reshape(s) for k, s in adapter_shapes.items()}
    mapped = tune_to_peft_adapter_weights(
        probes,
        num_heads=hf_config["num_attention_heads"],
        num_kv_heads=hf_config["num_key_value_heads"],
        dim=hf_config["hidden_size"],
        head_dim=hf_config.get("head_dim"),
    )
    out = {}
    for tune_key, (peft_key, index) in zip(probes, mapped.items()):  # the conversion keeps the order
        flat = torch.empty(index.numel(), dtype=peft[peft_key].dtype)
        flat[index.reshape(-1)] = peft[peft_key].reshape(-1)
        out[tune_key] = flat.reshape(adapter_shapes[tune_key])
    return out


def build_model(cfg: DictConfig, opts: Options, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, str]:
    """Instantiate the job's model, load the checkpoint into it; return it and the kind.

    Built on the meta device and materialised once, so no random initialisation is spent on
    weights about to be overwritten; every parameter and buffer of the state dict is loaded
    (strict), and RoPE caches, which are outside it, are rebuilt as torchtune's recipes do.
    """
    from torchtune.modules.peft import get_adapter_params

    with training.set_default_dtype(dtype), torch.device("meta"):
        model = config.instantiate(cfg.model)
    adapter_shapes = {k: p.shape for k, p in get_adapter_params(model).items()}
    kind, files = checkpoint_kind(opts.checkpoint_dir, is_lora=bool(adapter_shapes))
    state = dict(load_weights(cfg.checkpointer, opts, kind, files))
    if kind == KIND_ADAPTER:
        hf_config = _hf_config(opts.checkpoint_dir, cfg.checkpointer)
        state.update(read_adapter(opts.checkpoint_dir, adapter_shapes, hf_config))
    elif kind == KIND_MERGED:
        # lora_b = 0 makes every LoRA term exactly zero: the model computes the merged weights.
        state.update({k: torch.zeros(s) for k, s in adapter_shapes.items() if k not in state})
    model.to_empty(device=device)
    with training.set_default_dtype(dtype), device:
        for m in model.modules():
            if hasattr(m, "rope_init"):
                m.rope_init()
    model.load_state_dict(state, strict=True)
    if kind == KIND_MERGED:
        for m in model.modules():
            if hasattr(m, "initialize_dora_magnitude"):
                m.initialize_dora_magnitude()  # with lora_b = 0: the norm of the merged weight, an identity
    return model, kind


def _hf_config(folder: Path, cfg_checkpointer: DictConfig) -> dict[str, Any]:
    """``config.json`` of the epoch folder (torchtune copies it there), else of the base checkpoint."""
    for where in (folder, Path(str(cfg_checkpointer.checkpoint_dir))):
        if (where / "config.json").is_file():
            return json.loads((where / "config.json").read_text())
    return {}


def write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file and a rename: never half-written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Evaluate the checkpoint named by ``cfg.validate``; write and return the result (module docstring).

    Raises:
        ValueError: bad ``validate.*`` keys (:func:`read_options`), no ``dataset_val``, or a folder
            that is not a checkpoint (:func:`checkpoint_kind`).
    """
    node = cfg.get("validate", None)
    if isinstance(node, DictConfig) and node.get("check", False) is True:
        return check_dataset_val(cfg)
    opts = read_options(cfg)
    config.log_config(recipe_name="validate_checkpoint", cfg=cfg)
    if cfg.get("dataset_val") is None:
        raise ValueError("the job's config has no dataset_val: add a dataset_val node (a dataset like `dataset`, "
                         "e.g. the same component with split: train[95%:]) to the config or its overrides")
    _validation.check_keys(cfg)
    opts.output_dir.mkdir(parents=True, exist_ok=True)
    # ${output_dir} interpolations (the checkpointer's, the logs') now name the evaluation's folder.
    cfg.output_dir = str(opts.output_dir)
    device = utils.get_device(device=cfg.get("device", None))
    dtype = training.get_dtype(cfg.get("dtype", None), device=device)
    model, kind = build_model(cfg, opts, device, dtype)
    tokenizer = config.instantiate(cfg.tokenizer)
    loss_fn = config.instantiate(cfg.loss)
    if loss_fn.__class__.__name__ == "CEWithChunkedOutputLoss":
        model.set_num_output_chunks(loss_fn.num_output_chunks)
    val = _validation.build_val_loader(
        cfg.dataset_val,
        tokenizer,
        loss_fn.ignore_index,
        batch_size=cfg.get("batch_size_val", cfg.get("batch_size", 1)),
        collate_fn=cfg.get("collate_fn", _validation.DEFAULT_COLLATE),
    )
    result = _validation.validation_loss(model, val, loss_fn, device)
    return _report(opts, kind, result)


def check_dataset_val(cfg: DictConfig) -> dict[str, Any]:
    """``validate.check=true``: build the tokenizer and ``dataset_val`` as an evaluation (and a
    recipe validating in its loop) would; print and return ``{"examples": N}``.

    Raises:
        ValueError: no ``dataset_val``, bad validation keys, or a validate node with other keys.
    """
    node = cfg.pop("validate")
    if set(node) != {"check"}:
        raise ValueError(f"validate.check=true takes no other validate.* key (got {sorted(node)})")
    if cfg.get("dataset_val") is None:
        raise ValueError("the config has no dataset_val: add a dataset_val node (a dataset like `dataset`)")
    _validation.check_keys(cfg)
    tokenizer = config.instantiate(cfg.tokenizer)
    loss_fn = config.instantiate(cfg.loss)
    val = _validation.build_val_loader(cfg.dataset_val, tokenizer, getattr(loss_fn, "ignore_index", -100),
                                       batch_size=cfg.get("batch_size_val", cfg.get("batch_size", 1)),
                                       collate_fn=cfg.get("collate_fn", _validation.DEFAULT_COLLATE))
    next(val.batches())  # the first batch, as the loop would take it: a column map the data lacks fails here
    out = {"examples": len(val.dataset)}
    print(json.dumps(out), flush=True)
    return out


def _report(opts: Options, kind: str, result: _validation.ValResult) -> dict[str, Any]:
    """Print and log the DiskLogger line, write ``val_loss.json``; return its content."""
    from torchtune.training.metric_logging import DiskLogger

    log.info(f"Validation loss: {result.val_loss:.4f}")
    logger = DiskLogger(log_dir=str(opts.output_dir / "logs"))
    logger.log_dict({_validation.VAL_LOSS_KEY: result.val_loss}, step=opts.step)
    logger.close()
    print(f"Step {opts.step} | {_validation.VAL_LOSS_KEY}:{result.val_loss} ", flush=True)
    out = {
        "epoch": opts.epoch,
        "step": opts.step,
        "val_loss": result.val_loss,
        "tokens": result.tokens,
        "examples": result.examples,
        "checkpoint_dir": str(opts.checkpoint_dir),
        "kind": kind,
        "seconds": round(time.perf_counter() - _T0, 3),
    }
    write_json_atomic(opts.output_dir / RESULT_NAME, out)
    return out


@config.parse
def recipe_main(cfg: DictConfig) -> int:
    """Entry point: the job's config and overrides plus ``validate.*`` (module docstring). A bad
    key or a ``dataset_val`` that cannot be built ends with one line on stderr and exit 2."""
    try:
        evaluate(cfg)
    except Exception as exc:  # noqa: BLE001 - the caller reads one line: what failed and how to fix it
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        import traceback

        traceback.print_exc()
        lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()] or [type(exc).__name__]
        first = lines[0]
        if first.endswith(":") and len(lines) > 1:  # "Error loading 'x':" says why on the next line
            first = f"{first} {lines[1]}"
        print(f"validate_checkpoint: error: {type(exc).__name__}: {first}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(recipe_main())
