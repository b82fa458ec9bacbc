"""SLURM plans from the one command builder, the batch script (golden text), and every refusal —
all before anything is submitted. sbatch here is a FAKE executable on PATH (never run by these
tests: every case is decided before submitting)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

import tune_magic
from tune_magic.job.launch import build_plan
from tune_magic.errors import PlanError
from tune_magic.schedulers.slurm.submit import (batch_script, directive_word, directives, output_pattern, sbatch_argv,
                                                shell_word)

from jobhelpers import DATA, TOY_CONFIG, TOY_RECIPE, toy_args


@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch):
    """A FAKE sbatch on PATH that fails if it is ever run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "sbatch"
    exe.write_text("#!/bin/sh\necho 'FAKE sbatch must not run in these tests' >&2\nexit 99\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for key in list(os.environ):
        if key.startswith(("PET_", "SBATCH_")) or key == "TUNE_MAGIC_SCHEDULER":
            monkeypatch.delenv(key)
    return exe


def dry(args: str, **kw):
    return tune_magic.launch(args, scheduler="slurm", dry_run=True, **kw)


def test_two_nodes_per_node_command_and_sbatch_line_FAKE_sbatch(fake_sbatch):
    plan = dry(toy_args("steps=5", nproc=None), nodes=2, gpus_per_node=8, cpus_per_node=64, partition="gpu",
               time_limit="2:00:00", account="proj", sbatch=["--qos=high"])
    i = plan.argv.index("torch.distributed.run") + 1
    assert plan.argv[i : i + 12] == ["--nnodes", "${SLURM_JOB_NUM_NODES}", "--nproc_per_node", "8", "--rdzv-backend",
                                     "c10d", "--rdzv-endpoint", "${TUNE_MAGIC_RDZV_ENDPOINT}", "--rdzv-id",
                                     "${SLURM_JOB_ID}", str(TOY_RECIPE), "--config"]
    assert (plan.scheduler, plan.rendezvous, plan.nnodes, plan.nproc_per_node) == ("slurm", "scheduler", "2", "8")
    job_dir = Path(os.environ["TUNE_MAGIC_HOME"]) / "jobs" / plan.job_id
    assert plan.submit_argv == ["sbatch", "--parsable", f"{job_dir}/job.sbatch"]
    head = [line for line in plan.batch_script.splitlines() if line.startswith("#SBATCH ")]
    assert head == [f"#SBATCH {o}" for o in (
        f"--job-name=tune_magic-{plan.job_id}", "--nodes=2", "--ntasks-per-node=1", f"--output={job_dir}/output.log",
        f"--error={job_dir}/output.log", "--open-mode=append", f"--chdir={os.getcwd()}", "--export=ALL",
        "--gpus-per-node=8", "--cpus-per-task=64", "--partition=gpu", "--time=2:00:00", "--account=proj",
        "--no-requeue", "--qos=high")]
    lines = plan.batch_script.splitlines()
    assert lines[0] == "#!/bin/bash" and lines[1:len(head) + 1] == head  # before any command: sbatch reads them
    assert plan.command_line() == shlex.join(plan.submit_argv)
    assert f"srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=64 --kill-on-bad-exit=1" in plan.batch_script
    assert '"${TUNE_MAGIC_RDZV_ENDPOINT}"' in plan.batch_script and '"${SLURM_JOB_ID}"' in plan.batch_script
    assert f"output_dir=${{oc.env:TUNE_MAGIC_HOME}}/runs/toy/{plan.job_id}" in plan.batch_script


def test_one_node_runs_standalone_inside_the_allocation_FAKE_sbatch(fake_sbatch):
    plan = dry(toy_args(nproc=2), nodes=1, cpus_per_node=2)
    assert plan.rendezvous == "standalone" and "--standalone" in plan.argv and "--rdzv-endpoint" not in plan.argv
    assert plan.argv[plan.argv.index("--nproc_per_node") + 1] == "2"


def test_the_users_endpoint_conf_and_id_FAKE_sbatch(fake_sbatch):
    plan = dry("--rdzv-endpoint node0:29400 --rdzv-conf join_timeout=300 --rdzv-id mine " + toy_args(nproc=1),
               nodes=2, cpus_per_node=1)
    assert plan.rendezvous == "user" and plan.argv[plan.argv.index("--rdzv-endpoint") + 1] == "node0:29400"
    assert plan.argv[plan.argv.index("--rdzv-id") + 1] == "${SLURM_JOB_ID}" and "mine" not in plan.argv
    assert "--rdzv-conf" not in plan.argv and plan.rdzv_conf == "join_timeout=300"
    assert "export TUNE_MAGIC_RDZV_CONF=join_timeout=300" in plan.batch_script and "--user-endpoint" in plan.batch_script
    assert any("every node must reach" in w for w in plan.warnings)
    assert any("replaced by the SLURM job id" in w for w in plan.warnings)


def test_nnodes_means_nodes_FAKE_sbatch(fake_sbatch, monkeypatch):
    assert dry("--nnodes 2 " + toy_args(nproc=1), cpus_per_node=1).nnodes == "2"
    monkeypatch.setenv("PET_NNODES", "3")
    assert dry(toy_args(nproc=1), cpus_per_node=1).nnodes == "3"


def test_no_cpus_per_node_warns_FAKE_sbatch(fake_sbatch):
    plan = dry(toy_args(nproc=1), nodes=2)
    assert any("--cpus-per-node" in w for w in plan.warnings)
    assert not any("--cpus-per-node" in w for w in dry(toy_args(nproc=1), nodes=2, cpus_per_node=2).warnings)


@pytest.mark.parametrize("args,kw,words", [
    ("--master-port 29500 {toy}", {}, "set per node by the SLURM scheduler"),
    ("--master-addr n0 {toy}", {}, "set per node"),
    ("--node-rank 0 {toy}", {}, "set per node"),
    ("--local-addr 10.0.0.1 {toy}", {}, "set per node"),
    ("--standalone {toy}", {}, "set per node"),
    ("--nnodes 2:4 --rdzv-endpoint a:1 {toy}", {}, "elastic range is not supported"),
    ("--nnodes 3 {toy}", {"nodes": 2}, "differ"),
    ("{toy}", {"gpus": "0,1"}, "give --gpus-per-node"),
    ("{toy}", {"time_limit": "2h"}, "--time"),
    ("{toy}", {"time_limit": "1:2:3:4"}, "--time"),
    ("{toy}", {"sbatch": ["-N2"]}, "--nodes"),
    ("{toy}", {"sbatch": ["--output=x"]}, "the scheduler owns sbatch's --output"),
    ("{toy}", {"sbatch": ["--job-name=x"]}, "names the job tune_magic-<id>"),
    ("{toy}", {"nodes": 0}, "positive integer"),
    ("{toy}", {"nodes": -1}, "positive integer"),
    ("{toy}", {"nodes": "abc"}, "positive integer"),
    ("lora_finetune_distributed --config tiny/builtin_lora", {}, "needs GPUs"),
])
def test_refusals_name_the_fix_FAKE_sbatch(fake_sbatch, args, kw, words):
    with pytest.raises(PlanError, match=words):
        dry(args.format(toy=toy_args(nproc=1)), **{"cpus_per_node": 1, **kw})


def test_pet_variables_set_per_node_are_refused_FAKE_sbatch(fake_sbatch, monkeypatch):
    monkeypatch.setenv("PET_MASTER_PORT", "29500")
    with pytest.raises(PlanError, match="unset PET_MASTER_PORT"):
        dry(toy_args(nproc=1), nodes=2)


def test_without_sbatch_the_message_says_how_to_get_it_and_nothing_is_left(monkeypatch, tmp_path):
    from tune_magic.registry import store as jobstore

    monkeypatch.setenv("PATH", str(tmp_path))
    before = {r.id for r in jobstore.list_records()}
    with pytest.raises(PlanError, match="install them .* or use --scheduler local"):
        tune_magic.launch(toy_args(nproc=1), scheduler="slurm", nodes=2, cpus_per_node=1)
    assert {r.id for r in jobstore.list_records()} == before
    assert not [p for p in jobstore.jobs_root().iterdir() if p.name.startswith(".staging")]
    plan = tune_magic.launch(toy_args(nproc=1), scheduler="slurm", nodes=2, cpus_per_node=1, dry_run=True)
    assert plan.batch_script and any("sbatch is not on PATH here" in w for w in plan.warnings)


@pytest.mark.parametrize("kw", [{"nodes": 1}, {"gpus_per_node": 2}, {"cpus_per_node": 4}, {"partition": "gpu"},
                                {"time_limit": "10"}, {"account": "a"}, {"sbatch": ["--qos=x"]}])
def test_local_scheduler_refuses_slurm_options(kw):
    flag = {"gpus_per_node": "--gpus-per-node", "cpus_per_node": "--cpus-per-node", "time_limit": "--time"}.get(
        next(iter(kw)), "--" + next(iter(kw)))
    with pytest.raises(PlanError, match=f"^{flag}: an option of --scheduler slurm, not of local: add --scheduler slurm; "
                                        "for several nodes without a cluster scheduler run torchrun's --nnodes N "
                                        "--rdzv-endpoint HOST:PORT on every node$"):
        tune_magic.launch(toy_args(), dry_run=True, **kw)


@pytest.mark.parametrize("name,words", [("nccl", "communication or rendezvous backend"), ("gloo", "backend"),
                                        ("kubernetes", "is not a scheduler; use local or slurm")])
def test_scheduler_names(name, words, monkeypatch):
    with pytest.raises(PlanError, match=words):
        tune_magic.launch(toy_args(), scheduler=name, dry_run=True)
    monkeypatch.setenv("TUNE_MAGIC_SCHEDULER", name)
    with pytest.raises(PlanError, match="TUNE_MAGIC_SCHEDULER"):
        tune_magic.launch(toy_args(), dry_run=True)


def test_own_options_after_a_torchrun_option_get_put_it_first():
    from tune_magic.job.launch import launch_options
    from tune_magic.plan import options as launchopts

    run = launch_options(launchopts.RUN)

    for flag in ("--nodes 2", "--gpus-per-node 8", "--partition gpu", "--time 10", "--account a",
                 "--sbatch=--qos=x", "--scheduler slurm", "--cpus-per-node 4"):
        with pytest.raises(PlanError, match="put it first"):
            launchopts.split_own(shlex.split(f"--nproc_per_node 2 {flag} x --config y"), run)
    with pytest.raises(PlanError, match="= form"):
        launchopts.split_own(["--sbatch", "--qos=x", "r"], run)
    own, rest = launchopts.split_own(shlex.split("--scheduler slurm --nodes 2 --sbatch=--qos=a --sbatch=-x r --config c"),
                                     run)
    assert own == {"scheduler": "slurm", "nodes": "2", "sbatch": ["--qos=a", "-x"]} and rest == ["r", "--config", "c"]


GOLDEN = DATA / "slurm" / "batch_script.golden"


def test_batch_script_golden_text():
    from dataclasses import replace

    plan = build_plan(f"--nproc_per_node 2 {TOY_RECIPE} --config {TOY_CONFIG} steps=3 'name=a b'",
                      env={"HOME": "/home/u", "TUNE_MAGIC_HOME": "/shared/tm", "PATH": "/usr/bin"}, cwd="/",
                      job_id="20261201-000000-abcdef", scheduler="slurm", nodes=2)

    def fixed(text: str) -> str:  # the same text in any checkout (line breaks depend on lengths)
        return text.replace(sys.executable, "/venv/bin/python").replace(str(TOY_RECIPE.parent), "/recipes")

    plan = replace(plan, argv=[fixed(a) for a in plan.argv], env={k: fixed(v) for k, v in plan.env.items()})
    lines = directives(job_id="20261201-000000-abcdef", job_dir="/shared/tm/jobs/20261201-000000-abcdef",
                       cwd="/work dir", nodes=2, gpus_per_node=None, cpus_per_node=4, partition="gpu", time_limit="10",
                       account=None, user_options=[["--qos=high"], ["-C", "a100 or h100"]], requeue=False)
    text = batch_script(plan, job_id="20261201-000000-abcdef", job_dir="/shared/tm/jobs/20261201-000000-abcdef",
                        cwd="/work dir", python="/venv/bin/python", nodes=2, cpus_per_node=4, rdzv_conf="timeout=900",
                        user_endpoint=False, sbatch_lines=lines)
    if os.environ.get("TUNE_MAGIC_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_every_shell_word_is_literal():
    assert shell_word("${SLURM_JOB_ID}") == "'${SLURM_JOB_ID}'"
    assert shell_word("a:${TUNE_MAGIC_RDZV_ENDPOINT}") == "'a:${TUNE_MAGIC_RDZV_ENDPOINT}'"
    assert shell_word("${HOME}") == "'${HOME}'" and shell_word("$(rm -rf /)") == "'$(rm -rf /)'"
    lines = directives(job_id="j", job_dir="/d", cwd="/", nodes=1, gpus_per_node=None, cpus_per_node=None,
                       partition=None, time_limit=None, account=None, user_options=[["--requeue"]], requeue=True)
    assert lines[-1] == "#SBATCH --requeue" and "#SBATCH --no-requeue" not in lines
    assert sbatch_argv("/d/s") == ["sbatch", "--parsable", "/d/s"]


@pytest.mark.parametrize("value, written", [
    ("gpu", "gpu"), ("--qos=high", "--qos=high"), ("/work dir", '"/work dir"'), ("a#b", '"a#b"'),
    ('say "hi"', '"say \\"hi\\""'), ("it's", '"it\'s"'), ("back\\slash", '"back\\\\slash"'), ("", '""'),
])
def test_directive_words_are_quoted_as_sbatchs_directive_parser_reads_them(value, written):
    assert directive_word(value) == written
    assert _sbatch_reads(written) == value


def _sbatch_reads(text: str) -> str:
    """One argument as sbatch's _get_argument (src/sbatch/opt.c, 22.05) reads it: quotes " and '
    group, a backslash escapes the next character anywhere, an unquoted # ends the line."""
    out, quote, escape = [], None, False
    for c in text:
        if escape:
            out.append(c)
            escape = False
        elif c == "\\":
            escape = True
        elif quote:
            if c == quote:
                quote = None
            else:
                out.append(c)
        elif c in "\"'":
            quote = c
        elif c == "#" or c.isspace():
            break
        else:
            out.append(c)
    return "".join(out)


def test_a_line_break_in_an_sbatch_value_is_refused_and_a_percent_in_the_log_path_is_doubled():
    with pytest.raises(PlanError, match="line break"):
        directive_word("--comment=a\nb")
    assert output_pattern("/home/50%/jobs/x/output.log") == "/home/50%%/jobs/x/output.log"
