"""Generation through the product (issue 29), real tiny jobs on CPU: the right weights are loaded.

``tiny/fact.yaml`` trained with ``tune_magic.launch`` answers its made-up fact through
``job.generate`` exactly, and the untrained base model does not; ``%tune_generate`` in a real
IPython shell and ``tune-magic generate`` (the recipe's one-shot mode) give the same text as the
kept-alive serve process; a second prompt reuses that process (same pid, ``loads == 1``); a killed
one is started again; nothing is written outside the job's directory; bad input is refused with
the fix. "best" is the checkpoint of the lowest validation loss at a save step, and compare() puts
jobs, and a sweep's trials with their axis values, side by side.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import tune_magic
from tune_magic.assets import FACT_ANSWER as ANSWER
from tune_magic.assets import FACT_QUESTION as QUESTION
from tune_magic.job.generators import generators

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 600


def tree(folder: Path) -> dict[str, tuple[int, float]]:
    """Every file under ``folder``: size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime) for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def fact_job(tiny_assets):
    job = tune_magic.launch("full_finetune --config tiny/fact", cwd=REPO)
    assert job.wait(TIMEOUT) == "succeeded", job.tail(30)
    yield job
    job.close_generation()


@pytest.fixture(scope="module")
def val_job(tiny_assets):
    """fact.yaml for 3 epochs with the last 10% of its data held out: validated in the loop at each epoch's end."""
    job = tune_magic.launch("full_finetune --config tiny/fact epochs=3", cwd=REPO, val_split=0.1)
    assert job.wait(TIMEOUT) == "succeeded", job.tail(30)
    yield job
    job.close_generation()


def test_the_trained_job_answers_the_fact_from_one_kept_alive_process(fact_job):
    out_dir, repo_before = Path(fact_job.output_dir), sorted(os.listdir(REPO))
    before = tree(out_dir)
    assert fact_job.generate(QUESTION) == ANSWER
    (proc,) = generators(fact_job.id)
    pid, first = proc.pid, proc.last
    assert (first["loads"], first["request"], first["stop"]) == (1, 1, "eos")
    assert fact_job.generate(QUESTION, max_new_tokens=40) == ANSWER  # a second prompt, the same process
    assert (proc.pid, proc.starts, proc.last["request"], proc.last["loads"]) == (pid, 1, 2, 1)
    assert proc.argv[2:4] == ["--config", str(REPO / "recipes" / "configs" / "tiny" / "fact.yaml")]
    assert f"generate.checkpoint_dir={out_dir / 'epoch_3'}" in proc.argv  # "last"
    base = fact_job.generate(QUESTION, checkpoint="base")
    assert base != ANSWER and ANSWER not in base and len(generators(fact_job.id)) == 2
    # nothing written outside the job's registry directory (its generate/ folder: logs only)
    assert tree(out_dir) == before and sorted(os.listdir(REPO)) == repo_before
    assert sorted(p.name for p in (fact_job.dir / "generate").iterdir()) == ["serve-base.log", "serve-epoch_3.log"]
    pids = [p.pid for p in generators(fact_job.id)]
    assert fact_job.close_generation() == 2 and not any(psutil.pid_exists(p) for p in pids)
    assert "Serve: end of input, ending" in (fact_job.dir / "generate" / "serve-epoch_3.log").read_text()


