"""Tests for tune_magic.logs.metricfollow: incremental reading, merging, discovery, serialisers.

Expected values are written by hand, never computed by the code under test.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import tracemalloc
from collections import deque
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tune_magic.logs.export import points_to_csv, points_to_frame, points_to_json
from tune_magic.logs.metricfollow import JobMetricsFollower
from tune_magic.logs.linefollow import LineFollower
from tune_magic.logs.logfiles import find_metric_file
from tune_magic.logs.metricstore import MetricStore
from tune_magic.logs.points import MetricPoint
from tune_magic.logs.readers import parse_text

from jobhelpers import DATA

NAN = float("nan")
INF = float("inf")
BAR = ":  {p}%|{h}| {n}/10 [00:0{n}<00:01,  1.00it/s]"


def P(step, name, value, epoch=None, source="disklogger") -> MetricPoint:
    return MetricPoint(step, name, value, epoch, source)


def append(path: Path, data: bytes | str) -> None:
    with open(path, "ab") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def progress(epoch: int, step: int, loss: str) -> str:
    return f"\r{epoch}|{step}|Loss: {loss}" + BAR.format(p=step * 10, h="#" * step, n=step)


# -- LineFollower ---------------------------------------------------------------------------------


def test_partial_line_across_reads(tmp_path):
    log = tmp_path / "job.log"
    f = LineFollower(log)
    append(log, "Step 1 | loss:1.5")
    assert f.poll() == []
    assert f.tail() == ["Step 1 | loss:1.5"]  # the unterminated line is shown, not parsed
    append(log, " lr:2e-05 \nStep 2 | lo")
    assert f.poll() == ["Step 1 | loss:1.5 lr:2e-05 "]
    append(log, "ss:1.25 \n")
    assert f.poll() == ["Step 2 | loss:1.25 "]
    assert f.poll() == []
    assert f.offset == log.stat().st_size


def test_multibyte_char_split_across_reads(tmp_path):
    log = tmp_path / "job.log"
    f = LineFollower(log, chunk_bytes=3)  # reads of 3 bytes split most characters below
    data = "héllo wörld ✓ 😀\n".encode()
    for i in range(0, len(data), 2):
        append(log, data[i : i + 2])
        f.poll()
    assert f.tail() == ["héllo wörld ✓ 😀"]


def test_carriage_return_replaces_the_line(tmp_path):
    log = tmp_path / "job.log"
    job = JobMetricsFollower(log)
    append(log, "INFO start\n" + progress(1, 1, "3.0") + progress(1, 2, "2.5"))
    assert job.poll() == [P(1, "loss", 3.0, 1, "progress")]  # step 2's segment is not ended yet
    assert job.tail() == ["INFO start", "1|2|Loss: 2.5" + BAR.format(p=20, h="##", n=2)]
    append(log, progress(1, 3, "2.25") + "\r\n")
    assert job.poll() == [P(2, "loss", 2.5, 1, "progress"), P(3, "loss", 2.25, 1, "progress")]
    assert job.tail() == ["INFO start", "1|3|Loss: 2.25" + BAR.format(p=30, h="###", n=3)]
    assert job.latest_progress == "1|3|Loss: 2.25" + BAR.format(p=30, h="###", n=3)


def test_truncation_starts_over(tmp_path):
    log = tmp_path / "log_1.txt"
    f = LineFollower(log)
    append(log, "Step 1 | loss:3.0 \nStep 2 | loss:2.5 \nStep 3 | loss:2.0 \n")
    assert len(f.poll()) == 3
    log.write_bytes(b"Step 1 | loss:9.0 \n")  # truncated and rewritten, shorter
    assert f.poll() == ["Step 1 | loss:9.0 "]
    assert f.resets == 1
    append(log, "Step 2 | loss:8.0 \n")
    assert f.poll() == ["Step 2 | loss:8.0 "]


def test_rotation_drains_old_file_then_reads_new_one(tmp_path):
    log = tmp_path / "job.log"
    f = LineFollower(log)
    append(log, "old 1\n")
    assert f.poll() == ["old 1"]
    append(log, "old 2\n")  # written before the rotation, not yet read
    log.rename(tmp_path / "job.log.1")
    append(log, "new 1\nnew 2\n")
    assert f.poll() == ["old 2", "new 1", "new 2"]
    assert f.resets == 1
    assert f.tail() == ["old 1", "old 2", "new 1", "new 2"]


def test_removed_file_is_not_an_error(tmp_path):
    log = tmp_path / "job.log"
    f = LineFollower(log)
    append(log, "a\n")
    assert f.poll() == ["a"]
    log.unlink()
    assert f.poll() == []
    append(log, "b\n")
    assert f.poll() == ["b"]


def test_late_appearing_file_and_directory(tmp_path):
    log = tmp_path / "not" / "yet" / "job.log"
    job = JobMetricsFollower(log, log_dir=tmp_path / "logs")
    assert job.poll() == [] and job.tail() == [] and job.latest_progress is None
    log.parent.mkdir(parents=True)
    append(log, progress(1, 1, "2.0") + "\n")
    assert job.poll() == [P(1, "loss", 2.0, 1, "progress")]


def test_very_long_line(tmp_path):
    log = tmp_path / "job.log"
    f = LineFollower(log, max_line_chars=1000, chunk_bytes=4096)
    append(log, "x" * 1_000_000 + "\n")
    append(log, "Step 4 | loss:1.75 " + "pad:1.0 " * 500 + "\n")  # 4,019 characters
    append(log, "Step 5 | loss:1.5 \n")
    records = f.poll()
    assert len(records) == 3
    assert records[0] == "x" * 1000
    assert records[1].startswith("Step 4 | loss:1.75 pad:1.0 ") and len(records[1]) <= 1000
    assert records[1].endswith("pad:1.0")  # cut back to a whole field
    assert records[2] == "Step 5 | loss:1.5 "
    assert all(len(line) <= 1000 for line in f.tail())


def test_invalid_bytes_are_replaced(tmp_path):
    log = tmp_path / "job.log"
    job = JobMetricsFollower(log)
    append(log, b"Step 1 | loss:1.5 \n\xff\xfe junk \x80\n\xc3(\nStep 2 | loss:1.25 \n")
    assert job.poll() == [P(1, "loss", 1.5), P(2, "loss", 1.25)]
    assert job.tail() == ["Step 1 | loss:1.5 ", "\ufffd\ufffd junk \ufffd", "\ufffd(", "Step 2 | loss:1.25 "]


def test_ring_buffer_is_bounded(tmp_path):
    log = tmp_path / "job.log"
    with open(log, "w") as out:
        for i in range(100_000):
            out.write(f"INFO 2026-11-29 line number {i:06d} of the job's output\n")
    f = LineFollower(log, max_lines=100, chunk_bytes=64 << 10)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        while not f.caught_up:
            f.poll()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    tail = f.tail()
    assert len(tail) == 100
    assert tail[0] == "INFO 2026-11-29 line number 099900 of the job's output"
    assert tail[-1] == "INFO 2026-11-29 line number 099999 of the job's output"
    # 100 lines of ~55 characters plus the decoder and deque: far below the 5.5 MB read.
    assert retained < 200_000, retained


def test_poll_budget_continues_next_poll(tmp_path):
    log = tmp_path / "job.log"
    append(log, "".join(f"line {i}\n" for i in range(1000)))  # 7,890 bytes
    f = LineFollower(log, max_lines=5, chunk_bytes=1000, poll_bytes=3000)
    first = f.poll()
    assert not f.caught_up and 0 < len(first) < 1000
    rest = f.poll() + f.poll() + f.poll()
    assert f.caught_up
    assert first + rest == [f"line {i}" for i in range(1000)]


def test_points_budget_spreads_a_backlog_over_polls(tmp_path):
    log, metrics, job = _job(tmp_path)
    job = JobMetricsFollower(log, poll_points=100)
    with open(metrics, "w") as out:
        for step in range(1, 20_001):  # ~360 KB: more than one 256 KiB read
            out.write(f"Step {step} | loss:{step}.5 \n")
    first = job.poll()
    assert 100 <= len(first) < 20_000 and not job.caught_up
    assert first[0] == P(1, "loss", 1.5) and [p.step for p in first] == list(range(1, len(first) + 1))
    seen = len(first)
    while not job.caught_up:
        seen += len(job.poll())
    assert seen == 20_000
    assert job.last("loss") == P(20_000, "loss", 20_000.5)


def test_finish_reads_past_the_budget(tmp_path):
    log, metrics, job = _job(tmp_path)
    job = JobMetricsFollower(log, poll_points=10)
    append(metrics, "".join(f"Step {s} | loss:{s}.25 \n" for s in range(1, 30_001)) + "Step 30001 | loss:0.5")
    done = job.finish()
    assert len(done) == 30_001 and done[-1] == P(30_001, "loss", 0.5)
    assert job.caught_up


# -- merging ----------------------------------------------------------------------------------------


def _job(tmp_path: Path) -> tuple[Path, Path, JobMetricsFollower]:
    log = tmp_path / "job.log"
    metrics = tmp_path / "logs" / "log_1732912345.txt"
    metrics.parent.mkdir()
    append(log, f"INFO Writing logs to {metrics}\n")
    return log, metrics, JobMetricsFollower(log)


def test_metric_file_wins_over_progress_for_the_same_step(tmp_path):
    log, metrics, job = _job(tmp_path)
    append(log, progress(1, 1, "2.5") + progress(1, 2, "2.25") + "\n")
    assert job.poll() == [P(1, "loss", 2.5, 1, "progress"), P(2, "loss", 2.25, 1, "progress")]
    append(metrics, "Step 1 | loss:2.4871 lr:2e-05 \n")
    # replaces step 1's progress value; keeps the epoch the progress bar told us
    assert job.poll() == [P(1, "loss", 2.4871, 1, "disklogger"), P(1, "lr", 2e-05)]
    # a later progress redraw of an already-logged step does not win
    append(log, progress(1, 1, "2.5") + "\n")
    assert job.poll() == []
    assert job.points() == [
        P(1, "loss", 2.4871, 1, "disklogger"),
        P(1, "lr", 2e-05),
        P(2, "loss", 2.25, 1, "progress"),
    ]
    assert job.last("loss") == P(2, "loss", 2.25, 1, "progress")
    assert job.last("lr") == P(1, "lr", 2e-05)
    assert job.last("nope") is None


def test_metric_file_first_then_progress(tmp_path):
    log, metrics, job = _job(tmp_path)
    append(metrics, "Step 3 | loss:1.125 \n")
    append(log, progress(1, 3, "1.12") + "\n")
    assert job.poll() == [P(3, "loss", 1.125, 1, "disklogger")]


def test_no_double_counting_when_polled_repeatedly(tmp_path):
    log, metrics, job = _job(tmp_path)
    for step, loss in ((1, "3.0"), (2, "2.5"), (3, "2.0")):
        append(metrics, f"Step {step} | loss:{loss} \n")
        append(log, progress(1, step, loss) + "\n")
        job.poll()
        assert job.poll() == []
    # the same file re-read from the start (e.g. rewritten after a restart) adds nothing
    metrics.write_text("Step 1 | loss:3.0 \n")
    assert job.poll() == []
    assert job.points() == [P(1, "loss", 3.0, 1), P(2, "loss", 2.5, 1), P(3, "loss", 2.0, 1)]


def test_same_source_later_value_replaces(tmp_path):
    store = MetricStore()
    store.add_points([P(5, "loss", 2.0), P(6, "loss", 1.5)])
    assert store.take_changes() == [P(5, "loss", 2.0), P(6, "loss", 1.5)]
    store.add_points([P(5, "loss", 1.75), P(4, "loss", 2.5), P(6, "loss", 1.5), P(5, "lr", NAN)])
    changes = store.take_changes()
    assert changes[:2] == [P(4, "loss", 2.5), P(5, "loss", 1.75)]
    assert (changes[2].step, changes[2].name) == (5, "lr") and math.isnan(changes[2].value)
    assert len(changes) == 3
    store.add_points([P(5, "lr", NAN)])  # nan == nan for merging
    assert store.take_changes() == []
    assert [p.step for p in store.points()] == [4, 5, 5, 6]


def test_series_thinning_keeps_spikes_and_last_point():
    store = MetricStore()
    values = [1.0] * 10_000
    values[4321] = 50.0  # a spike
    values[777] = NAN
    store.add_points(P(i, "loss", v) for i, v in enumerate(values))
    full = store.series("loss", max_points=None)
    assert len(full.steps) == 10_000 and full.steps[:3] == [0, 1, 2]
    thin = store.series("loss", max_points=101)
    assert len(thin.steps) <= 101
    assert thin.steps == sorted(set(thin.steps))
    assert 4321 in thin.steps and 50.0 in thin.values
    assert thin.steps[-1] == 9999
    assert not any(math.isnan(v) for v in thin.values)
    assert store.series("other") == ([], [])
    with pytest.raises(ValueError):
        store.series("loss", max_points=1)


# -- JobMetricsFollower discovery -----------------------------------------------------------------


def test_finds_metric_file_from_writing_logs_line(tmp_path):
    log = tmp_path / "job.log"
    (tmp_path / "run" / "logs").mkdir(parents=True)
    metrics = tmp_path / "run" / "logs" / "log_1732912345.txt"
    decoy = tmp_path / "run" / "logs" / "log_9999999999.txt"  # newer, but not this job's
    append(decoy, "Step 1 | loss:99.0 \n")
    job = JobMetricsFollower(log, log_dir=tmp_path / "nowhere", cwd=tmp_path)
    append(log, "\x1b[32mWriting logs to run/logs/log_1732912345.txt\x1b[0m\n")  # relative to cwd
    assert job.poll() == []
    assert job.metrics_path == metrics
    append(metrics, "Step 1 | loss:2.0853 lr:2e-05 tokens_per_second_per_gpu:57.8 \n")
    assert job.poll() == [P(1, "loss", 2.0853), P(1, "lr", 2e-05), P(1, "tokens_per_second_per_gpu", 57.8)]


def test_finds_newest_metric_file_in_log_dir(tmp_path):
    log = tmp_path / "job.log"
    logs = tmp_path / "logs"
    logs.mkdir()
    old = logs / "log_100.txt"
    append(old, "Step 1 | loss:9.0 \n")
    os.utime(old, (1000.0, 1000.0))
    other = logs / "notes.txt"
    append(other, "Step 1 | loss:8.0 \n")
    job = JobMetricsFollower(log, log_dir=logs, started_after=2000.0)
    append(log, progress(1, 1, "3.0") + "\n")
    assert job.poll() == [P(1, "loss", 3.0, 1, "progress")] and job.metrics_path is None
    new = logs / "log_200.jsonl"
    append(new, '{"step": 1, "loss": 2.75, "lr": 2e-05}\n')
    os.utime(new, (3000.0, 3000.0))
    assert job.poll() == [P(1, "loss", 2.75, 1, "jsonl"), P(1, "lr", 2e-05, None, "jsonl")]
    assert job.metrics_path == new


def test_find_metric_file(tmp_path):
    assert find_metric_file(tmp_path / "missing") is None
    a, b = tmp_path / "log_1.txt", tmp_path / "log_2.jsonl"
    append(a, "x\n")
    append(b, "x\n")
    os.utime(a, (5000.0, 5000.0))
    os.utime(b, (4000.0, 4000.0))
    assert find_metric_file(tmp_path) == a
    assert find_metric_file(tmp_path, started_after=4500.0) == a
    assert find_metric_file(tmp_path, started_after=6000.0) is None


def test_finish_parses_the_unterminated_last_line(tmp_path):
    log, metrics, job = _job(tmp_path)
    append(metrics, "Step 1 | loss:2.0 \nStep 2 | loss:1.5")
    assert job.poll() == [P(1, "loss", 2.0)]
    assert job.finish() == [P(2, "loss", 1.5)]


def test_stats_count_malformed_lines(tmp_path):
    log, metrics, job = _job(tmp_path)
    append(metrics, "Step 1 | loss:2.0 \nStep x | loss:1 \ngarbage\nStep 2 | loss:1.5 \n")
    assert job.poll() == [P(1, "loss", 2.0), P(2, "loss", 1.5)]
    assert job.stats["metrics"].malformed == 2


# -- serialisers ------------------------------------------------------------------------------------

SAMPLE = [P(1, "loss", 2.5, 1, "progress"), P(1, "lr", 2e-05), P(2, "loss", NAN), P(2, "gn", INF), P(2, "m", -INF)]


def test_points_to_json_is_strict():
    text = points_to_json(SAMPLE)

    def no_constants(name):
        raise AssertionError(f"non-strict JSON constant {name}")

    assert json.loads(text, parse_constant=no_constants) == [
        {"step": 1, "name": "loss", "value": 2.5, "epoch": 1, "source": "progress"},
        {"step": 1, "name": "lr", "value": 2e-05, "source": "disklogger"},
        {"step": 2, "name": "loss", "value": "nan", "source": "disklogger"},
        {"step": 2, "name": "gn", "value": "inf", "source": "disklogger"},
        {"step": 2, "name": "m", "value": "-inf", "source": "disklogger"},
    ]
    assert points_to_json([]) == "[]"


def test_points_to_csv():
    assert points_to_csv(SAMPLE) == (
        "step,name,value,epoch,source\n"
        "1,loss,2.5,1,progress\n"
        "1,lr,2e-05,,disklogger\n"
        "2,loss,nan,,disklogger\n"
        "2,gn,inf,,disklogger\n"
        "2,m,-inf,,disklogger\n"
    )


def test_points_to_frame():
    pytest.importorskip("pandas")
    frame = points_to_frame(SAMPLE + [P(1, "loss", 2.4, None, "disklogger")])
    assert list(frame.columns) == ["step", "name", "value", "epoch", "source"]
    assert len(frame) == 5  # one row per (step, name): the file value replaced the progress one
    assert frame["step"].tolist() == [1, 1, 2, 2, 2]
    assert frame["name"].tolist() == ["loss", "lr", "gn", "loss", "m"]
    assert frame["value"].tolist()[:3] == [2.4, 2e-05, INF]
    assert math.isnan(frame["value"].iloc[3])
    assert frame["epoch"].iloc[0] == 1 and frame["epoch"].isna().tolist() == [False, True, True, True, True]
    assert str(frame["step"].dtype) == "int64" and str(frame["value"].dtype) == "float64"


def test_points_to_frame_without_pandas(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        points_to_frame(SAMPLE)


# -- property: chunking does not matter ---------------------------------------------------------------

_keys = st.sampled_from(["loss", "lr", "tokens_per_second_per_gpu", "rewards/chosen"])
_values = st.sampled_from(
    ["2.0853", "2e-05", "1.5E+3", "57", "nan", "inf", "-inf", "tensor(0.4300, device='cuda:0', grad_fn=<X>)",
     "tensor(0.43)", "abc"]
)
_steps = st.integers(min_value=0, max_value=30)
_disk = st.builds(
    lambda s, kv: f"Step {s} | " + "".join(f"{k}:{v} " for k, v in kv) + "\n",
    _steps,
    st.lists(st.tuples(_keys, _values), min_size=1, max_size=3),
)
_prog = st.builds(
    lambda e, s, v, p: f"\r{e}|{s}|Loss: {v}:{p:4d}%|{'#' * (p // 10)}| {p}/100 [00:01<00:02,  1.00it/s]",
    st.integers(1, 3),
    _steps,
    st.sampled_from(["2.5", "11.97315", "nan", "1e-3"]),
    st.integers(0, 100),
)
_ansi = st.sampled_from(["\x1b[?25l", "\x1b[?25h", "\x1b[31m", "\x1b[0m", "\x1b]0;title\x07"])
_junk = st.text(alphabet=st.sampled_from(list("ab |:.Step0123\té✓😀ß")), max_size=30).map(
    lambda t: t.replace("Writing", "")
)
_tee_prefix = st.sampled_from(["[default0]:", "[default1]:", "[rank0]: ", "[default0]:[rank0]: "])
_piece = st.one_of(
    _disk.map(str.encode),
    _prog.map(str.encode),
    # torchrun --tee forms: a prefixed line, and a cut piece followed by the next piece
    st.builds(lambda p, d: (p + d).encode(), _tee_prefix, _disk),
    st.builds(lambda p, d: (p + d.lstrip("\r")).encode(), _tee_prefix, _prog),
    st.builds(lambda p, d, k, e: (p + d[:k] + p + e).encode(), _tee_prefix, _disk, st.integers(0, 60), _disk),
    _ansi.map(str.encode),
    _junk.map(str.encode),
    st.sampled_from([b"\n", b"\r\n", b"\r", b"\xff", b"\xc3", b"\xe2\x9c", b"\x80"]),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=st.lists(_piece, max_size=40), cuts=st.lists(st.integers(0, 4000), max_size=12))
def test_any_chunking_gives_the_points_of_parsing_at_once(pieces, cuts):
    data = b"".join(pieces) + b"\n"
    # Reference: parse the whole text at once, merge with the same rule.
    lines: deque[str] = deque(maxlen=50)
    whole, parser = parse_text(data.decode("utf-8", errors="replace"), lines=lines)
    ref = MetricStore()
    ref.add_points(whole)
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "job.log"
        job = JobMetricsFollower(log, max_lines=50)
        seen = []
        for a, b in zip(bounds, bounds[1:]):
            append(log, data[a:b])
            seen += job.poll()
        seen += job.finish()  # a cut --tee line may still wait for its rest
        got = job.points()
        assert _key(got) == _key(ref.points())
        # every point reported by a poll is in the final result or was superseded by a later one
        assert {(p.step, p.name) for p in seen} == {(p.step, p.name) for p in got}
        assert job.tail() == list(lines)
        assert job.latest_progress == parser.latest_progress
        job.close()


_BAR = "Loss: 2.5:   0%|| 0/100 [00:01<00:02,  1.00it/s]"
_DISK0 = (0, "loss", 2.0853, None, "disklogger")  # the file's value beats the bar's echo of step 0


@pytest.mark.parametrize("bars, want, progress_text", [
    # hypothesis's falsifying example and its variant: three --tee bar pieces (rank 1, then rank 0
    # twice) on one physical line; each piece is a redraw of its own
    ([f"[default1]:1|0|{_BAR}", f"[default0]:1|0|{_BAR}", f"[default0]:1|1|{_BAR}"],
     [_DISK0, (1, "loss", 2.5, 1, "progress")], f"1|1|{_BAR}"),
    ([f"[default1]:1|0|{_BAR}", f"[default0]:1|0|{_BAR}", f"[default0]:1|0|{_BAR}"], [_DISK0], f"1|0|{_BAR}"),
    # torch's excepthook prefix inside torchrun's: "[rank0]: " glued after it is no cut of its own
    ([f"[default0]:[rank0]: 1|0|{_BAR}", f"[rank0]: 1|1|{_BAR}"], [_DISK0], f"1|0|{_BAR}[rank0]: 1|1|{_BAR}"),
], ids=["other-rank-then-step-1", "other-rank-then-step-0", "torch-prefix-glued"])
def test_rank_prefixed_bars_glued_after_a_complete_line_at_any_cut(tmp_path, bars, want, progress_text):
    # The same points and progress text whether the bar line reaches the parser in a plain run
    # (the whole text, or a chunk holding both lines) or as a record of its own.
    data = ("Step 0 | loss:2.0853 \n" + "".join(bars) + "\n").encode()
    points, parser = parse_text(data.decode())
    ref = MetricStore()
    ref.add_points(points)
    assert _key(ref.points()) == want
    assert parser.latest_progress == progress_text
    for cut in range(len(data) + 1):  # 22 (hypothesis's): right after the Step line's newline
        log = tmp_path / f"job{cut}.log"
        with JobMetricsFollower(log, max_lines=50) as job:
            for piece in (data[:cut], data[cut:]):
                append(log, piece)
                job.poll()
            job.finish()
            assert _key(job.points()) == want, cut
            assert job.latest_progress == progress_text, cut


def _key(points):
    return [(p.step, p.name, "nan" if math.isnan(p.value) else p.value, p.epoch, p.source) for p in points]


def test_close_then_poll_resumes_same_file(tmp_path):
    log = tmp_path / "job.log"
    f = LineFollower(log)
    append(log, "a\nb")
    assert f.poll() == ["a"]
    f.close()
    append(log, "c\n")
    assert f.poll() == ["bc"]
    assert f.resets == 0 and f.tail() == ["a", "bc"]


# -- property: the store against a dict model of the merge rule -------------------------------------

_RANK_MODEL = {"progress": 0, "disklogger": 1, "jsonl": 1}
_point = st.builds(
    MetricPoint,
    st.integers(0, 40),
    st.sampled_from(["loss", "lr"]),
    st.sampled_from([1.0, 2.5, NAN, INF]),
    st.one_of(st.none(), st.integers(1, 3)),
    st.sampled_from(["progress", "disklogger", "jsonl"]),
)
_run_batch = st.builds(  # increasing steps, one name cycle: the bulk path's input
    lambda start, n, source: [MetricPoint(s, name, float(s), None, source)
                              for s in range(start, start + n) for name in ("loss", "lr")],
    st.integers(0, 60), st.integers(1, 30), st.sampled_from(["progress", "disklogger"]),
)


@settings(max_examples=80, deadline=None)
@given(batches=st.lists(st.one_of(st.lists(_point, max_size=12), _run_batch), max_size=8))
def test_store_matches_a_dict_model_of_the_merge_rule(batches):
    store = MetricStore()
    model: dict[tuple[int, str], tuple] = {}
    for batch in batches:
        changed = set()
        for p in batch:
            key = (p.step, p.name)
            old = model.get(key)
            if old is not None:
                if _RANK_MODEL[p.source] < _RANK_MODEL[old[2]]:
                    continue
                epoch = p.epoch if p.epoch is not None else old[1]
                new = (p.value, epoch, p.source)
                if repr(new) == repr(old):
                    continue
            else:
                new = (p.value, p.epoch, p.source)
            model[key] = new
            changed.add(key)
        store.add_points(batch)
        want = [(s, n, repr(model[s, n][0]), model[s, n][1], model[s, n][2]) for s, n in sorted(changed)]
        got = [(p.step, p.name, repr(p.value), p.epoch, p.source) for p in store.take_changes()]
        assert got == want
    assert [(p.step, p.name, repr(p.value), p.epoch, p.source) for p in store.points()] == [
        (s, n, repr(v), e, src) for (s, n), (v, e, src) in sorted(model.items())
    ]


def test_finish_with_a_named_metric_file_that_does_not_exist(tmp_path):
    log = tmp_path / "job.log"
    append(log, f"Writing logs to {tmp_path}/gone/log_1.txt\n" + progress(1, 1, "2.5") + "\n")
    job = JobMetricsFollower(log)
    assert job.finish() == [P(1, "loss", 2.5, 1, "progress")]  # returns: a missing file is caught up
    assert job.caught_up and job.metrics_path == tmp_path / "gone" / "log_1.txt"
    assert job.poll() == []


# -- per-rank files under torchrun's --log-dir (--redirects / --tee) --------------------------------


def _capture_steps(n: int = 8) -> list[tuple]:
    """capture_worker.py metrics mode: loss 10/step, lr 2e-05, tokens 100+step, grad_norm 0.5*step."""
    out = []
    for s in range(1, n + 1):
        out += [(s, "grad_norm", 0.5 * s, None, "jsonl"), (s, "loss", 10.0 / s, None, "disklogger"),
                (s, "lr", 2e-05, None, "disklogger"), (s, "tokens_per_second_per_gpu", 100.0 + s, None, "disklogger")]
    return out


def test_rank_log_files_layout_of_torch_2_13():
    from tune_magic.logs.logfiles import rank_log_files

    files = rank_log_files(DATA / "tee3_metrics")
    assert [(f.local_rank, f.stream, f.attempt, f.label) for f in files] == [
        (0, "stdout", 0, "rank 0 stdout"), (0, "stderr", 0, "rank 0 stderr"),
        (1, "stdout", 0, "rank 1 stdout"), (1, "stderr", 0, "rank 1 stderr")]
    assert all(f.path == f.run_dir / "attempt_0" / str(f.local_rank) / f"{f.stream}.log" for f in files)
    assert rank_log_files(DATA / "tee3_metrics", started_after=4e9) == []  # older than the job
    assert rank_log_files(DATA / "no_such_dir") == []


def test_redirected_metrics_are_found_only_in_the_rank_files():
    # real torchrun --redirects 3 run: its combined log has no worker output at all
    combined = DATA / "redirects3_metrics.log"
    with JobMetricsFollower(combined) as alone:
        alone.finish()
        assert alone.points() == [] and alone.latest_progress is None
    with JobMetricsFollower(combined, rank_log_dir=DATA / "redirects3_metrics") as job:
        job.finish()
        got = [(p.step, p.name, p.value, p.epoch, p.source) for p in job.points()]
        assert got == _capture_steps()
        assert job.latest_progress.startswith("1|8|Loss: 1.25: 100%|")
        sections = job.log_sections(2)
        assert [label for label, _ in sections] == ["combined", "rank 0 stdout", "rank 0 stderr", "rank 1 stderr"]
        assert sections[1][1] == ['Step 8 | loss:1.25 lr:2e-05 tokens_per_second_per_gpu:108.0 ',
                                  '{"step": 8, "grad_norm": 4.0}']
        tail = job.labelled_tail(1)
        assert tail[1:] == ['[rank 0 stdout] {"step": 8, "grad_norm": 4.0}',
                            "[rank 0 stderr] 1|8|Loss: 1.25: 100%|██████████| 8/8 [00:00<00:00, 19.73it/s]",
                            "[rank 1 stderr] WARNING:torchao.kernel.intmm:Warning: Detected no triton, on systems "
                            "without Triton certain kernels will not work"]
        assert "rank 0 stdout" in job.stats


@pytest.mark.parametrize("name", ["tee3_metrics", "tee3_filter0_metrics"])
def test_teed_metrics_from_the_combined_log_and_the_rank_files_agree(name):
    # (a merged metric-file value keeps the progress bar's epoch when the bar came first)
    want = [(s, n, v, src) for s, n, v, _, src in _capture_steps()]
    for rank_dir in (None, DATA / name):
        with JobMetricsFollower(DATA / f"{name}.log", rank_log_dir=rank_dir) as job:
            job.finish()
            assert [(p.step, p.name, p.value, p.source) for p in job.points()] == want


def test_rank_files_that_appear_later_are_followed(tmp_path):
    # the workers create their files after the job starts; a live follower picks them up
    combined = tmp_path / "output.log"
    append(combined, "")
    job = JobMetricsFollower(combined, rank_log_dir=tmp_path / "ranks", rank_scan_s=0)
    assert job.poll() == []
    rank0 = tmp_path / "ranks" / "abc_1" / "attempt_0" / "0"
    rank0.mkdir(parents=True)
    append(rank0 / "stdout.log", "Step 1 | loss:2.5 lr:0.001 \n")
    append(rank0 / "stderr.log", "\r1|1|Loss: 2.5:  50%|#| 1/2 [00:01<00:01,  1.00it/s]\r1|2|Lo")
    assert job.poll() == [P(1, "loss", 2.5), P(1, "lr", 0.001)]  # stdout read first: the bar adds nothing
    assert job.latest_progress == "1|1|Loss: 2.5:  50%|#| 1/2 [00:01<00:01,  1.00it/s]"
    append(rank0 / "stdout.log", "Step 2 | loss:1.25 lr:0.001 \n")
    assert job.poll() == [P(2, "loss", 1.25), P(2, "lr", 0.001)]
    job.close()


def test_read_rank_logs_keys_by_local_rank_stdout_then_stderr(tmp_path):
    from tune_magic.logs.logfiles import read_rank_logs

    logs = read_rank_logs(DATA / "redirects3_metrics")
    assert sorted(logs) == [0, 1]
    assert logs[0].startswith("Writing logs to ") and "\nWARNING:torchao" in logs[0]
    assert logs[1].startswith("WARNING:torchao")
    assert read_rank_logs(tmp_path / "none") == {}


def test_cli_metrics_file_reads_prefixed_step_lines():
    # tune-magic metrics --file of a torchrun --tee log (it used to print nothing for these lines)
    import subprocess

    r = subprocess.run([sys.executable, "-m", "tune_magic", "metrics", "--file", str(DATA / "tee3_metrics.log"), "--csv"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()
    assert rows[0] == "step,name,value,epoch,source"
    assert "1,lr,2e-05,,disklogger" in rows and "8,tokens_per_second_per_gpu,108.0,,disklogger" in rows
    assert len(rows) == 1 + 4 * 8


def test_every_metric_file_the_log_named_keeps_its_points(tmp_path):
    """A job started again (torchrun's restarts, --max-resumes) names a new DiskLogger file each
    time: the points of the earlier files stay, whether the follower saw them named one by one or
    both lines at once; the later file's values win for a step both have."""
    logs = tmp_path / "logs"
    logs.mkdir()
    first, second = logs / "log_1.txt", logs / "log_2.txt"
    first.write_text("Step 1 | loss:4.0 \nStep 2 | loss:3.0 \nStep 3 | loss:2.9 \n")
    second.write_text("Step 3 | loss:2.5 \nStep 4 | loss:2.0 \n")
    combined = tmp_path / "out.log"
    named = "INFO:torchtune.utils._logging:Writing logs to {}\n"
    combined.write_text(named.format(first) + named.format(second))
    with JobMetricsFollower(combined, max_lines=10) as f:
        f.finish()
        assert [(p.step, p.value) for p in f.points() if p.name == "loss"] == [(1, 4.0), (2, 3.0), (3, 2.5), (4, 2.0)]
    combined.write_text(named.format(first))
    with JobMetricsFollower(combined, max_lines=10) as f:
        f.poll()
        assert [p.step for p in f.points()] == [1, 2, 3]
        with open(combined, "a") as out:
            out.write(named.format(second))
        f.poll()
        assert [(p.step, p.value) for p in f.points() if p.name == "loss"] == [(1, 4.0), (2, 3.0), (3, 2.5), (4, 2.0)]
        assert f.metrics_path == second
