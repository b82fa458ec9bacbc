"""Table-driven tests of the command builder: the rendezvous policy, resolution and every bad input.

Expected values are written out by hand; torchrun's own parser re-parses every distributed argv.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from pathlib import Path

import pytest

from tune_magic.config import catalog
from tune_magic.plan.model import JOB_ID_PLACEHOLDER
from tune_magic.errors import PlanError
from tune_magic.job.launch import build_plan

BUILTIN = "lora_finetune_distributed --config llama3_2/1B_lora"
TT_ROOT = Path(importlib.util.find_spec("torchtune").origin).parent.parent  # site-packages


@pytest.fixture
def env(tmp_path):
    """A clean job environment: no PET_* from the machine running the tests."""
    return {"HOME": str(tmp_path / "home"), "PATH": os.environ.get("PATH", "")}


@pytest.fixture
def custom(tmp_path):
    """A custom recipe with a component module next to it, and a config with an output_dir."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "my_recipe.py").write_text("import my_components\n")
    (d / "my_components.py").write_text("X = 1\n")
    (d / "my.yaml").write_text("output_dir: /tmp/out/my\nseed: 1\n")
    return d


def torchrun_reparse(argv: list[str], monkeypatch):
    """Parse the part after ``-m torch.distributed.run`` with torchrun's own parser."""
    from torch.distributed.run import get_args_parser

    for key in list(os.environ):
        if key.startswith("PET_"):
            monkeypatch.delenv(key)
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    return get_args_parser().parse_args(argv[3:])


# --- rendezvous policy -------------------------------------------------------------------------

POLICY = [
    # (id, args, extra env, expected rendezvous, expected endpoint, token that must be kept)
    ("none->standalone", f"--nproc_per_node 2 {BUILTIN}", {}, "standalone", None, None),
    ("rdzv-endpoint", f"--rdzv-endpoint host:29400 {BUILTIN}", {}, "user", "host:29400", "--rdzv-endpoint"),
    ("rdzv_endpoint=", f"--rdzv_endpoint=host:29400 {BUILTIN}", {}, "user", "host:29400", "--rdzv_endpoint=host:29400"),
    ("PET_RDZV_ENDPOINT", BUILTIN, {"PET_RDZV_ENDPOINT": "host:29400"}, "user", "host:29400", None),
    ("master_port", f"--master_port 29600 {BUILTIN}", {}, "user", "127.0.0.1:29600", "--master_port"),
    ("master-port=", f"--master-port=29600 {BUILTIN}", {}, "user", "127.0.0.1:29600", "--master-port=29600"),
    ("PET_MASTER_PORT", BUILTIN, {"PET_MASTER_PORT": "29600"}, "user", "127.0.0.1:29600", None),
    ("master-addr", f"--master-addr 10.0.0.5 {BUILTIN}", {}, "user", "10.0.0.5", "--master-addr"),
    ("PET_MASTER_ADDR", BUILTIN, {"PET_MASTER_ADDR": "10.0.0.5"}, "user", "10.0.0.5", None),
    ("addr+port", f"--master_addr n0 --master_port 29601 {BUILTIN}", {}, "user", "n0:29601", "--master_addr"),
    ("ipv6 endpoint", f"--rdzv-endpoint [fe80::1]:29400 {BUILTIN}", {}, "user", "[fe80::1]:29400", None),
    ("multi-node c10d", f"--nnodes 2 --rdzv-backend c10d --rdzv-id r1 --rdzv-endpoint n0:29400 {BUILTIN}", {},
     "user", "n0:29400", "--rdzv-id"),
    ("multi-node static", f"--nnodes 2:4 --master-addr n0 --master-port 29500 {BUILTIN}", {}, "user", "n0:29500", None),
    ("explicit standalone kept once", f"--standalone {BUILTIN}", {}, "standalone", None, "--standalone"),
]


