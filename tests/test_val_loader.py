"""recipes/_validation.py without a recipe: the keys' check, each example counted exactly once
across ranks, equal forward passes on every rank (FSDP's collectives), and the exact loss of a small
model against a hand computation (issue 28)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from tune_magic.recipes import _validation as V

IGNORE = -100


def make_dataset(tokenizer=None, n: int = 11):
    """A dataset component for ``dataset_val`` (``_component_: test_val_loader.make_dataset``):
    example i has i % 4 + 2 tokens, the first ``i + 1`` (which names it in a batch); its first label
    is ignored (the prompt), the rest are the tokens."""
    out = []
    for i in range(n):
        tokens = [i + 1] + [(7 * i + j) % 13 + 1 for j in range(i % 4 + 1)]
        out.append({"tokens": tokens, "labels": [IGNORE] + tokens[1:]})
    return out


class _Tokenizer:
    pad_id = 0


def test_check_keys_names_the_fix():
    with pytest.raises(ValueError, match=r"run_val_every_n_steps=5 is set but dataset_val is not: add a dataset_val"):
        V.check_keys(OmegaConf.create({"run_val_every_n_steps": 5}))
    with pytest.raises(ValueError, match="positive int"):
        V.check_keys(OmegaConf.create({"run_val_every_n_steps": 0, "dataset_val": {"_component_": "x"}}))
    with pytest.raises(ValueError, match="batch_size_val must be a positive int"):
        V.check_keys(OmegaConf.create({"batch_size_val": 0}))
    assert V.check_keys(OmegaConf.create({})) is None
    assert V.check_keys(OmegaConf.create({"dataset_val": {"_component_": "x"}})) is None
    assert V.check_keys(OmegaConf.create({"run_val_every_n_steps": 3, "dataset_val": {"_component_": "x"}})) == 3


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("batch_size", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [1, 2, 7, 11, 12])
def test_every_example_once_and_equal_passes_on_every_rank(n, batch_size, world_size):
    cfg = OmegaConf.create({"_component_": "test_val_loader.make_dataset", "n": n})
    seen, passes = [], set()
    for rank in range(world_size):
        val = V.build_val_loader(cfg, _Tokenizer(), IGNORE, batch_size, world_size=world_size, rank=rank)
        batches = list(val.batches())
        passes.add(len(batches))
        counted = [b for b, c in batches if c]
        assert all(c for _, c in batches[: len(counted)])  # fillers only after the rank's own batches
        seen += [int(row[0]) - 1 for b in counted for row in b["tokens"]]
    assert sorted(seen) == list(range(n))  # once each: nothing dropped, nothing repeated
    assert passes == {math.ceil(math.ceil(n / world_size) / batch_size)}


class _Bigram(nn.Module):
    """logits[b, t] depend on tokens[b, t] only: a stand-in model, with a dropout to see eval mode."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(16, 16)
        self.drop = nn.Dropout(0.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.drop(self.emb(tokens))


def test_the_loss_is_exact_in_eval_mode_and_leaves_rng_and_mode_alone():
    model = _Bigram()
    cfg = OmegaConf.create({"_component_": "test_val_loader.make_dataset"})
    val = V.build_val_loader(cfg, _Tokenizer(), IGNORE, batch_size=3)
    loss_fn = nn.CrossEntropyLoss(ignore_index=IGNORE)  # a mean over label tokens, as torchtune's
    rng = torch.get_rng_state()
    result = V.validation_loss(model, val, loss_fn, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), rng)  # no draw from the global RNG
    assert model.training  # put back
    total, count = 0.0, 0
    with torch.no_grad():
        for ex in make_dataset():
            logits = model.emb(torch.tensor(ex["tokens"]))  # eval: no dropout
            target = torch.tensor(ex["labels"][1:])
            total += F.cross_entropy(logits[:-1].double(), target, ignore_index=IGNORE, reduction="sum").item()
            count += int((target != IGNORE).sum())
    assert (result.tokens, result.examples) == (count, 11)
    assert result.val_loss == pytest.approx(total / count, rel=1e-6)
