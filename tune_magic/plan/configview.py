"""Read where a plan's job will write: its output, metric-log and checkpoint directories.

Pure (no processes): loads the plan's config with OmegaConf, applies the plan's overrides exactly
as torchtune 0.6.1's config parser does (:mod:`tune_magic.config.tuneparse`), and resolves three keys. Used to
keep concurrent jobs apart and to warn when a config writes outside the job's ``output_dir``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tune_magic.plan.model import LaunchPlan

#: Config keys (torchtune 0.6.1 conventions) holding directories a job writes to.
METRIC_LOG_DIR_KEY = "metric_logger.log_dir"
CHECKPOINT_DIR_KEY = "checkpointer.output_dir"
#: Last parts of config keys (torchtune 0.6.1 conventions: ``output_dir``, ``checkpointer.output_dir``,
#: ``metric_logger.log_dir``, ``profiler.output_dir``...) naming a path the job writes to; a key
#: ending in ``_`` plus one of these counts too (``adapter_output_dir``). Inputs
#: (``checkpoint_dir``, ``tokenizer.path``, ``data_dir``) are not among them.
WRITTEN_LEAVES = ("output_dir", "log_dir", "save_dir", "cache_dir", "output_path", "save_path")


@dataclass(frozen=True)
class JobDirs:
    """Resolved directories of a job (absolute paths, or ``None`` when unset or unresolvable).

    Attributes:
        output_dir: the config's ``output_dir``.
        metric_log_dir: ``metric_logger.log_dir`` (where torchtune's DiskLogger writes ``log_*.txt``).
        checkpoint_dir: ``checkpointer.output_dir``.
        warnings: human-readable warnings, e.g. a checkpoint dir outside ``output_dir``.
        missing_inputs: ``(key, path)`` of the model's and tokenizer's inputs that do not exist
            here (:func:`tune_magic.config.modelfiles.missing_model_paths`), every one of them.
        errors: why a directory key could not be resolved (e.g. an ``${oc.env:...}`` variable
            that is not set); the job would fail at start-up.
        epochs, max_steps_per_epoch: the config's keys of those names (torchtune 0.6.1 recipes:
            how many epochs, and the cap on steps per epoch), positive integers, or ``None``
            when unset, null, or not a positive integer (cards show how long the run is).
    """

    output_dir: str | None
    metric_log_dir: str | None
    checkpoint_dir: str | None
    warnings: list[str] = field(default_factory=list)
    missing_inputs: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    epochs: int | None = None
    max_steps_per_epoch: int | None = None


def _select(cfg, key: str, cwd: str, errors: list[str] | None = None) -> str | None:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
    except (OmegaConfBaseException, ValueError) as exc:
        if errors is not None:
            first = str(exc).strip().splitlines()[0]
            errors.append(f"config key {key} cannot be resolved ({first}); set what it refers to or override {key}=...")
        return None
    if value is None or not isinstance(value, (str, os.PathLike)) or not str(value):
        return None
    text = str(value)
    if text.startswith("~"):
        # the recipe never expands it: "~/x" would be a folder named "~" in the job's working directory
        if errors is not None:
            errors.append(f"config key {key} is {text!r}: torchtune does not expand ~, so the job would use a folder "
                          f"named '~' in its working directory; write the full path, e.g. "
                          f"{key}={os.path.expanduser(text)}")
        return None
    return os.path.normpath(os.path.join(cwd, text))


def _count(cfg, key: str) -> int | None:
    """``key``'s value when it is a positive integer (or its text), else ``None``."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
    except (OmegaConfBaseException, ValueError):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _inside(child: str, parent: str) -> bool:
    return Path(child) == Path(parent) or Path(parent) in Path(child).parents


def _with_overrides(plan: LaunchPlan):
    """The plan's config with its overrides applied exactly as torchtune 0.6.1 applies them
    (:func:`tune_magic.config.tuneparse.recipe_config`: deletions from the config file first, the
    component shorthand, then the dotlist merge), interpolations unresolved.

    Raises:
        ValueError: the config cannot be read or an override not applied (the message says which).
    """
    import yaml
    from omegaconf.errors import OmegaConfBaseException

    from tune_magic.config.tuneparse import recipe_config

    try:
        return recipe_config(plan.config, plan.overrides)
    except (OmegaConfBaseException, yaml.YAMLError, OSError, ValueError) as exc:
        raise ValueError(f"cannot read config {plan.config} with its overrides ({exc})") from None


