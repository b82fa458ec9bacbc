"""Validation loss on ``dataset_val``: the keys, the data loader and the exact loss.

Import it as ``tune_magic.recipes._validation`` (see ``recipes/_common.py`` for why). Used by the
training loop of tune_magic's own recipes (``_common.DistributedRecipeBase``) and by
``recipes/validate_checkpoint.py``; it imports nothing heavier than torchtune's ``config``, so the
evaluation recipe starts fast.

Keys are torchtune's own, from the distributed recipes after 0.6.1 (pytorch/torchtune#2464):
``dataset_val`` (a dataset node like ``dataset``, or a list of them), ``batch_size_val`` (default
``batch_size``) and ``run_val_every_n_steps`` (optional int).

The value, ``val_loss``, is the mean cross-entropy per label token over the whole validation set:
the sum over batches of (the batch's loss x its label tokens), summed over ranks, divided by all
label tokens, summed over ranks; a label token is a position of the *shifted* labels (the token
each position predicts) that is not the loss's ``ignore_index``. The model is in eval mode, under
``torch.no_grad()``. This is what torchtune's later ``validate()`` computes, with two differences
that only make it exact:

* every example counts exactly once: torchtune's val loader uses a ``DistributedSampler`` (which
  pads the last round with repeated examples when the set does not divide by the world size) and
  ``drop_last=True`` (which drops each rank's last partial batch); here each rank takes examples
  ``rank, rank + world_size, ...`` (the sampler's own order, without its padding) and keeps partial
  batches;
* the tokens are counted on the shifted labels, the ones the loss averages over (torchtune counts
  the unshifted labels; the two agree whenever each sequence's first label is ignored, as with
  ``train_on_input: False``, where the first label is the prompt's BOS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator

import torch
from omegaconf import DictConfig, ListConfig
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset
from torchtune import config

#: Metric name of the validation loss, as torchtune's later recipes log it
#: (``log_dict({"val_loss": ...}, step=global_step)``, recipes/lora_finetune_distributed.py).
VAL_LOSS_KEY = "val_loss"
#: The collate torchtune's recipes default to (``collate_fn`` key).
DEFAULT_COLLATE = "torchtune.data.padded_collate_sft"


def check_keys(cfg: DictConfig) -> int | None:
    """Check the validation keys of a training config; return ``run_val_every_n_steps``.

    Args:
        cfg: the merged recipe config.

    Returns:
        ``run_val_every_n_steps`` (a positive int) or ``None`` when unset.

    Raises:
        ValueError: ``run_val_every_n_steps`` is set without ``dataset_val`` (the message names
            both fixes), is not a positive int, or ``batch_size_val`` is not a positive int.
    """
    every = cfg.get("run_val_every_n_steps", None)
    if every is not None:
        if cfg.get("dataset_val", None) is None:
            raise ValueError(
                f"run_val_every_n_steps={every} is set but dataset_val is not: add a dataset_val node "
                "(a dataset like `dataset`, e.g. the same component with split: train[95%:]) or remove "
                "run_val_every_n_steps (set it to null)"
            )
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"run_val_every_n_steps must be a positive int (steps), got {every!r}")
    batch_size_val = cfg.get("batch_size_val", None)
    if batch_size_val is not None and (
        isinstance(batch_size_val, bool) or not isinstance(batch_size_val, int) or batch_size_val < 1
    ):
        raise ValueError(f"batch_size_val must be a positive int, got {batch_size_val!r}")
    return every


def rank_indices(num_examples: int, world_size: int, rank: int) -> range:
    """The examples one rank evaluates: ``rank, rank + world_size, ...``.

    The order ``DistributedSampler(shuffle=False)`` gives, without the repeated examples it adds
    to make every rank's share equal: across ranks, every index in ``range(num_examples)`` appears
    exactly once.
    """
    return range(rank, num_examples, world_size)


def batches_per_rank(num_examples: int, world_size: int, batch_size: int) -> int:
    """Forward passes every rank makes: the largest rank's share (rank 0's) in batches.

    Ranks with fewer batches make filler passes (see :class:`ValLoader`), because under FSDP each
    forward pass is a collective (the parameters are all-gathered) that every rank must join.
    """
    return math.ceil(math.ceil(num_examples / world_size) / batch_size)


@dataclass
class ValLoader:
    """A rank's share of the validation set, in batches, padded with uncounted filler passes.

    Attributes:
        dataset: the whole (tokenized) validation dataset.
        loader: this rank's examples (:func:`rank_indices`), partial last batch kept.
        num_batches: forward passes each rank makes (:func:`batches_per_rank`).
        collate: the collate function (padding with the tokenizer's ``pad_id``, labels with the
            loss's ``ignore_index``), for the filler batch.
    """

    dataset: Dataset
    loader: DataLoader
    num_batches: int
    collate: Any

    @property
    def num_examples(self) -> int:
        """Examples in the whole validation set (all ranks)."""
        return len(self.dataset)

    def batches(self) -> Iterator[tuple[dict[str, torch.Tensor], bool]]:
        """Yield ``(batch, counted)``: this rank's batches (counted), then filler passes (not)."""
        n = 0
        for batch in self.loader:
            n += 1
            yield batch, True
        while n < self.num_batches:
            n += 1
            yield self.collate([self.dataset[0]]), False


def build_val_loader(
    cfg_dataset: DictConfig | ListConfig,
    tokenizer: Any,
    ignore_index: int,
    batch_size: int,
    collate_fn: str = DEFAULT_COLLATE,
    world_size: int = 1,
    rank: int = 0,
) -> ValLoader:
    """Instantiate ``dataset_val`` as torchtune's recipes instantiate ``dataset`` and batch this rank's share.

    Args:
        cfg_dataset: the ``dataset_val`` node (one dataset, or a list: concatenated).
        tokenizer: the job's tokenizer (``cfg.tokenizer`` instantiated).
        ignore_index: the loss's ``ignore_index`` (padding of labels).
        batch_size: ``batch_size_val``.
        collate_fn: dotted path of the collate (``collate_fn`` key); ignored for packed datasets.
        world_size: ranks sharing the work.
        rank: this rank.

    Raises:
        ValueError: the validation set is empty.
        RuntimeError: a ``left_pad_sequence`` collate (inference only, as in torchtune).
    """
    from torchtune.config._utils import _get_component_from_path
    from torchtune.data import padded_collate_packed

    if isinstance(cfg_dataset, ListConfig):
        from torchtune.datasets import ConcatDataset

        ds = ConcatDataset(datasets=[config.instantiate(c, tokenizer) for c in cfg_dataset])
        packed = getattr(ds, "packed", False)
    else:
        ds = config.instantiate(cfg_dataset, tokenizer)
        packed = cfg_dataset.get("packed", False)
    if len(ds) == 0:
        raise ValueError("dataset_val has no examples")
    if "left_pad_sequence" in collate_fn:
        raise RuntimeError("left_pad_sequence collator is only for inference.")
    if packed:
        collate = padded_collate_packed
    else:
        collate = partial(
            _get_component_from_path(collate_fn), padding_idx=tokenizer.pad_id, ignore_idx=ignore_index
        )
    share = Subset(ds, rank_indices(len(ds), world_size, rank))
    # A generator of its own: a DataLoader iterator draws its base seed from the global RNG
    # otherwise, and validating would then change the training run's later random draws (dropout).
    loader = DataLoader(
        share, batch_size=batch_size, shuffle=False, drop_last=False, collate_fn=collate,
        generator=torch.Generator().manual_seed(0),
    )
    return ValLoader(ds, loader, batches_per_rank(len(ds), world_size, batch_size), collate)


def batch_loss_sum(
    model: nn.Module, batch: dict[str, torch.Tensor], loss_fn: nn.Module
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward one batch; return (sum of the per-token loss, number of label tokens).

    The labels are shifted as torchtune's recipes shift them (the ignore index appended rather
    than the logits sliced); the loss is torchtune's mean over label tokens, multiplied back by
    their count. ``batch`` is consumed (its ``labels`` popped).
    """
    labels = batch.pop("labels")
    logits = model(**batch)
    pad = torch.full((labels.shape[0], 1), loss_fn.ignore_index, dtype=labels.dtype, device=labels.device)
    labels = torch.hstack((labels[..., 1:], pad))
    tokens = (labels != loss_fn.ignore_index).sum()
    if not isinstance(logits, list):
        labels = labels.reshape(-1)
        logits = logits.reshape(-1, logits.size(-1))
    if tokens == 0:  # the mean would be 0/0
        return torch.zeros((), dtype=torch.float64, device=labels.device), tokens
    return loss_fn(logits, labels).double() * tokens, tokens


@dataclass(frozen=True)
class ValResult:
    """One validation pass over the whole set (all ranks).

    Attributes:
        val_loss: mean cross-entropy per label token (nats); ``inf`` when there is no label token.
        tokens: label tokens over the whole set.
        examples: examples over the whole set.
    """

    val_loss: float
    tokens: int
    examples: int


def validation_loss(model: nn.Module, val: ValLoader, loss_fn: nn.Module, device: torch.device) -> ValResult:
    """The exact validation loss (module docstring), model in eval mode under ``torch.no_grad()``.

    A collective when ``torch.distributed`` is initialised: every rank must call it (the sums are
    all-reduced). The model's training mode is put back as it was.

    Args:
        model: the model (FSDP-sharded or not), with ``set_num_output_chunks`` already called
            when the loss is ``CEWithChunkedOutputLoss``.
        val: this rank's :class:`ValLoader`.
        loss_fn: the job's loss (reads ``ignore_index``).
        device: where batches go.
    """
    import torch.distributed as dist
    from torchtune import utils

    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    tokens = torch.zeros((), dtype=torch.int64, device=device)
    try:
        with torch.no_grad():
            for batch, counted in val.batches():
                utils.batch_to_device(batch, device)
                if not counted:
                    batch.pop("labels")
                    model(**batch)  # a filler pass: join the ranks' collectives, count nothing
                    continue
                loss_sum, n = batch_loss_sum(model, batch, loss_fn)
                total += loss_sum
                tokens += n
    finally:
        model.train(was_training)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(total)
        dist.all_reduce(tokens)
    n_tokens = int(tokens.item())
    value = total.item() / n_tokens if n_tokens else float("inf")
    return ValResult(val_loss=value, tokens=n_tokens, examples=val.num_examples)
