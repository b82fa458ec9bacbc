"""The tune-magic CLI, run as a real subprocess (python -m tune_magic)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tune_magic", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_cmd_prints_one_copy_pasteable_line():
    r = run("cmd", "--gpus", "2,3", "--nproc_per_node", "2", "lora_finetune_distributed", "--config", "llama3_2/1B_lora")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("PYTHONUNBUFFERED=1 ")
    assert "CUDA_VISIBLE_DEVICES=2,3 " in lines[0]
    assert " -m torch.distributed.run --standalone --nproc_per_node 2 " in lines[0]


def test_cmd_json_has_the_documented_keys():
    r = run("cmd", "--json", "--rdzv-endpoint", "n0:29400", "--nnodes", "2", "lora_finetune_distributed",
            "--config", "llama3_2/1B_lora")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert {"argv", "env", "distributed", "rendezvous", "recipe", "config"} <= set(plan)
    assert plan["rendezvous"] == "user" and plan["distributed"] is True
    assert "--standalone" not in plan["argv"]
    assert plan["argv"][plan["argv"].index("--rdzv-endpoint") + 1] == "n0:29400"


@pytest.mark.parametrize("args, words", [
    (["cmd", "--nnodes", "2", "lora_finetune_distributed", "--config", "llama3_2/1B_lora"], ["endpoint"]),
    (["cmd", "lora_finetune_distributed"], ["missing --config"]),
    (["cmd", "--gpus", "0,x", "lora_finetune_distributed", "--config", "llama3_2/1B_lora"], ["GPU id"]),
    (["nosuch"], ["unknown command"]),
])
def test_bad_input_exits_2_with_one_paragraph(args, words):
    r = run(*args)
    assert r.returncode == 2
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    for word in words:
        assert word in r.stderr


def test_ls_lists_torchtune_and_shipped_recipes_and_configs():
    r = run("ls")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == ["RECIPE", "CONFIG"]
    assert "lora_finetune_distributed" in r.stdout and "llama3_2/1B_lora" in r.stdout
    data = json.loads(run("ls", "--json").stdout)
    by_name = {d["name"]: d for d in data}
    assert by_name["lora_finetune_distributed"]["source"] == "torchtune"
    assert "tiny/builtin_lora" in by_name["lora_finetune_distributed"]["configs"]
    assert by_name["lora_finetune"]["source"] == "tune_magic"
    assert by_name["lora_finetune"]["configs"] == ["tiny/lora"]
    assert by_name["full_finetune"]["configs"] == ["tiny/full"]


def test_demo_plans_prints_two_plans_on_distinct_gpus_with_standalone():
    r = run("demo", "--plans")
    assert r.returncode == 0, r.stderr
    commands = [l for l in r.stdout.splitlines() if "torch.distributed.run" in l]
    assert len(commands) == 2
    assert "CUDA_VISIBLE_DEVICES=0,1" in commands[0] and "CUDA_VISIBLE_DEVICES=2,3" in commands[1]
    assert all("--standalone --nproc_per_node 2" in c for c in commands)
    out_dirs = [c.rsplit("output_dir=", 1)[1] for c in commands]
    assert out_dirs[0] != out_dirs[1]


def test_demo_without_the_notebook_says_where_it_looked(tmp_path):
    missing = tmp_path / "nowhere" / "quickstart.ipynb"
    r = run("demo", "--notebook", str(missing))
    assert r.returncode == 2
    assert str(missing) in r.stderr and "not found" in r.stderr and "--plans" in r.stderr
    assert "Traceback" not in r.stderr
