"""Overrides and YAML cell bodies checked against the config (tune_magic.config.checks), with the
project's shipped configs (recipes/configs/tiny) and every config torchtune 0.6.1 ships."""

from __future__ import annotations

import ast
import functools
import sysconfig
from argparse import Namespace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tune_magic.errors import PlanError
from tune_magic.config.checks import EXPECTED_KEYS, check_overrides, load_config, split_override
from tune_magic.config.nearkeys import edit_distance, is_near_miss, nearest_keys

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "configs" / "tiny"
LORA = str(TINY / "lora.yaml")  # has optimizer (AdamW, lr 1e-2), lr_scheduler, compile: False, no profiler
FULL = str(TINY / "full.yaml")
# torchtune's wheel ships its recipes and configs as a top-level `recipes` package (not importable)
TT_RECIPES = Path(sysconfig.get_paths()["purelib"]) / "recipes"
TT_CONFIGS = sorted((TT_RECIPES / "configs").rglob("*.yaml"))
# full_finetune_single_device's config: no lr_scheduler (the recipe reads it with cfg.get)
TT_FULL_1B = str(TT_RECIPES / "configs" / "llama3_2" / "1B_full_single_device.yaml")


def refused(config, overrides, overlay=None) -> str:
    with pytest.raises(PlanError) as info:
        check_overrides(config, overrides, overlay)
    return str(info.value)


# -- the near-miss rule -------------------------------------------------------------------------


@pytest.mark.parametrize("a, b, distance", [
    ("optimizer", "optimizer", 0), ("optimzer", "optimizer", 1), ("optmizer", "optimizer", 1),
    ("potimizer", "optimizer", 1), ("optimizerr", "optimizer", 1), ("lr", "rl", 1), ("", "abc", 3),
    ("encoder_trainable", "decoder_trainable", 2), ("num_heads", "num_kv_heads", 3),
])
def test_edit_distance_counts_a_swap_of_neighbours_as_one(a, b, distance):
    assert edit_distance(a, b) == distance
    assert edit_distance(b, a) == distance


@pytest.mark.parametrize("typed, existing, near", [
    ("optimzer", "optimizer", True),
    ("Optimizer", "optimizer", True),
    ("lr-scheduler", "lr_scheduler", True),
    ("batchsize", "batch_size", True),
    ("weight_decy", "weight_decay", True),
    ("gradient_accumlation_steps", "gradient_accumulation_steps", True),
    ("epoch", "epochs", True),
    ("lt", "lr", True),
    ("mode", "model", True),
    ("name", "mode", False),  # two edits in four letters: different words
    ("decoder_trainable", "encoder_trainable", False),  # real siblings: different first letter
    ("num_heads", "num_kv_heads", False),
    ("tensor_parallel_dim", "tensor_parallel_plan", False),
    ("profiler", "compile", False),
    ("lr_scheduler", "lr", False),
    ("optimizer", "optimizer", False),  # the key itself is not a miss
])
def test_near_miss_rule(typed, existing, near):
    assert is_near_miss(typed, existing) is near


def test_nearest_keys_are_ordered_by_distance_and_at_most_three():
    assert nearest_keys("lora_rnk", ["lora_rank", "lora_alpha", "lora_dropout"]) == ["lora_rank"]
    assert nearest_keys("seeds", ["seed", "seeds_x", "speed", "shuffle"]) == ["seed", "seeds_x", "speed"]  # ties: the more similar first
    assert nearest_keys("abcd", ["abce", "abcf", "abcg", "abch"]) == ["abce", "abcf", "abcg"]


@pytest.mark.parametrize("value, axis", [
    ("1e-4,3e-4", True), ("1,2,3", True), ("a, b", True), ("range(1,4)", True), ("range(1, 4)", True),
    ("f(1,2)", True),  # parentheses are not brackets to YAML or to the sweep grammar: two items
    ("[1,2]", False), ("{x: 1, y: 2}", False), ("'a,b'", False), ('"a,b"', False), ("${oc.env:A,b}", False),
    ("1e-4", False), ("ranges", False),
])
def test_the_comma_list_refusal_and_the_sweep_grammar_agree_on_what_an_axis_is(value, axis):
    """One rule (tune_magic.config.overrides.looks_like_axis) says what an axis is; without --sweep, such a
    value where the config holds a number is refused saying to add --sweep, and nothing else is."""
    from tune_magic.config.overrides import looks_like_axis, word_axis

    assert looks_like_axis(value) is axis
    assert (word_axis(f"batch_size={value}") is not None) is axis
    try:
        check_overrides(LORA, [f"batch_size={value}"])
        message = ""
    except PlanError as exc:
        message = str(exc)
    assert ("add --sweep (a sweep over batch_size)" in message) is axis, message


