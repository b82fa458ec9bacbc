"""Override values: refused exactly when a torchtune 0.6.1 recipe would not read them as typed.

The reference is torchtune's own parser (``torchtune.config._utils._merge_yaml_and_cli_args``), run
here on every value: what we accept is what the recipe gets, and what we refuse the recipe would
have failed on or silently changed.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from argparse import Namespace

import pytest

from tune_magic.config import overrides
from tune_magic.config.cellbody import parse_cell_body
from tune_magic.errors import PlanError
from tune_magic.job.launch import build_plan

BUILTIN = "lora_finetune_distributed --config llama3_2/1B_lora"


def torchtune_reads(token: str):
    """What torchtune 0.6.1's recipe parser makes of one ``key=value`` override (or the exception)."""
    from omegaconf import OmegaConf
    from torchtune.config._utils import _merge_yaml_and_cli_args

    key = token.split("=", 1)[0]
    try:
        conf = _merge_yaml_and_cli_args(Namespace(), [token])
    except Exception as exc:  # noqa: BLE001 - any failure means the recipe dies at start-up
        return exc
    node = OmegaConf.to_container(conf, resolve=False)
    for part in key.split("."):
        node = node[part]
    return node


@pytest.fixture
def env(tmp_path):
    return {"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}


# --- accepted: the recipe gets exactly this ---------------------------------------------------

ACCEPTED = [
    # (token as it reaches the recipe, the Python value the recipe gets)
    ("k=[a,b]", ["a", "b"]),
    ("k={x: 1}", {"x": 1}),
    ("model.lora_attn_modules=['q_proj','v_proj']", ["q_proj", "v_proj"]),
    ("model.lora_attn_modules=[q_proj, v_proj]", ["q_proj", "v_proj"]),
    ("k={a: [1, 2], b: {c: null}}", {"a": [1, 2], "b": {"c": None}}),
    ("batch_size=4", 4),
    ("optimizer.lr=3e-4", 0.0003),
    ("optimizer.lr=0.5", 0.5),
    ("k=-1", -1),
    ("k=1_000", 1000),
    ("k=0x10", 16),
    ("k=.inf", float("inf")),
    ("output_dir=/tmp/runs/a b", "/tmp/runs/a b"),
    ("output_dir=~/runs", "~/runs"),
    ("output_dir=${oc.env:HOME}/runs", "${oc.env:HOME}/runs"),
    ("metric_logger.log_dir=${output_dir}/logs", "${output_dir}/logs"),
    ("k=null", None),
    ("k=None", None),  # torchtune turns None into !!null
    ("k=true", True),
    ("k=False", False),
    ("k=", None),  # an empty value is null, in torchtune as in OmegaConf
    ("metric_logger.name=my run", "my run"),
    ("k=a#b", "a#b"),
    ("k=a:b", "a:b"),
    ("k=http://host:80/x?y", "http://host:80/x?y"),
    ("k=2024-01-01", "2024-01-01"),
    ("k=y", "y"),
    ("k=a\tb", "a\tb"),
    ("k=é😀", "é😀"),
    ("k='&x'", "&x"),  # the quoted form the errors suggest
    ("k='it''s'", "it's"),
    ('k="a #b"', "a #b"),
    ("k='010'", "010"),
    ("k=!!str 007", "007"),
    ("k={x: }", {"x": None}),
    ("k=\\${x", "\\${x"),  # OmegaConf's escape for a literal ${ (the fix its grammar error names)
]


@pytest.mark.parametrize("token, expected", ACCEPTED, ids=[t for t, _ in ACCEPTED])
def test_accepted_value_is_what_the_recipe_gets(token, expected):
    key, _, value = token.partition("=")
    overrides.check_value(key, value)  # must not raise
    assert overrides.recipe_value(key, value) == expected
    assert torchtune_reads(token) == expected


@pytest.mark.parametrize("token, expected", ACCEPTED, ids=[t for t, _ in ACCEPTED])
def test_accepted_value_reaches_the_plan_unchanged(token, expected, env):
    plan = build_plan(["lora_finetune_distributed", "--config", "llama3_2/1B_lora", token], env=env)
    assert token in plan.argv


def test_a_zero_padded_max_filename_reaches_the_plan_unchanged(env):
    # torchtune adds !!str to max_filename values; 70B_lora gives checkpoint_files as a mapping
    token = "checkpointer.checkpoint_files.max_filename=00003"
    plan = build_plan(["lora_finetune_distributed", "--config", "llama3_1/70B_lora", token], env=env)
    assert token in plan.argv


# --- refused: the recipe would fail or get something else ---------------------------------------

REFUSED = [
    # (value, words the message must hold besides the key and the quoted form, what torchtune gives)
    ("`a", ["cannot start any token"], Exception),
    ("|x", ["block scalar"], Exception),
    ("@x", ["cannot start any token"], Exception),
    ("%x", ["directive"], Exception),
    ("[1,2", ["flow list", "close it with ']'"], Exception),
    ("{x: 1", ["flow mapping", "close it with '}'"], Exception),
    ("&x", ["YAML anchor", "would get None"], None),
    ("&x y", ["YAML anchor", "would get 'y'"], "y"),
    ("*x", ["YAML alias", "would fail to start"], Exception),
    ("!tag x", ["'!tag' is a YAML tag"], Exception),
    ("! x", ["'!' is a YAML tag"], "x"),
    ("!!binary aGkh", ["'!!binary' is a YAML tag"], b"hi!"),
    ("!!python/name:os.system", ["YAML tag"], Exception),
    ("~", ["reads '~' as null", "k=null", "does not expand ~"], None),
    ("#x", ["comment", "would get None"], None),
    ("a #b", ["'#b' as a comment", "would get 'a'"], "a"),
    ("'a' #b", ["comment"], "a"),
    ("---", ["document marker"], None),
    ("--- a", ["document marker", "would get 'a'"], "a"),
    ("...", ["cannot read"], Exception),
    ("  ", ["only spaces"], None),
    ("yes", ["boolean", "would get True", "k=true or k=false"], True),
    ("Off", ["boolean", "would get False"], False),
    ("010", ["octal", "would get 8", "decimal"], 8),
    ("00", ["octal"], 0),
    ("1:30", ["base-60", "would get 90"], 90),
    ("12:30:00", ["base-60", "would get 45000"], 45000),
    ("- a", ["block list", "k=[a,b]"], ["a"]),
    ("-", ["block list"], [None]),
    ("a: b", ["block mapping", "k={x: 1}"], {"a": "b"}),
    ("${oc.env: HOME}", ["block mapping"], {"${oc.env": "HOME}"}),
    ("? x", ["block mapping"], {"x": None}),
    (">", ["block scalar"], ""),
    ("[010]", ["octal", "would get [8]"], [8]),
    ("[~]", ["null"], [None]),
    ("[&a x, *a]", ["YAML anchor"], ["x", "x"]),
    ("{<<: {a: 1}}", ["merge"], {"a": 1}),
    ("{a: 1, a: 2}", ["duplicate key"], Exception),
    ("${x", ["OmegaConf cannot read it", r"k=\${x"], Exception),
    ("'a' b", ["cannot read"], Exception),
    (",x", ["cannot read"], Exception),
]


@pytest.mark.parametrize("value, words, torchtune_gives", REFUSED, ids=[v for v, _, _ in REFUSED])
def test_refused_value_names_the_key_and_the_fix(value, words, torchtune_gives):
    with pytest.raises(PlanError) as err:
        overrides.check_value("k", value)
    message = str(err.value)
    assert message.startswith(f"override k={value}: ")
    assert "\n" not in message and message.endswith("Nothing was started.")
    for word in words:
        assert word in message
    got = torchtune_reads(f"k={value}")
    if torchtune_gives is Exception:
        assert isinstance(got, Exception)
    else:
        assert got == torchtune_gives and got != value


@pytest.mark.parametrize("value", [v for v, _, _ in REFUSED if v not in ("  ", "${x")])
def test_the_suggested_quoting_is_accepted_and_gives_the_typed_text(value, env):
    """The message's command-line form, split like a %%tune_run line, reaches the recipe as the text."""
    with pytest.raises(PlanError) as err:
        overrides.check_value("k", value)
    message = str(err.value)
    quoted = overrides.yaml_quoted("k", value)
    typed = overrides.shell_typed("k", value)
    assert f"quote it for YAML: {quoted} (" in message and f"type {typed})" in message
    assert shlex.split(typed) == [typed_token := shlex.split(typed)[0]]
    plan = build_plan(f"{BUILTIN} {typed}", env=env)
    assert typed_token in plan.argv
    assert torchtune_reads(typed_token) == value


def test_a_value_with_a_second_equals_sign_is_refused_as_torchtune_splits_at_every_one():
    for value in ("a=b", "=", "${oc.env:X,a=b}"):
        with pytest.raises(PlanError, match="splits an override at every '='.*YAML cell body"):
            overrides.check_value("k", value)
        assert isinstance(torchtune_reads(f"k={value}"), ValueError)


INDICATORS = "-?:,[]{}#&*!|>'\"%@`"
FORMS = ["{c}", "{c}x", "{c} x", "x{c}", "x {c}", "x{c} y", "x {c} y", "x{c}y", "{c}{c}", "x{c}{c}"]


@pytest.mark.parametrize("c", list(INDICATORS))
def test_every_yaml_indicator_is_refused_exactly_when_the_recipe_would_not_get_the_text(c):
    """Plain text built around each YAML indicator: accepted iff torchtune reads back the same text."""
    for form in FORMS:
        value = form.format(c=c)
        got = torchtune_reads(f"k={value}")
        quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""  # '' or "": YAML on purpose
        faithful = got == (value[1:-1] if quoted else value)
        try:
            overrides.check_value("k", value)
            accepted = True
        except PlanError:
            accepted = False
        assert accepted == faithful, f"k={value}: accepted={accepted} but torchtune gives {got!r}"


@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "Yes", "NO", "On", "OFF", "~", "010", "0777", "1:2",
                                  "1:2:3.5"])
