"""Export one checkpoint (an ``epoch_N/`` folder) to a folder of its own, ready to load elsewhere.

The layout of ``dest`` (pure file copies; torch is never imported)::

    dest/
      README.md                 what this is and how to load it (transformers, PEFT, torchtune)
      config.json, model-0000K-of-0000N.safetensors, model.safetensors.index.json, tokenizer...
                                the epoch folder's files as torchtune 0.6.1's FullModelHFCheckpointer
                                wrote them: the Hugging Face layout, loadable with
                                ``AutoModelForCausalLM.from_pretrained(dest)``
      adapter/                  merged LoRA only: adapter_model.safetensors + adapter_config.json
                                (PEFT's layout) + adapter_model.pt (torchtune's names). Kept out of
                                the top level: transformers treats a folder holding adapter_config.json
                                as an adapter, not as a model
      torchtune/                the job's config files, and its tokenizer where the epoch folder's
                                copy differs from it

An adapter-only checkpoint (``save_adapter_weights_only: True``) exports as an adapter: its files
at the top level in PEFT's layout, no base weights (they can be tens of GB, and the job did not
change them). ``adapter_config.json``'s ``base_model_name_or_path``, which torchtune leaves null
without a hub id, is set to ``base_checkpoint_dir`` when given, so
``AutoPeftModelForCausalLM.from_pretrained(dest)`` finds the base; the README names it too.

``dest`` is built in a hidden sibling folder and renamed into place, so it is either complete or
absent; an existing non-empty ``dest`` is refused, never merged into.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from tune_magic.checkpoints.catalog import (ADAPTER_CONFIG, ADAPTER_ONLY, ADAPTER_PT, INDEX_FILES, LORA_MERGED,
                                            PEFT_ADAPTER_FILES, Checkpoint, CheckpointError, SaveSettings,
                                            read_checkpoint)
from tune_magic.checkpoints.layout import DIST_EPOCH_DIR, EPOCH_DIR, size_text

ADAPTER_FILES = (ADAPTER_PT, *PEFT_ADAPTER_FILES, ADAPTER_CONFIG)
README = "README.md"


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_checkpoint` wrote.

    Attributes:
        dest: the export folder (absolute).
        kind: the checkpoint's kind.
        files: every file written, relative to ``dest`` (POSIX), sorted.
        bytes: their total size (bytes).
        hf_layout: the model loads with ``transformers`` from ``dest`` (or, adapter-only, with PEFT).
    """

    dest: Path
    kind: str
    files: tuple[str, ...]
    bytes: int
    hf_layout: bool


def check_destination(dest: Path, source: Path) -> None:
    """Refuse a ``dest`` that would mix with other files or with the checkpoint itself.

    Raises:
        CheckpointError: ``dest`` is a file, a non-empty folder, inside ``source``, or where the job
            keeps its checkpoints (an ``epoch_N`` or ``recipe_state`` folder of ``source``'s
            ``output_dir``, which listings and retention would take for the job's own).
    """
    if dest == source or source in dest.parents:
        raise CheckpointError(f"cannot export {source} into itself ({dest}); choose a folder outside it")
    out = source.parent
    if out in dest.parents:
        first = dest.relative_to(out).parts[0]
        if EPOCH_DIR.match(first) or DIST_EPOCH_DIR.match(first) or first == "recipe_state":
            raise CheckpointError(f"the export destination {dest} is where the job keeps its checkpoints ({out}/"
                                  f"{first}); choose a folder with another name, or outside {out}")
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise CheckpointError(f"the export destination {dest} exists and is not a folder; choose a new folder")
    if dest.is_dir() and any(dest.iterdir()):
        raise CheckpointError(f"the export destination {dest} exists and is not empty; choose a new folder, or "
                              "empty this one first (an export never overwrites or merges)")


def _plan(ckpt: Checkpoint) -> dict[str, str]:
    """``{source file (relative to the epoch folder): destination (relative to dest)}``."""
    plan = {}
    for name in ckpt.files:
        base = name.rsplit("/", 1)[-1]
        if base in ADAPTER_FILES and ckpt.kind == LORA_MERGED:
            plan[name] = f"adapter/{name}"
        else:
            plan[name] = name
    return plan


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)  # not copy2: a 0600 shard of the job stays the job's; the copy is shareable