@pytest.mark.parametrize("token, parsed", [
    ("optimizer.lr=1e-3", ("set", "optimizer.lr", "1e-3")),
    ("+profiler.enabled=true", ("add", "profiler.enabled", "true")),
    ("~compile", ("delete", "compile", None)),
    ("a=b=c", ("set", "a", "b=c")),
    ("+x=", ("add", "x", "")),
])
def test_split_override(token, parsed):
    assert split_override(token) == parsed


@pytest.mark.parametrize("token, part", [
    ("+y", "adding a key is +key=value"),
    ("++y=1", "adding a key is +key=value"),
    ("+~y=1", "adding a key is +key=value"),
    ("~y=1", "a deletion is ~key with no value"),
    ("y", "is not key=value"),
    ("1y=2", "is not key=value"),
])
def test_split_override_refuses_malformed_words(token, part):
    with pytest.raises(PlanError, match=part.replace("+", r"\+")):
        split_override(token)


# -- keys -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("config, overrides, parts", [
    (LORA, ["optimzer.lr=1e-3"],
     ["override optimzer.lr=1e-3: the config has no key optimzer; did you mean optimizer.lr?",
      "write +optimzer.lr=1e-3", "Nothing was started."]),
    (LORA, ["Optimizer.lr=1e-3"], ["the config has no key Optimizer; did you mean optimizer.lr?"]),
    (LORA, ["optimizer.weight_decy=0.1"],
     ["the config has no key optimizer.weight_decy; did you mean optimizer.weight_decay?"]),
    (LORA, ["model.lora_rnk=4"], ["did you mean model.lora_rank?"]),
    (LORA, ["batchsize=4"], ["the config has no key batchsize; did you mean batch_size?"]),
    (LORA, ["epoch=3"], ["did you mean epochs?"]),
    (LORA, ["lr_schedular.num_warmup_steps=1"], ["did you mean lr_scheduler.num_warmup_steps?"]),
    (LORA, ["max_steps_per_epochs=3"], ["did you mean max_steps_per_epoch?"]),
    (FULL, ["gradient_accumlation_steps=2"], ["did you mean gradient_accumulation_steps?"]),
    (TT_FULL_1B, ["optimzer.lr=1e-3"], ["did you mean optimizer.lr?"]),
])
def test_a_near_miss_of_a_config_key_is_refused_with_the_nearest_keys(config, overrides, parts):
    message = refused(config, overrides)
    for part in parts:
        assert part in message


@pytest.mark.parametrize("config, override, parts", [
    (LORA, "profiler.enabled=True",
     ["override profiler.enabled=True: the config has no key profiler (top-level keys: tune_magic_home, ",
      "ignores it silently otherwise", "write +profiler.enabled=True"]),
    (TT_FULL_1B, "lr_scheduler.num_warmup_steps=10",
     ["override lr_scheduler.num_warmup_steps=10: the config has no key lr_scheduler",
      "write +lr_scheduler.num_warmup_steps=10"]),
    (LORA, "dataset.column_map.extra=x",
     ["the config has no key dataset.column_map.extra (its keys: input, output)"]),
    (LORA, "early_exit_loss.layers=all", ["the config has no key early_exit_loss"]),
])
def test_any_other_missing_key_is_a_warning_not_a_refusal(config, override, parts):
    result = check_overrides(config, [override])
    assert result.overrides == [override]
    assert len(result.warnings) == 1
    for part in parts:
        assert part in result.warnings[0]


