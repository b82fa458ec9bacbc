"""Per-job summaries: the values listings show, kept by reading only what the logs gained."""

from __future__ import annotations

import builtins
import io
import json
import os
import time
from pathlib import Path

import pytest

import tune_magic.job as J
from tune_magic.registry import store as jobstore
from tune_magic.logs import summary as S
from tune_magic.registry.store import JobRecord


def make_job(root: Path, job_id: str, *, status="succeeded", steps=5, bar=True, ended=True) -> JobRecord:
    d = root / job_id
    d.mkdir(parents=True)
    metric_dir = root.parent / "runs" / job_id / "logs"
    metric_dir.mkdir(parents=True)
    metric_file = metric_dir / "log_1.txt"
    metric_file.write_text("".join(f"Step {i} | loss:{10 / i} lr:0.001 tokens_per_second_per_gpu:{100 + i} \n"
                                   for i in range(1, steps + 1)))
    log = d / jobstore.OUTPUT_LOG
    parts = [f"INFO:torchtune.utils._logging:Writing logs to {metric_file}\n"]
    if bar:
        parts += [f"\r1|{i}|Loss: {10 / i}: {i * 100 // steps}%|###| {i}/{steps} [00:0{i}<00:00, 1.0it/s]"
                  for i in range(1, steps + 1)]
    parts.append("\ndone\n")
    log.write_text("".join(parts))
    rec = JobRecord(id=job_id, name="n", argv=["python", "x.py"], env={}, cwd=str(root), log_path=str(log),
                    started_at=time.time() - 60, status=status, metric_log_dir=str(metric_dir),
                    ended_at=time.time() if ended else None, returncode=0 if status == "succeeded" else None)
    jobstore.write_record(d, rec)
    return rec


def test_tracker_reads_step_loss_epoch_metrics_and_progress(tmp_path):
    rec = make_job(tmp_path / "jobs", "a", steps=5)
    t = S.SummaryTracker(rec)
    assert t.advance(final=True)
    s = t.summary
    assert (s.step, s.loss, s.epoch) == (5, 2.0, 1)
    assert s.metrics == {"loss": 2.0, "lr": 0.001, "tokens_per_second_per_gpu": 105.0}
    assert s.progress.startswith("1|5|Loss: 2.0: 100%")
    assert s.log_offset == os.path.getsize(rec.log_path) and s.metrics_path.endswith("log_1.txt")
    assert not t.advance(final=True)  # nothing new: nothing read, nothing changed


def test_resume_from_the_file_reads_only_new_bytes(tmp_path):
    rec = make_job(tmp_path / "jobs", "b", steps=3)
    t = S.SummaryTracker(rec)
    t.advance()
    d = Path(rec.log_path).parent
    assert S.write_summary(d, t.summary)
    offset = t.summary.metrics_offset
    with open(t.summary.metrics_path, "a") as f:
        f.write("Step 4 | loss:0.5 lr:0.001 tokens_per_second_per_gpu:9 \nStep 5 | loss:0.25")  # 5 unfinished
    again = S.SummaryTracker(rec, S.read_summary(d))
    assert again.summary.metrics_offset == offset
    assert again.advance()
    assert (again.summary.step, again.summary.loss) == (4, 0.5)  # an unfinished record is not consumed
    assert again.advance(final=True)
    assert (again.summary.step, again.summary.loss) == (5, 0.25)


def test_metric_file_wins_over_the_progress_bar_and_a_bar_ahead_shows(tmp_path):
    rec = make_job(tmp_path / "jobs", "c", steps=2)
    with open(rec.log_path, "a") as f:
        f.write("\r1|3|Loss: 3.5: 100%|###| 3/3")
    t = S.SummaryTracker(rec)
    t.advance(final=True)
    assert (t.summary.step, t.summary.loss) == (3, 3.5)  # the bar is ahead of the metric file
    with open(t.summary.metrics_path, "a") as f:
        f.write("Step 3 | loss:3.25 \n")
    t.advance(final=True)
    assert (t.summary.step, t.summary.loss) == (3, 3.25)


