"""A job's card (tune_magic.ui.cards.JobCard), asserted on its widgets' traits, no browser.

Jobs here are records and logs written by the test in the format the real ones have (torchtune
0.6.1's bar and DiskLogger lines, torchrun's output); the card reads them through its real
watcher, polled by hand (``watch=False``). A ``running`` job needs a live supervisor: the test
stands in for it by holding the job's supervisor lock, as a supervisor does. Real jobs on real
torchrun: tests/e2e/test_magics.py and tests/e2e/test_browser.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import time
from pathlib import Path

import pytest

from tune_magic.registry import store as jobstore
from tune_magic.logs.failure import FailureReason
from tune_magic.job import Job
from tune_magic.registry.store import JobRecord
from tune_magic.checkpoints.layout import RECIPE_STATE
from tune_magic.ui.cardlines import OVERRIDES_LINE_CHARS, overrides_text
from tune_magic.ui.cards import JobCard
from tune_magic.ui.charts import int_ticks, step_domain
from tune_magic.ui.watch import JobSnapshot

SAVE_START = "INFO:torchtune.utils._logging:Saving checkpoint. This may take some time. Retrieving full model state dict..."
SAVE_END = "INFO:torchtune.utils._logging:Saving checkpoint took 31.20 secs"


def bar(epoch: int, step: int, n: int, total: int, rate: str = "2.00it/s") -> str:
    """One redraw of torchtune 0.6.1's tqdm bar (tqdm's default format), with its leading ``\\r``."""
    filled = n * 10 // total
    return (f"\r{epoch}|{step}|Loss: {10 / step}: {n * 100 // total:3d}%|{'█' * filled}{' ' * (10 - filled)}| "
            f"{n}/{total} [00:10<00:05, {rate}]")


def metric(step: int, tps: float = 1234.4) -> str:
    return f"Step {step} | loss:{10 / step} lr:0.001 tokens_per_second_per_gpu:{tps} \n"


class Jobs:
    """Makes job directories under ``root`` and holds the supervisor lock of the running ones."""

    def __init__(self, root: Path):
        self.root = root
        self.held: list[int] = []
        self.n = 0

    def make(self, status: str = "running", *, log: str = "", metrics: str | None = None, **fields) -> Job:
        """A job of ``status`` whose combined log is ``log`` (``{out}`` stands for its output_dir) and
        whose metric file ``{out}/logs/log_1.txt`` holds ``metrics`` (none if ``None``)."""
        self.n += 1
        job_id = f"20990101-000000-card{self.n:02d}"
        d = self.root / "jobs" / job_id
        d.mkdir(parents=True)
        out = self.root / "out" / job_id
        (out / "logs").mkdir(parents=True)
        if metrics is not None:
            (out / "logs" / "log_1.txt").write_text(metrics)
        (d / jobstore.OUTPUT_LOG).write_text(log.replace("{out}", str(out)))
        if status == "running":  # the test is this job's supervisor: it holds the lock
            fd = os.open(d / jobstore.SUPERVISOR_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.held.append(fd)
        fields.setdefault("argv", ["python", "r.py"])
        rec = JobRecord(id=job_id, name="card test", env={}, cwd=str(self.root),
                        log_path=str(d / jobstore.OUTPUT_LOG), started_at=time.time() - 65, status=status,
                        output_dir=str(out), metric_log_dir=str(out / "logs"), **fields)
        if status in ("succeeded", "failed", "stopped"):
            rec.ended_at = rec.started_at + 62
        jobstore.write_record(d, rec)
        return Job(d)

    def close(self) -> None:
        for fd in self.held:
            os.close(fd)


@pytest.fixture
def make(tmp_path):
    jobs = Jobs(tmp_path)
    yield jobs.make
    jobs.close()


def card_of(job: Job, **kw) -> JobCard:
    card = JobCard(job, watch=False, **kw)
    card.watcher.poll_once()
    return card


def append(job: Job, text: str) -> None:
    with open(job.log_path, "a") as f:
        f.write(text)


def update(job: Job, **changes) -> None:
    jobstore.update(job.dir, **changes)


def text_of(html_value: str) -> str:
    """What a browser shows of an HTML trait (tags dropped, entities of the escaped text undone)."""
    text = re.sub(r"<br>", "\n", html_value)
    text = re.sub(r"<[^>]+>", "", text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&#x27;", "'").replace("&amp;", "&")


# -- the step axis --------------------------------------------------------------------------------

def test_int_ticks_are_distinct_integers_within_the_limit():
    for lo in (0, 1, 2, 7, 99, 1000):
        for width in (0, 1, 2, 3, 7, 8, 9, 19, 40, 99, 1000, 123_456):
            hi = lo + width
            ticks = int_ticks(lo, hi)
            assert all(isinstance(t, int) for t in ticks), (lo, hi, ticks)
            assert ticks == sorted(set(ticks)), (lo, hi, ticks)  # each label once, in order
            assert 1 <= len(ticks) <= 8 and lo <= ticks[0] and ticks[-1] <= hi, (lo, hi, ticks)
            if width >= 1:
                assert len(ticks) >= 2, (lo, hi, ticks)


def test_int_ticks_examples():
    assert int_ticks(1, 8) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert int_ticks(1, 40) == [5, 10, 15, 20, 25, 30, 35, 40]
    assert int_ticks(1, 1000) == [200, 400, 600, 800, 1000]
    assert step_domain([3]) == (2, 4) and step_domain([1]) == (0, 2) and step_domain([0]) == (0, 1)
    assert step_domain([2, 9, 5]) == (2, 9)


def test_no_chart_before_the_first_step_then_integer_ticks_each_once(make):
    job = make(log="INFO:torchtune.utils._logging:Writing logs to {out}/logs/log_1.txt\n")
    card = card_of(job)
    # before the first point: no empty 0..1 grid, the progress line says what it waits for
    assert card.chart.layout.display == "none"
    assert "waiting for the first step" in text_of(card.progress.value)
    metrics = Path(job.output_dir, "logs", "log_1.txt")
    metrics.write_text(metric(1))
    card.watcher.poll_once()
    assert card.chart.layout.display is None and list(card.loss_line.x) == [1]
    assert list(card.x_axis.tick_values) == [0, 1, 2] and (card._x_scale.min, card._x_scale.max) == (0.0, 2.0)
    metrics.write_text("".join(metric(s) for s in range(1, 9)))
    card.watcher.poll_once()
    assert list(card.x_axis.tick_values) == [1, 2, 3, 4, 5, 6, 7, 8]  # was "1 2 2 3 3 ... 8 8"
    assert (card._x_scale.min, card._x_scale.max) == (1.0, 8.0)
    assert card.x_axis.tick_format == "d"
    metrics.write_text("".join(metric(s) for s in range(1, 41)))
    card.watcher.poll_once()
    assert list(card.x_axis.tick_values) == [5, 10, 15, 20, 25, 30, 35, 40]


def test_failed_before_any_step_shows_its_error_first_no_chart_and_the_traceback_behind_a_toggle(make):
    tb = ('Traceback (most recent call last):\n  File "r.py", line 9, in <module>\n    main()\n'
          "RuntimeError: toy recipe crashed on purpose")
    job = make("failed", log="[rank1]: " + tb.replace("\n", "\n[rank1]: ") + "\n",
               error="rank 1: RuntimeError: toy recipe crashed on purpose", returncode=1)
    reason = FailureReason(line=job.record.error, kind="exception", rank=1, exc_type="RuntimeError",
                           message="toy recipe crashed on purpose", traceback=tb, exitcode=1)
    (job.dir / jobstore.FAILURE).write_text(json.dumps(reason.to_dict()))
    card = card_of(job)
    assert card.children[0] is card.error and card.error.layout.display is None
    assert text_of(card.error.value) == job.error  # the card's first line is the job's error
    assert card.chart.layout.display == "none"  # no empty chart
    assert card.traceback.layout.display is None and card.traceback.selected_index is None  # collapsed
    assert card.traceback.titles == ("traceback",)
    assert text_of(card.traceback_html.value) == tb
    assert card.stop_button.layout.display == "none"
    text = card.text()
    assert text.splitlines()[1] == job.error and f"tune-magic logs {job.id} --error" in text


def test_failed_without_a_failure_file_shows_its_error_and_no_toggle(make):
    job = make("failed", error="rank 0: killed by SIGKILL (signal 9)", returncode=-9)
    card = card_of(job)
    assert text_of(card.error.value) == "rank 0: killed by SIGKILL (signal 9)"
    assert card.traceback.layout.display == "none"


# -- where the run is -------------------------------------------------------------------------------

def test_progress_says_where_the_whole_run_is(make):
    # the case: a 50-epoch job at epoch 1 showed only "13/20 65%"
    job = make(log="INFO:torchtune.utils._logging:Writing logs to " + "{out}/logs/log_1.txt\n", epochs=50,
               max_steps_per_epoch=20, metrics="".join(metric(s) for s in range(1, 14)))
    append(job, "".join(bar(1, s, s, 20, "1.30it/s") for s in range(1, 14)))
    card = card_of(job)
    snap = card.snapshot
    parts = {cls: text + suffix for cls, text, suffix in snap.progress_parts()}
    assert parts["tm-epoch"] == "epoch 1/50"
    assert parts["tm-step"] == "step 13/1000"
    assert parts["tm-loss"] == f"loss {10 / 13:.5g}"
    assert parts["tm-epoch-steps"] == "13/20 this epoch"
    assert re.fullmatch(r"1:0\d elapsed", parts["tm-elapsed"])
    # 7 steps of this epoch and 49 epochs of 20 left, at 1.3 steps a second: 759 s
    assert re.fullmatch(r"ETA 12:3\d", parts["tm-eta"]) and snap.eta_s == pytest.approx(987 / 1.3, abs=2)
    assert parts["tm-throughput"] == "1,234 tokens/s/GPU"  # the metric file's tokens_per_second_per_gpu
    shown = text_of(card.progress.value)
    assert shown.startswith("epoch 1/50 · step 13/1000 · loss 0.76923 · 13/20 this epoch · 1:0")
    assert card.snapshot.progress_text() == shown
    assert shown in card.text()
    # the ETA counts down between redraws
    later = JobSnapshot(**{**snap.__dict__, "elapsed_s": snap.run_at_s + 60})
    assert later.eta_s == pytest.approx(snap.run.eta_s - 60)


def test_steps_per_epoch_from_the_config_before_the_first_bar(make):
    job = make(epochs=3, max_steps_per_epoch=10, metrics=metric(1))
    snap = card_of(job).snapshot
    assert snap.run.total_steps == 30 and snap.progress_text().startswith("step 1/30 · loss 10")


def test_saving_checkpoint_from_its_line_until_a_step_or_the_status_changes(make):
    job = make(epochs=2, metrics=metric(1) + metric(2))
    append(job, bar(1, 1, 1, 2) + bar(1, 2, 2, 2))
    card = card_of(job)
    assert "saving" not in card.progress.value
    append(job, SAVE_START + "\n")  # glued to the open bar, as torchtune's line is
    card.watcher.poll_once()
    assert text_of(card.progress.value).startswith("saving checkpoint… · epoch 1/2 · step 2/4")
    assert "ETA" not in card.progress.value
    # other lines during the save (the checkpointer's) change nothing
    append(job, "INFO:torchtune.utils._logging:Model checkpoint of size 0.00 GiB saved to /x/epoch_0/model.safetensors\n")
    card.watcher.poll_once()
    assert text_of(card.progress.value).startswith("saving checkpoint…")
    append(job, SAVE_END + "\n")
    card.watcher.poll_once()
    assert text_of(card.progress.value).startswith("checkpoint saved · ")
    append(job, bar(2, 3, 1, 2))  # the next epoch: training again
    card.watcher.poll_once()
    assert "checkpoint" not in card.progress.value and text_of(card.progress.value).startswith("epoch 2/2 · ")
    append(job, bar(2, 4, 2, 2) + SAVE_START + "\n")
    card.watcher.poll_once()
    assert text_of(card.progress.value).startswith("saving checkpoint…")
    # the deciding line scrolls out of the lines kept: still saving while no step came
    append(job, "".join(f"INFO:x:writing shard {i}\n" for i in range(200)))
    card.watcher.poll_once()
    assert text_of(card.progress.value).startswith("saving checkpoint…")
    update(job, status="succeeded", returncode=0, ended_at=time.time())
    card.watcher.poll_once()
    assert "checkpoint" not in card.progress.value and "took " in card.progress.value


def test_pending_shows_the_queue_reason_and_a_stop_button(make):
    job = make("pending", pending_reason="Resources")
    card = card_of(job)
    assert text_of(card.progress.value).startswith("waiting in the queue: Resources · ")
    assert card.stop_button.layout.display is None and not card.stop_button.disabled
    assert "waiting in the queue: Resources" in card.text()


@pytest.mark.parametrize("status,label,stop", [("running", "running", True), ("pending", "pending", True),
                                               ("succeeded", "succeeded", False), ("failed", "failed", False),
                                               ("stopped", "stopped", False), ("unknown", "outcome unknown", False)])
def test_status_label_and_stop_button_for_live_statuses_only(make, status, label, stop):
    job = make(status if status != "unknown" else "running")
    card = card_of(job)
    snap = card.snapshot
    if status == "unknown":  # "unknown" settles to failed on a real record without processes: shown as is
        snap = JobSnapshot(**{**snap.__dict__, "status": "unknown"})
        card.update(snap)
    assert re.search(r"<span class='tm-status'[^>]*>([^<]*)</span>", card.header.value)[1] == label
    assert (card.stop_button.layout.display is None) is stop
    assert card.text().splitlines()[0].endswith(f": {label}")
    if status == "unknown":
        assert "outcome unknown" in text_of(card.error.value) and card.error.layout.display is None


def test_notes_nodes_warnings_and_a_lost_log(make):
    lost = time.time() - 30
    warning = ("no --cpus-per-node: the agent and all its workers share SLURM's default CPUs of the allocation "
               "(often 1 per task); pass --cpus-per-node N")
    job = make(num_nodes=2, warnings=[warning], log_lost_at=lost)
    card = card_of(job)
    notes = text_of(card.notes.value)
    assert card.notes.layout.display is None
    assert f"node {socket.gethostname()}" in notes.splitlines()  # the local part of a two-node torchrun
    assert notes.count(warning) == 1 and card.header.value.count(warning) == 0
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lost))
    assert f"recreated at {when}: the log before that time is gone" in notes
    assert "font-size:11px" in card.notes.value  # small
    text = card.text()
    assert text.count(warning) == 1 and "the log before that time is gone" in text
    card.watcher.poll_once()
    assert text_of(card.notes.value).count(warning) == 1  # shown once, however often it refreshes
    plain = card_of(make())
    assert plain.notes.layout.display == "none"  # one local node, no warning: no notes line


def test_a_failed_card_shows_the_overrides_it_ran_with_on_one_collapsed_line(make):
    words = ["optimizer.lr=abc", "metric_logger.name=my run", "~clip_grad_norm"]
    job = make("failed", error="rank 1: TypeError: '<=' not supported between instances of 'float' and 'str'",
               returncode=1)
    update(job, overrides=[*words, f"output_dir=/runs/tiny_lora/{job.id}"])  # the per-job one tune_magic adds
    card = card_of(job)
    assert job.overrides == [*words, f"output_dir=/runs/tiny_lora/{job.id}"]  # every word the recipe got
    assert card.children.index(card.overrides) == card.children.index(card.header) + 1
    assert card.overrides.layout.display is None
    value = card.overrides.value
    assert value.startswith("<details class='tm-overrides'") and "<details open" not in value  # collapsed
    summary = text_of(re.search(r"<summary[^>]*>(.*?)</summary>", value)[1])
    assert summary == "overrides: optimizer.lr=abc 'metric_logger.name=my run' '~clip_grad_norm'"
    assert [text_of(w) for w in re.findall(r"<div><code>(.*?)</code></div>", value)] == words  # one a line, opened
    assert summary in card.text().splitlines()
    assert card_of(make()).overrides.layout.display == "none"  # none given: no line


def test_the_card_shows_torchtunes_component_shorthand_as_given_in_either_order(make, tmp_path):
    """``optimizer=torch.optim.SGD`` (torchtune 0.6.1 sets optimizer._component_) passes the launch's
    checks before or after ``optimizer.lr=...``, and the card's line shows the words the recipe got."""
    from tune_magic.job.launch import build_plan

    root = Path(__file__).resolve().parents[2]
    env = {"HOME": str(tmp_path / "h"), "PATH": os.environ.get("PATH", ""), "TUNE_MAGIC_HOME": str(tmp_path / "tm")}
    for words in (["optimizer=torch.optim.SGD", "optimizer.lr=0.01"], ["optimizer.lr=0.01", "optimizer=torch.optim.SGD"]):
        job = make("failed", error="x", returncode=1)
        plan = build_plan([str(root / "recipes" / "lora_finetune.py"), "--config",
                           str(root / "recipes" / "configs" / "tiny" / "lora.yaml"), *words], env=env, job_id=job.id)
        assert plan.overrides[:2] == words and plan.overrides[2].endswith("/" + job.id)
        update(job, overrides=plan.overrides)
        value = card_of(job).overrides.value
        summary = text_of(re.search(r"<summary[^>]*>(.*?)</summary>", value)[1])
        assert summary == "overrides: " + " ".join(words)  # the per-job output_dir is left out
        assert [text_of(w) for w in re.findall(r"<div><code>(.*?)</code></div>", value)] == words