@pytest.mark.parametrize("case", POLICY, ids=[c[0] for c in POLICY])
def test_rendezvous_policy(case, env, monkeypatch):
    _, args, extra, mode, endpoint, kept = case
    plan = build_plan(args, env={**env, **extra})
    assert plan.distributed is True
    assert plan.rendezvous == mode
    assert plan.endpoint == endpoint
    assert plan.argv.count("--standalone") == (1 if mode == "standalone" else 0)
    if kept:
        assert kept in plan.torchrun_args
    for token in shlex.split(args.split("lora_finetune_distributed")[0]):
        assert token in plan.torchrun_args  # passed through unchanged
    ns = torchrun_reparse(plan.argv, monkeypatch)
    assert ns.standalone is (mode == "standalone")
    assert ns.training_script == str(TT_ROOT / "recipes" / "lora_finetune_distributed.py")


def test_case1_two_jobs_same_config_each_get_standalone_and_own_output_dir(env):
    """Field case 1: two jobs from one config on one node, no endpoint."""
    a = build_plan(f"--nproc_per_node 2 {BUILTIN}", env=env, gpus="0,1", job_id="job-a")
    b = build_plan(f"--nproc_per_node 2 {BUILTIN}", env=env, gpus="2,3", job_id="job-b")
    for plan in (a, b):
        assert plan.argv[3] == "--standalone"
        assert plan.rendezvous == "standalone"
    assert a.output_dir == "/tmp/torchtune/llama3_2_1B/lora/job-a"
    assert b.output_dir == "/tmp/torchtune/llama3_2_1B/lora/job-b"
    assert a.argv[-1] == "output_dir=/tmp/torchtune/llama3_2_1B/lora/job-a"
    assert (a.env["CUDA_VISIBLE_DEVICES"], b.env["CUDA_VISIBLE_DEVICES"]) == ("0,1", "2,3")


def test_preview_without_job_id_shows_placeholder(env):
    plan = build_plan(BUILTIN, env=env)
    assert plan.output_dir == f"/tmp/torchtune/llama3_2_1B/lora/{JOB_ID_PLACEHOLDER}"
    assert plan.argv[-1] == f"output_dir=/tmp/torchtune/llama3_2_1B/lora/{JOB_ID_PLACEHOLDER}"


def test_user_output_dir_is_kept_and_nothing_added(env):
    plan = build_plan(f"{BUILTIN} output_dir=/data/mine", env=env, job_id="j1")
    assert plan.output_dir is None
    assert [a for a in plan.argv if a.startswith("output_dir=")] == ["output_dir=/data/mine"]


def test_case5_quoted_override_with_spaces_is_one_argument(env):
    plan = build_plan(f'{BUILTIN} metric_logger.name="my run" batch_size=2', env=env)
    i = plan.argv.index("metric_logger.name=my run")
    assert plan.argv[i + 1] == "batch_size=2"
    assert not any('"' in a for a in plan.argv)


def test_list_input_taken_as_is(env):
    plan = build_plan(["lora_finetune_distributed", "--config", "llama3_2/1B_lora", "metric_logger.name=a b"], env=env)
    assert "metric_logger.name=a b" in plan.argv


