"""%%tune_run cell bodies under sweep mode: override lines keep their shell quotes, a YAML body's
sweep: mapping is taken out (config/cellbody.py with sweeping/grid.py; pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tune_magic.errors import PlanError
from tune_magic.config.cellbody import (
    CellBody,
    expand_fields,
    override_line,
    override_line_words,
    parse_cell_body,
)
from tune_magic.config.shellwords import Word, split_words
from tune_magic.sweeping.grid import plan_sweep
from tune_magic.config.cellbody import split_sweep_section

LAUNCH = ["lora_finetune", "--config", "tiny/lora"]


def body_plan(cell: str, line: str = ""):
    """What the magic does under --sweep: the line's words, then the body's words and sweep: axes."""
    body = parse_cell_body(cell, sweep=True)
    return body, plan_sweep([*LAUNCH, *split_words(line), *body.words], body_axes=body.sweep)


# --- override lines ------------------------------------------------------------------------------

def test_override_lines_under_sweep():
    cell = ("optimizer.lr=1e-4,3e-4\n"
            "tag=\"a,b\"                        # shell quotes: one value\n"
            "model.lora_attn_modules=[q_proj],[q_proj,v_proj]\n"
            "metric_logger.name=my run, v2     # one override per line, value as typed: an axis\n"
            "seed=1 epochs=range(1,3)\n")
    body, plan = body_plan(cell)
    assert body.overrides == ["optimizer.lr=1e-4,3e-4", "tag=a,b", "model.lora_attn_modules=[q_proj],[q_proj,v_proj]",
                              "metric_logger.name=my run, v2", "seed=1", "epochs=range(1,3)"]
    assert [w.text for w in body.words] == body.overrides
    assert [(a.key, a.texts) for a in plan.axes] == [
        ("optimizer.lr", ("1e-4", "3e-4")),
        ("model.lora_attn_modules", ("[q_proj]", "[q_proj,v_proj]")),
        ("metric_logger.name", ("my run", "v2")),
        ("epochs", ("1", "2")),
    ]
    assert len(plan) == 16
    assert "tag=a,b" in plan.args(0)


def test_without_sweep_an_axis_word_is_checked_as_one_value():
    # the raw list is not a value torchtune can read: refused without --sweep, item by item with it
    with pytest.raises(PlanError, match="cell line 1"):
        parse_cell_body("model.lora_attn_modules=[q_proj],[q_proj,v_proj]\n")
    assert parse_cell_body("model.lora_attn_modules=[q_proj],[q_proj,v_proj]\n", sweep=True).words
    # and without sweep mode nothing else changes
    assert parse_cell_body("seed=1,2\n") == CellBody(overrides=["seed=1,2"])


def test_a_bad_item_in_a_cell_line_is_refused_by_the_plan():
    body = parse_cell_body("flag=true,yes\n", sweep=True)
    with pytest.raises(PlanError, match=r"item 2 \(yes\)"):
        plan_sweep([*LAUNCH, *body.words])
    with pytest.raises(PlanError, match="cell line 2: .*empty item"):
        parse_cell_body("seed=1\nlr=1e-4,,3e-4\n", sweep=True)


_LINE = st.lists(st.sampled_from(list("ab=,'\" #[]~.\\") + ["x=1", "lr=", " "]), max_size=16).map("".join)


@settings(max_examples=300, deadline=None)
@given(_LINE)
def test_override_line_words_has_the_texts_of_override_line(line):
    try:
        expected = override_line(line)
    except PlanError:
        with pytest.raises(PlanError):
            override_line_words(line)
        return
    assert [w.text for w in override_line_words(line)] == expected


def test_expand_fields_keeps_quotes_on_words():
    ns = {"t": "a,b", "lrs": "1e-4,3e-4", "n": 3}
    tag, lr, plain = split_words('tag="{t}" lr={lrs} name=x{n}y')
    e_tag, e_lr, e_plain = (expand_fields(w, ns) for w in (tag, lr, plain))
    assert e_tag == Word("tag=a,b", frozenset({4, 5, 6}))        # typed inside quotes: stays one value
    assert e_lr == Word("lr=1e-4,3e-4")                          # expanded outside quotes: an axis
    assert e_plain == Word("name=x3y")
    assert expand_fields("lr={lrs}", ns) == "lr=1e-4,3e-4"       # a str stays a str
    plan = plan_sweep([*LAUNCH, e_tag, e_lr])
    assert [(a.key, a.texts) for a in plan.axes] == [("lr", ("1e-4", "3e-4"))]


# --- a YAML body's sweep: mapping ---------------------------------------------------------------

YAML_BODY = """\
# my overlay
seed: 3
sweep:
  optimizer.lr: [1.0e-4, 3.0e-4]
  model:
    lora_rank: [4, 8]
    lora_attn_modules: [[q_proj], [q_proj, v_proj]]
  # a comment inside the section goes with it