def test_overrides_of_a_record_written_before_the_field_come_from_its_argv(make):
    job = make("succeeded", argv=["/v/bin/python", "-m", "torch.distributed.run", "--standalone",
                                  "--nproc_per_node", "2", "r.py", "--config", "/c/lora.yaml", "seed=3",
                                  "output_dir=/o/x"])
    data = json.loads((job.dir / jobstore.RECORD).read_text())
    del data["overrides"]  # as a release before the field wrote it
    (job.dir / jobstore.RECORD).write_text(json.dumps(data))
    job = Job(job.dir)
    assert job.record.overrides is None and job.overrides == ["seed=3", "output_dir=/o/x"]
    assert text_of(card_of(job).overrides.value).startswith("overrides: seed=3 output_dir=/o/x")
    assert make("succeeded").overrides == []  # an argv without --config: none


def test_the_engines_id_of_the_job_is_in_the_header(make):
    job = make("succeeded", scheduler="slurm", backend={"job_id": "7"}, nodes=["n1", "n2"], num_nodes=2)
    card = card_of(job)
    assert re.search(r"<span class='tm-engine-id'>([^<]*)</span>", card.header.value)[1] == "SLURM ID 7"
    assert "SLURM ID 7" in card.text().splitlines()[1]
    assert "tm-engine-id" not in card_of(make("succeeded")).header.value  # a local job has none


