"""The model a config reads, and what to say when it is not here. Pure (files are only looked at).

A torchtune config reads its model from ``checkpointer.checkpoint_dir`` (the files
``checkpointer.checkpoint_files`` inside it) and its tokenizer from ``tokenizer.path`` (and, for
some tokenizers, ``tokenizer.merges_file``). When any of them is missing, every rank fails at
start-up, so a launch is refused before anything starts, naming **every** missing path at once,
and saying how to get the model: the ``tune download ...`` command(s) the config names in its
header comment (torchtune 0.6.1's built-in configs start with ``# This config assumes that you've
run the following command before launching this run:`` and the command; knowledge-distillation
configs name two), else downloading it or pointing the keys at where it is. Never "create it": a
model is downloaded, not made.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

#: Config keys naming a file or directory of the model or tokenizer that a job only reads.
INPUT_KEYS = ("checkpointer.checkpoint_dir", "tokenizer.path", "tokenizer.merges_file")
#: The key of the model's files, relative to ``checkpointer.checkpoint_dir``.
FILES_KEY = "checkpointer.checkpoint_files"
#: How a missing file of a resumed full fine-tune is named: torchtune reads it from ``output_dir``.
RESUMED_FILES_KEY = "checkpointer.checkpoint_files (read from checkpointer.output_dir: resume_from_checkpoint=True)"

_DOWNLOAD_RE = re.compile(r"^#\s*(tune download\s.+?)\s*$")


def checkpoint_file_names(value: Any) -> list[str]:
    """The file names ``checkpointer.checkpoint_files`` stands for: a list of names, one name, or
    torchtune's ``{filename_format, max_filename}`` form, expanded as torchtune 0.6.1's
    ``FormattedCheckpointFiles.build_checkpoint_filenames`` does (``model-{}-of-{}.safetensors``
    with ``"00004"``: ``model-00001-of-00004.safetensors`` ... ``model-00004-of-00004...``); a
    value of another shape gives ``[]`` (the recipe reports it itself)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, str)]
    if isinstance(value, dict):
        fmt, top = value.get("filename_format"), value.get("max_filename")
        if isinstance(fmt, str) and isinstance(top, str) and top.isdigit() and int(top) <= 10_000:
            try:
                return [fmt.format(str(i + 1).zfill(len(top)), top) for i in range(int(top))]
            except (IndexError, KeyError, ValueError):
                return []
    return []


def _truthy(cfg, key: str) -> bool:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
    except (OmegaConfBaseException, ValueError):
        return False
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def loads_recipe_state(cfg) -> bool:
    """Whether the job resumes (torchtune 0.6.1's recipes pass ``resume_from_checkpoint`` to the
    checkpointer as ``should_load_recipe_state``; the checkpointer's own keys say the same)."""
    return any(_truthy(cfg, k) for k in ("resume_from_checkpoint", "checkpointer.should_load_recipe_state",
                                          "checkpointer.resume_from_checkpoint"))


def files_dir(cfg, checkpoint_dir: str, cwd: str, select) -> str | None:
    """The directory torchtune 0.6.1 reads ``checkpointer.checkpoint_files`` from
    (``get_model_checkpoint_path`` in torchtune/training/checkpointing/_utils.py): the
    ``checkpoint_dir``, except when resuming without an adapter checkpoint (a full fine-tune),
    when it is ``checkpointer.output_dir``. An adapter checkpoint is the one
    ``checkpointer.adapter_checkpoint`` names (relative to ``output_dir``), else
    ``adapter_model.pt`` in the highest ``epoch_N`` folder of ``output_dir``
    (``get_adapter_checkpoint_path``). ``None``: resuming into an ``output_dir`` that cannot be
    resolved (the recipe reports that itself)."""
    if not loads_recipe_state(cfg):
        return checkpoint_dir
    out = select(cfg, "checkpointer.output_dir", cwd)
    if out is None:
        return None
    if select(cfg, "checkpointer.adapter_checkpoint", cwd) is not None:
        return checkpoint_dir
    try:
        epochs = [(int(m[1]), name) for name in os.listdir(out) if (m := re.match(r"^epoch_(\d+)", name))]
    except OSError:
        epochs = []
    if epochs and os.path.exists(os.path.join(out, max(epochs)[1], "adapter_model.pt")):
        return checkpoint_dir
    return out


