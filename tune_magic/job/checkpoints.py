"""A job's checkpoints as things: each ``epoch_N/`` with the step it was saved at, its validation
loss, whether a resume needs it and whether retention removed it; and a checkpoint exported.

``Job.checkpoints()`` and ``Job.export()`` are answered here from the job's files:
:func:`tune_magic.checkpoints.catalog.list_checkpoints` (the folders, read without torch), the
job's log (:class:`~tune_magic.checkpoints.validation.SaveSteps`: the step of each save), its
validation losses (the evaluations of its checkpoints, or the points its recipe logged in its
loop at the save's step), ``recipe_state.pt`` (which one a resume would load) and
``pruned.jsonl`` (what its keeper removed, :mod:`tune_magic.job.keeper`).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from tune_magic.checkpoints import catalog, validation
from tune_magic.registry.record import overrides_of

#: Most bytes of a job's log read for the steps of its saves.
STEPS_READ_BYTES = 256 << 20


def job_config(record) -> Any:
    """The job's config with its overrides (OmegaConf), or ``None`` when it cannot be read."""
    from tune_magic.config.tuneparse import recipe_config

    try:
        return recipe_config(record.config, overrides_of(record))
    except Exception:  # noqa: BLE001 - a config gone since: the folders are read from their files alone
        return None


def _save_steps(log_path: str) -> validation.SaveSteps:
    steps = validation.SaveSteps()
    try:
        with open(log_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - STEPS_READ_BYTES))
            while chunk := f.read(8 << 20):
                steps.feed(chunk.decode("utf-8", errors="replace"))
    except OSError:
        pass
    return steps


#: One line per checkpoint retention removed: ``{"epoch", "at", "bytes_freed", "path"}`` (the keeper writes it).
PRUNED = "pruned.jsonl"


