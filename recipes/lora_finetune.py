"""LoRA fine-tuning with FSDP2 on any number of processes, CPU (gloo) or GPU (nccl).

A torchtune-style recipe that, unlike torchtune 0.6.1's ``lora_finetune_distributed`` (which
hard-codes ``init_process_group("cuda:nccl,cpu:gloo")``), also runs on a CPU-only torch and as a
single process without a launcher. Logs, metrics and checkpoints match the built-in recipe.

Run it by path (never import it as ``recipes.lora_finetune``; see ``recipes/_common.py``)::

    python -m torch.distributed.run --standalone --nproc_per_node 2 recipes/lora_finetune.py \\
        --config recipes/configs/tiny/lora.yaml max_steps_per_epoch=20
    tune run --nproc_per_node 2 recipes/lora_finetune.py --config recipes/configs/tiny/lora.yaml
    python recipes/lora_finetune.py --config recipes/configs/tiny/lora.yaml   # one process
    PYTHONPATH=. tune run recipes/lora_finetune.py --config ...   # one process via tune run

Outputs under ``output_dir``: ``resolved_config.yaml``, ``torchtune_config.yaml``, the metric
logger's files (``logs/log_<unix seconds>.txt`` for DiskLogger) and, per epoch, ``epoch_<N>/``
with the merged HF weights (``model-00001-of-00001.safetensors``), ``adapter_model.pt``,
``adapter_model.safetensors`` and ``adapter_config.json``; after every epoch but the last also
``recipe_state/recipe_state.pt``. Resume exactly as torchtune's LoRA recipes do::

    ... resume_from_checkpoint=True checkpointer.adapter_checkpoint=epoch_1/adapter_model.pt \
        checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt

(``tune_magic.checkpoints.preflight.preflight`` gives these for a job.)
"""

import sys
import time
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn
from torchtune import config, training, utils
from torchtune.modules.peft import (
    DoRALinear,
    get_adapter_params,
    get_adapter_state_dict,
    get_lora_module_names,
    get_merged_lora_ckpt,
    LoRALinear,
    set_trainable_params,
    validate_missing_and_unexpected_for_lora,
)

from tune_magic.recipes import _common

log = utils.get_logger("DEBUG")

#: Read by tune_magic's resume pre-flight (tune_magic.checkpoints.preflight): torchtune 0.6.1's LoRA resume
#: layout and keys, exact resume.
TUNE_MAGIC_RESUME = "lora"


