"""%%tune_run cell bodies and {name} expansion (pure)."""

import pytest

from tune_magic.cellbody import CellBody, expand_fields, parse_cell_body
from tune_magic.command import PlanError


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
