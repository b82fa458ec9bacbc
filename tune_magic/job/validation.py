"""A launch's validation: whether and how its job validates, ``--val-split``, the build of
``dataset_val`` as the recipe would build it, before anything starts, and the start of the
evaluator of a job that validates by checkpoints (the rules are
:mod:`tune_magic.checkpoints.validation`'s; the evaluator is :mod:`tune_magic.job.evaluate`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from tune_magic.checkpoints import validation
from tune_magic.checkpoints.validation import fraction_of  # noqa: F401 - --val-split read, for the sweep layer
from tune_magic.errors import PlanError
from tune_magic.registry import store as jobstore
from tune_magic.registry.files import open_nofollow

#: Held by the evaluator for its whole life.
EVALUATOR_LOCK = "evaluator.lock"
#: The evaluator's output.
EVALUATOR_LOG = "evaluator.log"
#: Written when the evaluator has nothing left to do (no revive after it).
EVALUATOR_DONE = "evaluator.done"
#: Seconds the pre-flight build of ``dataset_val`` may take.
CHECK_TIMEOUT_S = 600.0

_CHECKED: dict[str, int] = {}  # digest of what builds dataset_val -> its examples (this process)
_started: list[subprocess.Popen] = []


def evaluation_recipe() -> str:
    """The absolute path of ``recipes/validate_checkpoint.py`` (installed as ``tune_magic.recipes``)."""
    import importlib.util

    spec = importlib.util.find_spec("tune_magic.recipes")
    return str(Path(next(iter(spec.submodule_search_locations))) / f"{validation.EVALUATION_RECIPE}.py")


_HINTS = {
    "FileNotFoundError": "check dataset_val's data_files / source (a path relative to the job's working "
                         "directory, or absolute)",
    "KeyError": "dataset_val's column_map names a column its data lacks: map the data's own columns",
    "InstantiationError": "check dataset_val._component_: a dotted path to a dataset builder, e.g. "
                          "torchtune.datasets.instruct_dataset",
    "TypeError": "a dataset_val key is not an argument of its component: check its keyword arguments",
}


def _check_key(cfg) -> str:
    """A digest of everything that builds ``dataset_val`` (the node, the tokenizer, the loss's
    ``ignore_index``, the batch sizes, the collate): trials of a sweep that differ elsewhere share it."""
    from omegaconf import OmegaConf

    parts = {}
    for key in ("dataset_val", "tokenizer", "loss", "batch_size_val", "batch_size", "collate_fn"):
        node = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        try:
            parts[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        except Exception:  # noqa: BLE001 - an interpolation only the recipe resolves: keep it as written
            parts[key] = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def check_dataset_val(plan, cfg, *, cwd: str, env: Mapping[str, str]) -> int:
    """Build the tokenizer and ``dataset_val`` as the recipe (and an evaluation) would, in a
    process of its own (torch is never imported here); return the validation examples.

    Args:
        plan: the job's :class:`~tune_magic.plan.model.LaunchPlan` (its config, overrides, env).
        cfg: its config with its overrides (to key the result: trials of a sweep build it once).
        cwd: the job's working directory.
        env: the caller's environment.

    Raises:
        PlanError: ``dataset_val`` cannot be built, or holds no example; the message gives the
            recipe's own error and what to check.
    """
    key = _check_key(cfg)
    if key in _CHECKED:
        return _CHECKED[key]
    words = [w for w in plan.overrides if not w.startswith("output_dir=")]
    argv = [sys.executable, evaluation_recipe(), "--config", plan.config, *words, "validate.check=true"]
    try:
        r = subprocess.run(argv, cwd=cwd, env={**env, **plan.env}, capture_output=True, text=True,
                           timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise PlanError(f"building dataset_val took over {CHECK_TIMEOUT_S:.0f} s; check that its data is "
                        "reachable from here. Nothing was started.") from None
    if r.returncode == 0:
        try:
            examples = int(json.loads(r.stdout.strip().splitlines()[-1])["examples"])
        except (ValueError, KeyError, IndexError, TypeError):
            examples = 0
        _CHECKED[key] = examples
        return examples
    line = next((ln for ln in reversed(r.stderr.splitlines()) if ln.startswith("validate_checkpoint: error:")), "")
    why = line.split(": error: ", 1)[1] if line else (r.stderr.strip().splitlines() or ["no output"])[-1]
    kind = why.split(":", 1)[0]
    hint = _HINTS.get(kind, "")
    if "has no examples" in why or "corresponds to no data" in why:  # the recipe's check, or Hugging Face's slice
        hint = "the validation set is empty: give it data (with --val-split, a larger fraction or more data)"
    raise PlanError(f"dataset_val cannot be built as the recipe would build it: {why}" + (f"; {hint}" if hint else "")
                    + ". Nothing was started.")


def val_split_words(plan, fraction: float) -> list[str]:
    """The overrides of ``--val-split`` for the plan's config (see :func:`launch`)."""
    from tune_magic.checkpoints.validation import val_split_overrides
    from tune_magic.config.tuneparse import recipe_config

    return val_split_overrides(recipe_config(plan.config, plan.overrides), fraction)


def validation_of(plan):
    """How the plan's job validates (:func:`tune_magic.checkpoints.validation.plan_validation`), and
    the config it was read from; ``(None, config)`` without a ``dataset_val``.

    Raises:
        PlanError: validation keys that cannot work (the message names the fix).
    """
    from tune_magic.checkpoints.validation import plan_validation
    from tune_magic.config.tuneparse import recipe_config

    if not plan.config:
        return None, None
    try:
        cfg = recipe_config(plan.config, plan.overrides)
    except (OSError, ValueError):
        return None, None  # a config the recipe cannot read: its own checks said why already
    return plan_validation(cfg, plan.recipe, plan.recipe_name), cfg


def evaluator_alive(job_dir: Path) -> bool:
    """Whether a process holds the job's evaluator lock."""
    held = jobstore.lock_is_held(job_dir / EVALUATOR_LOCK)
    return bool(held)


def start_evaluator(job_dir: Path, *, env: Mapping[str, str] | None = None, cwd: str | None = None) -> bool:
    """Start the job's evaluator in a session of its own, unless one holds its lock or it is done;
    return whether one was started. Its output is appended to ``evaluator.log``."""
    if (job_dir / EVALUATOR_DONE).exists() or not os.access(job_dir, os.W_OK):
        return False
    try:
        lock_fd = open_nofollow(job_dir / EVALUATOR_LOCK, os.O_RDWR | os.O_CREAT)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # alive
            return False
        log = open_nofollow(job_dir / EVALUATOR_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            proc = subprocess.Popen([sys.executable, "-m", "tune_magic.job.evaluate", str(job_dir), "--lock-fd",
                                     str(lock_fd)], cwd=cwd if cwd and os.path.isdir(cwd) else None,
                                    env=dict(os.environ if env is None else env), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                    pass_fds=(lock_fd,))
        finally:
            os.close(log)
        _started.append(proc)
        for p in list(_started):  # reaped once exited: none is left a zombie
            if p.poll() is not None:
                _started.remove(p)
        return True
    except OSError:
        return False
    finally:
        os.close(lock_fd)
