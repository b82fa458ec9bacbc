"""Shared machinery of tune_magic's own torchtune recipes (``recipes/*.py``).

Import it as ``tune_magic.recipes._common``, never ``recipes._common``: torchtune's wheel ships a
top-level ``recipes`` package of its own, and which of the two a bare ``recipes`` import finds
depends on the working directory and sys.path.

The training loop, metric names, progress-bar text and checkpoint layout copy torchtune 0.6.1's
``lora_finetune_distributed`` / ``full_finetune_distributed`` so that anything reading a built-in
recipe's output (DiskLogger lines, the tqdm description, ``epoch_N/`` folders) reads ours too.
What differs: the process group works on a CPU-only torch (gloo) and without a launcher
(a world-size-1 group), and features a tiny demo does not need (compile, profiler, activation
offloading, optimizer-in-backward, async checkpointing) are rejected with a clear error instead.

Resume works as in torchtune 0.6.1 (same keys, same files) and is exact: every non-final epoch end
writes ``recipe_state/recipe_state.pt`` (optimizer, ``seed``, ``epochs_run``, ``total_epochs``,
``max_steps_per_epoch``, the data loader's state, plus ``lr_scheduler`` and each rank's
``rng_state``), and ``resume_from_checkpoint=True`` with ``checkpointer.recipe_checkpoint`` (and
``adapter_checkpoint`` / ``checkpoint_files`` under ``epoch_K/``) continues with the same losses,
learning rates and step numbers as an uninterrupted run. Two differences from the built-ins make it
exact: the global step is always ``epochs_run * steps_per_epoch`` (lora_finetune_single_device sets
it only when ``max_steps_per_epoch`` truncates an epoch), and each rank's RNG state is restored.

Validation (issue 28) takes torchtune's later keys (``dataset_val``, ``batch_size_val``,
``run_val_every_n_steps``; see ``recipes/_validation.py`` for the exact value): every
``run_val_every_n_steps`` optimizer steps and at each epoch's end, before its checkpoint is saved (so
the value is that of the saved weights), rank 0 logs ``val_loss`` at the current global step through
the metric logger (DiskLogger: ``Step N | val_loss:X ``), once per step even when both fall on it.

Test-only knob (environment, read by every rank): ``TUNE_MAGIC_TEST_PAUSE_AFTER_STEP=N`` with
``TUNE_MAGIC_TEST_PAUSE_FILE=PATH`` makes the run stop moving right after global step N is logged:
rank 0 writes PATH, then every rank sleeps (up to 600 s), so a test can interrupt a tiny run at a
chosen point with a real signal. A run that starts while PATH exists does not pause (the same job
started again, e.g. requeued by its engine, goes on).
"""

from __future__ import annotations

import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from omegaconf import DictConfig, ListConfig, OmegaConf
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler
from torchtune import config, training, utils
from torchtune.config._utils import _get_component_from_path
from torchtune.data import padded_collate_packed
from torchtune.datasets import ConcatDataset
from torchtune.recipe_interfaces import FTRecipeInterface
from tqdm import tqdm

from tune_magic.recipes import _validation

log = utils.get_logger("DEBUG")

#: File, relative to ``output_dir``, holding the fully resolved config of the run (rank 0 writes it).
RESOLVED_CONFIG_NAME = "resolved_config.yaml"

#: Top-level key of ``recipe_state.pt`` holding the LR scheduler's ``state_dict()``.
LR_SCHEDULER_KEY = "lr_scheduler"
#: Environment variables of the test-only pause (see the module docstring).
PAUSE_STEP_ENV, PAUSE_FILE_ENV = "TUNE_MAGIC_TEST_PAUSE_AFTER_STEP", "TUNE_MAGIC_TEST_PAUSE_FILE"
_PAUSE_MAX_S = 600