def missing_model_paths(cfg, cwd: str, select, errors: list[str] | None = None) -> list[tuple[str, str]]:
    """``(key, path)`` of every model and tokenizer input of ``cfg`` that does not exist here: the
    :data:`INPUT_KEYS`, and each checkpoint file where torchtune reads it (:func:`files_dir`: the
    checkpoint directory, or a resumed full fine-tune's ``output_dir``, keyed
    :data:`RESUMED_FILES_KEY`) when the checkpoint directory exists (a missing directory already
    says its files are missing). A job resumed into an ``output_dir`` with no ``epoch_N`` folder
    fails in torchtune 0.6.1 too (its adapter lookup joins ``None``), so its files count as missing.

    Args:
        cfg: the job's config (OmegaConf, overrides applied).
        cwd: the job's working directory (relative paths).
        select: ``select(cfg, key, cwd, errors=None) -> absolute path or None`` (the caller's resolver).
        errors: where a key that cannot be resolved is reported.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    missing = []
    for key in INPUT_KEYS:
        path = select(cfg, key, cwd, errors)
        if path is not None and not os.path.exists(path):
            missing.append((key, path))
        if key == INPUT_KEYS[0] and path is not None and os.path.isdir(path):
            where = files_dir(cfg, path, cwd, select)
            if where is None:
                continue
            try:
                raw = OmegaConf.select(cfg, FILES_KEY, throw_on_missing=False)
                value = OmegaConf.to_container(raw, resolve=True) if OmegaConf.is_config(raw) else raw
            except (OmegaConfBaseException, ValueError):
                value = None
            label = FILES_KEY if where == path else RESUMED_FILES_KEY
            missing += [(label, p) for p in (os.path.join(where, name) for name in checkpoint_file_names(value))
                        if not os.path.exists(p)]
    return missing


def download_commands(config_path: str | os.PathLike | None) -> list[str]:
    """The ``tune download ...`` commands in the config file's header comment (the comment lines
    before its first setting), in order; ``[]`` when it names none or cannot be read."""
    if config_path is None:
        return []
    try:
        with open(config_path, encoding="utf-8", errors="replace") as f:
            head = [line for _, line in zip(range(200), f)]
    except OSError:
        return []
    found = []
    for line in head:
        text = line.strip()
        if text and not text.startswith("#"):
            break
        m = _DOWNLOAD_RE.match(text)
        if m:
            found.append(m[1])
    return found


def missing_model_error(missing: Sequence[tuple[str, str]], config_path: str | os.PathLike | None, *,
                        who: str = "every rank", shipped_hint: str = "") -> str:
    """The refusal of a launch whose model or tokenizer is not here: every missing path, then how
    to get them (the config's own ``tune download`` commands when it names them).

    Args:
        missing: ``(key, path)`` pairs (:func:`missing_model_paths`).
        config_path: the config file the job reads (its header comment is searched).
        who: what would fail (``"every rank"``, ``"every trial"``).
        shipped_hint: what to say instead for the project's own configs (their tiny assets).
    """
    paths = "; ".join(f"{key} {path}" for key, path in missing)
    keys = list(dict.fromkeys(key for key, _ in missing))
    if keys == [RESUMED_FILES_KEY]:
        return (f"the checkpoint this resumed job reads is not here, so {who} would fail at start-up: {paths} "
                f"{'does' if len(missing) == 1 else 'do'} not exist. A full fine-tune resumed with "
                "resume_from_checkpoint=True reads checkpointer.checkpoint_files from checkpointer.output_dir "
                "(torchtune 0.6.1): set output_dir to the run to resume and checkpoint_files to its epoch_N files "
                "(tune-magic resume JOB does both), or drop resume_from_checkpoint. Nothing was started")
    point = ", ".join(f"{k}=..." for k in keys if k not in (FILES_KEY, RESUMED_FILES_KEY)) or f"{FILES_KEY}=[...]"
    text = f"the model or tokenizer this config reads is not here, so {who} would fail at start-up: {paths} " \
           f"{'does' if len(missing) == 1 else 'do'} not exist. "
    commands = download_commands(config_path)
    if shipped_hint:
        text += shipped_hint
    elif commands:
        text += (f"Download it as the config {Path(config_path).name} says: " + "; then ".join(commands)
                 + f" (or override {point} to where it is)")
    else:
        text += f"Download the model (e.g. tune download <model> --output-dir <dir>) and override {point} to where it is"
    return text + ". Nothing was started"