# -- the log tail -------------------------------------------------------------------------------------

def test_a_failed_cards_first_line_and_its_tail_name_the_same_rank(make):
    from tune_magic.logs.failure import describe_failure

    from jobhelpers import DATA

    # two nodes' agents in one log; the rank that raised first (0) has the second report
    text = (DATA / "two_agents_both_raise.log").read_text()
    reason = describe_failure(text)
    job = make("failed", log=text, error=reason.line, returncode=1)
    (job.dir / jobstore.FAILURE).write_text(json.dumps(reason.to_dict()))
    card = card_of(job)
    assert text_of(card.error.value) == "rank 0 failed first; 2 ranks failed: ValueError: rank 0 raised on purpose"
    tail = text_of(card.log_tail.value).splitlines()
    assert tail[-1] == "[rank0]: ValueError: rank 0 raised on purpose", tail
    assert not any("[rank2]: ValueError" in line for line in tail[-6:])



def test_tail_collapses_redraws_and_warnings_and_a_long_line_wraps(make):
    # every rank prints it (tests/data/lora_2proc_5steps/output.log)
    warning = "/x/torch/distributed/tensor/_dispatch.py:342: UserWarning: DTensor random operators may not have complete support on cpu device mesh"
    source = "  if not random._rng_tracker and is_rng_supported_mesh(mesh):"
    log = (f"{warning}\n{source}\n{warning}\n{source}\n"
           + "long line: " + "x" * 400 + "\n" + "".join(bar(1, s, s, 5) for s in range(1, 4)))
    job = make(log=log)
    card = card_of(job)
    tail = text_of(card.log_tail.value).splitlines()
    assert tail[0] == warning + " (×2)" and tail[1] == source
    assert [line for line in tail if "%|" in line] == [bar(1, 3, 3, 5)[1:]]  # the latest redraw only
    assert tail[2].startswith("long line: xxx") and tail[2].endswith(" …")  # cut at 400 characters
    assert "white-space:pre-wrap" in card.log_tail.value and "overflow-wrap:anywhere" in card.log_tail.value
    # the log on disk and Job.tail() keep every line
    assert Path(job.log_path).read_text().count(warning) == 2 and job.tail(50).count(warning) == 2