# Keys of torchtune's built-in configs that these recipes accept only at their "off" value.
_UNSUPPORTED = {
    "compile": False,
    "enable_activation_offloading": False,
    "optimizer_in_bwd": False,
    "fsdp_cpu_offload": False,
    "enable_async_checkpointing": False,  # full_finetune_distributed's dist_epoch_K/ checkpoints
}


def process_group_backend(cuda_available: bool | None = None) -> str:
    """Return the ``init_process_group`` backend for this process.

    ``"cuda:nccl,cpu:gloo"`` where CUDA is usable (torchtune's choice: nccl for GPU tensors, gloo
    for the CPU ones some collectives touch), else ``"gloo"``.

    Args:
        cuda_available: override for ``torch.cuda.is_available()`` (tests).
    """
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    return "cuda:nccl,cpu:gloo" if cuda_available else "gloo"


def init_distributed() -> tuple[int, int]:
    """Join the launcher's process group, or make a world-size-1 group when there is no launcher.

    Under torchrun / ``tune run --nproc_per_node N`` the rendezvous comes from the environment
    (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``). Run as plain ``python recipe.py``
    (or ``tune run recipe.py`` with no launcher flags) there is none; an in-memory ``HashStore``
    then gives a one-rank group with no port to pick, so FSDP2 and the collectives run unchanged.

    Returns:
        ``(world_size, rank)``.

    Raises:
        RuntimeError: torch.distributed is unavailable in this torch build.
    """
    if not dist.is_available():
        raise RuntimeError("this recipe needs torch.distributed, which this torch build lacks")
    if not dist.is_initialized():
        backend = process_group_backend()
        if training.is_distributed():
            dist.init_process_group(backend=backend)
        else:
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    return dist.get_world_size(), dist.get_rank()


def save_resolved_config(cfg: DictConfig, output_dir: str | os.PathLike[str]) -> Path:
    """Write ``cfg`` with every interpolation resolved to ``<output_dir>/resolved_config.yaml``.

    Args:
        cfg: the merged YAML + CLI config the recipe runs with.
        output_dir: run directory; created if missing.

    Returns:
        Path of the written YAML file.

    Raises:
        omegaconf.errors.InterpolationResolutionError: an interpolation cannot be resolved
            (e.g. ``${oc.env:X}`` with X unset and no default).
    """
    path = Path(output_dir) / RESOLVED_CONFIG_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, path, resolve=True)
    return path