@pytest.mark.parametrize("config, overrides", [
    # keys the config has
    (LORA, ["optimizer.lr=1e-3", "compile=True", "clip_grad_norm=1.0", "lr_scheduler.num_warmup_steps=5"]),
    # a keyword argument of an existing component (a wrong one fails loudly at instantiate)
    (LORA, ["optimizer.amsgrad=True", "model.use_dora=True", "dataset.filter_fn=null"]),
    # added on purpose
    (LORA, ["+profiler.enabled=True", "+optimzer.lr=1e-3"]),
    # a section added by an earlier override counts as the config's for later ones
    (LORA, ["+profiler._component_=torchtune.training.setup_torch_profiler", "profiler.enabled=True"]),
    # a top-level component set by name (torchtune 0.6.1 sets its _component_)
    (LORA, ["model=torchtune.models.llama2.lora_llama2"]),
])
def test_keys_the_config_has_or_that_are_added_on_purpose_pass_silently(config, overrides):
    result = check_overrides(config, overrides)
    assert result.warnings == []
    assert result.overrides == [o.lstrip("+") for o in overrides]


def test_plus_key_hands_the_recipe_key_equals_value_in_order():
    result = check_overrides(LORA, ["seed=1", "+profiler.enabled=True", "~compile", "+x.y=[1, 2]"])
    assert result.overrides == ["seed=1", "profiler.enabled=True", "~compile", "x.y=[1, 2]"]
    assert result.warnings == []


def test_plus_key_values_are_checked_like_any_override():
    message = refused(LORA, ["+profiler.name=&x"])
    assert "override profiler.name=&x: '&x' is a YAML anchor" in message


@pytest.mark.parametrize("overrides, parts", [
    (["checkpointer.checkpoint_files.0=x.safetensors"],
     ["checkpointer.checkpoint_files is a list in the config, and torchtune 0.6.1 cannot set one item of a list",
      "Cannot merge incompatible container types", "checkpointer.checkpoint_files=[...]"]),
    (["checkpointer.checkpoint_files[0]=x.safetensors"], ["cannot set one item of a list"]),
    (["batch_size.x=1"],
     ["batch_size is a number in the config (batch_size: 2), not a section with keys, so batch_size.x would "
      "silently replace it; set batch_size itself"]),
])
def test_keys_through_a_list_or_a_plain_value_are_refused(overrides, parts):
    message = refused(LORA, overrides)
    for part in parts:
        assert part in message


# -- deletions --------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, parts", [
    (["~profiler"], ["override ~profiler: the config has no key profiler to delete",
                     '"Could not find key profiler in yaml config to remove"', "drop ~profiler"]),
    (["~optimizer.amsgrad"], ["the config has no key optimizer.amsgrad to delete"]),
    (["~compil"], ["the config has no key compil to delete", "did you mean ~compile?"]),
    (["~compile", "~compile"], ["override ~compile: an earlier override already deleted compile"]),
    (["+x=1", "~x"], ["the config has no key x to delete"]),  # torchtune deletes from the file only
    (["~model"], ["model is a section with a _component_, which torchtune 0.6.1 cannot delete",
                  '"Could not find key model in yaml config to remove"', "override model._component_"]),
    (["~model._component_"], ["torchtune cannot remove a component"]),
    (["~batch_size.x"], ["batch_size is a number (batch_size: 2) in the config, with no keys to delete"]),
    (["~checkpointer.checkpoint_files.x"], ["checkpointer.checkpoint_files is a list in the config"]),
])
def test_a_deletion_torchtune_would_refuse_is_refused_before_launch(overrides, parts):
    message = refused(LORA, overrides)
    for part in parts:
        assert part in message


@pytest.mark.parametrize("overrides", [
    ["~compile"], ["~optimizer.fused", "~optimizer.weight_decay"], ["~clip_grad_norm", "clip_grad_norm=1.0"],
    ["~dataset.column_map.input", "~dataset.column_map.output"],
])
def test_deletions_of_keys_the_config_has_pass(overrides):
    assert check_overrides(LORA, overrides).overrides == overrides


def _torchtune_merge(config: str, overrides: list[str]):
    from torchtune.config._utils import _merge_yaml_and_cli_args

    yaml_kwargs = OmegaConf.to_container(OmegaConf.load(config), resolve=False)
    return _merge_yaml_and_cli_args(Namespace(**yaml_kwargs), overrides)


