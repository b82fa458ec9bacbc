"""Metrics read from real logs of the project's LoRA recipe (2 processes, 5 steps, captured into
tests/data/lora_2proc_5steps/). Expected values are copied by hand from the files, not computed
by the parser under test."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tune_magic.logs.metricfollow import JobMetricsFollower

from jobhelpers import DATA as TEST_DATA

DATA = TEST_DATA / "lora_2proc_5steps"
DISKLOGGER = next(DATA.glob("log_*.txt"))
OUTPUT_LOG = DATA / "output.log"

LOSS = [6.249058723449707, 6.212747097015381, 6.078856945037842, 5.796189308166504, 5.453219890594482]
LR = [0.005, 0.01, 0.0075, 0.0025000000000000014, 0.0]
TPS = [42.346031188964844, 127.37529754638672, 127.48484802246094, 174.3932647705078, 161.48251342773438]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tune_magic", "metrics", *args], capture_output=True, text=True,
                          timeout=60)


def test_cli_json_of_a_disklogger_file():
    r = cli("--file", str(DISKLOGGER), "--json")
    assert r.returncode == 0, r.stderr
    points = json.loads(r.stdout)
    by = {(p["step"], p["name"]): p["value"] for p in points}
    assert len(points) == 15
    for step in range(1, 6):
        assert by[(step, "loss")] == LOSS[step - 1]
        assert by[(step, "lr")] == LR[step - 1]
        assert by[(step, "tokens_per_second_per_gpu")] == TPS[step - 1]
    assert {p["source"] for p in points} == {"disklogger"}


def test_cli_csv_header_and_rows():
    lines = cli("--file", str(DISKLOGGER), "--csv").stdout.splitlines()
    assert lines[0] == "step,name,value,epoch,source"
    assert lines[1] == "1,loss,6.249058723449707,,disklogger"
    assert len(lines) == 16


def test_progress_bar_of_the_combined_log_gives_the_same_losses():
    # The captured log names a metric file that does not exist here; without it, the redrawn
    # (\r) progress bar alone must give each step's loss once, with epoch 1.
    with JobMetricsFollower(OUTPUT_LOG, max_lines=50) as f:
        f.finish()
        losses = [p for p in f.points() if p.name == "loss"]
    assert [(p.step, p.epoch, p.source) for p in losses] == [(s, 1, "progress") for s in range(1, 6)]
    assert [p.value for p in losses] == pytest.approx(LOSS)
    assert f.latest_progress.startswith("1|5|Loss: 5.453219890594482: 100%")


def test_metric_file_wins_over_progress_and_nothing_is_counted_twice(tmp_path):
    log = tmp_path / "output.log"  # the captured log, naming the captured metric file
    log.write_bytes(OUTPUT_LOG.read_bytes().replace(
        b"/nonexistent/runs/tiny_lora/20261129-205540-1c1279/logs/" + DISKLOGGER.name.encode(), str(DISKLOGGER).encode()))
    with JobMetricsFollower(log, max_lines=50) as f:
        f.finish()
        points = f.points()
    losses = [p for p in points if p.name == "loss"]
    assert [p.step for p in losses] == [1, 2, 3, 4, 5]
    assert [p.value for p in losses] == LOSS
    assert {p.source for p in points} == {"disklogger"}
    assert len(points) == 15


def test_cli_bad_input():
    assert cli().returncode == 2
    r = cli("--file", "/nonexistent/log.txt")
    assert r.returncode == 2 and "no such file" in r.stderr
    r = cli("20990101-000000-abcdef")
    assert r.returncode == 2 and "no job" in r.stderr
