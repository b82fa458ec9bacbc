"""A job's card lists its checkpoints (issue 29): each ``epoch_N/`` with the step it was saved at, its
size on disk, its validation loss (the best marked), pruned ones with the bytes freed, the one a
resume needs, and its path; asserted on the widget's HTML and the card's text, no browser.

Checkpoint folders are written as torchtune 0.6.1's FullModelHFCheckpointer writes them (a real
safetensors shard, its index, config.json); the log holds the progress bars that date each save.
"""

from __future__ import annotations

import json
import re
import struct
import time
from pathlib import Path

import pytest

from tune_magic.job.checkpoints import PRUNED
from tune_magic.ui.cards import JobCard

from test_card import Jobs


@pytest.fixture
def jobs(tmp_path):
    made = Jobs(tmp_path)
    yield made
    made.close()


def write_epoch(out: Path, epoch: int) -> int:
    """``out/epoch_<epoch>/`` with one small safetensors shard, its index and config.json; its bytes."""
    d = out / f"epoch_{epoch}"
    d.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [256], "data_offsets": [0, 1024]}}).encode()
    header += b" " * (-len(header) % 8)
    (d / "model-00001-of-00001.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(1024))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1024},
                                                               "weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    (d / "config.json").write_text("{}")
    return sum(p.stat().st_blocks * 512 for p in d.iterdir())


def bars(epochs: int, steps: int) -> str:
    """torchtune's progress bars for ``epochs`` epochs of ``steps`` steps (1-based epochs)."""
    out, g = [], 0
    for e in range(1, epochs + 1):
        for n in range(1, steps + 1):
            g += 1
            out.append(f"{e}|{g}|Loss: {5 - g / 10}: {100 * n // steps}%|#| {n}/{steps} [00:01<00:01,  1.00it/s]")
        out.append("")
    return "\r".join(out) + "\n"


def test_the_card_lists_each_checkpoint_with_its_step_size_val_loss_and_the_best(jobs):
    job = jobs.make("succeeded", log=bars(3, 4), metrics="".join(
        f"Step {s} | loss:{5 - s / 10} \nStep {s} | val_loss:{v} \n" for s, v in ((4, 3.0), (8, 2.5), (12, 2.7))),
        validation={"mode": "in_loop", "every_n_steps": None})
    out = Path(job.record.output_dir)
    sizes = [write_epoch(out, e) for e in range(3)]
    card = JobCard(job, watch=False)
    try:
        card.watcher.poll_once()
        shown = re.sub(r"<[^>]+>", "\n", card.checkpoints.value)
        rows = [line for line in shown.splitlines() if line.startswith("epoch_")]
        assert rows[0].startswith("epoch_0 · step 4 · ") and "val 3 · " in rows[0]
        assert rows[1].startswith("epoch_1 · step 8 · ") and "val 2.5 ◆ best · " in rows[1]
        assert rows[2].startswith("epoch_2 · step 12 · ") and rows[2].endswith(str(out / "epoch_2"))
        assert card.checkpoints.layout.display is None and "checkpoints (3)" in card.checkpoints.value
        assert "tm-best' data-name='epoch_1'" in card.checkpoints.value
        # the keeper removes epoch_0: listed as pruned with the bytes it freed, as soon as it is written
        import shutil

        shutil.rmtree(out / "epoch_0")
        (job.dir / PRUNED).write_text(json.dumps({"epoch": 0, "at": time.time(), "bytes_freed": sizes[0],
                                                  "path": str(out / "epoch_0")}) + "\n")
        card.watcher.poll_once()
        rows = [line for line in re.sub(r"<[^>]+>", "\n", card.checkpoints.value).splitlines()
                if line.startswith("epoch_")]
        assert rows[0].startswith(f"epoch_0 · step 4 · pruned (freed ") and str(out) not in rows[0]
        assert "checkpoint epoch_1 · step 8" in card.text()
    finally:
        card.close()


def test_a_job_without_checkpoints_shows_no_list(jobs):
    job = jobs.make("succeeded", log=bars(1, 2))
    card = JobCard(job, watch=False)
    try:
        card.watcher.poll_once()
        assert card.checkpoints.value == "" and card.checkpoints.layout.display == "none"
        assert "checkpoint epoch" not in card.text()
    finally:
        card.close()


@pytest.mark.parametrize("status, said", [("running", "being written"),
                                          ("failed", "incomplete: its save did not finish")])
def test_an_incomplete_checkpoint_is_being_written_only_while_its_job_runs(jobs, status, said):
    """A folder missing its shard: while the job runs it is being written; once the job ended (a
    save cut by the crash), the card says it is incomplete, as ``tune-magic checkpoints`` does."""
    job = jobs.make(status, log=bars(2, 4))
    out = Path(job.record.output_dir)
    write_epoch(out, 0)
    write_epoch(out, 1)
    (out / "epoch_1" / "model-00001-of-00001.safetensors").unlink()
    card = JobCard(job, watch=False)
    try:
        card.watcher.poll_once()
        rows = [line for line in re.sub(r"<[^>]+>", "\n", card.checkpoints.value).splitlines()
                if line.startswith("epoch_")]
        assert rows[1].startswith(f"epoch_1 · step 8 · {said} · "), rows
        assert re.fullmatch(r"[\d.]+ ([KMGT]B|bytes)", rows[0].split(" · ")[2]), rows  # complete: its size
    finally:
        card.close()