def _same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            ca, cb = fa.read(1 << 20), fb.read(1 << 20)
            if ca != cb:
                return False
            if not ca:
                return True


def _extras(tmp: Path, tokenizer_path: Path | None, config_files: Iterable[Path]) -> list[str]:
    """Copy the job's tokenizer and configs; return notes for the README."""
    notes = []
    if tokenizer_path is not None:
        top = tmp / tokenizer_path.name
        if not top.exists():
            _copy(tokenizer_path, top)
        elif not _same_bytes(tokenizer_path, top):
            _copy(tokenizer_path, tmp / "torchtune" / tokenizer_path.name)
            notes.append(f"The job's tokenizer ({tokenizer_path}) differs from the {tokenizer_path.name} the "
                         f"checkpointer copied; the job's is torchtune/{tokenizer_path.name}.")
    for path in config_files:
        _copy(path, tmp / "torchtune" / path.name)
    return notes


def _set_base(tmp: Path, rel: str, base: Path | None) -> None:
    """Point an exported adapter config's null ``base_model_name_or_path`` at the base model."""
    path = tmp / rel
    if base is None or not path.is_file():
        return
    config = json.loads(path.read_text())
    if isinstance(config, dict) and not config.get("base_model_name_or_path"):
        config["base_model_name_or_path"] = str(base)
        path.write_text(json.dumps(config, indent=1) + "\n")