def test_case6_custom_recipe_path_from_another_cwd(env, custom, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the process cwd is not where the recipe is
    plan = build_plan("my_recipe.py --config my.yaml", env=env, cwd=custom, job_id="j6")
    assert plan.recipe == str(custom / "my_recipe.py")
    assert plan.config == str(custom / "my.yaml")
    assert plan.argv == [sys.executable, str(custom / "my_recipe.py"), "--config", str(custom / "my.yaml"),
                         "output_dir=/tmp/out/my/j6"]
    assert plan.env["PYTHONPATH"].split(os.pathsep)[0] == str(custom)  # components next to the recipe import
    assert plan.distributed is False and plan.rendezvous is None


def test_pythonpath_keeps_callers_entries(env, custom):
    plan = build_plan("my_recipe.py --config my.yaml", env={**env, "PYTHONPATH": "/a:/b"}, cwd=custom)
    assert plan.env["PYTHONPATH"] == os.pathsep.join([str(custom), "/a:/b"])


def test_case7_gpus_set_in_plan_env_only(env):
    before = dict(os.environ)
    plan = build_plan(BUILTIN, env=env, gpus=[2, 3])
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert plan.nproc_per_node == "2"
    assert plan.argv[3:6] == ["--standalone", "--nproc_per_node", "2"]
    assert dict(os.environ) == before


def test_builtin_recipe_and_config_resolve_inside_installed_torchtune(env):
    plan = build_plan(BUILTIN, env=env)
    assert plan.recipe == str(TT_ROOT / "recipes" / "lora_finetune_distributed.py")
    assert plan.config == str(TT_ROOT / "recipes" / "configs" / "llama3_2" / "1B_lora.yaml")
    assert Path(plan.recipe).is_file() and Path(plan.config).is_file()
    assert (plan.recipe_source, plan.recipe_name, plan.config_name) == ("torchtune", "lora_finetune_distributed", "llama3_2/1B_lora")


def test_builtin_distributed_recipe_always_runs_under_torchrun(env):
    plan = build_plan(BUILTIN, env=env)
    assert plan.argv[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    assert plan.nproc_per_node == "1"


def test_builtin_single_device_recipe_runs_as_one_process(env):
    plan = build_plan("lora_finetune_single_device --config llama3_2/1B_lora_single_device", env=env)
    assert plan.argv[:2] == [sys.executable, str(TT_ROOT / "recipes" / "lora_finetune_single_device.py")]
    assert plan.distributed is False and plan.rendezvous is None and plan.nproc_per_node is None


def test_custom_recipe_goes_distributed_with_torchrun_option_or_two_gpus(env, custom):
    a = build_plan("--nnodes 1 my_recipe.py --config my.yaml", env=env, cwd=custom)
    b = build_plan("my_recipe.py --config my.yaml", env=env, cwd=custom, gpus="0,1")
    c = build_plan("my_recipe.py --config my.yaml", env=env, cwd=custom, gpus="0")
    assert (a.distributed, a.nproc_per_node, a.rendezvous) == (True, "1", "standalone")
    assert (b.distributed, b.nproc_per_node) == (True, "2")
    assert (c.distributed, c.env["CUDA_VISIBLE_DEVICES"]) == (False, "0")


@pytest.mark.parametrize("nproc", ["auto", "gpu", "cpu", "4"])
def test_nproc_words_and_integers_allowed(env, nproc, monkeypatch):
    plan = build_plan(f"--nproc-per-node {nproc} {BUILTIN}", env=env)
    assert plan.nproc_per_node == nproc
    assert torchrun_reparse(plan.argv, monkeypatch).nproc_per_node == nproc


def test_both_spellings_of_one_flag_pass_once(env, monkeypatch):
    plan = build_plan(f"--nproc_per_node 2 --nproc-per-node 2 {BUILTIN}", env=env)
    assert plan.torchrun_args == ["--standalone", "--nproc_per_node", "2"]
    torchrun_reparse(plan.argv, monkeypatch)


def test_other_torchrun_flags_pass_through_unchanged(env, monkeypatch):
    args = f"--nproc_per_node 2 --max-restarts 3 --log_dir /tmp/tl -r 3 --tee=3 --monitor-interval 1 {BUILTIN}"
    plan = build_plan(args, env=env)
    assert plan.torchrun_args == ["--standalone", "--nproc_per_node", "2", "--max-restarts", "3", "--log_dir",
                                  "/tmp/tl", "-r", "3", "--tee=3", "--monitor-interval", "1"]
    ns = torchrun_reparse(plan.argv, monkeypatch)
    assert (ns.max_restarts, ns.log_dir, ns.redirects, ns.tee) == (3, "/tmp/tl", "3", "3")


def test_config_equals_form_accepted(env):
    assert build_plan("lora_finetune_distributed --config=llama3_2/1B_lora", env=env).config_name == "llama3_2/1B_lora"


def test_deletion_override_allowed(env):
    assert "~model.lora_rank" in build_plan(f"{BUILTIN} ~model.lora_rank", env=env).argv


def test_name_in_both_registries_is_an_error_naming_both(env, monkeypatch):
    fake = catalog.RecipeEntry("lora_finetune_distributed", Path("/x/lora_finetune_distributed.py"), catalog.TUNE_MAGIC, True, ())
    recipes, configs = catalog._shipped()
    monkeypatch.setattr(catalog, "_shipped", lambda: ((*recipes, fake), configs))
    with pytest.raises(PlanError) as err:
        build_plan(BUILTIN, env=env)
    assert "torchtune" in str(err.value) and "tune_magic" in str(err.value) and "/x/lora_finetune_distributed.py" in str(err.value)


# --- bad input ---------------------------------------------------------------------------------

BAD = [
    # (id, args, extra env, gpus, words the message must contain)
    ("missing --config", "lora_finetune_distributed", {}, None, ["missing --config"]),
    ("--config without value", "lora_finetune_distributed --config", {}, None, ["--config needs a value"]),
    ("--config twice", f"{BUILTIN} --config llama3_2/1B_lora", {}, None, ["twice"]),
    ("no recipe", "--nproc_per_node 2", {}, None, ["no recipe"]),
    ("unknown recipe suggests", "lora_finetune_distribted --config llama3_2/1B_lora", {}, None,
     ["unknown recipe", "lora_finetune_distributed"]),
    ("recipe path missing", "nope/my.py --config llama3_2/1B_lora", {}, None, ["not found"]),
    ("config path missing", "lora_finetune_distributed --config nope/x.yaml", {}, None, ["config", "not found"]),
    ("nnodes 2 no endpoint", f"--nnodes 2 {BUILTIN}", {}, None, ["endpoint", "--rdzv-endpoint"]),
    ("nnodes 2:4 no endpoint", f"--nnodes 2:4 {BUILTIN}", {}, None, ["endpoint"]),
    ("PET_NNODES no endpoint", BUILTIN, {"PET_NNODES": "2"}, None, ["endpoint"]),
    ("nnodes 2 master_port only", f"--nnodes 2 --master-port 29500 {BUILTIN}", {}, None, ["endpoint"]),
    ("nnodes garbage", f"--nnodes two {BUILTIN}", {}, None, ["--nnodes"]),
    ("standalone + endpoint", f"--standalone --rdzv-endpoint h:1 {BUILTIN}", {}, None, ["--standalone", "drop"]),
    ("standalone + master_port", f"--standalone --master_port 29500 {BUILTIN}", {}, None, ["--standalone"]),
    ("standalone + PET endpoint", f"--standalone {BUILTIN}", {"PET_RDZV_ENDPOINT": "h:1"}, None, ["PET_RDZV_ENDPOINT"]),
    ("rdzv-backend alone", f"--rdzv-backend c10d {BUILTIN}", {}, None, ["--rdzv-endpoint", "drop"]),
    ("rdzv_id alone", f"--rdzv_id abc {BUILTIN}", {}, None, ["--rdzv-endpoint"]),
    ("rdzv-conf alone", f"--rdzv-conf timeout=5 {BUILTIN}", {}, None, ["--rdzv-endpoint"]),
    ("endpoint empty host", f"--rdzv-endpoint :29400 {BUILTIN}", {}, None, ["empty host"]),
    ("endpoint port too big", f"--rdzv-endpoint h:70000 {BUILTIN}", {}, None, ["0-65535"]),
    ("endpoint port text", f"--rdzv-endpoint h:abc {BUILTIN}", {}, None, ["not a number"]),
    ("endpoint bare ipv6", f"--rdzv-endpoint fe80::1:29400 {BUILTIN}", {}, None, ["brackets"]),
    ("endpoint bad bracket", f"--rdzv-endpoint [fe80::1:29400 {BUILTIN}", {}, None, ["]"]),
    ("PET endpoint bad", BUILTIN, {"PET_RDZV_ENDPOINT": "h:99999"}, None, ["PET_RDZV_ENDPOINT", "0-65535"]),
    ("master_port out of range", f"--master_port 65536 {BUILTIN}", {}, None, ["0-65535"]),
    ("torchrun flag after recipe", "lora_finetune_distributed --nproc_per_node 2 --config llama3_2/1B_lora", {}, None,
     ["before the recipe"]),
    ("torchrun flag= after recipe", f"{BUILTIN} --nnodes=1", {}, None, ["before the recipe"]),
    ("unknown flag after recipe", f"{BUILTIN} --foo", {}, None, ["neither --config nor key=value"]),
    ("--config before recipe", "--config llama3_2/1B_lora lora_finetune_distributed", {}, None, ["after the recipe"]),
    ("override not key=value", f"{BUILTIN} batch_size", {}, None, ["not key=value"]),
    ("override empty key", f"{BUILTIN} =3", {}, None, ["not key=value"]),
    ("deletion with value", f"{BUILTIN} ~a=1", {}, None, ["deletion"]),
    ("nproc zero", f"--nproc_per_node 0 {BUILTIN}", {}, None, ["positive integer"]),
    ("nproc negative", f"--nproc_per_node -1 {BUILTIN}", {}, None, ["positive integer"]),
    ("nproc text", f"--nproc_per_node two {BUILTIN}", {}, None, ["positive integer"]),
    ("PET nproc bad", BUILTIN, {"PET_NPROC_PER_NODE": "0"}, None, ["PET_NPROC_PER_NODE", "positive integer"]),
    ("nproc disagrees with gpus", f"--nproc_per_node 4 {BUILTIN}", {}, "0,1", ["disagrees"]),
    ("flag twice differently", f"--nproc_per_node 2 --nproc-per-node 3 {BUILTIN}", {}, None, ["twice"]),
    ("unknown torchrun flag", f"--nprocs_per_node 2 {BUILTIN}", {}, None,
     ["not a torchrun option", "Did you mean", "--nproc_per_node"]),
    ("abbreviated flag", f"--nproc 2 {BUILTIN}", {}, None, ["abbreviates --nproc-per-node or --nproc_per_node"]),
    ("abbreviated flag=", f"--max=3 {BUILTIN}", {}, None, ["abbreviates", "--max-restarts"]),
    ("int flag not int", f"--max-restarts abc {BUILTIN}", {}, None, ["--max-restarts 'abc' is not an int"]),
    ("float flag not float", f"--monitor-interval abc {BUILTIN}", {}, None, ["is not a float"]),
    ("choice flag bad", f"--start-method bogus {BUILTIN}", {}, None, ["not one of spawn, fork, forkserver"]),
    ("PET_MODULE refused", BUILTIN, {"PET_MODULE": "1"}, None, ["PET_MODULE", "unset it"]),
    ("PET_NO_PYTHON refused", BUILTIN, {"PET_NO_PYTHON": "true"}, None, ["PET_NO_PYTHON"]),
    ("endpoint with scheme", f"--rdzv-endpoint http://node0:29400 {BUILTIN}", {}, None, ["drop the scheme"]),
    ("override with NUL", f"{BUILTIN} x=a\x00b", {}, None, ["control character"]),
    ("-m refused", f"-m {BUILTIN}", {}, None, ["-m"]),
    ("--no-python refused", f"--no-python {BUILTIN}", {}, None, ["--no-python"]),
    ("switch with value", f"--standalone=1 {BUILTIN}", {}, None, ["takes no value"]),
    ("flag missing value", "--nproc_per_node", {}, None, ["needs a value"]),
    ("unclosed quote", f'{BUILTIN} metric_logger.name="my run', {}, None, ["quote"]),
    ("single-device + torchrun", "--nproc_per_node 2 lora_finetune_single_device --config llama3_2/1B_lora_single_device",
     {}, None, ["does not support torchrun"]),
    ("single-device + 2 gpus", "lora_finetune_single_device --config llama3_2/1B_lora_single_device", {}, "0,1",
     ["does not support torchrun"]),
    ("gpu id negative", BUILTIN, {}, "-1", ["GPU id"]),
    ("gpu id text", BUILTIN, {}, "a,b", ["GPU id"]),
    ("gpu id twice", BUILTIN, {}, "1,1", ["twice"]),
    ("gpu id underscore", BUILTIN, {}, "1_0", ["GPU id"]),
    ("gpu id non-ascii digit", BUILTIN, {}, "\u0663", ["GPU id"]),
    ("gpus bool", BUILTIN, {}, True, ["gpus=True"]),
    ("gpus int", BUILTIN, {}, 1, ["gpus=1"]),
    ("gpus bytes", BUILTIN, {}, b"0", ["gpus=b'0'"]),
    ("gpus float in list", BUILTIN, {}, [1.5], ["GPU id"]),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_a_clear_error(case, env):
    _, args, extra, gpus, words = case
    with pytest.raises(PlanError) as err:
        build_plan(args, env={**env, **extra}, gpus=gpus)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("job_id", ["a/b", "..", "../x", ".hidden", "", "a b", "a\n"])
def test_bad_job_id(env, job_id):
    with pytest.raises(PlanError, match="job id"):
        build_plan(BUILTIN, env=env, job_id=job_id)


def test_building_a_plan_never_touches_cuda_or_starts_a_process(env, custom, monkeypatch):
    import subprocess

    import torch

    def boom(*a, **k):
        raise AssertionError("CUDA touched while building a plan")

    for name in ("init", "_lazy_init", "is_available", "device_count", "current_device", "get_device_name"):
        monkeypatch.setattr(torch.cuda, name, boom)
    monkeypatch.setattr(subprocess.Popen, "__init__", boom)
    monkeypatch.setattr(os, "fork", boom)
    for args, gpus in [(BUILTIN, "0,1"), (f"--nproc_per_node gpu {BUILTIN}", None), ("my_recipe.py --config my.yaml", "0,1")]:
        plan = build_plan(args, env=env, cwd=custom, gpus=gpus)
        assert plan.distributed is True


@pytest.mark.parametrize("content, words", [
    ("- 1\n- 2\n", "not a YAML mapping"), ("", "not a YAML mapping"),
    ("a: [1\n", "not valid YAML"), (b"\x9c\xff\x00binary", r"not a text \(UTF-8\) YAML file"),
])
def test_config_that_is_not_a_yaml_mapping(env, custom, content, words):
    bad = custom / "bad.yaml"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(PlanError, match=words):
        build_plan("my_recipe.py --config bad.yaml", env=env, cwd=custom)


def test_directories_are_not_recipes_or_configs(env, custom):
    (custom / "adir").mkdir()
    with pytest.raises(PlanError, match="is a directory"):
        build_plan("adir --config my.yaml", env=env, cwd=custom)
    with pytest.raises(PlanError, match="is a directory"):
        build_plan("my_recipe.py --config adir", env=env, cwd=custom)


def test_tilde_paths_expand_to_home(env, custom, monkeypatch):
    monkeypatch.setenv("HOME", str(custom))
    plan = build_plan("~/my_recipe.py --config ~/my.yaml", env=env, cwd="/")
    assert (plan.recipe, plan.config) == (str(custom / "my_recipe.py"), str(custom / "my.yaml"))


@pytest.mark.parametrize("value", ['""', "5", "{a: 1}"])
def test_output_dir_that_is_not_a_path_gets_no_per_job_dir(env, custom, value):
    (custom / "odd.yaml").write_text(f"output_dir: {value}\nseed: 1\n")
    plan = build_plan("my_recipe.py --config odd.yaml", env=env, cwd=custom, job_id="j9")
    assert plan.output_dir is None and not any(a.startswith("output_dir=") for a in plan.argv)


# --- torchrun values its parser takes and its launcher refuses -------------------------------------


def _torchrun_refuses(tokens: list[str], monkeypatch) -> bool:
    """Whether torch 2.13's own launcher code refuses these options when torchrun starts: its
    config_from_args (max_restarts, shutdown_timeout, redirects/tee, local_ranks_filter), the
    agent's WorkerSpec (monitor_interval <= 0) and the agent's time.sleep(monitor_interval)
    (nan, inf: ``0 * x`` keeps them nan, so one sleep of 0 s asks the same question)."""
    import time

    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.run import config_from_args, get_args_parser

    for key in list(os.environ):
        if key.startswith("PET_"):
            monkeypatch.delenv(key)
    try:
        cfg, cmd, _ = config_from_args(get_args_parser().parse_args([*tokens, "--nproc-per-node", "1", "x.py"]))
        WorkerSpec(role="default", local_world_size=1, rdzv_handler=None, entrypoint=cmd,
                   monitor_interval=cfg.monitor_interval)
        time.sleep(0 * cfg.monitor_interval)
    except (AssertionError, ValueError, OverflowError):
        return True
    return False


TORCHRUN_VALUES = [
    # (flag and value, refused)
    ("--max-restarts -1", True), ("--max_restarts=-2", True), ("--max-restarts 0", False),
    ("--monitor-interval 0", True), ("--monitor-interval -1", True), ("--monitor-interval nan", True),
    ("--monitor-interval inf", True), ("--monitor-interval 0.01", False),
    ("--shutdown-timeout -1", True), ("--shutdown-timeout 0", False),
    ("--redirects 4", True), ("-r 0:3,1:4", True), ("-r 12:1", True), ("-r 0:3,1:2", False), ("--tee 3", False),
    ("--local-ranks-filter 0,", True), ("--local-ranks-filter a", True), ("--local-ranks-filter 0,1", False),
]


@pytest.mark.parametrize("tokens,refused", TORCHRUN_VALUES, ids=[t for t, _ in TORCHRUN_VALUES])
def test_torchrun_values_its_launcher_refuses_are_refused_before_start(tokens, refused, env, monkeypatch):
    words = shlex.split(tokens)
    assert _torchrun_refuses(words, monkeypatch) is refused  # torch's own verdict
    args = f"{tokens} --nproc_per_node 1 {BUILTIN}"
    if not refused:
        torchrun_reparse(build_plan(args, env=env).argv, monkeypatch)
        return
    with pytest.raises(PlanError) as err:
        build_plan(args, env=env)
    flag = words[0].split("=")[0]
    shown = {"-r": "--redirects", "--max_restarts": "--max-restarts"}.get(flag, flag)
    assert str(err.value).startswith(f"{shown} ")
    assert "torchrun would refuse it when it starts" in str(err.value)


@pytest.mark.parametrize("variable,value,words", [
    ("PET_MAX_RESTARTS", "-1", "PET_MAX_RESTARTS '-1' must be a whole number >= 0, e.g. PET_MAX_RESTARTS 3"),
    ("PET_MONITOR_INTERVAL", "0", "PET_MONITOR_INTERVAL '0' must be a number of seconds > 0"),
    ("PET_TEE", "9", "PET_TEE '9' must be 0-3"),
    ("PET_NODE_RANK", "-1", "PET_NODE_RANK '-1' must be a whole number >= 0"),
])
def test_torchrun_values_from_pet_variables_are_checked_too(variable, value, words, env):
    with pytest.raises(PlanError) as err:
        build_plan(f"--nproc_per_node 2 {BUILTIN}", env={**env, variable: value})
    assert str(err.value).startswith(words)


def test_negative_node_rank_and_local_rank_filter_are_refused(env):
    with pytest.raises(PlanError, match=r"^--node-rank '-1' must be a whole number >= 0, e.g. --node-rank 0"):
        build_plan(f"--node-rank -1 --nproc_per_node 2 {BUILTIN}", env=env)
    with pytest.raises(PlanError, match=r"^--local-ranks-filter '0,-1' must be local ranks"):
        build_plan(f"--local-ranks-filter 0,-1 --nproc_per_node 2 {BUILTIN}", env=env)
    assert "--max-restarts" in build_plan(f"--max-restarts 0 --nproc_per_node 2 {BUILTIN}", env=env).argv


# --- empty values of path keys, configs that are not mappings, recipes that are not Python ---------


NULL_PATH = "null (a path of None, e.g. ./None/...)"


@pytest.mark.parametrize("override,reads", [
    ("output_dir=", NULL_PATH), ("output_dir= ", NULL_PATH), ("metric_logger.log_dir=", NULL_PATH),
    ("checkpointer.checkpoint_dir=", NULL_PATH), ("tokenizer.path=", NULL_PATH), ("tokenizer.merges_file=", NULL_PATH),
    ("checkpointer.checkpoint_files=", NULL_PATH), ("checkpointer.checkpoint_files[0]=", NULL_PATH),
    ("profiler.output_dir=", NULL_PATH), ('output_dir=""', "an empty path"), ("tokenizer.path=' '", "an empty path"),
])
def test_an_empty_value_for_a_path_key_is_refused(override, reads, env, custom):
    key = override.split("=")[0]
    with pytest.raises(PlanError) as err:
        build_plan(["my_recipe.py", "--config", "my.yaml", override], env=env, cwd=custom)
    assert str(err.value) == (
        f"override {override!r} leaves {key} empty: the recipe reads {reads}; give a path ({key}=PATH), or drop the "
        "override to keep the config's value")


@pytest.mark.parametrize("override", ["a=", "seed=", "optimizer.lr=", "dataset.source=", "directory=", "output_dir=x",
                                      'a=""', "output_dir=null"])
def test_an_empty_value_for_other_keys_stays_null_as_in_torchtune(override, env, custom):
    plan = build_plan(["my_recipe.py", "--config", "my.yaml", override], env=env, cwd=custom)
    assert plan.argv[-1 if override.startswith("output_dir") else -2] == override


SCALAR = "a single scalar: plain text, not key: value lines"


@pytest.mark.parametrize("content,what", [
    ("just a string\n", SCALAR), ("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/:/bin/sh\n", SCALAR),
    ("42\n", SCALAR), ("'quoted'\n", SCALAR), ("- a\n- b\n", "a list"), ("", "empty"), ("# only a comment\n", "empty"),
    ("{}\n", "empty"),
])
def test_a_config_that_is_not_a_mapping_is_refused_with_or_without_output_dir(content, what, env, custom):
    bad = custom / "bad.yaml"
    bad.write_text(content)
    want = (f"config {bad} is not a YAML mapping of keys to values (it is {what}); give a torchtune config "
            "(key: value lines)")
    for extra in ("", " output_dir=/tmp/o"):  # the override used to skip reading the file
        with pytest.raises(PlanError) as err:
            build_plan(f"my_recipe.py --config bad.yaml{extra}", env=env, cwd=custom)
        assert str(err.value) == want


@pytest.mark.parametrize("recipe", ["/bin/ls", "/etc/passwd", "my.yaml", "notes.txt", "my_recipe.pyc"])
def test_a_custom_recipe_must_be_a_python_file(recipe, env, custom):
    (custom / "notes.txt").write_text("x\n")
    (custom / "my_recipe.pyc").write_bytes(b"\x00")
    with pytest.raises(PlanError) as err:
        build_plan(f"{recipe} --config my.yaml", env=env, cwd=custom)
    path = custom / recipe if not recipe.startswith("/") else Path(recipe)
    assert str(err.value) == (f"recipe {recipe!r} ({path}) is not a Python file: a custom recipe must be a .py file; "
                              "give the recipe's .py file or a name from tune-magic ls")


@pytest.mark.parametrize("words", [["", "--config", "my.yaml"], [" ", "--config", "my.yaml"],
                                   ["--nproc_per_node", "2", "", "--config", "my.yaml"]])
def test_an_empty_recipe_says_no_recipe_was_given(words, env, custom):
    with pytest.raises(PlanError) as err:
        build_plan(words, env=env, cwd=custom)
    recipe = next(w for w in words if not w.strip())
    assert str(err.value).startswith(f"no recipe given (the recipe is the empty word {recipe!r}): ")
    assert "directory" not in str(err.value)


@pytest.mark.parametrize("gpus,nproc,line", [
    ("0", "2", "--nproc-per-node 2 disagrees with --gpus 0 (1 GPU); drop --nproc-per-node (the GPU list sets it) "
               "or give 2 GPUs"),
    ("0,1", "1", "--nproc-per-node 1 disagrees with --gpus 0,1 (2 GPUs); drop --nproc-per-node (the GPU list sets "
                 "it) or give 1 GPU"),
])
def test_gpu_counts_are_pluralised(gpus, nproc, line, env):
    with pytest.raises(PlanError) as err:
        build_plan(f"--nproc-per-node {nproc} {BUILTIN}", env=env, gpus=gpus)
    assert str(err.value) == line
