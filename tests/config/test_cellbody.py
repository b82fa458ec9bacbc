"""%%tune_run cell bodies and {name} expansion (pure)."""

import pytest

from tune_magic.config.cellbody import CellBody, expand_fields, parse_cell_body
from tune_magic.errors import PlanError


@pytest.mark.parametrize("text", [None, "", "\n\n", "# only a comment\n   \n"])
def test_empty_bodies(text):
    assert parse_cell_body(text) == CellBody()


def test_override_lines_with_comments_quotes_and_deletions():
    body = parse_cell_body('# tweak\nbatch_size=4\nmetric_logger.name="my run"  # trailing comment\n~model.x\nseed=1 epochs=2\n')
    assert body == CellBody(overrides=["batch_size=4", "metric_logger.name=my run", "~model.x", "seed=1", "epochs=2"])


def test_yaml_mapping_body_is_kept_as_text():
    text = "# my config\nseed: 3\nmodel:\n  lora_rank: 4\n"
    assert parse_cell_body(text) == CellBody(config_yaml=text)


def test_yaml_error_names_the_cell_line():
    with pytest.raises(PlanError, match=r"line 4, column 4.*Nothing was started"):
        parse_cell_body("seed: 3\nmodel:\n - a\n  b: [\n")


@pytest.mark.parametrize("text", ["- a\n- b\n", "just words here\n"])
def test_non_mapping_yaml_is_refused(text):
    with pytest.raises(PlanError):
        parse_cell_body(text)


def test_bad_override_line():
    with pytest.raises(PlanError, match="not key=value"):
        parse_cell_body("batch_size=4\nseed\n")


def test_expand_fields():
    ns = {"steps": 20, "run": "r1", "cfg": type("C", (), {"rank": 8})()}
    assert expand_fields("max_steps_per_epoch={steps}", ns) == "max_steps_per_epoch=20"
    assert expand_fields("model.lora_rank={cfg.rank}", ns) == "model.lora_rank=8"
    # OmegaConf interpolations, nested ones included, are left alone
    assert expand_fields("output_dir=${oc.env:A,${oc.env:HOME}/x}/{run}", ns) == "output_dir=${oc.env:A,${oc.env:HOME}/x}/r1"
    assert expand_fields("a=${x.${y}}", ns) == "a=${x.${y}}"
    assert expand_fields("name=my run", ns) == "name=my run"


def test_expand_undefined_is_an_error():
    with pytest.raises(PlanError, match="'nope' is not defined"):
        expand_fields("x={nope}", {})
    with pytest.raises(PlanError, match="no attribute 'missing'"):
        expand_fields("x={run.missing}", {"run": "r"})


def test_duplicate_keys_are_refused_like_torchtune_would():
    with pytest.raises(PlanError, match="not a usable config"):
        parse_cell_body("a: 1\na: 2\n")


# --- one override line: several k=v words, or one override whose value has spaces --------------

LINES = [
    # (the line as typed, the arguments the recipe gets)
    ("metric_logger.name=my run", ["metric_logger.name=my run"]),
    ("metric_logger.name=my   run", ["metric_logger.name=my   run"]),  # spaces kept as typed
    ("metric_logger.name=my run  # a comment", ["metric_logger.name=my run"]),
    ('metric_logger.name="my run"', ["metric_logger.name=my run"]),  # quotes, as before
    ("seed=1 epochs=2", ["seed=1", "epochs=2"]),  # several k=v words stay several overrides
    ('seed=1 metric_logger.name="my run" ~model.x', ["seed=1", "metric_logger.name=my run", "~model.x"]),
    ("seed=1 epochs=2  # two", ["seed=1", "epochs=2"]),
    # '#' inside a word is text (a shell starts a comment only at a word's start)
    ("tag=run#1", ["tag=run#1"]),
    ("tag=run#1 of 3", ["tag=run#1 of 3"]),
    ("tag=run #1", ["tag=run"]),  # '#' after a space: a comment, as YAML and a shell read it
    ("""tag='"run #1"'""", ['tag="run #1"']),  # YAML-quoted inside shell quotes: the recipe gets "run #1"
    ("""tag='"run #1"' b=2""", ['tag="run #1"', "b=2"]),
    # quotes inside a value with spaces are kept as typed (YAML reads them as text)
    ("metric_logger.name=Bob's run", ["metric_logger.name=Bob's run"]),
    ('metric_logger.name=say "hi" now', ['metric_logger.name=say "hi" now']),
    ("k=[a, b]", ["k=[a, b]"]),
    ("output_dir=/tmp/runs/a b", ["output_dir=/tmp/runs/a b"]),
    # {name} fields stay for expansion, with or without spaces
    ("metric_logger.name={run} v2", ["metric_logger.name={run} v2"]),
    ("metric_logger.name={run}", ["metric_logger.name={run}"]),
    ("output_dir=${oc.env:HOME}/my runs", ["output_dir=${oc.env:HOME}/my runs"]),
]


@pytest.mark.parametrize("line, expected", LINES, ids=[line for line, _ in LINES])
def test_override_line_rule(line, expected):
    assert parse_cell_body(line + "\n") == CellBody(overrides=expected)
    # the same line among others: one line never spills into another
    assert parse_cell_body(f"batch_size=4\n{line}\nseed=3\n").overrides == ["batch_size=4", *expected, "seed=3"]


@pytest.mark.parametrize("line, expected", [
    ("metric_logger.name={run} v2", "metric_logger.name=r 7 v2"),
    ("metric_logger.name={run}", "metric_logger.name=r 7"),
])
def test_fields_in_a_value_with_spaces_expand_to_one_argument(line, expected):
    (token,) = parse_cell_body(line).overrides
    assert expand_fields(token, {"run": "r 7"}) == expected


