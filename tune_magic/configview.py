"""Read where a plan's job will write: its output, metric-log and checkpoint directories.

Pure (no processes): loads the plan's config with OmegaConf, applies the plan's overrides the way
torchtune's config parser does (dotlist merge, ``~key`` deletes), and resolves three keys. Used to
keep concurrent jobs apart and to warn when a config writes outside the job's ``output_dir``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .command import LaunchPlan

#: Config keys (torchtune 0.6.1 conventions) holding directories a job writes to.
METRIC_LOG_DIR_KEY = "metric_logger.log_dir"
CHECKPOINT_DIR_KEY = "checkpointer.output_dir"
#: Config keys holding local inputs a job reads; a missing one fails every rank at start-up.
INPUT_KEYS = ("checkpointer.checkpoint_dir", "tokenizer.path")


@dataclass(frozen=True)
class JobDirs:
    """Resolved directories of a job (absolute paths, or ``None`` when unset or unresolvable).

    Attributes:
        output_dir: the config's ``output_dir``.
        metric_log_dir: ``metric_logger.log_dir`` (where torchtune's DiskLogger writes ``log_*.txt``).
        checkpoint_dir: ``checkpointer.output_dir``.
        warnings: human-readable warnings, e.g. a checkpoint dir outside ``output_dir``.
        missing_inputs: ``(key, path)`` of inputs (:data:`INPUT_KEYS`) that do not exist here.
    """

    output_dir: str | None
    metric_log_dir: str | None
    checkpoint_dir: str | None
    warnings: list[str] = field(default_factory=list)
    missing_inputs: list[tuple[str, str]] = field(default_factory=list)


def _select(cfg, key: str) -> str | None:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
    except (OmegaConfBaseException, ValueError):
        return None
    return None if value is None else os.path.abspath(os.path.expanduser(str(value)))


def _inside(child: str, parent: str) -> bool:
    return Path(child) == Path(parent) or Path(parent) in Path(child).parents


def resolve_dirs(plan: LaunchPlan) -> JobDirs:
    """Resolve the plan's ``output_dir``, metric-log dir and checkpoint dir.

    Interpolations resolve against this process's environment, which matches the job's for the
    variables configs use (``TUNE_MAGIC_HOME`` is the same value :func:`tune_magic.home` gives).

    Returns:
        :class:`JobDirs`; a directory that cannot be resolved is ``None``, never an error.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = OmegaConf.load(plan.config)
        dotlist = [o for o in plan.overrides if not o.startswith("~")]
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(dotlist))
        for deletion in (o[1:] for o in plan.overrides if o.startswith("~")):
            parent, _, leaf = deletion.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if node is not None and leaf in node:
                del node[leaf]
    except (OmegaConfBaseException, OSError, ValueError):
        return JobDirs(None, None, None, ["could not read the config to check its output directories"])
    out = _select(cfg, "output_dir")
    logs = _select(cfg, METRIC_LOG_DIR_KEY)
    ckpt = _select(cfg, CHECKPOINT_DIR_KEY)
    warnings = []
    if out is not None:
        for key, value in ((METRIC_LOG_DIR_KEY, logs), (CHECKPOINT_DIR_KEY, ckpt)):
            if value is not None and not _inside(value, out):
                warnings.append(
                    f"{key} is {value}, outside this job's output_dir {out}: concurrent jobs from this config "
                    f"will share it; set {key}=${{output_dir}}/... in the config"
                )
    missing = [(key, path) for key in INPUT_KEYS for path in [_select(cfg, key)]
               if path is not None and not os.path.exists(path)]
    return JobDirs(out, logs, ckpt, warnings, missing)


def write_overlaid_config(base: str | os.PathLike | None, overlay_yaml: str, dest: str | os.PathLike) -> Path:
    """Write the config a job runs with: ``overlay_yaml`` merged over the ``base`` config file (or
    ``overlay_yaml`` alone), interpolations kept unresolved, to ``dest``.

    Raises:
        ValueError: the overlay is not a YAML mapping.
    """
    from omegaconf import OmegaConf

    overlay = OmegaConf.create(overlay_yaml)
    if not OmegaConf.is_dict(overlay):
        raise ValueError("the config overlay must be a YAML mapping")
    merged = OmegaConf.merge(OmegaConf.load(base), overlay) if base is not None else overlay
    dest = Path(dest)
    OmegaConf.save(merged, dest, resolve=False)
    return dest
