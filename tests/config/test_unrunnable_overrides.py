"""Overrides no recipe can run with, refused before anything starts by every way in: the magic,
the CLI (``python -m tune_magic run``), ``tune_magic.launch()`` and a sweep axis (issue 26).

* a comma list as a component (``optimizer._component_=torch.optim.SGD,torch.optim.AdamW`` or
  torchtune 0.6.1's shorthand ``optimizer=...``) without ``--sweep``: it used to start and fail as
  "exited with code 1" when the recipe could not import it;
* a float where the config holds an integer (``model.lora_rank=8.5``): it used to start and fail
  19 s later with torch's ``TypeError``. An integer for a float key stays fine, and so does a float
  tagged on purpose (``!!float``); a boolean key is not an integer key.

Every refusal is checked to leave nothing registered."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from IPython.core.error import UsageError

import tune_magic
from tune_magic.errors import PlanError
from tune_magic.sweeping.create import sweep

ROOT = Path(__file__).resolve().parents[2]
LORA = f"{ROOT / 'recipes' / 'lora_finetune.py'} --config {ROOT / 'recipes' / 'configs' / 'tiny' / 'lora.yaml'}"


@pytest.fixture
def nothing_registered(session_home):
    before = {j.id for j in tune_magic.jobs()}
    yield
    assert {j.id for j in tune_magic.jobs()} == before


REFUSED = [
    ("optimizer._component_=torch.optim.SGD,torch.optim.AdamW",
     ["'torch.optim.SGD,torch.optim.AdamW' is a comma list, and a component is one dotted path",
      "add --sweep (a sweep over optimizer._component_), or pick one, e.g. optimizer._component_=torch.optim.SGD"]),
    ("optimizer=torch.optim.SGD,torch.optim.AdamW",
     ["(optimizer=torch.optim.SGD,torch.optim.AdamW sets optimizer._component_, as torchtune 0.6.1 reads it)",
      "add --sweep (a sweep over optimizer), or pick one, e.g. optimizer=torch.optim.SGD"]),
    ("model.lora_rank=8.5",
     ["the config has model.lora_rank: 8 (an integer), and the recipe would get the float 8.5",
      "give an integer (e.g. model.lora_rank=8)", "tag it: 'model.lora_rank=!!float 8.5'"]),
    ("batch_size=4.0", ["the config has batch_size: 2 (an integer), and the recipe would get the float 4.0"]),
]


@pytest.mark.parametrize("word, parts", REFUSED, ids=[r[0] for r in REFUSED])
def test_launch_refuses_it_before_anything_starts(word, parts, nothing_registered):
    for dry_run in (True, False):
        with pytest.raises(PlanError) as info:
            tune_magic.launch(f"{LORA} {word}", dry_run=dry_run)
        for part in parts:
            assert part in str(info.value), str(info.value)
        assert str(info.value).endswith("Nothing was started.")


@pytest.mark.parametrize("word, parts", REFUSED, ids=[r[0] for r in REFUSED])
def test_the_magic_refuses_it_on_its_line_and_in_its_body(word, parts, ip, nothing_registered):
    for run in (lambda: ip.run_line_magic("tune_run", f"{LORA} {word}"),
                lambda: ip.run_cell_magic("tune_run", LORA, word + "\n")):
        with pytest.raises(UsageError) as info:
            run()
        for part in parts:
            assert part in str(info.value), str(info.value)


@pytest.mark.parametrize("word, parts", REFUSED[1:3], ids=[r[0] for r in REFUSED[1:3]])
def test_the_cli_refuses_it_with_a_usage_error(word, parts, nothing_registered):
    r = subprocess.run([sys.executable, "-m", "tune_magic", "run", *LORA.split(), word], capture_output=True,
                       text=True, env={**os.environ}, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("tune-magic run: error: override ")
    for part in parts:
        assert part in r.stderr


@pytest.mark.parametrize("words", [
    ["optimizer.lr=1"],  # an integer for a float key
    ["model.lora_alpha=!!float 16.5"],  # a float on purpose, tagged
    ["model.lora_alpha=16.5"],  # lora_llama2's own signature says lora_alpha: float (the config writes 16)
    ["compile=1.5"],  # a boolean key is not an integer key (not this rule's)
    ["clip_grad_norm=1.5"],  # null in the config: anything goes
    ["optimizer=torch.optim.SGD", "optimizer.lr=0.01"],  # one component
])
def test_what_can_run_still_passes(words, nothing_registered):
    plan = tune_magic.launch([*LORA.split(), *words], dry_run=True)
    assert plan.overrides[:len(words)] == words


def test_under_sweep_the_comma_list_is_an_axis_and_each_item_is_checked(nothing_registered):
    dry = sweep(f"{LORA} optimizer=torch.optim.SGD,torch.optim.AdamW model.lora_rank=4,8", dry_run=True)
    assert len(dry) == 4
    with pytest.raises(PlanError, match=r"sweep axis model.lora_rank, item 2 \(8.5\)"):
        sweep(f"{LORA} model.lora_rank=8,8.5", dry_run=False)


def test_a_components_own_signature_decides_whether_a_key_takes_a_float():
    from tune_magic.config.valuerules import takes_float

    assert takes_float("torchtune.models.llama2.lora_llama2", "lora_alpha")  # lora_alpha: float
    assert not takes_float("torchtune.models.llama2.lora_llama2", "lora_rank")  # lora_rank: int
    assert not takes_float("torchtune.models.llama2.lora_llama2", "no_such_argument")
    assert not takes_float("no_such_module.fn", "lora_alpha") and not takes_float(None, "lora_alpha")