REFUSED = [
    # (line, words of the error)
    ("metric_logger.name=a=b c", "cannot contain '='"),  # the one override's value holds '=': torchtune splits it
    ("seed=1 b=2 c", "cannot contain '='"),  # later words not all k=v: one override "1 b=2 c"
    ("k=a=b", "cannot contain '='"),
    ('metric_logger.name="my run', "close the quote"),
    ('tag="run #1"', "comment"),  # YAML would cut the value at ' #': the recipe would get 'run'
    ("tag=run #1 of 3", None),  # accepted: a comment after a space, as YAML reads it -> 'tag=run'
    ("metric_logger.name=my run &x", None),  # accepted: '&' inside a plain value is text
    ("metric_logger.name=&x y", "YAML anchor"),
]


@pytest.mark.parametrize("line, words", REFUSED, ids=[line for line, _ in REFUSED])
def test_override_line_refusals_name_the_line(line, words):
    if words is None:
        assert parse_cell_body(f"seed=1\n{line}\n").overrides == ["seed=1", line.split(" #")[0]]
        return
    with pytest.raises(PlanError) as err:
        parse_cell_body(f"seed=1\n{line}\n")
    assert str(err.value).startswith("cell line 2: ") and words in str(err.value), str(err.value)


@pytest.mark.parametrize("line", ["seed 4", "~model.x extra"])
def test_a_line_not_starting_with_key_equals_is_not_an_override(line):
    with pytest.raises(PlanError, match="key=value lines"):
        parse_cell_body(f"seed=1\n{line}\n")


def test_a_value_with_spaces_reaches_the_recipe_as_one_argument(tmp_path):
    """``metric_logger.name=my run`` in a cell body: the plan's argv holds the one argument, and
    torchtune 0.6.1's own parser reads the value ``my run`` from it."""
    from argparse import Namespace

    from omegaconf import OmegaConf
    from torchtune.config._utils import _merge_yaml_and_cli_args

    from tune_magic.job.launch import build_plan

    body = parse_cell_body("max_steps_per_epoch=4\nmetric_logger.name=my run\n")
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    plan = build_plan(["lora_finetune_distributed", "--config", "llama3_2/1B_lora", *body.overrides], env=env)
    i = plan.argv.index("max_steps_per_epoch=4")
    assert plan.argv[i + 1] == "metric_logger.name=my run" and "my" not in plan.argv and "run" not in plan.argv
    conf = _merge_yaml_and_cli_args(Namespace(), ["metric_logger.name=my run"])
    assert OmegaConf.to_container(conf)["metric_logger"]["name"] == "my run"


def test_magic_cell_body_value_with_spaces_and_a_field(ip, monkeypatch):
    """In %%tune_run, a body line ``metric_logger.name={who} run`` expands and stays one argument."""
    monkeypatch.setitem(ip.user_ns, "who", "my")
    plan = ip.run_cell_magic("tune_run", "--dry-run lora_finetune_distributed --config llama3_2/1B_lora",
                             "seed=1 epochs=2\nmetric_logger.name={who} run  # a comment\n")
    i = plan.argv.index("seed=1")
    assert plan.argv[i:i + 3] == ["seed=1", "epochs=2", "metric_logger.name=my run"]


NULL_PATH = "null (a path of None, e.g. ./None/...)"


@pytest.mark.parametrize("body,message", [
    ("seed: 1\noutput_dir:\n", f"cell line 2: output_dir is empty: the recipe reads {NULL_PATH}; give a path "
                               "(output_dir: PATH), or drop the line to keep the config's value"),
    ("metric_logger:\n  log_dir:\n", f"cell line 2: metric_logger.log_dir is empty: the recipe reads {NULL_PATH}; give "
                                     "a path (log_dir: PATH), or drop the line to keep the config's value"),
    ('output_dir: ""\n', "cell line 1: output_dir is empty: the recipe reads an empty path; give a path "
                         "(output_dir: PATH), or drop the line to keep the config's value"),
    ("seed=1\noutput_dir=\n", f"cell line 2: override 'output_dir=' leaves output_dir empty: the recipe reads "
                               f"{NULL_PATH}; give a path (output_dir=PATH), or drop the override to keep the config's value"),
])
def test_an_empty_path_in_the_cell_body_is_refused_like_an_empty_override(body, message):
    with pytest.raises(PlanError) as err:
        parse_cell_body(body)
    assert str(err.value) == message


@pytest.mark.parametrize("body", ["output_dir: null\n", "seed:\n", "output_dir: /tmp/x\n", "a=\n"])
def test_other_empty_values_and_an_explicit_null_stay_accepted(body):
    got = parse_cell_body(body)
    assert (got.config_yaml or got.overrides) == (body if ":" in body else ["a="])


def test_plus_key_lines_add_a_key_on_purpose():
    """``+key=value`` (Hydra's spelling, tune_magic.config.checks hands the recipe key=value) is an override line."""
    assert parse_cell_body("+profiler.enabled=true seed=3\n+x.y=my run\n").overrides == [
        "+profiler.enabled=true", "seed=3", "+x.y=my run"]
    with pytest.raises(PlanError, match="cell line 1: override x=&a: '&a' is a YAML anchor"):
        parse_cell_body("+x=&a\n")
    with pytest.raises(PlanError, match="cell line 1: '\\+y' is not key=value"):
        parse_cell_body("+y\n")
