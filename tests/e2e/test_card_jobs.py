"""The card of real torchrun jobs (the test-only toy recipe, 2 processes), launched by %%tune_run in a
real IPython shell: where the run is, "saving checkpoint…" while the recipe saves, a failure's line
first with its traceback behind the toggle, a stop that does not read as a crash, a log line of
400 characters that wraps. Asserted on the widgets' traits; the same cards in a browser:
tests/e2e/test_browser.py."""

from __future__ import annotations

import re
import time
from functools import partial
from pathlib import Path

import pytest

from tune_magic.ui.cards import JobCard

import waiting
from jobhelpers import toy_args

TIMEOUT = 180


@pytest.fixture
def started():
    jobs = []
    yield jobs
    for job in jobs:
        job.stop(grace_s=2)


#: this file's waits: TIMEOUT s deadlines, polled every 50 ms
wait_for = partial(waiting.wait_for, timeout=TIMEOUT, interval=0.05)


def shown(widget) -> str:
    """An HTML trait as a browser shows its text (tags dropped, the escaped text restored)."""
    text = re.sub(r"<[^>]+>", "", widget.value.replace("<br>", "\n"))
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&#x27;", "'").replace("&amp;", "&")


def test_progress_and_saving_checkpoint_during_the_save(ip, started):
    job = ip.run_cell_magic("tune_run", "--name ckpt " + toy_args("steps=3", "step_s=0.3", "epochs=2", "checkpoint_s=4",
                                                                  "warning=beware"), "# x\n")
    started.append(job)
    assert (job.record.epochs, job.record.max_steps_per_epoch) == (2, None)  # from the resolved config
    card = JobCard.for_job(job.id)
    log = Path(job.log_path)
    progress: list[str] = []  # what the progress line read, in order, while the job ran

    def saw(pattern: str) -> bool:
        text = shown(card.progress)
        if not progress or progress[-1] != text:
            progress.append(text)
        return re.search(pattern, text) is not None

    # the second epoch's save: from its line until the status changes it reads "saving checkpoint…"
    wait_for(lambda: log.read_text().count("Saving checkpoint. This may take some time") == 2 or None,
             what="the second save's line in the log")
    wait_for(lambda: saw(r"^saving checkpoint… · epoch 2/2 · step 6/6 · loss 1\.6667 · 3/3 this epoch"),
             what="saving checkpoint… on the card", timeout=10, interval=0.02)
    while "Saving checkpoint took" not in log.read_text().split("Saving checkpoint. This may")[-1]:
        assert saw(r"^saving checkpoint…"), progress  # all through the save
        assert job.status == "running"
        time.sleep(0.05)
    assert job.wait(TIMEOUT) == "succeeded"
    wait_for(lambda: card.snapshot.status == "succeeded", what="succeeded on the card")
    final = shown(card.progress)
    assert re.fullmatch(r"epoch 2/2 · step 6/6 · loss 1\.6667 · 3/3 this epoch · took \d+:\d\d · 100 tokens/s/GPU",
                        final), final
    tail = shown(card.log_tail).splitlines()
    assert [line for line in tail if "UserWarning: beware" in line][0].endswith("UserWarning: beware (×2)")
    assert sum("%|" in line for line in tail) == 1  # the bar's redraws: the latest only
    assert list(card.x_axis.tick_values) == [1, 2, 3, 4, 5, 6]


def test_failed_card_starts_with_the_error_and_has_the_traceback_behind_the_toggle(ip, started):
    job = ip.run_cell_magic("tune_run", "--name crash " + toy_args("crash_rank=1"), "# x\n")
    started.append(job)
    assert job.wait(TIMEOUT) == "failed"
    card = JobCard.for_job(job.id)
    wait_for(lambda: card.watcher.finished and card.snapshot.status == "failed", what="failed on the card")
    assert job.error == "rank 1: RuntimeError: toy recipe crashed on purpose"
    first = card.children[0]
    assert first is card.error and first.layout.display is None and shown(first) == job.error
    assert card.traceback.layout.display is None and card.traceback.selected_index is None
    tb = shown(card.traceback_html)
    assert tb == job.failure().traceback and tb.startswith("Traceback (most recent call last):")
    assert tb.rstrip().endswith("RuntimeError: toy recipe crashed on purpose")
    assert card.stop_button.layout.display == "none"
    assert card.text().splitlines()[1] == job.error
    # the tail ends with the failing rank's own lines, not torchrun's ChildFailedError report (in the log only)
    tail = shown(card.log_tail).splitlines()
    assert tail[-1] == "[rank1]: RuntimeError: toy recipe crashed on purpose", tail
    assert "Root Cause (first observed failure):" in Path(job.log_path).read_text()
    assert not any("ChildFailedError" in line or "Root Cause" in line or "error_file" in line for line in tail)


def test_failed_before_any_step_has_no_chart(ip, started):
    job = ip.run_cell_magic("tune_run", "--name early " + toy_args("crash_rank=0", "crash_step=1"), "# x\n")
    started.append(job)
    assert job.wait(TIMEOUT) == "failed"
    card = JobCard.for_job(job.id)
    wait_for(lambda: card.watcher.finished and card.snapshot.status == "failed", what="failed on the card")
    assert card.snapshot.steps == () and card.chart.layout.display == "none"
    assert shown(card.error) == job.error and "rank 0" in job.error


def test_stopped_card_tail_has_no_signal_traceback_and_a_long_line_wraps(ip, started):
    job = ip.run_cell_magic("tune_run", "--name stopme " + toy_args("steps=1000", "step_s=0.1", "long_line_chars=400"),
                            "# x\n")
    started.append(job)
    card = JobCard.for_job(job.id)
    wait_for(lambda: card.snapshot is not None and card.snapshot.step is not None, what="a step on the card")
    long_line = "long line: " + "x" * 400
    assert any(line.startswith(long_line[:300]) for line in shown(card.log_tail).splitlines())
    assert "white-space:pre-wrap" in card.log_tail.value
    card.stop_button.click()
    wait_for(lambda: card.snapshot.status == "stopped" and card.watcher.finished, what="stopped on the card")
    assert "SignalException" in Path(job.log_path).read_text()  # torchrun's traceback is in the log ...
    tail = shown(card.log_tail)
    assert "SignalException" not in tail and "Traceback" not in tail  # ... not on the card
    assert tail.splitlines()[-1] == "torchrun got SIGTERM (signal 15) and stopped its workers"
    assert shown(card.error).startswith("stopped by the user at step ")
    assert card.stop_button.layout.display == "none"


def test_redirected_job_card_shows_rank_files_labelled_and_its_progress(ip, started):
    # --redirects 3: the workers' output goes only to their files under <job dir>/ranks
    job = ip.run_cell_magic("tune_run", "--name redirected --redirects 3 " + toy_args("steps=3", "step_s=0.2"), "# x\n")
    started.append(job)
    assert job.wait(TIMEOUT) == "succeeded"
    card = JobCard.for_job(job.id)
    wait_for(lambda: card.watcher.finished and card.snapshot.status == "succeeded", what="succeeded on the card")
    tail = shown(card.log_tail).splitlines()
    assert "toy recipe done" not in Path(job.log_path).read_text()  # not in the combined log ...
    assert "[rank 0 stdout] toy recipe done" in tail  # ... but on the card, labelled by rank
    assert any(line.startswith("[rank 0 stderr] 1|3|Loss: 3.3333333333333335: 100%|") for line in tail), tail
    assert shown(card.progress).startswith("epoch 1/1 · step 3/3 · loss 3.3333 · 3/3 this epoch · took ")