@pytest.mark.parametrize("overrides", [
    ["~profiler"], ["~compile", "~compile"], ["~model"], ["~batch_size.x"], ["~checkpointer.checkpoint_files.x"],
    ["+x=1", "~x"],
])
def test_torchtune_itself_refuses_what_is_refused_here(overrides):
    """The same words through torchtune 0.6.1's own merge (``+x`` spelled as the recipe gets it)."""
    handed = [o.lstrip("+") for o in overrides]
    with pytest.raises((ValueError, TypeError)) as info:
        _torchtune_merge(LORA, handed)
    message = refused(LORA, overrides)
    if isinstance(info.value, ValueError):
        assert f'"{info.value}"' in message  # torchtune's own words, quoted
    else:
        assert "torchtune 0.6.1 stops the recipe with a TypeError" in message


def test_deletions_that_pass_here_pass_in_torchtune_with_the_same_result():
    overrides = ["~dataset.column_map.input", "~dataset.column_map.output", "~compile", "seed=5"]
    check_overrides(LORA, overrides)
    merged = _torchtune_merge(LORA, overrides)
    assert "column_map" not in merged.dataset and "compile" not in merged and merged.seed == 5


# -- values -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("override, parts", [
    ("optimizer.lr=abc",
     ["override optimizer.lr=abc: the config has optimizer.lr: 0.01 (a number), and the recipe would get the "
      "text 'abc'; give a number (e.g. optimizer.lr=0.01)",
      "to pass the text on purpose, quote it: optimizer.lr='abc'", "type optimizer.lr=\"'abc'\""]),
    ("compile=maybe",
     ["the config has compile: false (a boolean), and the recipe would get the text 'maybe'; give true or false "
      "(e.g. compile=false)"]),
    ("batch_size=four", ["the config has batch_size: 2 (a number)"]),
    ("model.norm_eps=small", ["the config has model.norm_eps: 1e-05 (a number)"]),
    ("optimizer.lr=1e-4,3e-4",
     ["the config has optimizer.lr: 0.01 (a number), and 1e-4,3e-4 is a comma list, which the recipe would get "
      "as the text '1e-4,3e-4'; to run one job per value add --sweep (a sweep over optimizer.lr), or to pass the "
      "text on purpose quote it: optimizer.lr='1e-4,3e-4'"]),
    ("batch_size=2,4", ["add --sweep (a sweep over batch_size)"]),
    ("batch_size=[1,2]", ["the config has batch_size: 2 (a number), and the recipe would get a list ([1, 2])"]),
    ("compile={x: 1}", ["the recipe would get a section"]),
    ("dataset.column_map=abc",
     ["the config has dataset.column_map: {input, output} (a section), and 'abc' would replace the whole section; "
      "set one of its keys, e.g. dataset.column_map.input=..."]),
    # torchtune 0.6.1 reads it as optimizer._component_=[1] (the component shorthand): never a component
    ("optimizer=[1]", ["the recipe would get a list ([1]) as the component (optimizer=[1] sets optimizer._component_"]),
    ("batch_size=4.0", ["the config has batch_size: 2 (an integer), and the recipe would get the float 4.0"]),
    ("checkpointer.checkpoint_files={a: 1}", ["a mapping cannot replace a list"]),
])
def test_a_value_whose_type_cannot_be_what_the_config_holds_is_refused(override, parts):
    message = refused(LORA, [override])
    for part in parts:
        assert part in message


@pytest.mark.parametrize("override", [
    "optimizer.lr=1e-4", "optimizer.lr=3", "optimizer.lr=null", "optimizer.lr=None", "optimizer.lr=${lr}",
    "optimizer.lr='abc'", 'optimizer.lr="abc"', "optimizer.lr=!!str abc", "compile=true", "compile=1",
    "clip_grad_norm=abc", "clip_grad_norm=1.5",  # the config's value is null: anything goes
    "output_dir=/tmp/x,y",  # text where the config holds text (an interpolation): commas are text
    "dataset.source=json", "model=torchtune.models.llama2.lora_llama2", "dataset.column_map={input: q}",
    "checkpointer.checkpoint_files=[a.safetensors,b.safetensors]", "profiler=null",
])
def test_values_of_the_configs_kind_null_interpolations_and_quoted_text_pass(override):
    assert check_overrides(LORA, [override]).overrides == [override]


