"""Generation from a job's checkpoint: the checks, the checkpoint chosen, the command, a one-shot run.

:meth:`tune_magic.job.Job.generate` answers a prompt with the job's own
model, tokenizer and config, loaded from one of its checkpoints by ``recipes/generate_text.py``
(docs/generation.md). Everything is checked here before a process starts: the prompt and the
options (:class:`GenOptions`), the checkpoint (:func:`choose_checkpoint`: ``"last"``, ``"best"``,
``"epoch_N"``, ``"base"`` or a path). The recipe runs with the job's config and overrides (its
per-job ``output_dir=`` left out), pointed at the checkpoint, with ``generate.output_dir`` the
folder :data:`OUTPUT_FOLDER` of the job's registry directory: it writes nothing anywhere else.
It runs where the job ran: its scheduler turns the command into one that runs there
(:meth:`tune_magic.schedulers.base.Scheduler.interactive_command`: on this machine the command
itself; a cluster's one-task job otherwise). This process never imports torch.

:mod:`tune_magic.job.generators` keeps the recipe's serve mode running between prompts
(``Job.generate``); :func:`generate_once` runs its one-shot mode (the CLI, and
:func:`tune_magic.compare`), whose greedy answer is the same text.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tune_magic.checkpoints.catalog import Checkpoint, CheckpointError, SaveSettings, read_checkpoint
from tune_magic.checkpoints.layout import EPOCH_DIR
from tune_magic.errors import PlanError, UserError
from tune_magic.registry.owner import TOKEN_ENV
from tune_magic.registry.record import JobRecord, overrides_of

#: The recipe, in tune_magic's ``recipes/`` (installed as ``tune_magic.recipes``).
GENERATION_RECIPE = "generate_text"
#: ``generate.output_dir`` and the generation logs: this folder of the job's registry directory.
OUTPUT_FOLDER = "generate"
#: The untrained input model of the job (its config's ``checkpointer.checkpoint_dir``; LoRA off).
BASE = "base"
#: Seconds a one-shot run may take (process start, model load and generation), else it is ended.
ONE_SHOT_TIMEOUT_S = 900.0
#: The recipe's own error lines start with this (``recipes/generate_text.py``).
RECIPE_ERROR = "generate_text: error: "


class GenerationError(UserError, RuntimeError):
    """The generation recipe refused the request or ended without answering (a prompt longer than
    the tokenizer's ``max_seq_len``, a checkpoint that does not fit the model...); the message is
    its own paragraph, or says where its log is."""


@dataclass(frozen=True)
class GenOptions:
    """How to generate (checked by :meth:`checked`; the recipe's keys of the same names).

    Attributes:
        max_new_tokens: at most this many new tokens (>= 1).
        temperature: 0.0 is greedy (the most likely token every step, exactly); > 0 samples.
        top_k: sample among the k most likely tokens only (>= 1), or ``None`` (all).
        seed: seeds the sampling (0 <= seed < 2**63): the same request gives the same text.
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int | None = None
    seed: int = 0

    @classmethod
    def checked(cls, max_new_tokens: Any = 64, temperature: Any = 0.0, top_k: Any = None,
                seed: Any = 0) -> "GenOptions":
        """The options, each checked.

        Raises:
            PlanError: a value of the wrong type or out of range (the message names the option and
                what it takes).
        """
        def whole(name: str, value: Any, low: int, high: int | None = None) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value < low or (high and value >= high):
                bound = f">= {low}" + (" and < 2**63" if high else "")
                raise PlanError(f"{name}={value!r}: give a whole number {bound}")
            return value

        whole("max_new_tokens", max_new_tokens, 1)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not math.isfinite(temperature) or temperature < 0:
            raise PlanError(f"temperature={temperature!r}: give a number >= 0 (0 is greedy, exactly)")
        if top_k is not None:
            whole("top_k", top_k, 1)
        whole("seed", seed, 0, 1 << 63)
        return cls(max_new_tokens, float(temperature), top_k, seed)

    def request(self, prompt: str, stream: bool = False) -> dict[str, Any]:
        """The serve-mode request (one JSON object: docs/generation.md)."""
        return {"prompt": prompt, "max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
                "top_k": self.top_k, "seed": self.seed, "stream": stream}

    def words(self) -> list[str]:
        """The recipe's ``generate.*`` words for these options (one-shot mode)."""
        return [f"generate.max_new_tokens={self.max_new_tokens}", f"generate.temperature={self.temperature!r}",
                f"generate.top_k={'null' if self.top_k is None else self.top_k}", f"generate.seed={self.seed}"]


def check_prompt(prompt: Any) -> str:
    """``prompt`` if it is text with something in it.

    Raises:
        PlanError: not a ``str``, or only whitespace.
    """
    if not isinstance(prompt, str):
        raise PlanError(f"the prompt must be text (str), not {type(prompt).__name__}")
    if not prompt.strip():
        raise PlanError("the prompt is empty: give the text to answer, e.g. job.generate(\"What is ...?\")")
    return prompt


# -- the checkpoint -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChosenCheckpoint:
    """The checkpoint a generation loads.

    Attributes:
        asked: what the caller named (``"last"``, ``"best"``, ``"epoch_3"``, ``"base"``, a path).
        path: the ``epoch_N/`` folder (absolute), or ``"base"``.
        epoch: N of ``epoch_N`` (``None`` for the base model).
        step: the global step it was saved at, when the job's log says (steps).
        val_loss: its validation loss, when the job has one for it.
    """

    asked: str
    path: str
    epoch: int | None = None
    step: int | None = None
    val_loss: float | None = None

    @property
    def label(self) -> str:
        """``epoch_N`` or ``base``: what tables and messages call it."""
        return BASE if self.epoch is None else f"epoch_{self.epoch}"


_SETTINGS: dict[tuple, SaveSettings | None] = {}  # (config, overrides) -> its settings: a record's never change


def _settings(record: JobRecord) -> SaveSettings | None:
    """What the job's config says about its checkpoints, or ``None`` when it cannot be read."""
    key = (record.config, tuple(overrides_of(record)))
    if key not in _SETTINGS:
        _SETTINGS[key] = _read_settings(record)
    return _SETTINGS[key]


def _read_settings(record: JobRecord) -> SaveSettings | None:
    try:
        from omegaconf import OmegaConf

        from tune_magic.config.tuneparse import recipe_config

        cfg = recipe_config(record.config, overrides_of(record))
        return SaveSettings.from_config(OmegaConf.to_container(cfg, resolve=True))
    except Exception:  # noqa: BLE001 - the catalog then reads each folder's kind from its files alone
        return None


def job_checkpoints(job, losses: bool = True) -> list[Checkpoint]:
    """The job's checkpoints (``Job.checkpoints``: pruned ones included), and with ``losses`` their
    ``step`` and ``val_loss`` too (these read the job's log and metrics: "last" or "epoch_N" alone
    need neither).

    Raises:
        CheckpointError: the job has no ``output_dir`` recorded.
    """
    from tune_magic.job.checkpoints import checkpoints_of

    if not job.record.output_dir:
        raise CheckpointError(f"job {job.record.id} has no output_dir recorded, so it has no checkpoint to generate "
                              "from; pass checkpoint=<a path to an epoch_N folder>")
    return checkpoints_of(job, details=losses)


def _by_path(job, path: Path, losses: bool) -> ChosenCheckpoint:
    """A checkpoint named by its folder (relative paths: to the job's working directory)."""
    record = job.record
    path = path.expanduser()
    folder = path if path.is_absolute() else Path(record.cwd) / path
    if record.output_dir and folder.parent.absolute() == Path(record.output_dir).absolute():
        m = EPOCH_DIR.match(folder.name)
        if m:  # one of the job's own: named by its epoch (pruned, incomplete, its loss)
            return _by_name(job, folder.name, losses, asked=str(path))
    ckpt = read_checkpoint(folder, _settings(record))
    if not ckpt.complete:
        raise CheckpointError(f"{ckpt.path} is not a complete checkpoint ({'; '.join(ckpt.problems)}); wait for its "
                              "save to end, or name another")
    return ChosenCheckpoint(str(path), str(ckpt.path), ckpt.epoch)


def _by_name(job, name: str | int, losses: bool, asked: str | None = None) -> ChosenCheckpoint:
    from tune_magic.job.checkpoints import find_of

    ckpt = find_of(job, job_checkpoints(job, losses or name == "best"), name)
    return ChosenCheckpoint(asked or str(name), str(ckpt.path), ckpt.epoch, ckpt.step, ckpt.val_loss)


def choose_checkpoint(job, checkpoint: Any = "last", losses: bool = True) -> ChosenCheckpoint:
    """The checkpoint ``checkpoint`` names for ``job`` (a :class:`~tune_magic.job.Job`).

    Args:
        checkpoint: ``"last"`` (the newest complete), ``"best"`` (the lowest validation loss:
            :func:`tune_magic.checkpoints.catalog.best_of` over the job's evaluations, or its in-loop
            ``val_loss`` at each save step), ``"epoch_N"`` (or N), ``"base"`` (the job's untrained
            input model), or a path to an ``epoch_N/`` folder (``str`` with a ``/``, or a path object).
        losses: fill in the chosen one's ``step`` and ``val_loss`` (they read the job's whole log
            and metrics; ``"best"`` always does).

    Raises:
        CheckpointError: an unknown name, a checkpoint that does not exist, was pruned by retention,
            is incomplete, none complete yet, or ``"best"`` where none has a validation loss (the
            message lists the ones there are and what to do).
    """
    if is_path(check_checkpoint_name(checkpoint)):
        return _by_path(job, Path(os.fspath(checkpoint)), losses)
    if checkpoint == BASE:
        return ChosenCheckpoint(BASE, BASE)
    return _by_name(job, checkpoint, losses)


def is_path(checkpoint: Any) -> bool:
    """Whether ``checkpoint`` names a folder (a path object, or text with a ``/``) rather than a name."""
    return isinstance(checkpoint, os.PathLike) or (isinstance(checkpoint, str) and os.sep in checkpoint)


def check_checkpoint_name(checkpoint: Any) -> Any:
    """``checkpoint`` if it has the form of one (any job's: whether the job has it is
    :func:`choose_checkpoint`'s question).

    Raises:
        CheckpointError: none of ``"last"``, ``"best"``, ``"epoch_N"`` (or N), ``"base"``, a path.
    """
    named = is_path(checkpoint) or checkpoint in ("last", "best", BASE) or (
        isinstance(checkpoint, str) and (EPOCH_DIR.match(checkpoint) or checkpoint.isascii() and checkpoint.isdigit())) or (
        isinstance(checkpoint, int) and not isinstance(checkpoint, bool) and checkpoint >= 0)
    if not named:
        raise CheckpointError(f"checkpoint={checkpoint!r} names no checkpoint: say \"last\", \"best\", \"epoch_N\", "
                              "\"base\" (the untrained input model) or give the path of an epoch_N folder")
    return checkpoint


# -- the command --------------------------------------------------------------------------------------


def hold_checkpoint(job, chosen: "ChosenCheckpoint") -> int | None:
    """Hold ``chosen`` in use while a generation reads it (:mod:`tune_magic.checkpoints.inuse`: the
    job's keeper never removes it meanwhile); return the lock's descriptor to close afterwards, or
    ``None`` for a checkpoint that is not one of the job's own ``epoch_N/`` (the base model, a path
    elsewhere) or a lock that cannot be made (a read-only registry)."""
    from tune_magic.checkpoints import inuse

    out = job.record.output_dir
    if chosen.epoch is None or not out or Path(chosen.path).parent != Path(out):
        return None
    try:
        return inuse.hold(job.dir, chosen.epoch)
    except OSError:
        return None


def generation_recipe() -> str:
    """The absolute path of ``recipes/generate_text.py`` (installed as ``tune_magic.recipes``)."""
    import importlib.util

    spec = importlib.util.find_spec("tune_magic.recipes")
    return str(Path(next(iter(spec.submodule_search_locations))) / f"{GENERATION_RECIPE}.py")


def output_dir(job) -> Path:
    """``generate.output_dir`` of the job's generations: :data:`OUTPUT_FOLDER` in its registry directory."""
    return Path(job.dir) / OUTPUT_FOLDER


def recipe_argv(record: JobRecord, chosen: ChosenCheckpoint, out_dir: Path, words: list[str]) -> list[str]:
    """The recipe's command on this machine: this Python, the recipe, the job's ``--config`` and
    overrides (its ``output_dir=`` left out), the checkpoint, the output folder, then ``words``.

    Raises:
        PlanError: the record names no config.
    """
    if not record.config:
        raise PlanError(f"job {record.id} has no config recorded: generation needs the config it trained with")
    overrides = [w for w in overrides_of(record) if not w.startswith("output_dir=")]
    return [sys.executable, generation_recipe(), "--config", record.config, *overrides,
            f"generate.checkpoint_dir={chosen.path}", f"generate.output_dir={out_dir}", *words]


def command(job, chosen: ChosenCheckpoint, words: list[str],
            env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run the recipe where the job ran (its scheduler's
    :meth:`~tune_magic.schedulers.base.Scheduler.interactive_command`). The environment is the
    caller's with the variables tune_magic gave the job (``TUNE_MAGIC_HOME``, ``PYTHONPATH``, its
    GPUs), without its stop token.

    Raises:
        PlanError: the record names no config, or the scheduler cannot run a command there.
    """
    from tune_magic import schedulers

    record = job.record
    base = {**(os.environ if env is None else env), **{k: v for k, v in record.env.items() if k != TOKEN_ENV}}
    base["PYTHONUNBUFFERED"] = "1"
    argv = recipe_argv(record, chosen, output_dir(job), words)
    return schedulers.get(record.scheduler).interactive_command(record, argv, base)


def recipe_error(log_text: str) -> str | None:
    """The recipe's own error paragraph in its stderr (the text after :data:`RECIPE_ERROR` on the
    last such line), or ``None``."""
    lines = [line for line in log_text.splitlines() if line.startswith(RECIPE_ERROR)]
    return lines[-1][len(RECIPE_ERROR):].strip() if lines else None


def failure_message(log_path: Path, offset: int, what: str) -> str:
    """A paragraph on why a generation process ended: the recipe's error, or ``what`` with the
    last lines of its log (read from byte ``offset`` of ``log_path``)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        text = ""
    own = recipe_error(text)
    if own:
        return own
    tail = " | ".join(line.strip() for line in text.strip().splitlines()[-3:])
    return f"{what}; its log is {log_path}" + (f" (last lines: {tail})" if tail else "")


def log_file(job, chosen: ChosenCheckpoint, kind: str) -> Path:
    """The log of a generation process (its stderr): ``<job dir>/generate/<kind>-<checkpoint>.log``."""
    folder = output_dir(job)
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / f"{kind}-{chosen.label}.log"


# -- the two ways to run it ---------------------------------------------------------------------------


def start_process(argv: list[str], *, cwd: str | None, env: dict[str, str], log: Path,
                  stdin: int) -> tuple[subprocess.Popen, int]:
    """Start a generation process: stdout a pipe (the answer), stderr appended to ``log`` (created,
    0600), a session of its own so that a notebook's interrupt (SIGINT to the kernel's process
    group) never reaches it. Returns the process and the log's size before it started (bytes: where
    its own lines begin).

    Raises:
        GenerationError: it could not be started (the log or working directory unusable, the
            program missing); the message shows the command (``shlex.join``).
    """
    try:
        log.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            offset = os.lseek(fd, 0, os.SEEK_END)
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=fd,
                                    start_new_session=True, close_fds=True)
        finally:
            os.close(fd)
    except OSError as exc:
        raise GenerationError(f"cannot start the generation process ({exc.strerror or exc}: "
                              f"{exc.filename or argv[0]}): {shlex.join(argv)}") from None
    return proc, offset