class DistributedRecipeBase(FTRecipeInterface):
    """The parts the tiny LoRA and full fine-tuning recipes share; subclasses build the model.

    Subclasses implement :meth:`_setup_model` (returns the FSDP2-sharded model) and
    :meth:`save_checkpoint`, and set ``recipe_name``.

    Args:
        cfg: merged config; keys as in torchtune 0.6.1's distributed recipe configs.

    Raises:
        ValueError: ``dtype`` is fp16, or a key in ``_UNSUPPORTED`` is switched on.
        RuntimeError: bf16 requested where the hardware lacks it (from torchtune's ``get_dtype``).
    """

    recipe_name = "DistributedRecipeBase"

    def __init__(self, cfg: DictConfig) -> None:
        for key, off in _UNSUPPORTED.items():
            if cfg.get(key, off) != off:
                raise ValueError(f"{key}={cfg.get(key)!r} is not supported by {self.recipe_name}")
        self._device = utils.get_device(device=cfg.device)
        self._dtype = training.get_dtype(cfg.dtype, device=self._device)
        if self._dtype == torch.float16:
            raise ValueError("full fp16 training is not supported; use bf16 or fp32")

        self.world_size, self.rank = utils.get_world_size_and_rank()
        self._is_rank_zero = self.rank == 0

        self._output_dir = cfg.output_dir
        self._log_every_n_steps = cfg.get("log_every_n_steps", 1)
        # torchtune's get_memory_stats only knows accelerators; on CPU it raises.
        self._log_peak_memory_stats = (
            cfg.get("log_peak_memory_stats", False) and self._device.type == "cuda"
        )

        self.seed = training.set_seed(
            seed=cfg.seed, debug_mode=cfg.get("cudnn_deterministic_mode", None)
        )
        self._resume_from_checkpoint = bool(cfg.get("resume_from_checkpoint", False))
        self.epochs_run = 0
        self.total_epochs = cfg.epochs
        self.max_steps_per_epoch = cfg.max_steps_per_epoch
        self.global_step = 0
        self._clip_grad_norm = cfg.get("clip_grad_norm", None)
        self._gradient_accumulation_steps = cfg.get("gradient_accumulation_steps", 1)
        self._enable_activation_checkpointing = cfg.get("enable_activation_checkpointing", False)
        # Fails before any work when run_val_every_n_steps has no dataset_val to run on.
        self._run_val_every_n_steps = _validation.check_keys(cfg)
        self._last_val_step: int | None = None

    # -- to implement -------------------------------------------------------------------------

    def _setup_model(
        self,
        cfg: DictConfig,
        base_model_state_dict: dict[str, Any],
        adapter_state_dict: dict[str, Any] | None = None,
    ) -> nn.Module:
        """Build, shard and load the model; ``adapter_state_dict`` is the resumed LoRA weights."""
        raise NotImplementedError

    def save_checkpoint(self, epoch: int) -> None:
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------------------

    def load_checkpoint(self, cfg_checkpointer: DictConfig) -> dict[str, Any]:
        """Instantiate ``cfg.checkpointer`` and return its (torchtune-format) state dict.

        When resuming, the checkpointer also loads the recipe state (and the adapter) and this
        recipe takes ``epochs_run``, ``seed`` and ``max_steps_per_epoch`` from it, as torchtune's do.

        Raises:
            KeyError: resuming from a file that is not a recipe state.
            ValueError: (torchtune's checkpointer) a pinned file is missing.
        """
        self._checkpointer = config.instantiate(
            cfg_checkpointer, should_load_recipe_state=self._resume_from_checkpoint
        )
        checkpoint_dict = self._checkpointer.load_checkpoint()
        if self._resume_from_checkpoint:
            self._update_recipe_state(checkpoint_dict)
        return checkpoint_dict

    def _update_recipe_state(self, ckpt: dict[str, Any]) -> None:
        """Take the run's progress from a recipe state (torchtune 0.6.1's rules and warnings)."""
        try:
            self.epochs_run = ckpt[training.EPOCHS_KEY]
            if self.seed != ckpt[training.SEED_KEY]:
                utils.log_rank_zero(log, f"Config value for seed does not match the checkpoint value, "
                                         f"using the checkpoint value: {ckpt[training.SEED_KEY]}")
                self.seed = ckpt[training.SEED_KEY]
            if self.max_steps_per_epoch != ckpt[training.MAX_STEPS_KEY]:
                utils.log_rank_zero(log, "Config value for max_steps_per_epoch does not match the checkpoint "
                                         f"value, using the checkpoint value: {ckpt[training.MAX_STEPS_KEY]}")
                self.max_steps_per_epoch = ckpt[training.MAX_STEPS_KEY]
            if self.total_epochs != ckpt[training.TOTAL_EPOCHS_KEY]:
                utils.log_rank_zero(log, "Config value for total_epochs does not match the checkpoint value, "
                                         f"using the config value: {self.total_epochs}")
        except KeyError as e:
            raise KeyError(
                "Checkpoint does not contain the required keys needed for updating recipe state. "
                "Are you sure you passed in the right recipe checkpoint?"
            ) from e

    def setup(self, cfg: DictConfig) -> None:
        """Build logger, model, tokenizer, optimizer, loss, data and LR schedule from ``cfg``."""
        if self._is_rank_zero:
            self._metric_logger = config.instantiate(cfg.metric_logger)
            # Same side effect as the built-ins (torchtune_config.yaml, unresolved) ...
            self._metric_logger.log_config(cfg)
            # ... plus the resolved values, which say what actually ran (paths, env defaults).
            save_resolved_config(cfg, self._output_dir)

        checkpoint_dict = self.load_checkpoint(cfg.checkpointer)
        resuming = self._resume_from_checkpoint
        self._model = self._setup_model(
            cfg,
            checkpoint_dict[training.MODEL_KEY],
            checkpoint_dict.get(training.ADAPTER_KEY) if resuming else None,
        )
        self._tokenizer = config.instantiate(cfg.tokenizer)

        trainable = [p for p in self._model.parameters() if p.requires_grad]
        self._optimizer = config.instantiate(cfg.optimizer, trainable)
        if resuming:
            training.load_from_full_optimizer_state_dict(
                self._model, self._optimizer, checkpoint_dict[training.OPT_KEY], self._device
            )
        utils.log_rank_zero(log, "Optimizer is initialized.")

        self._loss_fn = config.instantiate(cfg.loss)
        if self._loss_fn.__class__.__name__ == "CEWithChunkedOutputLoss":
            self._model.set_num_output_chunks(self._loss_fn.num_output_chunks)
        utils.log_rank_zero(log, "Loss is initialized.")

        # A resumed run starts epoch ``epochs_run`` at its first batch, as the uninterrupted run does
        # (it makes a fresh iterator per epoch), so the saved data-loader state is not loaded: after a
        # truncated epoch (max_steps_per_epoch) it holds that epoch's position, which would skip batches.
        self._dataloader = self._setup_data(
            cfg.dataset,
            shuffle=cfg.shuffle,
            batch_size=cfg.batch_size,
            collate_fn=cfg.get("collate_fn", "torchtune.data.padded_collate_sft"),
        )

        self._val = self._setup_val(cfg)

        self._steps_per_epoch = len(self._dataloader) // self._gradient_accumulation_steps
        if self.max_steps_per_epoch is not None and self.max_steps_per_epoch < self._steps_per_epoch:
            self._steps_per_epoch = self.max_steps_per_epoch
        self.global_step = self.epochs_run * self._steps_per_epoch

        self._lr_scheduler = config.instantiate(
            cfg.lr_scheduler,
            self._optimizer,
            num_training_steps=self.total_epochs * self._steps_per_epoch,
            last_epoch=self.global_step - 1,
        )
        if resuming and checkpoint_dict.get(LR_SCHEDULER_KEY) is not None:
            self._lr_scheduler.load_state_dict(checkpoint_dict[LR_SCHEDULER_KEY])
        utils.log_rank_zero(log, "Learning rate scheduler is initialized.")

        self.ignore_labels_cache = torch.full(
            (cfg.batch_size, 1), self._loss_fn.ignore_index, device=self._device
        )
        if resuming:
            self._restore_rng(checkpoint_dict.get(training.RNG_KEY))
        self._pause_after_step = int(os.environ.get(PAUSE_STEP_ENV, "0") or 0)
        if os.path.exists(os.environ.get(PAUSE_FILE_ENV, "")):  # paused once already: a requeued run goes on
            self._pause_after_step = 0

    def _setup_val(self, cfg: DictConfig) -> _validation.ValLoader | None:
        """This rank's share of ``dataset_val`` (``None`` without one); after tokenizer and loss."""
        if cfg.get("dataset_val") is None:
            return None
        return _validation.build_val_loader(
            cfg.dataset_val, self._tokenizer, self._loss_fn.ignore_index,
            batch_size=cfg.get("batch_size_val", cfg.batch_size),
            collate_fn=cfg.get("collate_fn", _validation.DEFAULT_COLLATE),
            world_size=self.world_size, rank=self.rank,
        )  # fmt: skip

    def _rng_state(self) -> dict[str, Any]:
        state = {"cpu": torch.get_rng_state()}
        if self._device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self._device)
        return state

    def _restore_rng(self, states: list[dict[str, Any]] | None) -> None:
        """Put back this rank's RNG state of the checkpoint (dropout draws as the uninterrupted run)."""
        if not states:
            return
        if len(states) != self.world_size:
            utils.log_rank_zero(log, f"The checkpoint holds the RNG state of {len(states)} ranks, this run has "
                                     f"{self.world_size}: random draws (dropout) will differ from the first run")
            return
        mine = states[self.rank]
        torch.set_rng_state(mine["cpu"])
        if self._device.type == "cuda" and mine.get("cuda") is not None:
            torch.cuda.set_rng_state(mine["cuda"], self._device)

    def recipe_state(self, epoch: int) -> dict[str, Any] | None:
        """The recipe state to save after ``epoch`` (0-based), or ``None`` after the final epoch.

        A collective: every rank must call it (it gathers the sharded optimizer state and every
        rank's RNG state). Rank 0 gets the dict (torchtune 0.6.1's keys ``optimizer``, ``seed``,
        ``epochs_run``, ``total_epochs``, ``max_steps_per_epoch``, ``dataloader``, plus
        ``lr_scheduler`` and ``rng_state``, a list with one ``{"cpu", ["cuda"]}`` dict per rank);
        the other ranks get ``{}``.
        """
        if epoch + 1 >= self.total_epochs:
            return None
        opt_state = training.get_full_optimizer_state_dict(
            self._model, self._optimizer, self._is_rank_zero, device=self._device
        )
        rng = [None] * self.world_size
        dist.all_gather_object(rng, self._rng_state())
        if not self._is_rank_zero:
            return {}
        return {
            training.OPT_KEY: opt_state,
            training.SEED_KEY: self.seed,
            training.EPOCHS_KEY: self.epochs_run,
            training.TOTAL_EPOCHS_KEY: self.total_epochs,
            training.MAX_STEPS_KEY: self.max_steps_per_epoch,
            training.DATALOADER_KEY: self._dataloader.state_dict(),
            LR_SCHEDULER_KEY: self._lr_scheduler.state_dict(),
            training.RNG_KEY: rng,
        }

    def _pause_if_asked(self) -> None:
        """The test-only pause (module docstring): hold every rank after the chosen step."""
        if self.global_step != self._pause_after_step:
            return
        if self._is_rank_zero:
            sys.stderr.flush()
            Path(os.environ[PAUSE_FILE_ENV]).write_text(f"{self.global_step}\n")
        time.sleep(_PAUSE_MAX_S)

    def _shard_and_load(
        self,
        model: nn.Module,
        cfg: DictConfig,
        state_dict: dict[str, Any],
        strict: bool,
        init_before_load: Callable[[nn.Module], None] | None = None,
    ) -> tuple[list[str], list[str]]:
        """FSDP2-shard a meta-device model, materialise it and load ``state_dict`` into it.

        Args:
            model: built under ``torch.device("meta")``.
            cfg: the recipe config (reads ``custom_sharded_layers``, ``fsdp_reshard_after_forward``).
            state_dict: full (unsharded) torchtune-format state dict, identical on every rank.
            strict: forwarded to torchtune's ``load_from_full_model_state_dict``.
            init_before_load: optional callable(module) run on every module after sharding and
                before loading (LoRA uses it to initialise adapters absent from the checkpoint).

        Returns:
            The ``(missing, unexpected)`` keys reported by the load.
        """
        if self._enable_activation_checkpointing:
            from torchtune import modules

            training.set_activation_checkpointing(
                model, auto_wrap_policy={modules.TransformerSelfAttentionLayer}
            )
        training.shard_model(
            model=model,
            shard_conditions=[
                partial(
                    training.get_shard_conditions,
                    names_to_match=cfg.get("custom_sharded_layers", None),
                )
            ],
            cpu_offload=False,
            reshard_after_forward=cfg.get("fsdp_reshard_after_forward", True),
        )
        with training.set_default_dtype(self._dtype), self._device:
            for m in model.modules():
                if init_before_load is not None:
                    init_before_load(m)
                # RoPE caches are buffers outside the state dict.
                if hasattr(m, "rope_init"):
                    m.rope_init()
        return training.load_from_full_model_state_dict(
            model, state_dict, self._device, strict=strict
        )

    def _setup_data(
        self, cfg_dataset: DictConfig, shuffle: bool, batch_size: int, collate_fn: str
    ) -> StatefulDataLoader:
        if isinstance(cfg_dataset, ListConfig):
            ds = ConcatDataset(
                datasets=[config.instantiate(c, self._tokenizer) for c in cfg_dataset]
            )
            packed = getattr(ds, "packed", False)
        else:
            ds = config.instantiate(cfg_dataset, self._tokenizer)
            packed = cfg_dataset.get("packed", False)
        if "left_pad_sequence" in collate_fn:
            raise RuntimeError("left_pad_sequence collator is only for inference.")
        collate = _get_component_from_path(collate_fn)
        sampler = StatefulDistributedSampler(
            ds, num_replicas=self.world_size, rank=self.rank, shuffle=shuffle, seed=self.seed
        )
        return StatefulDataLoader(
            dataset=ds,
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=(
                partial(
                    collate,
                    padding_idx=self._tokenizer.pad_id,
                    ignore_idx=self._loss_fn.ignore_index,
                )
                if not packed
                else padded_collate_packed
            ),
            drop_last=True,
        )

    def train(self) -> None:
        """Run ``epochs`` x ``steps_per_epoch`` optimizer steps; checkpoint after each epoch.

        Per step, rank 0 sets the tqdm description ``f"{epoch + 1}|{global_step}|Loss: {loss}"``
        and logs ``loss``, ``lr``, ``tokens_per_second_per_gpu`` (+ ``grad_norm`` when clipping,
        + memory stats on CUDA) through the metric logger, as torchtune 0.6.1 does.
        """
        import gc

        # torchtune's cleanup_before_training() calls torch.cpu.empty_cache, absent on CPU torch.
        gc.collect()
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

        self._optimizer.zero_grad()
        t0 = time.perf_counter()
        running_loss = 0
        num_tokens = 0

        for curr_epoch in range(self.epochs_run, self.total_epochs):
            pbar = tqdm(total=self._steps_per_epoch, disable=not self._is_rank_zero)
            self._dataloader.sampler.set_epoch(curr_epoch)
            for idx, batch in enumerate(self._dataloader):
                utils.batch_to_device(batch, self._device)
                current_num_tokens = (batch["labels"] != self._loss_fn.ignore_index).sum()
                num_tokens += current_num_tokens
                labels = batch.pop("labels")
                logits = self._model(**batch)
                # Shifted labels (ignore index appended) rather than slicing logits[..., :-1, :].
                labels = torch.hstack((labels[..., 1:], self.ignore_labels_cache[: labels.shape[0]]))
                if not isinstance(logits, list):
                    labels = labels.reshape(-1)
                    logits = logits.reshape(-1, logits.size(-1))
                # The loss is a per-token mean; scaling by the token count lets accumulation and
                # ranks be normalised by the global token count below.
                current_loss = self._loss_fn(logits, labels) * current_num_tokens
                del logits
                running_loss += current_loss
                current_loss.backward()

                if (idx + 1) % self._gradient_accumulation_steps == 0:
                    dist.all_reduce(num_tokens)
                    dist.all_reduce(running_loss)
                    # FSDP2 averages gradients over ranks; world_size undoes that.
                    training.scale_grads(self._model, self.world_size / num_tokens)
                    if self._clip_grad_norm is not None:
                        grad_norm = nn.utils.clip_grad_norm_(
                            self._model.parameters(), max_norm=float(self._clip_grad_norm)
                        )
                        if hasattr(grad_norm, "full_tensor"):
                            grad_norm = grad_norm.full_tensor()
                    self._optimizer.step()
                    self._optimizer.zero_grad(set_to_none=True)
                    self._lr_scheduler.step()
                    self.global_step += 1

                    loss_to_log = running_loss.item() / num_tokens
                    pbar.update(1)
                    pbar.set_description(f"{curr_epoch + 1}|{self.global_step}|Loss: {loss_to_log}")

                    if self.global_step % self._log_every_n_steps == 0 and self._is_rank_zero:
                        time_per_step = time.perf_counter() - t0
                        log_dict = {
                            "loss": loss_to_log,
                            "lr": self._optimizer.param_groups[0]["lr"],
                            "tokens_per_second_per_gpu": num_tokens
                            / (time_per_step * self.world_size),
                        }
                        if self._log_peak_memory_stats:
                            log_dict.update(training.get_memory_stats(device=self._device))
                        if self._clip_grad_norm is not None:
                            log_dict.update({"grad_norm": grad_norm})
                        self._metric_logger.log_dict(log_dict, step=self.global_step)

                    running_loss = 0
                    num_tokens = 0
                    every = self._run_val_every_n_steps
                    if every is not None and self.global_step % every == 0:
                        pbar.refresh()
                        self.validate()
                    if self._pause_after_step:
                        self._pause_if_asked()
                    t0 = time.perf_counter()

                if (idx + 1) // self._gradient_accumulation_steps == self.max_steps_per_epoch:
                    break

            self.epochs_run += 1
            if self._val is not None and self._last_val_step != self.global_step:
                self.validate()  # before the save: the value is that of the weights saved
            self.save_checkpoint(epoch=curr_epoch)

    def validate(self) -> float:
        """Return the validation loss (nats per label token); rank 0 logs it at ``global_step``.

        A collective: every rank calls it. Rank 0 logs ``Validation loss: X.XXXX (S.SSS s)`` (INFO;
        torchtune's later ``validate()`` logs the value alone, the seconds the passes took are ours)
        and ``{"val_loss": X}`` through the metric logger, as torchtune's later ``validate()`` does.
        """
        start = time.perf_counter()
        result = _validation.validation_loss(self._model, self._val, self._loss_fn, self._device)
        self._last_val_step = self.global_step
        if self._is_rank_zero:
            log.info(f"Validation loss: {result.val_loss:.4f} ({time.perf_counter() - start:.3f} s)")
            self._metric_logger.log_dict({_validation.VAL_LOSS_KEY: result.val_loss}, step=self.global_step)
        return result.val_loss

    def cleanup(self) -> None:
        """Close the metric logger (rank 0) and leave the process group, all ranks together."""
        if self._is_rank_zero:
            self._metric_logger.close()
        dist.barrier()  # no rank tears gloo down while another still talks to it
        dist.destroy_process_group()


def run(recipe_cls: type[DistributedRecipeBase], cfg: DictConfig) -> None:
    """Run a recipe end to end: process group, config log, setup, train, cleanup.

    Args:
        recipe_cls: a :class:`DistributedRecipeBase` subclass.
        cfg: the merged config from ``torchtune.config.parse``.
    """
    init_distributed()
    config.log_config(recipe_name=recipe_cls.recipe_name, cfg=cfg)
    recipe = recipe_cls(cfg=cfg)
    recipe.setup(cfg=cfg)
    recipe.train()
    recipe.cleanup()
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        # A torchrun worker: end now, with everything written and the process group gone. Interpreter
        # finalization would still destroy gloo's and FSDP's C++ objects, and under load a worker
        # thread destroyed while joinable aborts the rank ("terminate called without an active
        # exception", SIGABRT) after a run that succeeded (cf. pytorch/pytorch#179291).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
