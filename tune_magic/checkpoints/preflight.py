"""Resume pre-flight: what a job's ``output_dir`` holds, and the exact overrides that continue it.

Pure: reads files, starts nothing, never imports torch (checkpoint files are read by
:mod:`tune_magic.checkpoints.files`, which touches only their small index parts). Call
:func:`preflight` with what the job record holds (recipe, resolved ``output_dir``, config path
and the overrides it ran with, plus any the user adds); it returns a :class:`ResumePreflight` or
raises :class:`~tune_magic.errors.PlanError` saying why the job cannot be resumed and what to do.

torchtune 0.6.1 semantics (read from its recipes and checkpointers, measured on CPU):

* Checkpoints are written only at epoch ends, as ``epoch_<K>/`` under ``checkpointer.output_dir``
  (K the 0-based epoch). Only the non-final ones also write ``recipe_state/recipe_state.pt``
  (optimizer state, ``seed``, ``epochs_run``, ``total_epochs``, ``max_steps_per_epoch``, the
  data-loader state), overwritten each time, last in the save. So ``epochs_run = K + 1`` pairs
  the recipe state with its ``epoch_K/``, and a larger ``epoch_*`` folder (the final save, or a
  save cut short) is newer than the recipe state: the files are always pinned, never left to the
  checkpointer's "largest epoch folder" search.
* LoRA recipes: ``resume_from_checkpoint=True checkpointer.adapter_checkpoint=epoch_K/adapter_model.pt
  checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt``; both paths are joined onto
  ``checkpointer.output_dir``. The base weights come from ``checkpoint_dir`` as before.
* Full fine-tunes: ``resume_from_checkpoint=True checkpointer.checkpoint_files=[epoch_K/model-00001-of-0000N.safetensors,
  ...]`` (0.6.1 reads a resumed full model from ``output_dir``, not ``checkpoint_dir``; the docs'
  form, which sidesteps torchtune#2927) plus the pinned ``recipe_checkpoint``.
* ``full_finetune_distributed`` with ``enable_async_checkpointing=True`` saves its non-final
  epochs as distributed checkpoints ``dist_epoch_<K>/`` (complete once ``.metadata`` is written)
  and resumes from the newest one by itself; if that load fails it logs "Training will start
  from the base checkpoint" and trains on from the base model: :func:`failed_resume_line` finds
  that line, and the outcome rule makes such a job ``failed`` (:mod:`tune_magic.registry.outcome`,
  rule 4; the evidence is read by :func:`tune_magic.logs.endevidence.failed_resume_line`).
* The seed and ``max_steps_per_epoch`` of the checkpoint win over the config's; ``epochs`` comes
  from the config.

How exact each recipe's resume is (the :attr:`ResumePreflight.case`): see :data:`CASES`.

Recipes it knows: torchtune's ``lora_finetune_single_device``, ``lora_finetune_distributed``,
``qat_lora_finetune_distributed``, ``full_finetune_single_device``, ``full_finetune_distributed``
and ``qat_distributed`` (recognised by name, or by their file inside an installed torchtune), and
any recipe file that declares a line ``TUNE_MAGIC_RESUME = "lora"`` or ``"full"`` at top level:
this project's ``lora_finetune`` and ``full_finetune`` do (and the test suite's stand-in recipe).
The declaration means "writes torchtune 0.6.1's layout, takes its resume keys, and resumes
exactly"; a copy of a built-in recipe (``tune cp``) is unknown until its author adds it.

Not decided here (the caller's, from the job record and its scheduler, before calling): a job
that succeeded, a job whose outcome is unknown while its engine has not confirmed that nothing of
it runs, and a live job writing the same ``output_dir`` — each would make two runs share one
``output_dir``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from tune_magic.errors import NothingToResume, PlanError
# the line full_finetune_distributed (0.6.1) logs when its resume from an async checkpoint failed: one
# definition, which the outcome rule's evidence also reads from a resumed job's log (a failed resume)
from tune_magic.logs.endevidence import FAILED_RESUME_TEXT  # noqa: F401
from tune_magic.checkpoints.recipes import (  # noqa: F401  (the pre-flight's recipe table, re-exported)
    BUILTIN_RECIPES, FULL, LORA, SHIPPED_RECIPES, RecipeSupport, known_recipes, recipe_support,
)
from tune_magic.checkpoints.layout import (  # noqa: F401  (RECIPE_STATE, RecipeState, read_recipe_state: public here too)
    DIST_EPOCH_DIR, EPOCH_DIR, RECIPE_STATE, RecipeState, config_value, epoch_problems, int_or_none, load_config,
    null_text, numbered_dirs, raw_value, read_recipe_state, rel_path, size_text,
)


#: The resumed run gives the same losses as an uninterrupted one (tune_magic's recipes, tested
#: step for step on CPU).
CASE_EXACT = "exact"
#: Global step and LR schedule continue from the checkpoint, each remaining epoch sees the data an
#: uninterrupted run would (0.6.1 never reloads its saved data-loader state; every epoch reshuffles
#: from its seed and epoch number). Measured step for step on CPU for full_finetune_single_device
#: and lora_finetune_single_device (when its CPU merge, below, is off); read from the code for the
#: distributed recipes.
CASE_CONTINUES = "continues"
#: lora_finetune_single_device when max_steps_per_epoch does not truncate the epoch (null, or not
#: below the epoch's batches): the recipe sets ``global_step`` only when it truncates, so the
#: resumed run logs ``Step 1`` again and restarts the LR schedule, warm-up included.
CASE_STEPS_RESTART = "steps_restart"
#: full_finetune_distributed with enable_async_checkpointing: the recipe picks the newest
#: ``dist_epoch_<K>/`` itself (no file can be pinned); a failed load is only a warning line.
CASE_ASYNC = "async_checkpoint"

#: What each case means for the resumed run, as :meth:`ResumePreflight.summary` says it.
CASES = {
    CASE_EXACT: "exact: the remaining steps give the same losses as an uninterrupted run",
    CASE_CONTINUES: ("continues: global step and LR schedule go on from the checkpoint, and each remaining "
                     "epoch sees the data an uninterrupted run would (torchtune 0.6.1 does not reload its "
                     "data-loader state; every epoch reshuffles from its seed and epoch number)"),
    CASE_STEPS_RESTART: ("steps restart: {recipe} sets its global step only when max_steps_per_epoch truncates an "
                         "epoch, so with max_steps_per_epoch={max_steps} the resumed run logs Step 1 again and "
                         "restarts the LR schedule with its warm-up over all {epochs} epochs: its losses and "
                         "learning rates differ from an uninterrupted run's, and its step numbers repeat the "
                         "earlier run's"),
    CASE_ASYNC: ("async checkpoint: the recipe loads the newest complete dist_epoch_<K>/ itself (it cannot be "
                 "pinned); if that load fails it logs \"Training will start from the base checkpoint\" and "
                 "trains on from the base model, and tune_magic records the job as failed (a failed resume)"),
}


_LOG_TAIL_BYTES = 256 << 10


@dataclass(frozen=True)
class ResumePreflight:
    """What resuming a job will do. Produced by :func:`preflight`.

    Attributes:
        recipe: the recipe as given (path or name).
        support: how that recipe resumes (:class:`RecipeSupport`).
        output_dir: the job's ``output_dir``.
        checkpoint_root: where the checkpoints are (``checkpointer.output_dir``, normally
            ``output_dir``); the pinned paths are relative to it.
        epoch: K of the checkpoint resumed from (``epoch_K/`` or ``dist_epoch_K/``, 0-based).
        checkpoint: that folder.
        files: the checkpoint's files the resumed run loads, relative to ``checkpoint_root``.
        recipe_state: the recipe state read, or ``None`` (async checkpoints keep it inside
            ``dist_epoch_K/``).
        epochs_done: epochs the checkpoint holds (``epochs_run``).
        total_epochs: epochs the resumed run trains to (the config's ``epochs``), or ``None``.
        max_steps_per_epoch: the value the resumed run uses (the checkpoint's).
        steps_per_epoch: optimizer steps per epoch, from the job's progress bar, else
            ``max_steps_per_epoch`` (then an upper bound), else ``None``.
        resume_step: global step at the checkpoint (steps), or ``None`` when unknown.
        first_step: the step number the resumed run logs first, or ``None`` when unknown.
        last_step: the latest step the job reached, from its log, or ``None`` (unknown).
        lost_steps: steps done after the checkpoint, which the resumed run repeats; ``None``:
            unknown (no log given, or it shows no progress bar).
        overrides: the ``key=value`` overrides the resume adds, in order.
        case: one of :data:`CASES`' keys.
        warnings: consequences and oddities, one plain sentence each.
    """

    recipe: str
    support: RecipeSupport
    output_dir: Path
    checkpoint_root: Path
    epoch: int
    checkpoint: Path
    files: tuple[str, ...]
    recipe_state: RecipeState | None
    epochs_done: int
    total_epochs: int | None
    max_steps_per_epoch: int | None
    steps_per_epoch: int | None
    resume_step: int | None
    first_step: int | None
    last_step: int | None
    lost_steps: int | None
    overrides: tuple[str, ...]
    case: str
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def resumed_overrides(self, original: Sequence[str]) -> list[str]:
        """Return ``original`` without the keys the resume sets (a resume of a resume replaces
        them), followed by :attr:`overrides`.

        Args:
            original: the job's overrides (``key=value`` and ``~key``), plus any the user adds.
        """
        ours = {o.split("=", 1)[0] for o in self.overrides}
        kept = [o for o in original if o.split("=", 1)[0].lstrip("~") not in ours]
        return kept + list(self.overrides)

    @property
    def lost_text(self) -> str:
        """The lost work in words: ``"2 steps (steps 9-10)"``, ``"nothing"``, or ``"unknown ..."``."""
        if self.lost_steps is None:
            return "unknown (no progress of the job was read)"
        if self.lost_steps == 0:
            return "nothing (the job stopped at its checkpoint)"
        plural = "s" if self.lost_steps != 1 else ""
        if self.resume_step is not None:
            first, last = self.resume_step + 1, self.resume_step + self.lost_steps
            span = f"step {first}" if first == last else f"steps {first}-{last}"
            return f"{self.lost_steps} step{plural} ({span}), done again"
        return f"{self.lost_steps} step{plural}, done again"

    def summary(self) -> str:
        """A few plain lines: what was found, what is lost, what is added, the case, the warnings."""
        total = f" of {self.total_epochs}" if self.total_epochs is not None else ""
        at = f", global step {self.resume_step}" if self.resume_step is not None else ""
        lines = [f"Resume {self.support.name} from {self.checkpoint.name}/ ({self.epochs_done}{total} epochs done{at})"]
        lines.append(f"  output_dir: {self.output_dir}")
        rs = self.recipe_state
        if rs is not None:
            ms = rs.max_steps_per_epoch if rs.max_steps_per_epoch is not None else "null"
            lines.append(f"  recipe state: {rel_path(rs.path, self.checkpoint_root)} (epochs_run {rs.epochs_run}, seed "
                         f"{rs.seed}, max_steps_per_epoch {ms}, {size_text(rs.tensor_bytes)} of tensors)")
        lines.append(f"  loads: {', '.join(self.files)}")
        lines.append(f"  lost: {self.lost_text}")
        if self.first_step is not None:
            lines.append(f"  the resumed run starts at step {self.first_step}")
        lines.append(f"  adds: {' '.join(self.overrides)}")
        text = CASES[self.case].format(recipe=self.support.name, max_steps=null_text(self.max_steps_per_epoch),
                                       epochs=self.total_epochs if self.total_epochs is not None else "the")
        lines.append(f"  case: {text}")
        lines.extend(f"  warning: {w}" for w in self.warnings)
        return "\n".join(lines)


def failed_resume_line(text: str) -> str | None:
    """Return the first line of ``text`` saying a resume fell back to the base checkpoint, or ``None``.

    Matches full_finetune_distributed's (0.6.1) ``Failed to load distributed checkpoint: ...
    Training will start from the base checkpoint.`` warning, with or without a logger or rank
    prefix. Such a run trains from the base model although it was asked to resume: a failure.
    """
    for line in text.splitlines():
        if FAILED_RESUME_TEXT in line:
            return line.strip()
    return None


# -- the job's progress -------------------------------------------------------------------------


def _latest_bar(progress: str | None, log_path: str | os.PathLike[str] | None):
    from tune_magic.logs.progress import parse_bar

    if progress:
        bar = parse_bar(progress)
        if bar is not None:
            return bar
    if log_path is None:
        return None
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _LOG_TAIL_BYTES))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for record in reversed(re.split(r"\r\n|\r|\n", tail)):
        bar = parse_bar(record)
        if bar is not None:
            return bar
    return None


# -- the pre-flight -----------------------------------------------------------------------------


def preflight(
    recipe: str,
    output_dir: str | os.PathLike[str],
    *,
    config: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    recipe_name: str | None = None,
    progress: str | None = None,
    log_path: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> ResumePreflight:
    """Read a job's ``output_dir`` and say how to resume it, before anything starts.

    Long: the steps are short functions below; what is long here is the arguments and the refusals.

    Reads directory listings, the checkpoint files' headers and ``recipe_state.pt``'s small entries
    (never its tensors; see :mod:`tune_magic.checkpoints.files`), the config, and at most the last
    256 KiB of ``log_path``. Never imports torch.

    Args:
        recipe: the job's recipe (job records hold its absolute path) or a recipe name.
        output_dir: the job's resolved ``output_dir``.
        config: the job's config file (absolute path), or ``None``.
        overrides: the job's overrides in order (``key=value``, ``~key``), then any the user adds
            for the resumed run; read as torchtune 0.6.1 reads them.
        recipe_name: the recipe name as the user typed it, when known.
        progress: the job's latest progress-bar text (torchtune's tqdm line, e.g. the job
            summary's ``progress``), to count the lost steps.
        log_path: the job's combined log, read from its end when ``progress`` gives nothing.
        cwd: the job's working directory, against which relative paths of its config are taken
            (default: this process's).

    Returns:
        A :class:`ResumePreflight`.

    Raises:
        NothingToResume: (a PlanError) nothing to resume from: no checkpoint yet (the job died in its
            first epoch) or the ``output_dir`` is gone (``fresh_start`` is True for both), only a
            final checkpoint, or training finished.
        PlanError: the recipe is unknown, the
            recipe state is truncated, damaged or not a torch file, the checkpoint it pairs with is
            missing or incomplete, the base checkpoint is gone, or the config cannot be read. The
            message says why and what to do.
    """
    support = recipe_support(recipe, recipe_name)
    cwd = os.fspath(cwd) if cwd is not None else os.getcwd()
    out = Path(os.path.normpath(os.path.join(cwd, os.fspath(output_dir))))
    if not out.is_dir():
        raise NothingToResume(f"cannot resume: the job's output_dir {out} is gone, and with it every checkpoint; "
                              "start a fresh run with the same settings", fresh_start=True)
    cfg = load_config(config, overrides)
    warnings: list[str] = []
    root = _checkpoint_root(cfg, out, cwd, warnings)
    epochs = int_or_none(config_value(cfg, "epochs"))
    epochs_dirs = _refuse_what_cannot_resume(support, cfg, root, cwd, epochs)
    if support.async_checkpointing and config_value(cfg, "enable_async_checkpointing") is True:
        return _async(support, recipe, out, root, cfg, epochs, progress, log_path, warnings)
    state, k, folder, files = _paired_checkpoint(support, cfg, root, epochs_dirs, epochs, warnings)
    _config_warnings(cfg, state, epochs, warnings)
    bar = _latest_bar(progress, log_path)
    max_steps = state.max_steps_per_epoch
    steps_per_epoch = bar.total if bar is not None and bar.total else max_steps
    case = _case(support, cfg, bar, max_steps, warnings)
    resume_step = state.epochs_run * steps_per_epoch if steps_per_epoch else None
    first_step = 1 if case == CASE_STEPS_RESTART else (resume_step + 1 if resume_step is not None else None)
    last_step, lost = _lost(bar, state.epochs_run, resume_step)
    return ResumePreflight(recipe, support, out, root, k, folder, tuple(files) + (RECIPE_STATE,), state,
                           state.epochs_run, epochs, max_steps, steps_per_epoch, resume_step, first_step, last_step,
                           lost, _resume_overrides(support, files), case, tuple(warnings))


def _checkpoint_root(cfg, out: Path, cwd: str, warnings: list[str]) -> Path:
    """Where the checkpoints are: ``checkpointer.output_dir`` (``output_dir`` itself in every
    torchtune config: ``${output_dir}``, never re-resolved here, where the environment its
    interpolations read may differ from the job's)."""
    ckpt_out = None if raw_value(cfg, "checkpointer.output_dir") == "${output_dir}" else config_value(
        cfg, "checkpointer.output_dir")
    root = Path(os.path.normpath(os.path.join(cwd, ckpt_out))) if isinstance(ckpt_out, str) and ckpt_out else out
    if root != out:
        warnings.append(f"checkpointer.output_dir is {root}, not output_dir {out}: the checkpoints are read there")
        if not root.is_dir():
            raise PlanError(f"cannot resume: checkpointer.output_dir {root} is gone, and with it every checkpoint; "
                            "start a fresh run with the same settings")
    return root


def _refuse_what_cannot_resume(support: RecipeSupport, cfg, root: Path, cwd: str, epochs: int | None) -> dict:
    """Refuse a run whose base checkpoint is gone or whose training finished; return its
    ``epoch_<K>/`` folders by K."""
    base_dir = config_value(cfg, "checkpointer.checkpoint_dir")
    if isinstance(base_dir, str) and base_dir and not Path(cwd, base_dir).is_dir():
        raise PlanError(f"cannot resume: the base checkpoint directory {base_dir} (checkpointer.checkpoint_dir) is "
                        "gone; the resumed run reads the model's config (and for LoRA the base weights) from it. "
                        "Restore it, or override checkpointer.checkpoint_dir=<where it is now>")
    epochs_dirs = numbered_dirs(root, EPOCH_DIR)
    if epochs is not None and (epochs - 1) in epochs_dirs:
        final = epochs_dirs[epochs - 1]
        _, blocking, _ = epoch_problems(final, support, cfg, for_resume=False)
        if not blocking:
            raise NothingToResume(f"nothing to resume: {final.name}/ is the final checkpoint of all {epochs} epochs and "
                                  "it is complete, so training finished (anything that failed came after the last "
                                  "save). To train longer, start a new run from its weights", finished=True)
    return epochs_dirs


def _paired_checkpoint(support: RecipeSupport, cfg, root: Path, epochs_dirs: dict, epochs: int | None,
                       warnings: list[str]) -> tuple[RecipeState, int, Path, list[str]]:
    """The recipe state and the ``epoch_K/`` it pairs with (``epochs_run = K + 1``), checked
    complete: (state, K, folder, files to pin)."""
    state_path = root / RECIPE_STATE
    if not state_path.is_file():
        if epochs_dirs:
            last = max(epochs_dirs)
            raise NothingToResume(
                f"nothing to resume from: {root} has {epochs_dirs[last].name}/ but no {RECIPE_STATE}. torchtune writes the "
                "recipe state (optimizer, epochs done) only at the end of a non-final epoch, so that checkpoint holds "
                "weights only: start a new run (from its weights if you like)")
        raise NothingToResume(f"nothing to resume from: {root} holds no checkpoint (no epoch_<K>/, no {RECIPE_STATE}): "
                              "the job stopped in its first epoch, before any save. A fresh start with the same "
                              "settings is possible: launch it again", fresh_start=True)
    state = read_recipe_state(state_path)
    k = state.epochs_run - 1
    if k < 0:
        raise PlanError(f"cannot resume: {state_path} says {state.epochs_run} epochs were run; it pairs with no "
                        "checkpoint. Start a fresh run")
    folder = root / f"epoch_{k}"
    files, blocking, other = epoch_problems(folder, support, cfg, for_resume=True)
    if blocking:
        raise PlanError(
            f"cannot resume: {RECIPE_STATE} says {state.epochs_run} epoch(s) were done, which pairs it with "
            f"{folder.name}/, but " + "; ".join(blocking) + ". An older epoch's weights would not match the optimizer "
            "state, so there is nothing consistent to continue from: start a new run")
    warnings += other
    if epochs is not None and state.epochs_run >= epochs:
        raise NothingToResume(f"nothing to resume: the recipe state says {state.epochs_run} epochs were done and the "
                              f"config asks for epochs={epochs}; add epochs=<more than {state.epochs_run}> to train "
                              "longer", finished=True)
    newer = sorted(n for n in epochs_dirs if n > k)
    if newer:
        names = ", ".join(f"{epochs_dirs[n].name}/" for n in newer)
        one = len(newer) == 1
        warnings.append(f"{names} {'is' if one else 'are'} newer than the recipe state (which pairs with "
                        f"{folder.name}/) and {'holds' if one else 'hold'} no optimizer state: resuming from "
                        f"{folder.name}/ (pinned); {names} will be written again")
    return state, k, folder, files


def _config_warnings(cfg, state: RecipeState, epochs: int | None, warnings: list[str]) -> None:
    """Where the config and the checkpoint disagree, the checkpoint's seed and
    ``max_steps_per_epoch`` win (and the config's ``epochs``): say so."""
    max_steps = state.max_steps_per_epoch
    cfg_max_steps = config_value(cfg, "max_steps_per_epoch")
    if "max_steps_per_epoch" in cfg and int_or_none(cfg_max_steps) != max_steps:
        warnings.append(f"the config says max_steps_per_epoch={null_text(cfg_max_steps)}; the recipe uses the "
                        f"checkpoint's {null_text(max_steps)}")
    cfg_seed = int_or_none(config_value(cfg, "seed"))
    if state.seed is not None and cfg_seed is not None and cfg_seed != state.seed:
        warnings.append(f"the config says seed={cfg_seed}; the recipe uses the checkpoint's seed {state.seed}")
    if state.total_epochs is not None and epochs is not None and epochs != state.total_epochs:
        warnings.append(f"the checkpoint was saved by a run of {state.total_epochs} epochs; the resumed run trains to "
                        f"the config's epochs={epochs}")


def _case(support: RecipeSupport, cfg, bar, max_steps: int | None, warnings: list[str]) -> str:
    """How exact the resume is (:data:`CASES`), with the warnings that name its consequences."""
    case = CASE_EXACT if support.exact else CASE_CONTINUES
    if support.steps_continue_only_when_truncated:
        if max_steps is None or (bar is not None and bar.total and bar.total < max_steps):
            case = CASE_STEPS_RESTART
        elif bar is None or not bar.total or bar.total == max_steps:
            warnings.append(f"{support.name} continues its step count and LR schedule only if max_steps_per_epoch="
                            f"{max_steps} is below the epoch's number of batches; if it is not, the resumed run logs "
                            "Step 1 again and restarts the LR warm-up")
    device = str(config_value(cfg, "device") or "")
    if support.merges_lora_in_place_on_cpu and device == "cpu" and config_value(cfg, "save_adapter_weights_only") is not True:
        warnings.append(
            f"on CPU, {support.name}'s checkpoint save (torchtune 0.6.1) merges the LoRA weights into the live model's "
            "base weights (its .cpu() copy of a CPU tensor is the tensor itself, and the merge adds in place): after "
            "each save the run trains on a changed base. The resumed run starts from the clean base plus the saved "
            "adapter, so its losses differ from the interrupted run's (and its own later saves do the same); "
            "save_adapter_weights_only=True avoids it")
    return case


def _resume_overrides(support: RecipeSupport, files: list[str]) -> tuple[str, ...]:
    """The overrides that continue from the pinned files (paths relative to ``output_dir``)."""
    if support.kind == LORA:
        return ("resume_from_checkpoint=True", f"checkpointer.adapter_checkpoint={files[0]}",
                f"checkpointer.recipe_checkpoint={RECIPE_STATE}")
    return ("resume_from_checkpoint=True", f"checkpointer.checkpoint_files=[{','.join(files)}]",
            f"checkpointer.recipe_checkpoint={RECIPE_STATE}")


def _lost(bar, epochs_run: int, resume_step: int | None) -> tuple[int | None, int | None]:
    """``(last step, steps done after the checkpoint)`` from the job's latest progress bar."""
    if bar is None:
        return None, None
    done_epochs = bar.epoch - 1  # epochs finished before the bar's one
    if bar.n is not None and bar.total:
        whole = max(0, done_epochs - epochs_run) * bar.total
        return bar.step, whole + (bar.n if done_epochs >= epochs_run else 0)
    if resume_step is not None:
        return bar.step, max(0, bar.step - resume_step)
    return bar.step, None


def _async(support: RecipeSupport, recipe: str, out: Path, root: Path, cfg, epochs: int | None,
           progress: str | None, log_path, warnings: list[str]) -> ResumePreflight:
    """The async-checkpoint case: full_finetune_distributed resumes from its newest ``dist_epoch_K/``."""
    dists = numbered_dirs(root, DIST_EPOCH_DIR)
    complete = {n: p for n, p in dists.items() if (p / ".metadata").is_file() and (p / ".metadata").stat().st_size > 0}
    if not complete:
        why = (f"{', '.join(p.name + '/' for p in dists.values())} lack their .metadata (saves cut short)"
               if dists else "there is no dist_epoch_<K>/")
        raise NothingToResume(f"nothing to resume from: with enable_async_checkpointing the recipe resumes from a "
                              f"complete dist_epoch_<K>/ under {root}, and {why}: the job stopped before its first "
                              "checkpoint was written. A fresh start with the same settings is possible: launch it "
                              "again", fresh_start=True)
    k = max(complete)
    for n in sorted(n for n in dists if n > k):
        warnings.append(f"{dists[n].name}/ is incomplete (no .metadata); the recipe skips it and loads {complete[k].name}/")
    epochs_run = k + 1  # the recipe saves dist_epoch_<curr_epoch> after counting that epoch as run
    if epochs is not None and epochs_run >= epochs:
        raise NothingToResume(f"nothing to resume: {complete[k].name}/ holds {epochs_run} epoch(s) and the config asks for "
                        f"epochs={epochs}; add epochs=<more than {epochs_run}> to train longer", finished=True)
    max_steps = int_or_none(config_value(cfg, "max_steps_per_epoch"))
    bar = _latest_bar(progress, log_path)
    steps_per_epoch = bar.total if bar is not None and bar.total else max_steps
    resume_step = epochs_run * steps_per_epoch if steps_per_epoch else None
    last_step, lost = _lost(bar, epochs_run, resume_step)
    files = tuple(sorted(rel_path(p, root) for p in complete[k].iterdir() if p.is_file()))
    adds = ("resume_from_checkpoint=True", "enable_async_checkpointing=True")
    return ResumePreflight(recipe, support, out, root, k, complete[k], files, None, epochs_run, epochs, max_steps,
                           steps_per_epoch, resume_step, resume_step + 1 if resume_step is not None else None,
                           last_step, lost, adds, CASE_ASYNC, tuple(warnings))