def generate_once(job, prompt: Any, *, checkpoint: Any = "last", max_new_tokens: Any = 64, temperature: Any = 0.0,
                  top_k: Any = None, seed: Any = 0, chosen: ChosenCheckpoint | None = None) -> str:
    """Generate once with the recipe's one-shot mode: one process loads the model, answers and
    ends (nothing stays loaded). Same checks and arguments as
    :meth:`tune_magic.job.Job.generate`.

    Args:
        chosen: the checkpoint already chosen (``checkpoint`` is then not looked up again).

    Returns:
        The generated text (the recipe's stdout without the one newline that ends it).

    Raises:
        PlanError, CheckpointError: bad input (before anything starts).
        GenerationError: the recipe refused it (its own paragraph), ended without answering, or
            took more than :data:`ONE_SHOT_TIMEOUT_S` seconds.
    """
    prompt = check_prompt(prompt)
    opts = GenOptions.checked(max_new_tokens, temperature, top_k, seed)
    chosen = chosen or choose_checkpoint(job, checkpoint, losses=False)
    argv, env = command(job, chosen, [f"generate.prompt={prompt}", *opts.words()])
    try:
        log = log_file(job, chosen, "once")
    except OSError as exc:
        raise GenerationError(f"cannot start the generation process ({exc.strerror or exc}: "
                              f"{exc.filename or argv[0]}): {shlex.join(argv)}") from None
    proc, offset = start_process(argv, cwd=job.record.cwd, env=env, log=log, stdin=subprocess.DEVNULL)
    held = hold_checkpoint(job, chosen)  # retention never removes it under the generation
    try:
        out, _ = proc.communicate(timeout=ONE_SHOT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise GenerationError(f"the generation took more than {ONE_SHOT_TIMEOUT_S:.0f} s and was ended; its log is "
                              f"{log}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if held is not None:
            os.close(held)
    if proc.returncode != 0:
        raise GenerationError(failure_message(log, offset, f"the generation process ended with exit code "
                                                           f"{proc.returncode}"))
    text = out.decode("utf-8", errors="replace")
    return text[:-1] if text.endswith("\n") else text