class LoRAFinetuneRecipe(_common.DistributedRecipeBase):
    """LoRA fine-tuning: base weights frozen, adapters trained, FSDP2 over the process group.

    Config keys are those of torchtune 0.6.1's ``lora_finetune_distributed`` configs, plus
    ``save_adapter_weights_only`` (default False: also write merged full weights).
    Validation takes torchtune's later keys ``dataset_val``, ``batch_size_val`` and
    ``run_val_every_n_steps`` (``recipes/_validation.py``, docs/validation.md).

    Args:
        cfg: merged YAML + CLI config.

    Raises:
        ValueError: see :class:`~tune_magic.recipes._common.DistributedRecipeBase`.
    """

    recipe_name = "LoRAFinetuneRecipe"

    def __init__(self, cfg: DictConfig) -> None:
        super().__init__(cfg)
        self._save_adapter_weights_only = cfg.get("save_adapter_weights_only", False)

    def _setup_model(
        self,
        cfg: DictConfig,
        base_model_state_dict: dict[str, Any],
        adapter_state_dict: dict[str, Any] | None = None,
    ) -> nn.Module:
        cfg_model = cfg.model
        self._lora_rank = cfg_model.lora_rank
        self._lora_alpha = cfg_model.lora_alpha
        self._lora_attn_modules = list(cfg_model.lora_attn_modules)
        self._apply_lora_to_mlp = cfg_model.apply_lora_to_mlp
        self._apply_lora_to_output = cfg_model.get("apply_lora_to_output", False)

        init_start = time.perf_counter()
        # Built on the meta device, so each rank only ever materialises its own shards.
        with training.set_default_dtype(self._dtype), torch.device("meta"):
            model = config.instantiate(cfg_model)
        set_trainable_params(model, get_adapter_params(model))

        def init_adapters(m: nn.Module) -> None:
            # Adapters are not in the base checkpoint: give them their initial values.
            if isinstance(m, (LoRALinear, DoRALinear)):
                m.to_empty(device=self._device)
                m.initialize_parameters()

        base_missing, base_unexpected = self._shard_and_load(
            model, cfg, base_model_state_dict, strict=False, init_before_load=init_adapters
        )
        lora_missing = lora_unexpected = None
        if adapter_state_dict is not None:
            # Resuming: the saved adapters replace the freshly initialised ones.
            lora_missing, lora_unexpected = training.load_from_full_model_state_dict(
                model, adapter_state_dict, self._device, strict=False
            )
        for m in model.modules():
            if hasattr(m, "initialize_dora_magnitude") and adapter_state_dict is None:
                m.initialize_dora_magnitude()
        validate_missing_and_unexpected_for_lora(
            lora_attn_modules=self._lora_attn_modules,
            apply_lora_to_mlp=self._apply_lora_to_mlp,
            apply_lora_to_output=self._apply_lora_to_output,
            base_missing=base_missing,
            base_unexpected=base_unexpected,
            lora_missing=lora_missing,
            lora_unexpected=lora_unexpected,
        )
        training.validate_no_params_on_meta_device(model)
        utils.log_rank_zero(
            log,
            f"Instantiating model and loading checkpoint took "
            f"{time.perf_counter() - init_start:.2f} secs",
        )
        torch.distributed.barrier()
        return model

    def _unaliased(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """``state_dict`` with every tensor that shares memory with the live model copied.

        torchtune's ``get_merged_lora_ckpt`` adds the LoRA product into the base weights in place.
        On GPU the gathered state dict holds fresh CPU copies, but in a one-process CPU run the
        gathered tensor *is* the model's parameter (a one-rank ``full_tensor()`` and ``.cpu()`` of a
        CPU tensor copy nothing), and merging in place would change the base weights the run goes
        on training with (torchtune 0.6.1's lora_finetune_single_device does this on CPU).
        """
        live = set()
        for p in self._model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            live.add(local.untyped_storage().data_ptr())
        return {k: v.clone() if v.untyped_storage().data_ptr() in live else v for k, v in state_dict.items()}

    def save_checkpoint(self, epoch: int) -> None:
        """Write merged weights, adapter weights and adapter config to ``output_dir/epoch_<epoch>``,
        and after a non-final epoch the recipe state to ``output_dir/recipe_state/recipe_state.pt``.

        Every rank takes part in gathering the shards and the optimizer state; only rank 0 writes.

        Args:
            epoch: zero-based epoch index (names the folder).
        """
        utils.log_rank_zero(log, "Saving checkpoint. Retrieving full model state dict...")
        cpu_state_dict = training.gather_cpu_state_dict(
            self._model,
            self._is_rank_zero,
            device=self._device,
            adapter_weights_only=self._save_adapter_weights_only,
        )
        recipe_state = self.recipe_state(epoch)
        if self._is_rank_zero:
            start = time.perf_counter()
            checkpoint_dict: dict[str, Any] = {}
            if self._save_adapter_weights_only:
                adapter_state_dict = cpu_state_dict
            else:
                adapter_state_dict = get_adapter_state_dict(cpu_state_dict)
                checkpoint_dict[training.MODEL_KEY] = get_merged_lora_ckpt(
                    self._unaliased(cpu_state_dict), rank=self._lora_rank, alpha=self._lora_alpha
                )
            checkpoint_dict[training.ADAPTER_KEY] = adapter_state_dict
            checkpoint_dict[training.ADAPTER_CONFIG] = {
                "r": self._lora_rank,
                "lora_alpha": self._lora_alpha,
                "target_modules": get_lora_module_names(
                    self._lora_attn_modules, self._apply_lora_to_mlp, self._apply_lora_to_output
                ),
                "peft_type": "LORA",
            }
            if recipe_state is not None:
                checkpoint_dict.update(recipe_state)
            self._checkpointer.save_checkpoint(
                checkpoint_dict,
                epoch=epoch,
                intermediate_checkpoint=recipe_state is not None,
                adapter_only=self._save_adapter_weights_only,
            )
            log.info(f"Saving checkpoint took {time.perf_counter() - start:.2f} secs")
        torch.distributed.barrier()


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """
    Entry point for the recipe.

    Configurable parameters are read in the following order:
        - Parameters specified in config
        - Overwritten by arguments from the command-line
    """
    _common.run(LoRAFinetuneRecipe, cfg)


if __name__ == "__main__":
    sys.exit(recipe_main())