# -- YAML cell bodies -------------------------------------------------------------------------------


@pytest.mark.parametrize("body, parts", [
    ("seed: 1\noptimzer:\n  lr: 1e-3\n",
     ["cell line 2: optimzer: the config has no key optimzer; did you mean optimizer?",
      "set it on the %%tune_run line as +optimzer=..."]),
    ("optimizer:\n  weight_decy: 0.1\n", ["cell line 2: optimizer.weight_decy: ", "did you mean optimizer.weight_decay?"]),
    ("optimizer:\n  lr: abc\n",
     ["cell line 2: optimizer.lr: the config has optimizer.lr: 0.01 (a number), and the recipe would get the text "
      "'abc'; give a number (e.g. lr: 0.01), or to pass the text on purpose, quote it: lr: 'abc'"]),
    ("compile: sometimes\n", ["cell line 1: compile: the config has compile: false (a boolean)"]),
    ("checkpointer:\n  checkpoint_files: {a: 1}\n", ["cell line 2: ", "a mapping cannot replace a list",
                                                     "checkpoint_files: [...]"]),
    ("dataset:\n  column_map: abc\n", ["cell line 2: dataset.column_map: ", "would replace the whole section"]),
])
def test_a_yaml_cell_body_is_checked_by_the_same_rules(body, parts):
    message = refused(LORA, [], body)
    for part in parts:
        assert part in message


def test_a_yaml_cell_body_warns_about_missing_keys_and_passes_its_own_new_sections():
    body = ("optimizer:\n  lr: 3e-4\n  amsgrad: true\n"  # a component's keyword argument: silent
            "profiler:\n  _component_: torchtune.training.setup_torch_profiler\n  enabled: true\n"  # new component
            "early_exit_loss:\n  layers: all\n"  # a new plain section: warned
            "optimizer_notes: 'q'\n")  # not a near miss of optimizer (too far): warned
    result = check_overrides(LORA, ["profiler.enabled=False"], body)
    assert result.overrides == ["profiler.enabled=False"]  # the body's section counts for the overrides
    assert [w.split(": the config", 1)[0] for w in result.warnings] == [
        "cell line 7: early_exit_loss", "cell line 9: optimizer_notes"]
    assert "+early_exit_loss=..." in result.warnings[0]


def test_overrides_are_checked_against_the_config_with_the_body_merged():
    assert "the config has optimizer.lr: 0.0003" in refused(LORA, ["optimizer.lr=abc"], "optimizer:\n  lr: 3e-4\n")
    # a body that is the whole config (no --config): the overrides are checked against it
    assert "did you mean seed?" in refused(None, ["sed=2"], "seed: 0\n")
    assert check_overrides(None, ["seed=2"], "seed: 0\n").overrides == ["seed=2"]


# -- every shipped config -------------------------------------------------------------------------


def _configs() -> list[Path]:
    return sorted(TINY.glob("*.yaml")) + TT_CONFIGS


def _leaves(node, prefix=()):
    """``(key path, value)`` of every scalar leaf (lists are values; sections are walked)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, (*prefix, str(k)))
    elif prefix:
        yield prefix, node


def _typed(value) -> str | None:
    """How a value is typed as an override (None: not as one word)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str) and "=" not in value and "\n" not in value:
        return value if "${" in value else "'" + value.replace("'", "''") + "'"
    return None


@functools.cache
def _optional_keys() -> frozenset[str]:
    """Top-level keys torchtune 0.6.1's recipes read with a default: ``cfg.get("key", ...)``, and
    ``cfg.get(PROFILER_KEY, ...)`` (``torchtune.training.PROFILER_KEY``)."""
    profiler_source = (TT_RECIPES.parent / "torchtune" / "training" / "_profiler.py").read_text()
    keys = {ast.literal_eval(line.split("=", 1)[1]) for line in profiler_source.splitlines()
            if line.startswith("PROFILER_KEY =")}
    # tune_magic's recipes that read a training job's config for something else (generation,
    # evaluation) read its keys with defaults that are not optional training keys
    ours = [p for p in (ROOT / "recipes").glob("*.py") if p.stem not in ("generate_text", "validate_checkpoint")]
    for path in list(TT_RECIPES.glob("*.py")) + list(TT_RECIPES.glob("dev/*.py")) + ours:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "cfg" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                keys.add(node.args[0].value)
    return frozenset(keys)