def test_the_magic_and_the_command_give_the_same_text(fact_job, ip, capsys):
    capsys.readouterr()
    assert ip.run_line_magic("tune_generate", f"{fact_job.id} {QUESTION}") == ANSWER
    assert capsys.readouterr().out == ANSWER + "\n"  # shown as it arrived, once
    assert ip.run_cell_magic("tune_generate", f"{fact_job.id} --checkpoint epoch_3 --max-new-tokens 64",
                             QUESTION + "\n") == ANSWER
    (proc,) = generators(fact_job.id)
    assert proc.last["request"] == 2 and proc.starts == 1  # the line's and the cell's prompt: one process
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cli = subprocess.run([sys.executable, "-m", "tune_magic", "generate", fact_job.id, "--prompt", QUESTION],
                         capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert (cli.returncode, cli.stdout) == (0, ANSWER + "\n"), cli.stderr[-3000:]  # one-shot mode: the same text
    assert "Serve:" not in (fact_job.dir / "generate" / "once-epoch_3.log").read_text()
    base = subprocess.run([sys.executable, "-m", "tune_magic", "generate", fact_job.id, "--prompt", QUESTION,
                           "--checkpoint", "base"], capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert base.returncode == 0 and base.stdout == fact_job.generate(QUESTION, checkpoint="base") + "\n"


def test_a_killed_process_is_started_again_transparently(fact_job):
    assert fact_job.generate(QUESTION) == ANSWER
    proc = next(p for p in generators(fact_job.id) if p.key[1].endswith("epoch_3"))
    pid, starts = proc.pid, proc.starts
    psutil.Process(pid).kill()
    assert fact_job.generate(QUESTION) == ANSWER
    assert proc.pid != pid and proc.starts == starts + 1 and proc.last["request"] == 1


def test_bad_input_is_refused_naming_the_fix(fact_job, capsys):
    from tune_magic.checkpoints.catalog import CheckpointError
    from tune_magic.job.generate import GenerationError
    from tune_magic.ui import cli

    with pytest.raises(GenerationError, match=r"the prompt is 71 tokens, longer than the tokenizer's max_seq_len "
                                              r"\(64\) the job uses: shorten the prompt, or raise tokenizer.max_seq_len"):
        fact_job.generate("What " * 70)
    assert fact_job.generate(QUESTION) == ANSWER  # the process goes on after a refused prompt
    capsys.readouterr()
    assert cli.main(["generate", fact_job.id, "--prompt", "What " * 70]) == 2  # one-shot mode: the same paragraph
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "the prompt is 71 tokens" in err
    with pytest.raises(CheckpointError, match="no checkpoint has a validation loss"):
        fact_job.generate(QUESTION, checkpoint="best")
    with pytest.raises(CheckpointError, match=r"there is no epoch_9 \(checkpoints: epoch_0, epoch_1, epoch_2, epoch_3\)"):
        fact_job.generate(QUESTION, checkpoint="epoch_9")
    # retention removed epoch_0 and recorded it (<job dir>/pruned.jsonl)
    freed = sum(p.stat().st_size for p in (Path(fact_job.output_dir) / "epoch_0").iterdir())
    shutil.rmtree(Path(fact_job.output_dir) / "epoch_0")
    (fact_job.dir / "pruned.jsonl").write_text(json.dumps({"epoch": 0, "at": time.time(), "bytes_freed": freed}) + "\n")
    with pytest.raises(CheckpointError, match=r"epoch_0 was pruned by retention; use one that is kept \(epoch_1, "
                                              r"epoch_2, epoch_3\)"):
        fact_job.generate(QUESTION, checkpoint="epoch_0")
    assert len(generators(fact_job.id)) <= 2  # no process was made for any of these


def _val_lines(job) -> list[float]:
    """The job's val_loss values in its DiskLogger file, in order (one per epoch end: no run_val_every_n_steps)."""
    (path,) = Path(job.output_dir, "logs").glob("log_*.txt")
    return [float(m[1]) for m in re.finditer(r"^Step \d+ \| val_loss:(\S+) $", path.read_text(), re.M)]


def test_best_is_the_lowest_validation_loss_at_a_save_step_and_compare_lines_jobs_up(fact_job, val_job):
    from tune_magic.job.generate import choose_checkpoint

    losses = _val_lines(val_job)
    assert len(losses) == 3  # one per epoch's end, each right before its save
    best = choose_checkpoint(val_job, "best")
    assert (best.epoch, best.val_loss) == (losses.index(min(losses)), min(losses))
    text = val_job.generate(QUESTION, checkpoint="best")
    frame = tune_magic.compare([fact_job, val_job.id], QUESTION)  # "best" by default
    assert list(frame.columns) == ["job_id", "name", "checkpoint", "val_loss", "text", "error"]
    assert frame["job_id"].tolist() == [fact_job.id, val_job.id]
    fact_row, val_row = frame.to_dict("records")
    assert fact_row["text"] is None and "no checkpoint has a validation loss" in fact_row["error"]
    assert (val_row["checkpoint"], val_row["val_loss"], val_row["text"], val_row["error"]) == (
        best.label, min(losses), text, None)  # one-shot mode, greedy: the serve process's text
    last = tune_magic.compare([fact_job, val_job], QUESTION, checkpoint="last", max_new_tokens=12)
    assert last["checkpoint"].tolist() == ["epoch_3", "epoch_2"] and math.isnan(last["val_loss"][0])
    assert last["text"][0] == fact_job.generate(QUESTION, max_new_tokens=12)


def test_compare_a_sweeps_trials_with_their_axis_values(tiny_assets, ip, capsys):
    sweep = tune_magic.sweep("full_finetune --config tiny/fact epochs=2,4", cwd=REPO)
    sweep.wait(TIMEOUT)
    assert [t.status for t in sweep.trials] == ["succeeded", "succeeded"]
    frame = tune_magic.compare(sweep, QUESTION, checkpoint="last")
    assert frame.index.name == "trial" and frame.index.tolist() == [0, 1]
    assert list(frame.columns) == ["job_id", "name", "epochs", "checkpoint", "val_loss", "text", "error"]
    assert frame["epochs"].tolist() == [2, 4] and frame["checkpoint"].tolist() == ["epoch_1", "epoch_3"]
    assert frame["job_id"].tolist() == [t.job.id for t in sweep.trials]
    assert frame["text"][1] == ANSWER  # 4 epochs: fact.yaml itself
    assert frame["text"][0] == sweep.trials[0].job.generate(QUESTION)
    capsys.readouterr()
    shown = ip.run_line_magic("tune_compare", f"{sweep.id} --checkpoint last {QUESTION}")
    assert shown.equals(frame)
    with pytest.raises(Exception, match=f"{sweep.id} is a sweep: .*%tune_compare {sweep.id}"):
        ip.run_line_magic("tune_generate", f"{sweep.id} {QUESTION}")
    for job in sweep.jobs:
        job.close_generation()
