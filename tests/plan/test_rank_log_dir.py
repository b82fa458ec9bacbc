"""The plan's --log-dir rule: with --redirects/--tee and no --log-dir, worker files go to <job dir>/ranks.

Expected values are written out by hand; torchrun's own parser re-parses each argv.
"""

from __future__ import annotations

import os

import pytest

from tune_magic.plan.model import JOB_DIR_PLACEHOLDER
from tune_magic.job.launch import build_plan

BUILTIN = "lora_finetune_distributed --config llama3_2/1B_lora"


@pytest.fixture
def env(tmp_path):
    """A clean job environment: no PET_* from the machine running the tests."""
    return {"HOME": str(tmp_path / "home"), "PATH": os.environ.get("PATH", "")}


def reparsed(argv: list[str]):
    from torch.distributed.run import get_args_parser

    i = argv.index("torch.distributed.run") + 1
    return get_args_parser().parse_args(argv[i:])


@pytest.mark.parametrize("flags", [["--tee", "3"], ["--redirects", "3"], ["-r", "0:1,1:2"], ["--tee=3"]])
def test_redirects_or_tee_without_log_dir_adds_the_job_dir(flags, env, tmp_path):
    plan = build_plan([*flags, "--nproc-per-node", "2", *BUILTIN.split()], env=env, job_dir=str(tmp_path / "j1"))
    assert plan.rank_log_dir == f"{tmp_path}/j1/ranks"
    assert plan.argv.count("--log-dir") == 1
    assert plan.argv[plan.argv.index("--log-dir") + 1] == f"{tmp_path}/j1/ranks"
    assert reparsed(plan.argv).log_dir == f"{tmp_path}/j1/ranks"


def test_without_a_job_dir_the_plan_shows_a_placeholder(env):
    plan = build_plan(["--tee", "3", *BUILTIN.split()], env=env)
    assert JOB_DIR_PLACEHOLDER == "<job-dir>"
    assert plan.rank_log_dir == "<job-dir>/ranks"
    assert "--log-dir '<job-dir>/ranks'" in plan.command_line()


def test_environment_variables_count_like_flags(env, tmp_path):
    plan = build_plan(BUILTIN, env={**env, "PET_TEE": "3"}, job_dir=str(tmp_path))
    assert plan.torchrun_args[plan.torchrun_args.index("--log-dir") + 1] == f"{tmp_path}/ranks"
    plan = build_plan(["--tee", "3", *BUILTIN.split()], env={**env, "PET_LOG_DIR": "/var/log/tt"}, job_dir="/j")
    assert "--log-dir" not in plan.argv and plan.rank_log_dir == "/var/log/tt"


def test_the_users_log_dir_is_kept_and_resolved_against_cwd(env, tmp_path):
    plan = build_plan(["--tee", "3", "--log-dir", "logs/../tt", *BUILTIN.split()], env=env, cwd=tmp_path,
                      job_dir="/j")
    assert plan.argv.count("--log-dir") == 1 and plan.argv[plan.argv.index("--log-dir") + 1] == "logs/../tt"
    assert plan.rank_log_dir == f"{tmp_path}/tt"


@pytest.mark.parametrize("flags", [[], ["--tee", "0"], ["--redirects", "0"], ["--local-ranks-filter", "0"]])
def test_no_worker_files_no_log_dir(flags, env):
    plan = build_plan([*flags, "--nproc-per-node", "2", *BUILTIN.split()], env=env, job_dir="/j")
    assert plan.rank_log_dir is None and "--log-dir" not in plan.argv
