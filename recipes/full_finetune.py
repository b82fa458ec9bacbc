"""Full fine-tuning with FSDP2 on any number of processes, CPU (gloo) or GPU (nccl).

A torchtune-style recipe that, unlike torchtune 0.6.1's ``full_finetune_distributed`` (which
calls CUDA-only memory helpers), also runs on a CPU-only torch and as a single process without
a launcher. Logs, metrics and checkpoints match the built-in recipe.

Run it by path (never import it as ``recipes.full_finetune``; see ``recipes/_common.py``)::

    python -m torch.distributed.run --standalone --nproc_per_node 2 recipes/full_finetune.py \\
        --config recipes/configs/tiny/full.yaml
    python recipes/full_finetune.py --config recipes/configs/tiny/full.yaml   # one process
    PYTHONPATH=. tune run recipes/full_finetune.py --config ...   # one process via tune run

Outputs under ``output_dir``: ``resolved_config.yaml``, ``torchtune_config.yaml``, the metric
logger's files (``logs/log_<unix seconds>.txt`` for DiskLogger) and, per epoch, ``epoch_<N>/``
with HF weights (``model-00001-of-00001.safetensors``, ``model.safetensors.index.json``) plus the
non-weight files of the input checkpoint directory (config.json, tokenizer.model, ...); after every
epoch but the last also ``recipe_state/recipe_state.pt``. Resume exactly as torchtune's full
fine-tunes do (the model read from ``output_dir``)::

    ... resume_from_checkpoint=True \
        checkpointer.checkpoint_files=[epoch_1/model-00001-of-00001.safetensors] \
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

from tune_magic.recipes import _common

log = utils.get_logger("DEBUG")

#: Read by tune_magic's resume pre-flight (tune_magic.checkpoints.preflight): torchtune 0.6.1's full
#: fine-tune resume layout and keys, exact resume.
TUNE_MAGIC_RESUME = "full"


class FullFinetuneRecipe(_common.DistributedRecipeBase):
    """Full-parameter fine-tuning, FSDP2 over the process group.

    Config keys are those of torchtune 0.6.1's ``full_finetune_distributed`` configs (without
    tensor parallelism, optimizer-in-backward or async checkpointing).
    Validation takes torchtune's later keys ``dataset_val``, ``batch_size_val`` and
    ``run_val_every_n_steps`` (``recipes/_validation.py``, docs/validation.md).

    Args:
        cfg: merged YAML + CLI config.

    Raises:
        ValueError: see :class:`~tune_magic.recipes._common.DistributedRecipeBase`.
    """

    recipe_name = "FullFinetuneRecipe"

    def _setup_model(
        self,
        cfg: DictConfig,
        base_model_state_dict: dict[str, Any],
        adapter_state_dict: dict[str, Any] | None = None,
    ) -> nn.Module:
        init_start = time.perf_counter()
        with training.set_default_dtype(self._dtype), torch.device("meta"):
            model = config.instantiate(cfg.model)
        self._shard_and_load(model, cfg, base_model_state_dict, strict=True)
        training.validate_no_params_on_meta_device(model)
        utils.log_rank_zero(
            log,
            f"Instantiating model and loading checkpoint took "
            f"{time.perf_counter() - init_start:.2f} secs",
        )
        torch.distributed.barrier()
        return model

    def save_checkpoint(self, epoch: int) -> None:
        """Write the full HF-format weights to ``output_dir/epoch_<epoch>``, and after a non-final
        epoch the recipe state to ``output_dir/recipe_state/recipe_state.pt`` (rank 0 writes).

        Args:
            epoch: zero-based epoch index (names the folder).
        """
        utils.log_rank_zero(log, "Saving checkpoint. Retrieving full model state dict...")
        cpu_state_dict = training.gather_cpu_state_dict(
            self._model, self._is_rank_zero, device=self._device
        )
        recipe_state = self.recipe_state(epoch)
        if self._is_rank_zero:
            start = time.perf_counter()
            checkpoint_dict = {training.MODEL_KEY: cpu_state_dict, **(recipe_state or {})}
            self._checkpointer.save_checkpoint(
                checkpoint_dict, epoch=epoch, intermediate_checkpoint=recipe_state is not None
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
    _common.run(FullFinetuneRecipe, cfg)


if __name__ == "__main__":
    sys.exit(recipe_main())