def read_pruned(job_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The lines of a job's ``pruned.jsonl``, oldest first (a torn last line is skipped)."""
    from tune_magic.registry.files import read_epoch_lines

    return read_epoch_lines(Path(job_dir) / PRUNED)


def val_losses(job, steps: validation.SaveSteps) -> dict[int, float]:
    """``{epoch: val_loss}`` of the job's checkpoints that have one: their evaluations', or the
    point its recipe logged in its loop at the step the checkpoint was saved (``steps``)."""
    evaluated = {e.epoch: e.val_loss for e in job.evaluations() if e.val_loss is not None}
    if evaluated:
        return evaluated
    at = {p.step: p.value for p in job.validation_points()}
    out = {}
    for epoch in steps.last:
        step = steps.step_of(epoch - 1)
        if step in at:
            out[epoch - 1] = at[step]
    return out


def listing(record, job_dir: Path, settings=None, *, steps: validation.SaveSteps | None = None,
            losses: dict[int, float] | None = None, resume: int | None = None) -> list[catalog.Checkpoint]:
    """The checkpoints of a job's ``output_dir`` and those its keeper removed (``pruned``), by epoch,
    with ``step`` (from ``steps``), ``val_loss`` (from ``losses``) and ``needed_by_resume``
    (``resume``: the epoch a resume would load) filled where given. Reads the folders only (a live
    card calls it when they changed); :func:`checkpoints_of` gives it what it reads of the log."""
    if not record.output_dir:
        return []
    steps = steps if steps is not None else validation.SaveSteps()
    losses = losses or {}
    out = {c.epoch: replace(c, step=steps.step_of(c.epoch), val_loss=losses.get(c.epoch),
                            needed_by_resume=c.epoch == resume)
           for c in catalog.list_checkpoints(record.output_dir, settings)}
    for entry in read_pruned(job_dir):
        epoch = entry["epoch"]
        if epoch not in out:
            out[epoch] = catalog.Checkpoint(
                epoch=epoch, path=Path(entry.get("path") or Path(record.output_dir) / f"epoch_{epoch}"), files=(),
                bytes_on_disk=0, apparent_bytes=0, kind=None, complete=False, step=steps.step_of(epoch),
                val_loss=losses.get(epoch), pruned=catalog.Pruned(float(entry.get("at") or 0.0),
                                                                  int(entry.get("bytes_freed") or 0)))
    return [out[k] for k in sorted(out)]


def checkpoints_of(job, *, details: bool = True) -> list[catalog.Checkpoint]:
    """``Job.checkpoints()``: one :class:`~tune_magic.checkpoints.catalog.Checkpoint` per ``epoch_N/``
    of the job's ``output_dir`` (and per one its keeper removed, with ``pruned`` set), by epoch,
    with ``step``, ``val_loss`` and ``needed_by_resume`` filled (``details``: they read the job's log
    and metrics; without, the folders and what was pruned only)."""
    record = job.refresh().record
    if not record.output_dir:
        return []
    cfg = job_config(record)
    settings = catalog.SaveSettings.from_config(cfg) if cfg is not None else None
    if not details:
        return listing(record, job.dir, settings)
    steps = _save_steps(record.log_path)
    return listing(record, job.dir, settings, steps=steps, losses=val_losses(job, steps),
                   resume=catalog.resume_epoch(record.output_dir))


def find_of(job, checkpoints: list[catalog.Checkpoint], name: "str | int") -> catalog.Checkpoint:
    """:func:`~tune_magic.checkpoints.catalog.find_checkpoint` for ``job``, saying why none can be
    found where waiting would not help: the job evaluates another job's checkpoint (it saves none of
    its own), or it ended without a complete one.

    Raises:
        CheckpointError: as ``find_checkpoint``; the two cases above, each naming what to do instead.
    """
    if not catalog.kept(checkpoints):
        r = job.record
        if r.evaluates:
            of = r.evaluates.get("job")
            raise catalog.CheckpointError(
                f"job {job.id} evaluates epoch_{r.evaluates.get('epoch')} of job {of} and saves no checkpoint of its "
                f"own; name job {of} instead")
        if not r.state.is_live:
            raise catalog.CheckpointError(
                f"job {job.id} ended ({r.state.label}) without a complete checkpoint, so there is nothing to load; "
                "a recipe saves one at each epoch's end: run the job long enough to finish an epoch")
    return catalog.find_checkpoint(checkpoints, name)


def export_of(job, dest: str | os.PathLike[str], checkpoint: "str | int" = "best"):
    """``Job.export()``: copy one checkpoint of the job with its tokenizer and configs into ``dest``
    (:func:`tune_magic.checkpoints.export.export_checkpoint`).

    Raises:
        CheckpointError: an unknown, pruned or incomplete checkpoint, none with a validation loss for
            ``"best"``, a ``dest`` that is not a path, exists and is not empty, or cannot be written
            (each message says what to do).
    """
    from omegaconf import OmegaConf

    from tune_magic.checkpoints.export import export_checkpoint

    if not isinstance(dest, (str, os.PathLike)) or isinstance(dest, bytes) or not str(dest).strip():
        raise catalog.CheckpointError(f"dest={dest!r}: give the export's folder as a path (a str or "
                                      "pathlib.Path), e.g. job.export('exports/my-model')")

    chosen = find_of(job, checkpoints_of(job), checkpoint)
    record = job.record
    cfg = job_config(record)
    get = (lambda key: OmegaConf.select(cfg, key, default=None)) if cfg is not None else (lambda key: None)
    configs = [p for p in (record.config, Path(record.output_dir or "") / "torchtune_config.yaml")
               if p and Path(p).is_file()]
    return export_checkpoint(chosen.path, dest, tokenizer_path=get("tokenizer.path"), config_files=configs,
                             base_checkpoint_dir=get("checkpointer.checkpoint_dir"),
                             model_type=get("checkpointer.model_type"),
                             settings=catalog.SaveSettings.from_config(cfg) if cfg is not None else None)