def test_saving_checkpoint_until_the_next_step(tmp_path):
    rec = make_job(tmp_path / "jobs", "d", steps=2)
    t = S.SummaryTracker(rec)
    t.advance()
    assert t.summary.saving is False
    with open(rec.log_path, "a") as f:
        f.write("INFO:torchtune.utils._logging:Saving checkpoint. This may take some time.\n")
    t.advance()
    assert t.summary.saving is True
    with open(rec.log_path, "a") as f:
        f.write("\r2|3|Loss: 1.0: 5%|#| 1/20\n")
    t.advance()
    assert t.summary.saving is False and t.summary.epoch == 2


def test_a_recreated_log_starts_over_and_keeps_what_was_known(tmp_path):
    rec = make_job(tmp_path / "jobs", "e", steps=4)
    t = S.SummaryTracker(rec)
    t.advance()
    os.unlink(rec.log_path)
    Path(rec.log_path).write_text("[tune_magic] the log before this moment is gone\n")
    t.advance()
    assert t.summary.log_offset == os.path.getsize(rec.log_path) and t.summary.step == 4


def test_damaged_summary_is_ignored(tmp_path):
    rec = make_job(tmp_path / "jobs", "f")
    d = Path(rec.log_path).parent
    (d / S.SUMMARY).write_text('{"version": 1, "step": "x", "loss": 2')
    assert S.read_summary(d) is None
    s = S.current_summary(d, rec, kept=False, final=True)
    assert (s.step, s.loss) == (5, 2.0)
    assert S.read_summary(d).step == 5  # written back for the next reader


def test_listings_open_no_log(tmp_path, monkeypatch):
    """The listings that show step and loss read summaries: once each job has one, no log is opened."""
    home = tmp_path / "home"
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(home))
    root = home / "jobs"
    for i in range(3):
        rec = make_job(root, f"j{i}", steps=4 + i)
        S.write_summary(root / rec.id, S.current_summary(root / rec.id, rec, kept=False, final=True, write=False))
    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file, *a, **kw):
        opened.append(str(file))
        return real_open(file, *a, **kw)

    def spy_os_open(path, *a, **kw):
        opened.append(str(path))
        return real_os_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    from tune_magic.ui import cli
    from tune_magic.ui import demo
    from tune_magic.ui.views import JobsTable

    listed = J.jobs()
    table = JobsTable(listed)
    assert [table.summaries[f"j{i}"][2:4] for i in range(3)] == [(4, 2.5), (5, 2.0), (6, 10 / 6)]
    assert cli.main(["jobs"]) == 0
    text = demo.summary(listed)
    assert "2.5000" in text
    logs = [p for p in opened if p.endswith(".log") or "/logs/log_" in p]
    assert logs == [], logs


def _million_step_job(root: Path, job_id: str, steps: int = 1_000_000) -> JobRecord:
    """A finished job whose DiskLogger file has ``steps`` lines (about 80 MB), as no supervisor
    summarised it (a job of another machine, or one run before summaries existed)."""
    rec = make_job(root, job_id, steps=1, bar=False)
    metric_file = root.parent / "runs" / job_id / "logs" / "log_1.txt"
    with open(metric_file, "w") as f:
        for lo in range(1, steps + 1, 100_000):
            f.write("".join(f"Step {i} | loss:{10 / i} lr:0.001 tokens_per_second_per_gpu:{100 + i % 7} \n"
                            for i in range(lo, min(lo + 100_000, steps + 1))))
    with open(rec.log_path, "a") as f:
        f.write(f"\r1|{steps}|Loss: {10 / steps}: 100%|##########| {steps}/{steps}\ndone\n")
    return rec