def test_every_scalar_yaml_silently_changes_is_refused(word):
    got = torchtune_reads(f"k={word}")
    assert got != word  # YAML 1.1 changes it...
    with pytest.raises(PlanError):  # ...so it is refused
        overrides.check_value("k", word)


@pytest.mark.parametrize("char, what", [("\x85", "line break"), ("\u2028", "line break"), ("\x7f", "control"),
                                        ("\x9b", "control"), ("\ufeff", "control"), ("\x00", "control"),
                                        ("\udcff", "not UTF-8")])
def test_controls_line_breaks_and_undecodable_bytes_are_refused(char, what, env):
    with pytest.raises(PlanError, match=what):
        build_plan([*BUILTIN.split(), f"k=a{char}b"], env=env)


def test_deleting_a_component_is_refused_as_torchtune_does(env):
    from torchtune.config._utils import _merge_yaml_and_cli_args

    with pytest.raises(PlanError, match="cannot remove a component"):
        build_plan(f"{BUILTIN} ~model._component_", env=env)
    with pytest.raises(ValueError, match="Removing components from CLI is not supported"):
        _merge_yaml_and_cli_args(Namespace(model={"_component_": "x"}), ["~model._component_"])


# --- where overrides come from: the plan string, a cell body, the CLI, the magic ---------------


