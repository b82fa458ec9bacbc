"""sweeping/grid.py: axis syntax, trials, names, order and every refusal (pure; no process starts)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tune_magic.errors import PlanError
from tune_magic.job.launch import build_plan
from tune_magic.config.launchwords import check_override
from tune_magic.config.shellwords import Word, split_words
from tune_magic.config.overrides import looks_like_axis, parse_range, refused_axis_key, split_items, word_axis
from tune_magic.sweeping.grid import MAX_TRIALS, parse_max_trials, plan_sweep, short_keys

LAUNCH = "--nproc_per_node 1 lora_finetune --config tiny/lora"


def sweep_line(overrides: str, **kw):
    """plan_sweep of a %%tune_run line (shell-split with quote positions), as the magic will call it."""
    return plan_sweep(split_words(f"{LAUNCH} {overrides}"), **kw)


# --- split_items: where a value splits ------------------------------------------------------------

@pytest.mark.parametrize("value, items", [
    ("1e-4,3e-4,1e-3", ["1e-4", "3e-4", "1e-3"]),
    ("4,8", ["4", "8"]),
    ("1e-4, 3e-4", ["1e-4", "3e-4"]),                          # spaces around items are dropped
    ("[q_proj],[q_proj,v_proj]", ["[q_proj]", "[q_proj,v_proj]"]),
    ("[[a,b],[c]],[d]", ["[[a,b],[c]]", "[d]"]),               # nested brackets
    ("{x: 1, y: 2},{x: 3}", ["{x: 1, y: 2}", "{x: 3}"]),
    ("'a,b',c", ["'a,b'", "c"]),                                # YAML single quotes
    ('"a,b",c', ['"a,b"', "c"]),                                # YAML double quotes
    ("'it''s,x',y", ["'it''s,x'", "y"]),                       # '' inside single quotes
    ('"a\\",b",c', ['"a\\",b"', "c"]),                          # \" inside double quotes
    ("Bob's,Alice's", ["Bob's", "Alice's"]),                    # an apostrophe inside a word is no quote
    ("[a, 'x,]', b],c", ["[a, 'x,]', b]", "c"]),                # a quoted bracket inside a list
    ("${oc.env:A,b},x", ["${oc.env:A,b}", "x"]),                # an interpolation's comma is its own
    ("1e-4,,3e-4", ["1e-4", "", "3e-4"]),                       # empty items come back empty
    ("a,", ["a", ""]),
])
def test_split_items(value, items):
    assert split_items(value) == items


@pytest.mark.parametrize("value", ["1e-4", "[q_proj,v_proj]", "{x: 1, y: 2}", "'a,b'", '"a,b"',
                                   "${oc.env:A,b}", "[a,b", "", "my run"])
def test_one_value_is_not_split(value):
    assert split_items(value) is None


def test_shell_quoted_commas_do_not_split():
    # tag="a,b",c typed on a line: the shell removed the quotes around a,b
    assert split_items("a,b,c", quoted={0, 1, 2}) == ["a,b", "c"]
    assert split_items("a,b", quoted={1}) is None


# A value that is one item: a number, a name, a flow list of names, a YAML-quoted string that may
# hold commas, an interpolation with a default after a comma.
_NAME = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True)
_ITEM = st.one_of(
    st.integers(-10**6, 10**6).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    _NAME,
    st.lists(_NAME, min_size=1, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]"),
    st.lists(st.lists(_NAME, max_size=2).map(lambda xs: "[" + ",".join(xs) + "]"), min_size=1, max_size=3)
      .map(lambda xs: "[" + ", ".join(xs) + "]"),
    st.text(st.sampled_from(list("ab, '")), max_size=6).map(lambda s: "'" + s.replace("'", "''") + "'"),
    st.text(st.sampled_from(list('ab, "')), max_size=6).map(lambda s: '"' + s.replace('"', '\\"') + '"'),
    _NAME.map(lambda n: "${oc.env:" + n.upper() + "," + n + "}"),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ITEM, min_size=2, max_size=5))
def test_joining_items_then_splitting_gives_them_back(items):
    assert all(split_items(item) is None for item in items)
    assert split_items(",".join(items)) == items


@settings(max_examples=100, deadline=None)
@given(st.lists(_ITEM, min_size=2, max_size=4))
def test_every_item_is_a_valid_override_value_read_as_typed(items):
    """What the property above splits is exactly what check_override accepts unchanged."""
    hit = word_axis(f"k={','.join(items)}")
    assert hit == ("k", items)
    for item in items:
        assert check_override(f"k={item}") == f"k={item}"


def test_looks_like_axis():
    for value in ("1e-4,3e-4", "range(1,4)", "range(1, 4)", "a,b", "range(0.1,1)"):
        assert looks_like_axis(value), value
    for value in ("1e-4", "[q_proj,v_proj]", "'a,b'", "${oc.env:A,b}", "ranges"):
        assert not looks_like_axis(value), value


# --- range() -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("range(4)", [0, 1, 2, 3]),
    ("range(1,4)", [1, 2, 3]),
    ("range(1, 4)", [1, 2, 3]),
    ("range(0,12,4)", [0, 4, 8]),
    ("range(5,0,-2)", [5, 3, 1]),
    ("range(-2,1)", [-2, -1, 0]),
    (" range( +1 , 3 ) ", [1, 2]),
])
def test_range_has_python_meaning(text, expected):
    assert list(parse_range(text, "epochs")) == expected


@pytest.mark.parametrize("text, message", [
    ("range(0.1,1)", r"takes whole numbers.*list them: lr=1e-4,3e-4,1e-3"),
    ("range(1e-4,1)", "takes whole numbers"),
    ("range(5,1)", r"lr=range\(5,1\) is empty"),
    ("range(0)", "is empty"),
    ("range(1,5,0)", "step of a range cannot be 0"),
    ("range()", r"write range\(stop\), range\(start, stop\) or range\(start, stop, step\)"),
    ("range(1,2,3,4)", "write range"),
    ("range(a,b)", "write range"),
    ("range(1,", r"must be the whole value and closed.*without spaces"),
    ("range(1,4)x", "must be the whole value"),
])
def test_bad_ranges_are_refused(text, message):
    with pytest.raises(PlanError, match=message):
        parse_range(text, "lr")


def test_range_words_on_a_line():
    assert word_axis("epochs=range(1,4)") == ("epochs", range(1, 4))
    # the shell splits `range(1, 4)` at the space: the first half says how to write it
    with pytest.raises(PlanError, match="without spaces"):
        sweep_line("epochs=range(1, 4)")
    # range() inside a comma list
    with pytest.raises(PlanError, match="must be the whole value, not one item"):
        word_axis("epochs=5,range(1,3)")
    # shell-quoted: one (string) value, not a range
    (w,) = split_words('tag="range(1,3)"')
    assert word_axis(w) is None


# --- word_axis: which override words are axes ---------------------------------------------------

def test_word_axis():
    assert word_axis("optimizer.lr=1e-4,3e-4") == ("optimizer.lr", ["1e-4", "3e-4"])
    assert word_axis("model.lora_rank=8") is None
    assert word_axis("~model.x") is None                      # deletions are never axes
    assert word_axis("lora_attn_modules=[q_proj,v_proj]") is None
    assert word_axis("name=a,b,c") == ("name", ["a", "b", "c"])  # unquoted commas: an axis of strings
    (quoted,) = split_words('name="a,b",c')
    assert word_axis(quoted) == ("name", ["a,b", "c"])
    (key_quoted,) = split_words('"name=a,b"')                  # the whole word quoted: one value
    assert word_axis(key_quoted) is None


@pytest.mark.parametrize("word, where", [
    ("lr=1e-4,,3e-4", "two commas in a row"),
    ("lr=1e-4,3e-4,", "a trailing comma"),
    ("lr=,1e-4", "a leading comma"),
    ("lr=,", "a trailing comma"),
])
def test_empty_items_are_refused(word, where):
    with pytest.raises(PlanError, match=rf"has an empty item \({where}\).*lr=1e-4,3e-4"):
        word_axis(word)


# --- plan_sweep: trials, order, names ------------------------------------------------------------

def test_the_issue_example_gives_six_trials_first_axis_slowest():
    plan = sweep_line("optimizer.lr=1e-4,3e-4,1e-3 model.lora_rank=4,8 max_steps_per_epoch=20")
    assert [a.key for a in plan.axes] == ["optimizer.lr", "model.lora_rank"]
    assert len(plan) == 6
    assert [t.index for t in plan.trials] == list(range(6))
    assert [t.name for t in plan.trials] == [
        "lr=1e-4,lora_rank=4", "lr=1e-4,lora_rank=8", "lr=3e-4,lora_rank=4",
        "lr=3e-4,lora_rank=8", "lr=1e-3,lora_rank=4", "lr=1e-3,lora_rank=8"]
    t = plan.trials[3]
    assert t.values == {"optimizer.lr": 3e-4, "model.lora_rank": 8}
    assert t.texts == {"optimizer.lr": "3e-4", "model.lora_rank": "8"}
    assert t.words == ("optimizer.lr=3e-4", "model.lora_rank=8")
    assert plan.args(t) == plan.args(3) == ["--nproc_per_node", "1", "lora_finetune", "--config", "tiny/lora",
                                            "optimizer.lr=3e-4", "model.lora_rank=8", "max_steps_per_epoch=20"]


def test_every_trial_builds_a_real_launch_plan_with_its_values():
    plan = sweep_line("optimizer.lr=1e-4,3e-4 model.lora_attn_modules=[q_proj],[q_proj,v_proj] "
                      'metric_logger.name="a, b"')
    for trial in plan.trials:
        lp = build_plan(plan.args(trial), job_id=f"t{trial.index}")
        assert f"optimizer.lr={trial.texts['optimizer.lr']}" in lp.overrides
        assert f"model.lora_attn_modules={trial.texts['model.lora_attn_modules']}" in lp.overrides
        assert "metric_logger.name=a, b" in lp.overrides        # quoted: one value in every trial
    assert [t.values["model.lora_attn_modules"] for t in plan.trials] == [["q_proj"], ["q_proj", "v_proj"]] * 2


def test_numbers_keep_the_form_typed_and_values_are_what_the_recipe_reads():
    plan = sweep_line("optimizer.lr=3e-4,0.0003,3.0E-4 seed=range(0,3)")
    lrs = [t.texts["optimizer.lr"] for t in plan.trials[::3]]
    assert lrs == ["3e-4", "0.0003", "3.0E-4"]
    assert {t.values["optimizer.lr"] for t in plan.trials} == {3e-4}
    assert [t.values["seed"] for t in plan.trials[:3]] == [0, 1, 2]
    assert plan.trials[0].name == "lr=3e-4,seed=0"


def test_yaml_quoted_items_and_interpolations():
    plan = sweep_line("tag=\"'a,b'\",c dataset.x=${oc.env:A,b}")
    (axis,) = plan.axes
    assert axis.texts == ("'a,b'", "c") and axis.values == ("a,b", "c")
    assert plan.args(0)[-2:] == ["tag='a,b'", "dataset.x=${oc.env:A,b}"]


def test_a_list_of_arguments_has_no_shell_quotes():
    words = [*LAUNCH.split(), "tag=a,b", "name='x,y'"]
    plan = plan_sweep(words)
    assert [(a.key, a.texts) for a in plan.axes] == [("tag", ("a", "b"))]
    assert plan.args(1)[-2:] == ["tag=b", "name='x,y'"]


def test_torchrun_option_values_and_the_config_are_never_axes():
    words = split_words("--nnodes 1 --rdzv-conf join_timeout=900,read_timeout=60 --local-ranks-filter 0,1 "
                        "lora_finetune --config=tiny/lora seed=1,2")
    plan = plan_sweep(words)
    assert [a.key for a in plan.axes] == ["seed"]
    assert plan.axes[0].position == 8
    assert plan.args(1) == [w.text for w in words][:-1] + ["seed=2"]


def test_axes_are_ordered_as_written_line_then_cell_body():
    body = [Word("b.y=1,2"), Word("a.x=3,4")]
    plan = plan_sweep([*split_words(f"{LAUNCH} z=5,6"), *body], body_axes=[("c", ["7", "8"])])
    assert [a.key for a in plan.axes] == ["z", "b.y", "a.x", "c"]
    expected = list(itertools.product(["5", "6"], ["1", "2"], ["3", "4"], ["7", "8"]))
    assert [tuple(t.texts.values()) for t in plan.trials] == expected
    # a body sweep: axis is appended: it overrides the config overlay like every override
    assert plan.args(0)[-4:] == ["z=5", "b.y=1", "a.x=3", "c=7"]
    assert plan.axes[-1].source == "sweep: mapping" and plan.axes[-1].position is None


def test_short_keys():
    assert short_keys(["optimizer.lr", "model.lora_rank"]) == {"optimizer.lr": "lr", "model.lora_rank": "lora_rank"}
    assert short_keys(["a.x.lr", "b.x.lr", "c.rank"]) == {"a.x.lr": "a.x.lr", "b.x.lr": "b.x.lr", "c.rank": "rank"}
    assert short_keys(["lr", "optimizer.lr"]) == {"lr": "lr", "optimizer.lr": "optimizer.lr"}
    assert short_keys(["a.b.c", "x.b.c", "y.c"]) == {"a.b.c": "a.b.c", "x.b.c": "x.b.c", "y.c": "y.c"}
    plan = sweep_line("optimizer.lr=1,2 other.lr=3,4")
    assert plan.trials[0].name == "optimizer.lr=1,other.lr=3"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(2, 4), min_size=1, max_size=4))
def test_trials_are_the_product_of_the_axes(lengths):
    words = [f"k{i}={','.join(str(10 * i + j) for j in range(n))}" for i, n in enumerate(lengths)]
    plan = plan_sweep(["r", "--config", "c", *words])
    assert len(plan) == math.prod(lengths)
    combos = [tuple(t.texts.values()) for t in plan.trials]
    assert combos == list(itertools.product(*(a.texts for a in plan.axes)))  # first axis slowest
    assert len(set(combos)) == len(combos)
    for t in plan.trials:
        args = plan.args(t)
        assert [a for a in args if "=" in a] == list(t.words)  # each axis word replaced in place


# --- refusals -----------------------------------------------------------------------------------

def test_no_axis():
    with pytest.raises(PlanError, match=r"--sweep found no axis.*optimizer.lr=1e-4,3e-4.*or drop --sweep"):
        sweep_line('seed=1 tag="a,b" lora_attn_modules=[q_proj,v_proj]')


@pytest.mark.parametrize("key", ["output_dir", "metric_logger.log_dir", "profiler.output_dir", "checkpointer.output_dir",
                                 "x.dir", "x.out_dir[0]"])
def test_axes_on_directories_to_write_are_refused(key):
    assert refused_axis_key(key)
    with pytest.raises(PlanError, match=rf"sweep axis {key.replace('[', '.').replace(']', '.')}: .* names a directory "
                                        "the recipe writes to.*drop this axis"):
        sweep_line(f"{key}=/tmp/a,/tmp/b")


@pytest.mark.parametrize("key", ["checkpointer.checkpoint_dir", "checkpointer.checkpoint_files", "tokenizer.path",
                                 "x.vocab_path", "x.merges_file", "directory_name"])
def test_axes_on_paths_to_read_are_allowed(key):
    assert refused_axis_key(key) is None
    plan = sweep_line(f"{key}=/tmp/a,/tmp/b")
    assert plan.axes[0].texts == ("/tmp/a", "/tmp/b")


def test_one_output_dir_for_every_trial_is_refused():
    with pytest.raises(PlanError, match=r"--sweep with output_dir=/tmp/x: trials would share that directory, as it "
                                        r"does not name \$\{seed\}; drop it .* e.g. output_dir=/runs/seed_\$\{seed\}"):
        sweep_line("output_dir=/tmp/x seed=1,2")
    with pytest.raises(PlanError, match=r"does not name \$\{model.lora_rank\}; .*"
                                        r"output_dir=/runs/lr_\$\{optimizer.lr\}/lora_rank_\$\{model.lora_rank\}"):
        sweep_line("output_dir=/runs/${optimizer.lr} optimizer.lr=1e-4,3e-4 model.lora_rank=4,8")
    # one that names every axis differs per trial
    plan = sweep_line("output_dir=/runs/${optimizer.lr}_${model.lora_rank} optimizer.lr=1e-4,3e-4 model.lora_rank=4,8")
    assert len(plan) == 4 and all("output_dir=/runs/${optimizer.lr}_${model.lora_rank}" in plan.args(t)
                                  for t in plan.trials)


def test_a_key_given_twice():
    with pytest.raises(PlanError, match=r"seed is given as two axes \(seed=1,2 and seed=3,4\); merge them"):
        sweep_line("seed=1,2 seed=3,4")
    with pytest.raises(PlanError, match=r"seed is an axis \(seed=1,2\) and is also given as seed=5; keep one"):
        sweep_line("seed=5 seed=1,2")
    with pytest.raises(PlanError, match=r"is also given as ~seed"):
        sweep_line("seed=1,2 ~seed")
    with pytest.raises(PlanError, match=r"two axes \(seed=1,2 and sweep: seed: \[3, 4\]\)"):
        plan_sweep(split_words(f"{LAUNCH} seed=1,2"), body_axes=[("seed", ["3", "4"])])


def test_too_many_trials_says_the_count_and_the_cap():
    with pytest.raises(PlanError, match=r"makes 1,001 trials \(1001 seed\), more than the cap of 1,000.*"
                                        r"--max-trials 1001"):
        sweep_line("seed=range(0,1001)")
    assert MAX_TRIALS == 1000
    assert len(sweep_line("seed=range(0,1001)", max_trials=1001)) == 1001
    # counted before any trial is made: ten billion is refused at once
    with pytest.raises(PlanError, match=r"makes 10,000,000,000 trials \(100000 a x 100000 b\)"):
        sweep_line("a=range(100000) b=range(100000)")


@pytest.mark.parametrize("value", [0, -1, "0", "x", 1.5, True])
def test_max_trials_must_be_positive(value):
    with pytest.raises(PlanError, match="--max-trials"):
        parse_max_trials(value)
    with pytest.raises(PlanError, match="--max-trials"):
        sweep_line("seed=1,2", max_trials=value)


def test_each_item_is_checked_as_an_override():
    with pytest.raises(PlanError, match=r"sweep axis flag=true,yes, item 2 \(yes\): .*YAML 1.1 reads 'yes' as a boolean"):
        sweep_line("flag=true,yes")
    with pytest.raises(PlanError, match=r"item 2 \(\[c\): .*close it with"):
        sweep_line("x=[a,b],[c")
    with pytest.raises(PlanError, match="found no axis"):
        sweep_line("x=[a,b")  # unbalanced: one value (refused as such when its plan is built)
    # the raw list itself would fail check_override; under sweep only the items are checked
    with pytest.raises(PlanError):
        check_override("lora_attn_modules=[q_proj],[q_proj,v_proj]")
    assert len(sweep_line("lora_attn_modules=[q_proj],[q_proj,v_proj]")) == 2


def test_launch_grammar_errors_name_the_users_words():
    with pytest.raises(PlanError, match="missing --config") as exc:
        plan_sweep(["lora_finetune", "seed=1,2"])
    assert "tm_sweep" not in str(exc.value)
    with pytest.raises(PlanError, match=r"torchrun option --nnodes comes after the recipe") as exc:
        plan_sweep(["lora_finetune", "--config", "c", "seed=1,2", "--nnodes", "x=1"])
    assert "tm_sweep" not in str(exc.value)