def test_stopped_card_does_not_end_in_torchruns_signal_traceback(make):
    log = (bar(1, 7, 7, 20) + "\n"
           "W1201 05:38:51.259000 6395 api.py:753] Received 15 death signal, shutting down workers\n"
           "Traceback (most recent call last):\n  File \"run.py\", line 1032, in <module>\n    main()\n"
           "torch.distributed.elastic.multiprocessing.api.SignalException: Process 6395 got signal: 15\n")
    job = make("stopped", log=log, metrics="".join(metric(s) for s in range(1, 8)), returncode=-15)
    card = card_of(job)
    tail = text_of(card.log_tail.value)
    assert "SignalException" not in tail and "Traceback" not in tail
    assert tail.splitlines()[-1] == "torchrun got SIGTERM (signal 15) and stopped its workers"
    assert text_of(card.error.value) == "stopped by the user at step 7"
    assert "SignalException" in Path(job.log_path).read_text()  # the log keeps it


def test_per_rank_files_are_shown_labelled_by_rank(make, tmp_path):
    ranks = tmp_path / "ranks"
    for rank, out, err in ((0, bar(1, 2, 2, 5)[1:] + "\n", "INFO:x:rank 0 ready\n"),
                           (1, "", "[rank1]: RuntimeError: boom\n")):
        d = ranks / "run_abc" / "attempt_0" / str(rank)
        d.mkdir(parents=True)
        (d / "stdout.log").write_text(out)
        (d / "stderr.log").write_text(err)
    job = make(log="torchrun: started\n", rank_log_dir=str(ranks))
    card = card_of(job)
    tail = text_of(card.log_tail.value).splitlines()
    assert tail[0] == "torchrun: started"
    assert "[rank 0 stderr] INFO:x:rank 0 ready" in tail and "[rank 1 stderr] [rank1]: RuntimeError: boom" in tail
    assert "[rank 0 stdout] " + bar(1, 2, 2, 5)[1:] in tail
    assert text_of(card.progress.value).startswith("epoch 1 · step 2 · loss 5")  # the bar read from rank 0's file