def test_plan_from_a_string_refuses_an_anchor_and_accepts_its_quoted_form(env):
    with pytest.raises(PlanError) as err:
        build_plan(f"{BUILTIN} model.lora_rank=&x", env=env)
    assert "override model.lora_rank=&x: '&x' is a YAML anchor" in str(err.value)
    assert "quote it for YAML: model.lora_rank='&x' (" in str(err.value)
    assert "type model.lora_rank=\"'&x'\")" in str(err.value)
    plan = build_plan(f"""{BUILTIN} model.lora_rank="'&x'" """, env=env)
    assert "model.lora_rank='&x'" in plan.argv


def test_quoted_value_with_spaces_in_a_string_plan(env):
    plan = build_plan(f'{BUILTIN} metric_logger.name="my run"', env=env)
    assert "metric_logger.name=my run" in plan.argv
    assert torchtune_reads("metric_logger.name=my run") == "my run"


def test_cell_body_override_lines_go_through_the_same_check():
    with pytest.raises(PlanError) as err:
        parse_cell_body("batch_size=4\nmodel.lora_rank=&x\n")
    assert str(err.value).startswith("cell line 2: override model.lora_rank=&x: '&x' is a YAML anchor")
    assert "type model.lora_rank=\"'&x'\")" in str(err.value)
    body = parse_cell_body("batch_size=4\nmodel.lora_rank=\"'&x'\"\nk=[a,b]\n")
    assert body.overrides == ["batch_size=4", "model.lora_rank='&x'", "k=[a,b]"]


def test_cell_body_lines_with_fields_are_checked_after_expansion():
    # {first}_{second} is not YAML before expansion; the plan checks it once the names are filled in
    body = parse_cell_body("metric_logger.name={first}_{second}\n")
    assert body.overrides == ["metric_logger.name={first}_{second}"]


def test_cli_exits_2_with_one_paragraph_naming_the_quoted_form():
    r = subprocess.run([sys.executable, "-m", "tune_magic", "cmd", *BUILTIN.split(), "model.lora_rank=`a"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stdout == "" and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "model.lora_rank=`a" in r.stderr and "model.lora_rank='`a'" in r.stderr


def test_magic_turns_it_into_a_usage_error_and_takes_the_quoted_form(ip):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=r"override lr=&x: .*type lr=\"'&x'\"\)"):
        ip.run_line_magic("tune_run", f"--dry-run {BUILTIN} lr=&x")
    with pytest.raises(UsageError, match=r"cell line 1: override lr=@x"):
        ip.run_cell_magic("tune_run", f"--dry-run {BUILTIN}", "lr=@x\n")
    plan = ip.run_cell_magic("tune_run", f"""--dry-run {BUILTIN} lr="'&x'" """, "tag=\"'@x'\"\n")
    assert "lr='&x'" in plan.argv and "tag='@x'" in plan.argv