batch_size: 2
"""


def test_yaml_sweep_section_is_taken_out_of_the_config():
    body = parse_cell_body(YAML_BODY, sweep=True)
    assert body.config_yaml == "# my overlay\nseed: 3\nbatch_size: 2\n"
    assert body.sweep == (("optimizer.lr", ("1.0e-4", "3.0e-4")), ("model.lora_rank", ("4", "8")),
                          ("model.lora_attn_modules", ("[q_proj]", "[q_proj, v_proj]")))
    plan = plan_sweep(LAUNCH, body_axes=body.sweep)
    assert len(plan) == 8
    assert plan.trials[0].name == "lr=1.0e-4,lora_rank=4,lora_attn_modules=[q_proj]"
    assert plan.trials[-1].values == {"optimizer.lr": 3e-4, "model.lora_rank": 8,
                                      "model.lora_attn_modules": ["q_proj", "v_proj"]}
    assert plan.args(1) == [*LAUNCH, "optimizer.lr=1.0e-4", "model.lora_rank=4",
                            "model.lora_attn_modules=[q_proj, v_proj]"]


def test_a_body_of_only_a_sweep_section_leaves_no_config():
    body = parse_cell_body("sweep:\n  seed: [1, 2]\n", sweep=True)
    assert body == CellBody(config_yaml=None, sweep=(("seed", ("1", "2")),))
    body = parse_cell_body("# overlay\nsweep: {seed: [1, 2]}   # flow style\n", sweep=True)
    assert body.config_yaml is None and body.sweep == (("seed", ("1", "2")),)


def test_yaml_items_mean_what_the_body_means():
    text = ("sweep:\n  x: ['a,b', \"c\", null, ~, yes, 010, 1:30, !!str 5, !!float 1, {a: 1, b: [1, 2]}, 1e-4]\n")
    (key, items), = parse_cell_body(text, sweep=True).sweep
    assert items == ("'a,b'", "'c'", "null", "null", "true", "8", "90", "'5'", "!!float 1", "{a: 1, b: [1, 2]}", "1e-4")
    from omegaconf import OmegaConf

    # each override reads as the body's own YAML does (torchtune's reader: OmegaConf.from_dotlist)
    body_values = OmegaConf.to_container(OmegaConf.create(text))["sweep"]["x"]
    plan = plan_sweep(LAUNCH, body_axes=[(key, items)])
    assert list(plan.axes[0].values) == body_values


@pytest.mark.parametrize("text, message", [
    ("sweep:\n  seed: 3\n", r"cell line 2: sweep: seed must be a list of values"),
    ("sweep:\n  seed: []\n", r"cell line 2: sweep: seed has no values"),
    ("sweep: [1, 2]\n", r"cell line 1: sweep: must map keys to lists of values"),
    ("{seed: 1, sweep: {x: [1, 2]}}\n", r"inside a flow mapping"),
])
def test_bad_sweep_sections(text, message):
    with pytest.raises(PlanError, match=message):
        parse_cell_body(text, sweep=True)


def test_a_sweep_section_without_sweep_mode_is_refused():
    for text in (YAML_BODY, "sweep:\n  seed: 3\n"):  # refused before its content is read
        with pytest.raises(PlanError, match="has a sweep: mapping, which only a sweep reads: add --sweep"):
            parse_cell_body(text)
    # an empty one is just an unused key
    assert parse_cell_body("seed: 1\nsweep:\n") == CellBody(config_yaml="seed: 1\nsweep:\n")


def test_split_sweep_section_leaves_a_body_without_one_alone():
    assert split_sweep_section("seed: 1\n") == ("seed: 1\n", [])
    assert split_sweep_section("seed: 1\nsweep:\n") == ("seed: 1\n", [])


def test_axes_from_the_line_and_the_body_together():
    body, plan = body_plan("seed: 3\nsweep:\n  model.lora_rank: [4, 8]\n", line="optimizer.lr=1e-4,3e-4")
    assert body.config_yaml == "seed: 3\n"
    assert [t.name for t in plan.trials] == ["lr=1e-4,lora_rank=4", "lr=1e-4,lora_rank=8",
                                             "lr=3e-4,lora_rank=4", "lr=3e-4,lora_rank=8"]