def test_after_the_last_save_the_bars_closing_redraw_keeps_checkpoint_saved(make):
    # torchtune 0.6.1 (tests/data/lora_2proc_5steps/output.log): the save's lines, then tqdm redraws
    # the bar once more as it closes, at the same step; the job then exits
    job = make(epochs=1, metrics=metric(1) + metric(2))
    append(job, bar(1, 1, 1, 2) + bar(1, 2, 2, 2) + SAVE_START + "\n" + SAVE_END + "\n")
    card = card_of(job)
    assert text_of(card.progress.value).startswith("checkpoint saved · epoch 1/1 · step 2/2")
    append(job, bar(1, 2, 2, 2) + "\n")
    card.watcher.poll_once()
    assert text_of(card.progress.value).startswith("checkpoint saved · epoch 1/1 · step 2/2")
    assert "ETA" not in card.progress.value


def test_a_job_that_succeeded_though_a_stop_came_says_so_plainly(make):
    from tune_magic.registry.outcome import STOPPED_AFTER_END
    from tune_magic.ui.cli import end_line

    job = make("succeeded", returncode=1, error=STOPPED_AFTER_END, stop_requested=True)
    card = card_of(job)
    assert text_of(card.error.value) == f"succeeded: {STOPPED_AFTER_END}" and card.error.layout.display is None
    assert card.resume_control.layout.display == "none"  # nothing to resume
    assert card.text().splitlines()[1] == f"succeeded: {STOPPED_AFTER_END}" and "error:" not in card.text()
    assert end_line(job).endswith(f"succeeded · {STOPPED_AFTER_END}")