def export_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    tokenizer_path: str | os.PathLike[str] | None = None,
    config_files: Iterable[str | os.PathLike[str]] = (),
    base_checkpoint_dir: str | os.PathLike[str] | None = None,
    model_type: str | None = None,
    settings: SaveSettings | None = None,
) -> ExportResult:
    """Copy a complete checkpoint's model files, tokenizer and configs into the new folder ``dest``.

    Layout and adapter-only rules: the module docstring.

    Args:
        checkpoint_dir: the ``epoch_N/`` folder.
        dest: the export folder: new, or an empty folder (its parents are created).
        tokenizer_path: the job's tokenizer file (``tokenizer.path``).
        config_files: the job's config files (e.g. ``resolved_config.yaml``), into ``torchtune/``.
        base_checkpoint_dir: the job's input checkpoint (``checkpointer.checkpoint_dir``): what an
            adapter-only export is applied to.
        model_type: ``checkpointer.model_type`` (``LLAMA2``...), for the README's torchtune lines.
        settings: the job's :class:`~tune_magic.checkpoints.catalog.SaveSettings`, when known.

    Returns:
        An :class:`ExportResult`.

    Raises:
        CheckpointError: the checkpoint is not an ``epoch_N/`` folder or not complete; ``dest``
            exists and is not an empty folder, or lies inside the checkpoint; ``tokenizer_path`` or
            a config file does not exist (nothing is written).
        OSError: ``dest``'s parent cannot be written (nothing is left behind).
    """
    ckpt = read_checkpoint(checkpoint_dir, settings)
    if not ckpt.complete:
        raise CheckpointError(f"{ckpt.path} is not a complete checkpoint ({'; '.join(ckpt.problems)}); wait for "
                              "its save to end, or export another")
    dest = Path(dest).expanduser().absolute()
    check_destination(dest, ckpt.path)
    extras = [Path(p).absolute() for p in config_files]
    tok = Path(tokenizer_path).absolute() if tokenizer_path is not None else None
    for p in ([tok] if tok else []) + extras:
        if not p.is_file():
            what = "the job's tokenizer (tokenizer.path)" if p == tok else "the job's config"
            raise CheckpointError(f"cannot export {what} {p}: no such file; put it back (or point the job's "
                                  "config at it) and export again")
    base = Path(base_checkpoint_dir).absolute() if base_checkpoint_dir is not None else None
    tmp = _staging_dir(dest)
    try:
        written, total, hf = _build(ckpt, tmp, dest, tok, extras, base, model_type)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the export from others
        if dest.is_dir():
            dest.rmdir()  # empty (checked): rename(2) will not replace a folder another process filled since
        os.rename(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ExportResult(dest, ckpt.kind, tuple(written), total, hf)


def _staging_dir(dest: Path) -> Path:
    """A new hidden folder beside ``dest`` to build the export in (renamed to ``dest`` at the end).

    Raises:
        CheckpointError: ``dest``'s parent cannot be made or written (/proc, a file on the way, a
            read-only or full file system, no permission).
    """
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{dest.name}.export-", dir=dest.parent))
    except OSError as exc:
        raise CheckpointError(f"cannot write the export into {dest.parent}: {exc.strerror or exc}; choose a "
                              "destination in a folder you can write") from None


def _build(ckpt: Checkpoint, tmp: Path, dest: Path, tok: Path | None, extras: list[Path], base: Path | None,
           model_type: str | None) -> tuple[list[str], int, bool]:
    """Write the export into ``tmp``; return (files relative to it, their bytes, HF layout)."""
    for src, rel in _plan(ckpt).items():
        _copy(ckpt.path / src, tmp / rel)
    notes = _extras(tmp, tok, extras)
    if ckpt.kind == ADAPTER_ONLY:
        _set_base(tmp, ADAPTER_CONFIG, base)
    hf = (tmp / "config.json").is_file() and (ckpt.kind == ADAPTER_ONLY or any((tmp / i).is_file() for i in INDEX_FILES))
    written = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
    total = sum((tmp / f).stat().st_size for f in written)
    text = readme_text(ckpt, dest, hf=hf, base=base, model_type=model_type, files=written, total=total, notes=notes)
    (tmp / README).write_text(text)
    return sorted([*written, README]), total + (tmp / README).stat().st_size, hf


def readme_text(ckpt: Checkpoint, dest: Path, *, hf: bool, base: Path | None, model_type: str | None,
                files: list[str], total: int, notes: list[str]) -> str:
    """The export's README.md: what it is, where it came from, and how to load it."""
    shards = [f for f in files if f.startswith("model-") and "/" not in f]
    mt = model_type or "<checkpointer.model_type of the job's config>"
    lines = [f"# {ckpt.name} ({ckpt.kind.replace('_', ' ')})", "",
             f"Exported from `{ckpt.path}`: {len(files)} files, {size_text(total)}. "
             "Written by torchtune 0.6.1's checkpointer; configs of the job in `torchtune/`.", ""]
    if ckpt.kind == ADAPTER_ONLY:
        where = f"`{base}`" if base else "the job's `checkpointer.checkpoint_dir`"
        lines += ["A LoRA adapter only (the job saved with `save_adapter_weights_only: True`); the base model is "
                  f"not copied: it is {where}.", "", "```python",
                  "from peft import AutoPeftModelForCausalLM",
                  f"model = AutoPeftModelForCausalLM.from_pretrained({str(dest)!r})  # base from adapter_config.json",
                  "```", "",
                  f"torchtune: `checkpointer.checkpoint_dir={base or '<base>'}` with its own files, and "
                  f"`{ADAPTER_PT}` from here as the adapter (`model_type: {mt}`).", ""]
    elif hf:
        lines += ["The Hugging Face layout (config.json, safetensors shards and their index):", "", "```python",
                  "from transformers import AutoModelForCausalLM",
                  f"model = AutoModelForCausalLM.from_pretrained({str(dest)!r})", "```", "",
                  f"torchtune: `FullModelHFCheckpointer` with `checkpoint_dir: {dest}`, "
                  f"`checkpoint_files: {shards}`, `model_type: {mt}`.", ""]
    else:
        lines += ["torchtune's own format (no config.json): load it with the checkpointer the job used, "
                  f"`checkpoint_dir: {dest}`, `checkpoint_files: {shards}`, `model_type: {mt}`.", ""]
    if ckpt.kind == LORA_MERGED:
        lines += ["The weights above have the LoRA adapter merged in; `adapter/` holds the adapter alone "
                  "(PEFT layout), kept apart so that transformers loads this folder as a model.", ""]
    return "\n".join(lines + notes + ([""] if notes else []))