def written_paths(plan: LaunchPlan, cwd: str | os.PathLike | None = None) -> list[tuple[str, str]]:
    """``(key, absolute path)`` of every path the plan's job writes to (keys whose last part is one
    of :data:`WRITTEN_LEAVES`), resolved as :func:`resolve_dirs` resolves them; keys that cannot be
    resolved, and a config that cannot be read, give nothing."""
    from omegaconf import OmegaConf

    try:
        cfg = _with_overrides(plan)
    except ValueError:
        return []
    cwd = os.fspath(cwd) if cwd is not None else os.getcwd()
    keys: list[str] = []

    def walk(node, prefix: str) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            key = f"{prefix}{k}"
            if isinstance(v, (dict, list)):
                walk(v, key + ".")
            elif isinstance(k, str) and any(k == leaf or k.endswith("_" + leaf) for leaf in WRITTEN_LEAVES):
                keys.append(key)

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return [(key, path) for key in keys for path in [_select(cfg, key, cwd)] if path is not None]


def resolve_dirs(plan: LaunchPlan, cwd: str | os.PathLike | None = None) -> JobDirs:
    """Resolve the plan's ``output_dir``, metric-log dir and checkpoint dir.

    Interpolations resolve against this process's environment, which matches the job's for the
    variables configs use (``TUNE_MAGIC_HOME`` is the same value :func:`tune_magic.home` gives).
    Relative paths are taken from ``cwd``, the job's working directory (default: this process's).

    Returns:
        :class:`JobDirs`; a directory that cannot be resolved is ``None``, never an error.
    """
    try:
        cfg = _with_overrides(plan)
    except ValueError as exc:
        return JobDirs(None, None, None, errors=[str(exc)])
    cwd = os.fspath(cwd) if cwd is not None else os.getcwd()
    errors: list[str] = []
    out = _select(cfg, "output_dir", cwd, errors)
    logs = _select(cfg, METRIC_LOG_DIR_KEY, cwd, errors)
    ckpt = _select(cfg, CHECKPOINT_DIR_KEY, cwd, errors)
    warnings = []
    if out is None:
        for key, value in ((METRIC_LOG_DIR_KEY, logs), (CHECKPOINT_DIR_KEY, ckpt)):
            if value is not None:
                warnings.append(f"the config has no output_dir, so {key} {value} is not made per job: concurrent "
                                "jobs from this config will share it; add output_dir to the config")
    else:
        for key, value in ((METRIC_LOG_DIR_KEY, logs), (CHECKPOINT_DIR_KEY, ckpt)):
            if value is not None and not _inside(value, out):
                warnings.append(
                    f"{key} is {value}, outside this job's output_dir {out}: concurrent jobs from this config "
                    f"will share it; set {key}=${{output_dir}}/... in the config"
                )
    from tune_magic.paths import home

    registry = os.path.normpath(str(home(plan.env) / "jobs"))
    for key, value in (("output_dir", out), (METRIC_LOG_DIR_KEY, logs), (CHECKPOINT_DIR_KEY, ckpt)):
        if value is not None and _inside(os.path.realpath(value), os.path.realpath(registry)):
            errors.append(f"{key} {value} is inside tune_magic's job registry {registry}, where every folder must be "
                          "a job; choose another directory")
    from tune_magic.config.modelfiles import missing_model_paths

    missing = missing_model_paths(cfg, cwd, _select, errors)
    return JobDirs(out, logs, ckpt, warnings, missing, errors, epochs=_count(cfg, "epochs"),
                   max_steps_per_epoch=_count(cfg, "max_steps_per_epoch"))


def write_overlaid_config(base: str | os.PathLike | None, overlay_yaml: str, dest: str | os.PathLike) -> Path:
    """Write the config a job runs with: ``overlay_yaml`` merged over the ``base`` config file (or
    ``overlay_yaml`` alone), interpolations kept unresolved, to ``dest``.

    Raises:
        ValueError: the overlay is not a YAML mapping.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    import yaml

    try:
        overlay = OmegaConf.create(overlay_yaml)
        if not OmegaConf.is_dict(overlay):
            raise ValueError("the config overlay must be a YAML mapping")
        merged = OmegaConf.merge(OmegaConf.load(base), overlay) if base is not None else overlay
    except (yaml.YAMLError, OmegaConfBaseException, UnicodeDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"the cell body cannot be used as a config ({first})") from None
    dest = Path(dest)
    OmegaConf.save(merged, dest, resolve=False)
    return dest