def test_a_resumed_cards_long_overrides_line_is_cut_between_whole_overrides(make):
    # a resumed LoRA job's words: the user's, then what the resume sets (tune_magic.checkpoints.preflight)
    words = ["max_steps_per_epoch=12", "optimizer.lr=1e-2", "dataset.data_files=/home/user/data/alpaca_subset.json",
             "resume_from_checkpoint=True", "checkpointer.adapter_checkpoint=epoch_0/adapter_model.pt",
             f"checkpointer.recipe_checkpoint={RECIPE_STATE}"]
    job = make("running")
    update(job, overrides=words)
    card = card_of(job)
    summary = text_of(re.search(r"<summary[^>]*>(.*?)</summary>", card.overrides.value)[1])
    assert summary == ("overrides: max_steps_per_epoch=12 optimizer.lr=1e-2 dataset.data_files=/home/user/data/"
                       "alpaca_subset.json resume_from_checkpoint=True … (+2 more)")
    assert len(summary) <= OVERRIDES_LINE_CHARS
    shown = summary.removeprefix("overrides: ").removesuffix(" … (+2 more)").split(" ")
    assert shown == words[:4]  # whole overrides only, none cut mid-word
    assert [text_of(w) for w in re.findall(r"<div><code>(.*?)</code></div>", card.overrides.value)] == words
    assert summary in card.text().splitlines()
    # the first override is shown whole even alone longer than the line, and a fitting line is whole
    assert overrides_text([words[2], "seed=1"], width=40) == f"overrides: {words[2]} … (+1 more)"
    assert overrides_text(words[:2]) == "overrides: max_steps_per_epoch=12 optimizer.lr=1e-2"


def test_a_cards_bundle_and_header_say_what_to_do_once_its_kernel_is_gone(make):
    # issue 26: a saved card froze at "running · ETA ..." with nothing saying its kernel was gone
    from tune_magic.ui.cardlines import gone_hint, gone_text

    job = make("running")
    card = card_of(job)
    bundle = card._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == card.model_id  # live: the widget
    fallback = text_of(bundle["text/html"])
    assert gone_text(job.id) in fallback and card.text() in fallback  # what a frontend without it shows
    assert f"%tune_logs {job.id}" in gone_text(job.id) and f"tune-magic logs {job.id} --follow" in gone_text(job.id)
    assert bundle["text/plain"] == card.text() + "\n" + gone_hint(job.id)
    # the header's line: hidden on a live card, shown by the CSS on a disconnected one
    line = re.search(r"<div class='tm-gone'[^>]*>(.*?)</div>", card.header.value)
    assert text_of(line[1]) == gone_text(job.id)
    assert ".tune-magic-card .tm-gone{display:none}" in card.header.value
    assert ".tune-magic-card.jupyter-widgets-disconnected .tm-gone{display:block}" in card.header.value
    assert re.search(r"<span class='tm-status'[^>]*>([^<]*)</span>", card.header.value)[1] == "running"
