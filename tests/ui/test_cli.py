"""The tune-magic CLI, run as a real subprocess (python -m tune_magic)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

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


# --- paragraphs, not tracebacks -------------------------------------------------------------------


def _one_paragraph(r: subprocess.CompletedProcess, command: str) -> str:
    assert r.returncode == 2, r
    assert r.stdout == "" and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith(f"tune-magic {command}: error: ")
    return lines[-1]


@pytest.mark.parametrize("seed", ["-1", "1.5", "x", "１"])
def test_assets_seed_that_is_not_a_whole_number_is_a_usage_error(seed, tmp_path):
    r = run("assets", "--seed", seed, str(tmp_path / "a"))
    assert _one_paragraph(r, "assets") == (
        f"tune-magic assets: error: argument --seed: {seed!r} is not a whole number >= 0, e.g. --seed 0")
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("directory", ["", " "])
def test_assets_empty_path_is_not_the_working_directory(directory, tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    r = run("assets", directory, cwd=tmp_path)
    assert _one_paragraph(r, "assets") == (
        f"tune-magic assets: error: the directory {directory!r} is an empty path, not a directory; give one "
        "(tune-magic assets DIR) or leave it out for $TUNE_MAGIC_HOME/assets")
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_make_assets_refuses_an_empty_path_too():
    from tune_magic.assets import make_assets

    with pytest.raises(ValueError, match=r"^directory '' is an empty path, not a directory"):
        make_assets("")


def test_metrics_file_that_is_not_a_file_says_what_it_is(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = [
        (str(tmp_path), f"--file {tmp_path} is a directory; give a log file in it (DiskLogger log_*.txt or log_*.jsonl)"),
        (str(fifo), f"--file {fifo} is not a regular file (a FIFO, socket or device); give a log file"),
        (str(tmp_path / "none.txt"), f"--file {tmp_path / 'none.txt'}: no such file"),
        ("", "--file '' is an empty path, not a file; give a torchtune log, e.g. --file log_1.txt"),
    ]
    for path, message in cases:
        assert _one_paragraph(run("metrics", "--file", path), "metrics") == f"tune-magic metrics: error: {message}"


def test_help_help_shows_the_help_of_help():
    r = run("help", "help")
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.splitlines()[0] == "usage: tune-magic help [COMMAND]"
    assert ("commands: cmd, ls, assets, run, resume, jobs, sweeps, logs, stop, rm, metrics, checkpoints, export, "
            "generate, demo, help") in r.stdout


# --- a job's log is read only when it is a regular file --------------------------------------------


@pytest.fixture
def registry_log(tmp_path):
    """A job log path in a job directory, and a secret file outside it."""
    job_dir = tmp_path / "jobs" / "j1"
    job_dir.mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_text("SECRET LINE\n")
    return job_dir / "output.log", secret


def test_read_from_reads_a_regular_log_from_an_offset(registry_log):
    from tune_magic.ui.cli import read_from as _read_from

    log, _ = registry_log
    assert list(_read_from(str(log), 0)) == []  # not written yet
    log.write_bytes(b"0123456789")
    assert b"".join(_read_from(str(log), 4)) == b"456789"


@pytest.mark.parametrize("kind,words", [
    ("symlink", "is a symbolic link, not a regular file"),
    ("fifo", "is a FIFO, not a regular file"),
    ("directory", "is a directory, not a regular file"),
    ("device", "is a character device, not a regular file"),
])
def test_read_from_refuses_anything_but_a_regular_file(kind, words, registry_log):
    from tune_magic.ui.cli import CliError, check_job_log, read_from as _read_from

    log, secret = registry_log
    if kind == "symlink":
        log.symlink_to(secret)
    elif kind == "fifo":
        os.mkfifo(log)  # opening it for reading would block until a writer comes: never opened
    elif kind == "directory":
        log.mkdir()
    else:
        os.mknod(log, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    want = (f"the job's log {log} {words}: tune_magic writes a regular file there, so something else replaced it; "
            "refusing to read it (links are never followed inside the job registry)")
    with pytest.raises(CliError) as err:
        list(_read_from(str(log), 0))
    assert str(err.value) == want
    with pytest.raises(CliError):
        check_job_log(str(log))


def test_jobs_table_lines_up_wide_names_in_terminal_columns(tmp_path):
    """Names with CJK characters and emoji take two terminal columns per character (as wcwidth
    measures them): the later columns of every row start at the same column as an ASCII row's."""
    from wcwidth import wcswidth

    from tune_magic.registry import store as jobstore
    from tune_magic.registry.store import JobRecord

    names = {"20261201-100000-aaaaaa": "plain-run", "20261201-100001-bbbbbb": "实验-α",
             "20261201-100002-cccccc": "🚀 launch 😀"}
    for job_id, name in names.items():
        d = tmp_path / "jobs" / job_id
        d.mkdir(parents=True)
        jobstore.write_record(d, JobRecord(
            id=job_id, name=name, argv=["python", "x.py"], env={}, cwd=str(tmp_path), started_at=1.0, ended_at=61.0,
            log_path=str(d / "output.log"), status="succeeded", returncode=0))
        (d / "output.log").write_text("")
    r = subprocess.run([sys.executable, "-m", "tune_magic", "jobs"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TUNE_MAGIC_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    rows = {name: next(line for line in lines if name in line) for name in names.values()}
    assert len(rows) == 3 and lines[0].startswith("ID")

    def column(line: str, text: str) -> int:
        return wcswidth(line[:line.index(text)])

    status = column(lines[0], "STATUS")
    assert {name: column(row, "succeeded") for name, row in rows.items()} == dict.fromkeys(names.values(), status)
    elapsed = column(lines[0], "ELAPSED")
    assert {name: column(row, "60s") for name, row in rows.items()} == dict.fromkeys(names.values(), elapsed)


def _records(home, *rows) -> None:
    """Finished jobs' records written by hand under ``home``: ``(id, name, status, started, fields)``."""
    from tune_magic.registry import store as jobstore
    from tune_magic.registry.store import JobRecord

    for job_id, name, status, started, fields in rows:
        d = home / "jobs" / job_id
        d.mkdir(parents=True)
        fields = {"error": "rank 0: boom" if status == "failed" else None, **fields}
        jobstore.write_record(d, JobRecord(
            id=job_id, name=name, argv=["python", "x.py", "--config", "c.yaml", "seed=1"], env={}, cwd=str(home),
            started_at=started, ended_at=started + 60, log_path=str(d / "output.log"), status=status,
            returncode=0 if status == "succeeded" else 1, **fields))
        (d / "output.log").write_text("")


def test_jobs_narrowed_by_status_name_and_count(tmp_path, monkeypatch, capsys):
    from tune_magic.ui import cli

    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path))
    t0 = time.time() - 3600
    _records(tmp_path, ("j1", "lr-1", "succeeded", t0, {}), ("j2", "lr-2", "failed", t0 + 1, {}),
             ("j3", "other", "stopped", t0 + 2, {}), ("j4", "lr-3", "failed", t0 + 3, {}))

    def ids(*args) -> list[str]:
        capsys.readouterr()
        assert cli.main(["jobs", *args]) == 0
        return [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]

    assert ids() == ["j1", "j2", "j3", "j4"]  # oldest first: the newest next to the prompt
    assert ids("--failed") == ["j2", "j4"]
    assert ids("--running") == []
    assert ids("--name", "lr-*") == ["j1", "j2", "j4"]
    assert ids("--name", "lr-*", "--last", "2") == ["j2", "j4"]
    assert ids("--last", "1") == ["j4"]
    capsys.readouterr()
    assert cli.main(["jobs", "--json", "--failed"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in listed] == ["j2", "j4"] and listed[0]["overrides"] == ["seed=1"]
    assert cli.main(["jobs", "--last", "0"]) == 2
    assert "--last: '0' is not a number of jobs >= 1" in capsys.readouterr().err


def test_jobs_columns_started_and_the_engine_id_with_nodes_only_when_a_job_has_one(tmp_path, monkeypatch, capsys):
    from tune_magic.ui import cli
    from tune_magic.ui.tablecols import started_text

    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path))
    t0 = time.time() - 3600
    _records(tmp_path, ("j1", "local-run", "succeeded", t0, {}))
    capsys.readouterr()
    cli.main(["jobs"])
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["ID", "NAME", "STATUS", "STEP", "LOSS", "ELAPSED", "STARTED", "ENDPOINT", "OUTPUT_DIR",
                              "REASON", "RESUME"]
    assert row[header.index("STARTED"):].startswith(started_text(t0) + " ")
    _records(tmp_path, ("j2", "on-slurm", "succeeded", t0 + 5,
                        {"scheduler": "slurm", "backend": {"job_id": "81"}, "nodes": ["n1", "n2"], "num_nodes": 2}))
    cli.main(["jobs"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[6:11] == ["STARTED", "SCHEDULER", "SLURM", "ID", "NODES"]
    at = lines[0].index("SLURM ID")
    assert lines[2][at:].split()[:2] == ["81", "n1,n2"] and lines[1][at:].split()[0] == "-"
    assert lines[1][lines[0].index("SCHEDULER"):].split()[0] == "local"
    cli.main(["jobs", "--name", "local-*"])  # the column goes with the job that needs it
    assert "SLURM ID" not in capsys.readouterr().out


def test_logs_of_an_ended_job_say_how_it_ended_after_its_lines(tmp_path, monkeypatch, capsys):
    from tune_magic.ui import cli

    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path))
    t0 = time.time() - 600
    _records(tmp_path, ("j1", "a", "stopped", t0, {}), ("j2", "b", "failed", t0, {}),
             ("j3", "c", "stopped", t0, {"error": "cancelled outside tune_magic"}))
    tail = "torchrun got SIGTERM\nsrun: error: n1: task 0: Exited with exit code 1\n"  # what a stop leaves
    (tmp_path / "jobs" / "j1" / "output.log").write_text(tail)
    capsys.readouterr()
    assert cli.main(["logs", "j1"]) == 0
    out = capsys.readouterr()
    assert out.out == tail  # the log itself, every line
    assert out.err == "tune-magic logs: job j1 stopped · stopped by the user\n"
    cli.main(["logs", "j2"])
    assert capsys.readouterr().err == "tune-magic logs: job j2 failed · rank 0: boom\n"
    cli.main(["logs", "j3"])
    assert capsys.readouterr().err == "tune-magic logs: job j3 stopped · cancelled outside tune_magic\n"
