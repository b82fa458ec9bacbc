"""The checkpoints of a job's ``output_dir``: one :class:`Checkpoint` per ``epoch_N/`` folder. Pure.

What each folder holds is read from its files only (never with torch; safetensors headers and
torch zip indexes through :mod:`tune_magic.checkpoints.files`). The rules follow torchtune 0.6.1's
checkpointers (``torchtune/training/checkpointing/_checkpointer.py``), which write an epoch folder
in this order:

1. the model shards ``model-XXXXX-of-YYYYY.safetensors`` (``.bin`` with ``safe_serialization:
   False``, with ``FullModelTorchTuneCheckpointer`` and ``FullModelMetaCheckpointer``), unless
   ``save_adapter_weights_only``; then, HF checkpointer only, their index
   ``model.safetensors.index.json`` (``pytorch_model.bin.index.json``);
2. for LoRA, ``adapter_model.pt`` (torchtune's names), then, HF checkpointer only,
   ``adapter_model.safetensors`` (PEFT's names) and ``adapter_config.json``;
3. every other file of the input ``checkpoint_dir`` (``config.json``, the tokenizer...), copied
   by ``copy_files`` (files over 100 MB and hidden ones skipped).

Hence the kinds: model shards and an adapter: :data:`LORA_MERGED` (the shards hold base + LoRA
merged, as the LoRA recipes save by default); model shards only: :data:`FULL`; an adapter only:
:data:`ADAPTER_ONLY` (``save_adapter_weights_only: True``: generation needs the base model of
the job's ``checkpointer.checkpoint_dir`` too). A folder is *complete* when every file of its
kind is there and whole (the rule is :func:`completeness_problems`); a folder being written is
not. Fields a listing cannot know (step, validation loss, whether resume needs it, pruning) are
the caller's to fill with :func:`dataclasses.replace`.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tune_magic.checkpoints.files import CheckpointFileError, read_safetensors_header, read_torch_file
from tune_magic.checkpoints.layout import EPOCH_DIR, RECIPE_STATE, numbered_dirs, read_recipe_state
from tune_magic.errors import PlanError, UserError

#: :attr:`Checkpoint.kind` of a full fine-tune's checkpoint: the whole model.
FULL = "full"
#: :attr:`Checkpoint.kind` of a LoRA checkpoint with merged weights (and the adapter beside them).
LORA_MERGED = "lora_merged"
#: :attr:`Checkpoint.kind` of a LoRA checkpoint saved with ``save_adapter_weights_only: True``.
ADAPTER_ONLY = "adapter_only"
KINDS = (FULL, LORA_MERGED, ADAPTER_ONLY)

MODEL_SHARD = re.compile(r"^model-(\d{5})-of-(\d{5})\.(safetensors|bin)$")
#: The model shards' index the HF checkpointer writes after the shards.
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
#: torchtune's own adapter file: written for every LoRA save, by every checkpointer.
ADAPTER_PT = "adapter_model.pt"
#: PEFT's adapter files (HF checkpointer only; ``.bin`` with ``safe_serialization: False``).
PEFT_ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")
ADAPTER_CONFIG = "adapter_config.json"
HF_CHECKPOINTER = "FullModelHFCheckpointer"


class CheckpointError(UserError, ValueError):
    """A checkpoint cannot be used as asked (unknown, pruned, incomplete, or a bad destination);
    the message says which and what to do."""


@dataclass(frozen=True)
class SaveSettings:
    """What a job's config says about the checkpoints it writes (``None``: not known).

    Attributes:
        lora: the model is a LoRA (or DoRA) builder.
        adapter_weights_only: ``save_adapter_weights_only`` (LoRA recipes; default False).
        checkpointer: ``checkpointer._component_`` (e.g. ``torchtune.training.FullModelHFCheckpointer``).
    """

    lora: bool | None = None
    adapter_weights_only: bool | None = None
    checkpointer: str | None = None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "SaveSettings":
        """Read the settings from a job's config as a plain mapping (e.g. ``resolved_config.yaml``
        loaded with ``yaml.safe_load``, or ``OmegaConf.to_container(cfg, resolve=True)``)."""
        model = cfg.get("model") if isinstance(cfg.get("model"), Mapping) else {}
        builder = str(model.get("_component_", ""))
        leaf = builder.rsplit(".", 1)[-1]
        lora = "lora_rank" in model or leaf.startswith(("lora_", "qlora_", "dora_"))
        ckpt = cfg.get("checkpointer") if isinstance(cfg.get("checkpointer"), Mapping) else {}
        return cls(
            lora=lora if builder else None,
            adapter_weights_only=bool(cfg.get("save_adapter_weights_only", False)),
            checkpointer=str(ckpt["_component_"]) if "_component_" in ckpt else None,
        )

    @property
    def expected_kind(self) -> str | None:
        """The kind every checkpoint of this job has, or ``None`` when the settings do not say."""
        if self.lora is None:
            return None
        if not self.lora:
            return FULL
        return ADAPTER_ONLY if self.adapter_weights_only else LORA_MERGED

    @property
    def hf(self) -> bool | None:
        """Whether the HF checkpointer writes the checkpoints (index, PEFT files, config.json)."""
        return None if self.checkpointer is None else HF_CHECKPOINTER in self.checkpointer


@dataclass(frozen=True)
class Pruned:
    """When a checkpoint was removed by retention, and what that freed.

    Attributes:
        at: unix time of the removal (seconds).
        bytes_freed: :attr:`Checkpoint.bytes_on_disk` when it was removed (bytes).
    """

    at: float
    bytes_freed: int


@dataclass(frozen=True)
class Checkpoint:
    """One ``epoch_N/`` folder of a job (or the record of one that retention removed).

    Attributes:
        epoch: N of ``epoch_N`` (torchtune counts from 0: ``epoch_0`` is saved after the first epoch).
        path: the folder (absolute).
        files: the folder's files, paths relative to it (POSIX), sorted.
        bytes_on_disk: blocks the files use (``st_blocks * 512``, summed; what removing the folder
            frees unless a file has another hard link), bytes.
        apparent_bytes: the files' sizes (``st_size``, summed), bytes.
        kind: :data:`FULL`, :data:`LORA_MERGED`, :data:`ADAPTER_ONLY`, or ``None`` (no model or
            adapter file yet).
        complete: every file of its kind is there and whole (:func:`completeness_problems`).
        problems: why it is not complete (empty when it is).
        mtime: the newest modification time among its files (unix seconds; 0.0 when empty).
        step: global step at the save (the caller's: torchtune does not write it in the folder).
        val_loss: validation loss of this checkpoint, when evaluated (the caller's).
        needed_by_resume: a resume would load it (the caller's: :func:`resume_epoch` says which).
        pruned: set when retention removed it (the caller's record; the folder is then gone).
    """

    epoch: int
    path: Path
    files: tuple[str, ...]
    bytes_on_disk: int
    apparent_bytes: int
    kind: str | None
    complete: bool
    problems: tuple[str, ...] = ()
    mtime: float = 0.0
    step: int | None = None
    val_loss: float | None = None
    needed_by_resume: bool = False
    pruned: Pruned | None = None

    @property
    def name(self) -> str:
        """The folder's name, ``epoch_N``."""
        return f"epoch_{self.epoch}"

    @property
    def model_files(self) -> tuple[str, ...]:
        """The model shards in the folder (empty for an adapter-only checkpoint)."""
        return tuple(f for f in self.files if MODEL_SHARD.match(f))


def _walk(folder: Path) -> tuple[list[str], int, int, float]:
    """(relative file names, blocks in bytes, apparent bytes, newest mtime) of ``folder``'s tree;
    symlinks are listed but neither followed nor counted."""
    names, blocks, size, newest = [], 0, 0, 0.0
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in files:
            p = Path(root) / name
            try:
                st = p.lstat()
            except OSError:  # removed while we walked (pruned, or a writer's temp file)
                continue
            names.append(p.relative_to(folder).as_posix())
            if stat.S_ISREG(st.st_mode):
                blocks += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size  # Windows has none
                size += st.st_size
                newest = max(newest, st.st_mtime)
    return sorted(names), blocks, size, newest


def kind_of(files: set[str] | frozenset[str]) -> str | None:
    """The checkpoint kind the file names say (see the module docstring), or ``None``."""
    has_model = any(MODEL_SHARD.match(f) for f in files)
    has_adapter = ADAPTER_PT in files or any(f in files for f in PEFT_ADAPTER_FILES)
    if has_model:
        return LORA_MERGED if has_adapter else FULL
    return ADAPTER_ONLY if has_adapter else None


def _file_problem(path: Path) -> str | None:
    try:
        if path.suffix == ".safetensors":
            read_safetensors_header(path)
        elif path.suffix in (".pt", ".bin", ".pth"):
            read_torch_file(path)
    except FileNotFoundError:
        return f"{path.name} is missing"
    except (CheckpointFileError, OSError) as exc:
        return str(exc)
    return None


def _shard_problems(folder: Path, files: set[str], hf: bool | None) -> list[str]:
    """Every shard present, whole, and (HF) listed by a readable index naming only present files."""
    shards = sorted(f for f in files if MODEL_SHARD.match(f))
    if not shards:
        return ["no model-XXXXX-of-YYYYY shard yet"]
    totals = {int(MODEL_SHARD.match(f).group(2)) for f in shards}
    problems = [p for p in (_file_problem(folder / f) for f in shards) if p]
    if len(totals) == 1 and len(shards) < (total := totals.pop()):
        problems.append(f"{len(shards)} of {total} model shards so far")
    index = next((i for i in INDEX_FILES if i in files), None)
    if index is None:
        if hf is not False:  # the HF checkpointer writes it right after the last shard
            problems.append("no model.safetensors.index.json yet (the HF checkpointer writes it after the shards)")
        return problems
    try:
        weight_map = json.loads((folder / index).read_text())["weight_map"]
        listed = set(weight_map.values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return problems + [f"{index} is unreadable ({type(exc).__name__}: {exc})"]
    problems += [f"{index} names {name}, which is missing" for name in sorted(listed - files)]
    return problems


def _adapter_problems(folder: Path, files: set[str], hf: bool | None) -> list[str]:
    problems = [p for p in [_file_problem(folder / ADAPTER_PT)] if p]
    peft = [f for f in PEFT_ADAPTER_FILES if f in files]
    problems += [p for p in (_file_problem(folder / f) for f in peft) if p]
    if hf or peft:  # the HF checkpointer writes the PEFT weights, then their config
        if not peft:
            problems.append("adapter_model.safetensors is missing")
        try:
            json.loads((folder / ADAPTER_CONFIG).read_text())
        except (OSError, ValueError) as exc:
            reason = "missing" if isinstance(exc, FileNotFoundError) else f"unreadable ({exc})"
            problems.append(f"{ADAPTER_CONFIG} is {reason}")
    return problems


def completeness_problems(folder: Path, files: set[str], kind: str | None,
                          settings: SaveSettings | None = None) -> list[str]:
    """Why ``folder`` is not a complete checkpoint of ``kind`` (empty: it is complete).

    The rule: every model shard and adapter file of the kind is present and whole (a
    safetensors file as long as its header says, a torch file with its zip directory and every
    storage entry); the HF checkpointer's index names only present shards; the adapter config
    parses; and, for the HF checkpointer, ``config.json`` is there (``copy_files`` copies it
    last of all). Where the settings expect another kind than the files show, the folder is
    still being written (a LoRA merged save has written its shards but not yet its adapter).

    Args:
        folder: the ``epoch_N/`` folder.
        files: its file names (relative).
        kind: what the files show (:func:`kind_of`).
        settings: the job's :class:`SaveSettings`, when known.
    """
    settings = settings or SaveSettings()
    if kind is None:
        return ["no model or adapter file yet"]
    expected = settings.expected_kind
    if expected is not None and expected != kind:
        return [f"its files are those of a {kind} checkpoint, the job saves {expected} ones: still being "
                "written, or not this job's"]
    hf = settings.hf
    problems = _shard_problems(folder, files, hf) if kind in (FULL, LORA_MERGED) else []
    if kind in (LORA_MERGED, ADAPTER_ONLY):
        problems += _adapter_problems(folder, files, hf)
    if (hf or any(f in files for f in INDEX_FILES)) and "config.json" not in files:
        problems.append("config.json is not there yet (copied last of all)")
    return problems


def read_checkpoint(folder: str | os.PathLike[str], settings: SaveSettings | None = None) -> Checkpoint:
    """Describe one ``epoch_N/`` folder.

    Args:
        folder: the folder; its name must be ``epoch_<N>``.
        settings: the job's :class:`SaveSettings`, when known (makes the completeness rule exact).

    Raises:
        CheckpointError: the name is not ``epoch_<N>``, or it is not a directory.
    """
    path = Path(folder).absolute()
    m = EPOCH_DIR.match(path.name)
    if not m:
        raise CheckpointError(f"{path} is not a checkpoint folder: torchtune names them epoch_<N>")
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory (pruned, or never saved?)")
    names, blocks, size, newest = _walk(path)
    files = set(names)
    kind = kind_of(files)
    problems = tuple(completeness_problems(path, files, kind, settings))
    return Checkpoint(int(m.group(1)), path, tuple(names), blocks, size, kind, not problems, problems, newest)


def list_checkpoints(output_dir: str | os.PathLike[str], settings: SaveSettings | None = None) -> list[Checkpoint]:
    """Every ``epoch_N/`` folder directly under ``output_dir``, oldest epoch first.

    Args:
        output_dir: the job's ``output_dir`` (a missing folder lists nothing).
        settings: the job's :class:`SaveSettings`, when known.

    Returns:
        One :class:`Checkpoint` per folder; a folder removed while listing is left out.
    """
    out = []
    for _, path in sorted(numbered_dirs(Path(output_dir), EPOCH_DIR).items()):
        try:
            out.append(read_checkpoint(path, settings))
        except CheckpointError:
            continue
    return out


def resume_epoch(output_dir: str | os.PathLike[str]) -> int | None:
    """The epoch whose folder a resume of this job would load, or ``None`` (no recipe state).

    torchtune 0.6.1 writes ``recipe_state/recipe_state.pt`` after every epoch but the last,
    overwriting it, with ``epochs_run`` = epochs done; a resume loads ``epoch_<epochs_run - 1>``.
    A recipe state that cannot be read (being written) gives ``None``: the caller keeps the
    newest complete checkpoint anyway, which is the one such a state would name.
    """
    path = Path(output_dir) / RECIPE_STATE
    try:
        state = read_recipe_state(path)
    except (OSError, PlanError):
        return None
    return state.epochs_run - 1 if state.epochs_run >= 1 else None


def finite_loss(value: Any) -> float | None:
    """``value`` as a finite float, else ``None`` (NaN, inf, a bool or a non-number is never a loss)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def kept(checkpoints: list[Checkpoint]) -> list[Checkpoint]:
    """The complete checkpoints retention has not removed (those a generation, an export or a
    resume can load), in the given order."""
    return [c for c in checkpoints if c.pruned is None and c.complete]


def best_kept(checkpoints: list[Checkpoint]) -> Checkpoint | None:
    """The kept checkpoint (:func:`kept`) with the lowest validation loss: the one ``"best"``
    names; ``None`` while none has one."""
    return best_of(kept(checkpoints))


def best_of(checkpoints: list[Checkpoint], val_losses: Mapping[int, float] | None = None) -> Checkpoint | None:
    """The checkpoint with the lowest finite validation loss (the earliest among equals), or ``None``.

    Args:
        checkpoints: candidates (their :attr:`Checkpoint.val_loss`).
        val_losses: ``{epoch: loss}`` taking precedence over the checkpoints' own field.
    """
    best, best_loss = None, math.inf
    for c in sorted(checkpoints, key=lambda c: c.epoch):
        loss = finite_loss((val_losses or {}).get(c.epoch, c.val_loss))
        if loss is not None and loss < best_loss:
            best, best_loss = c, loss
    return best


def find_checkpoint(checkpoints: list[Checkpoint], name: str | int) -> Checkpoint:
    """The checkpoint ``name`` names: ``"last"`` (the newest complete), ``"best"`` (lowest finite
    :attr:`Checkpoint.val_loss`), ``"epoch_N"`` or ``N`` (an int, or its digits as text: ``"0"``).

    Raises:
        CheckpointError: no such checkpoint, it was pruned, it is incomplete, or none is evaluated
            (the message lists the ones there are).
    """
    done = kept(checkpoints)
    there = ", ".join(c.name for c in done) or "none yet"
    if name == "last":
        if not done:
            raise CheckpointError(f"no complete checkpoint yet (checkpoints: {there}); wait for the first epoch to end")
        return done[-1]
    if name == "best":
        best = best_kept(checkpoints)
        if best is None:
            raise CheckpointError(f"no checkpoint has a validation loss, so none is best (checkpoints: {there}); "
                                  "name one (\"last\", \"epoch_N\") or evaluate them first")
        return best
    m = EPOCH_DIR.match(name) if isinstance(name, str) else None
    epoch = (int(m.group(1)) if m else name if isinstance(name, int) and not isinstance(name, bool)
             else int(name) if isinstance(name, str) and name.isascii() and name.isdigit() else None)
    if epoch is None:
        raise CheckpointError(f"{name!r} names no checkpoint: say \"last\", \"best\" or \"epoch_N\" (checkpoints: {there})")
    found = next((c for c in checkpoints if c.epoch == epoch), None)
    if found is None:
        raise CheckpointError(f"there is no epoch_{epoch} (checkpoints: {there})")
    if found.pruned is not None:
        raise CheckpointError(f"epoch_{epoch} was pruned by retention; use one that is kept ({there}), or keep more "
                              "checkpoints next time")
    if not found.complete:
        raise CheckpointError(f"epoch_{epoch} is not complete ({'; '.join(found.problems)}); wait for its save to end, "
                              f"or use another ({there})")
    return found