def test_second_listing_of_a_million_step_job_reads_only_record_and_summary_files(tmp_path, monkeypatch, capsys):
    """The first listing of jobs nobody summarised reads each log once and writes the summaries;
    every listing after it (jobs(), the %tune_jobs table, tune-magic jobs, the demo's summary)
    opens only record.json and summary.json, however long the logs are."""
    home = tmp_path / "home"
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(home))
    root = home / "jobs"
    for i in range(3):
        make_job(root, f"j{i}", steps=2 + i)
    big = _million_step_job(root, "jbig")
    metric_size = os.path.getsize(root.parent / "runs" / "jbig" / "logs" / "log_1.txt")
    assert all(S.read_summary(root / f"j{i}") is None for i in range(3)) and S.read_summary(root / "jbig") is None

    first = {j.id: j.summary() for j in J.jobs()}  # the first reader: reads what no one summarised
    assert (first["jbig"].step, first["jbig"].loss) == (1_000_000, 10 / 1_000_000)
    written = S.read_summary(root / "jbig")
    assert (written.step, written.metrics_offset, written.log_offset) == (
        1_000_000, metric_size, os.path.getsize(big.log_path))

    opened: list[str] = []
    real_open, real_os_open, real_io_open = builtins.open, os.open, io.open

    def spy(real):
        def wrapper(file, *a, **kw):
            opened.append(os.fspath(file) if isinstance(file, (str, bytes, os.PathLike)) else repr(file))
            return real(file, *a, **kw)
        return wrapper

    monkeypatch.setattr(builtins, "open", spy(real_open))
    monkeypatch.setattr(io, "open", spy(real_io_open))
    monkeypatch.setattr(os, "open", spy(real_os_open))
    from tune_magic.ui import cli
    from tune_magic.ui import demo
    from tune_magic.ui.views import JobsTable

    listed = J.jobs()
    table = JobsTable(listed)
    assert table.summaries["jbig"][2:4] == (1_000_000, 10 / 1_000_000)
    capsys.readouterr()
    assert cli.main(["jobs"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("jbig"))
    assert line.split()[3:5] == ["1000000", "1e-05"]
    assert "1000000" in demo.summary(listed)
    in_registry = {Path(p).name for p in opened if p.startswith(str(root))}
    assert in_registry == {"record.json", "summary.json"}, in_registry
    logs = [p for p in opened if p.endswith(".log") or "/logs/log_" in p]
    assert logs == [], logs


def test_a_long_backlog_is_read_a_piece_at_a_time_and_an_endless_record_is_passed_over(tmp_path):
    # a 48 MB log (a sparse run of NULs, no line break: no record torchtune writes), then a step:
    # the catch-up holds about one piece in memory, not the advance's 64 MiB budget, and reaches it
    import tracemalloc

    rec = make_job(tmp_path / "jobs", "big", steps=2)
    with open(rec.log_path, "ab") as f:
        f.truncate(os.path.getsize(rec.log_path) + 48 * S.PIECE_BYTES)
    with open(rec.log_path, "a") as f:
        f.write("\n\r2|7|Loss: 0.125: 35%|###| 7/20\n")
    t = S.SummaryTracker(rec)
    tracemalloc.start()
    try:
        assert t.advance(final=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * S.PIECE_BYTES, peak
    assert (t.summary.step, t.summary.loss, t.summary.epoch) == (7, 0.125, 2)
    assert t.summary.log_offset == os.path.getsize(rec.log_path)


def test_a_step_whose_metric_lines_two_reads_gave_keeps_them_all(tmp_path):
    rec = make_job(tmp_path / "jobs", "split", steps=2, bar=False)
    t = S.SummaryTracker(rec)
    t.advance()
    with open(t.summary.metrics_path, "a") as f:
        f.write("Step 3 | loss:0.5 \n")
    t.advance()
    with open(t.summary.metrics_path, "a") as f:
        f.write("Step 3 | lr:0.002 \n")
    t.advance()
    assert t.summary.metrics == {"loss": 0.5, "lr": 0.002} and t.summary.step == 3


def test_a_summary_that_read_less_of_the_same_log_never_replaces_one_that_read_more(tmp_path):
    # a reader caught the job up to step 3 while its supervisor, a poll behind, still had step 1:
    # the supervisor's write must not take the table back to step 1 (seen: 3, 1, 3)
    from tune_magic.logs.summary import Summary, read_summary, write_summary

    ahead = Summary(step=3, log_offset=300, log_ident=[1, 2], metrics_offset=90, metrics_path="m.txt")
    behind = Summary(step=1, log_offset=100, log_ident=[1, 2], metrics_offset=30, metrics_path="m.txt")
    assert write_summary(tmp_path, ahead)
    assert not write_summary(tmp_path, behind) and read_summary(tmp_path).step == 3
    further = Summary(step=4, log_offset=400, log_ident=[1, 2], metrics_offset=90, metrics_path="m.txt")
    assert write_summary(tmp_path, further) and read_summary(tmp_path).step == 4
    other_file = Summary(step=1, log_offset=10, log_ident=[1, 3])  # the log was recreated: starts over
    assert write_summary(tmp_path, other_file) and read_summary(tmp_path).step == 1
    assert write_summary(tmp_path, ahead) and write_summary(tmp_path, behind, forward_only=False)  # the end's write
    assert read_summary(tmp_path).step == 1