def test_every_torchtune_config_is_found():
    assert len(TT_CONFIGS) > 100 and TT_FULL_1B in map(str, TT_CONFIGS)
    assert {"profiler", "compile", "clip_grad_norm", "lr_scheduler", "optimizer_in_bwd"} <= _optional_keys()


@pytest.mark.parametrize("config", _configs(), ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_key_of_a_shipped_config_passes_and_its_typos_are_caught(config):
    data = load_config(config)
    words = [f"{'.'.join(path)}={text}" for path, value in _leaves(data)
             if "_component_" not in path and (text := _typed(value)) is not None]
    result = check_overrides(config, words)
    assert result.warnings == [] and result.overrides == words
    # real optional keys are never refused (a warning when the config lacks them)
    optional = sorted(_optional_keys() - set(data) - set(EXPECTED_KEYS))
    result = check_overrides(config, [f"{k}=null" for k in optional])
    assert len(result.warnings) == len(optional)
    # torchtune's validation keys (its recipes after 0.6.1) are expected: no warning, no near miss
    missing = [k for k in EXPECTED_KEYS if k not in data]
    assert check_overrides(config, [f"{k}=null" for k in missing]).warnings == []
    if "lr_scheduler" not in data:
        assert check_overrides(config, ["lr_scheduler.num_warmup_steps=10"]).warnings
    # a typo of a top-level key (a letter dropped, two swapped, one doubled) is a near miss of it
    for key in (k for k in data if len(k) >= 4):
        for typo in {key[:2] + key[3:], key[:1] + key[2] + key[1] + key[3:], key[:3] + key[2:]} - set(data):
            assert key in nearest_keys(typo, list(data)), typo
    # and refused with it (one per config: each check reads the config again)
    key = max(data, key=len)
    message = refused(config, [f"{key[:-1]}=1"])
    assert f"the config has no key {key[:-1]}; did you mean {key}" in message


# --- through the public API: every launch path checks before anything starts ----------------------

def test_launch_refuses_a_misspelled_key_with_the_suggestion_and_starts_nothing(session_home):
    import tune_magic
    from tune_magic.registry import store as jobstore

    before = {r.id for r in jobstore.list_records()}
    for dry in (True, False):
        with pytest.raises(PlanError, match=r"did you mean optimizer\.lr\?"):
            tune_magic.launch("lora_finetune --config tiny/lora optimzer.lr=1e-3", dry_run=dry)
    assert {r.id for r in jobstore.list_records()} == before


def test_launch_refuses_text_for_a_number_and_a_comma_list_without_sweep(session_home):
    import tune_magic

    with pytest.raises(PlanError, match="optimizer.lr"):
        tune_magic.launch("lora_finetune --config tiny/lora optimizer.lr=abc", dry_run=True)
    with pytest.raises(PlanError, match="--sweep"):
        tune_magic.launch("lora_finetune --config tiny/lora optimizer.lr=1e-4,3e-4", dry_run=True)


def test_a_yaml_cell_body_typo_is_refused_and_a_plus_key_is_handed_on_without_the_plus(session_home):
    import tune_magic

    with pytest.raises(PlanError, match="did you mean"):
        tune_magic.launch("lora_finetune --config tiny/lora", config_overlay="optimzer:\n  lr: 0.001\n", dry_run=True)
    plan = tune_magic.launch("lora_finetune --config tiny/lora +my_tag=run1", dry_run=True)
    assert "my_tag=run1" in plan.argv and "+my_tag=run1" not in plan.argv and not any(
        "my_tag" in w for w in plan.warnings)


def test_a_key_the_config_lacks_that_is_no_near_miss_is_a_warning_on_the_plan(session_home):
    import tune_magic

    plan = tune_magic.launch("lora_finetune --config tiny/lora profiler.enabled=True", dry_run=True)
    assert "profiler.enabled=True" in plan.argv and any("profiler" in w for w in plan.warnings)
