"""Table tests for tune_magic.logs.parse (torchtune 0.6.1 log formats).

Every expected value below is written by hand from the format, never computed by the parser.
"""

from __future__ import annotations

import math
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tune_magic.logs.lineformat import (
    find_log_path,
    parse_progress,
    parse_value,
    split_prefixed,
    strip_ansi,
    strip_prefixes,
)
from tune_magic.logs.parse import LogParser
from tune_magic.logs.points import MetricPoint
from tune_magic.logs.readers import parse_disklogger_line, parse_file, parse_jsonl_line, parse_text
from tune_magic.logs.splitter import RecordSplitter

from jobhelpers import DATA

NAN = float("nan")
INF = float("inf")


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def assert_points(got: list[MetricPoint], want: list[tuple]) -> None:
    """Compare points to (step, name, value, epoch, source) tuples, nan-aware."""
    assert len(got) == len(want), (got, want)
    for p, w in zip(got, want):
        assert (p.step, p.name, p.epoch, p.source) == (w[0], w[1], w[3], w[4]), (p, w)
        assert same(p.value, w[2]), (p, w)


# -- values -----------------------------------------------------------------------------------

VALUES = [
    ("2", 2.0),
    ("-3", -3.0),
    ("0", 0.0),
    ("2.0853", 2.0853),
    ("57.8", 57.8),
    ("2e-05", 2e-05),
    ("1.5E+3", 1500.0),
    ("3.0e10", 3.0e10),
    ("-1.25e-7", -1.25e-7),
    ("nan", NAN),
    ("inf", INF),
    ("-inf", -INF),
    ("tensor(0.43)", 0.43),
    ("tensor(0.43, device='cuda:0')", 0.43),
    ("tensor(0.4300, device='cuda:0', grad_fn=<DivBackward0>)", 0.43),
    ("tensor(nan)", NAN),
    ("tensor(-inf, device='cuda:0')", -INF),
    ("tensor(2.5000e-05)", 2.5e-05),
    ("tensor(3, device='cuda:0')", 3.0),
    ("tensor(0.4297, dtype=torch.bfloat16)", 0.4297),
    ("np.float32(0.5)", 0.5),
]

NOT_VALUES = ["abc", "True", "", "tensor([0.1000, 0.2000])", "tensor(", "1.2.3", "0x1F"]


@pytest.mark.parametrize("text,want", VALUES)
def test_parse_value(text, want):
    got = parse_value(text)
    assert got is not None and same(got, want)


@pytest.mark.parametrize("text", NOT_VALUES)
def test_parse_value_rejects(text):
    assert parse_value(text) is None


@pytest.mark.parametrize("text,want", VALUES)
def test_every_value_form_in_a_disklogger_line(text, want):
    # DiskLogger.log_dict writes f"{name}:{value} " per metric; keys around the value must survive.
    line = f"Step 12 | loss:{text} lr:2e-05 "
    assert_points(
        parse_disklogger_line(line),
        [(12, "loss", want, None, "disklogger"), (12, "lr", 2e-05, None, "disklogger")],
    )


# -- DiskLogger lines ---------------------------------------------------------------------------

DISKLOGGER = [
    # the field case from torchtune 0.6.1
    (
        "Step 7 | loss:2.0853 lr:2e-05 tokens_per_second_per_gpu:57.8 ",
        [(7, "loss", 2.0853, None, "disklogger"), (7, "lr", 2e-05, None, "disklogger"),
         (7, "tokens_per_second_per_gpu", 57.8, None, "disklogger")],
    ),
    # DiskLogger.log (single metric) writes no trailing space
    ("Step 3 | loss:1.5", [(3, "loss", 1.5, None, "disklogger")]),
    # keys vary by recipe (DPO, KD, memory stats)
    (
        "Step 40 | loss:0.6931 rewards/chosen:0.01 rewards/margins:-0.002 peak_memory_alloc:12.5 ",
        [(40, "loss", 0.6931, None, "disklogger"), (40, "rewards/chosen", 0.01, None, "disklogger"),
         (40, "rewards/margins", -0.002, None, "disklogger"),
         (40, "peak_memory_alloc", 12.5, None, "disklogger")],
    ),
    # tensor reprs with spaces, mixed with plain values
    (
        "Step 9 | loss:tensor(0.4300, device='cuda:0', grad_fn=<DivBackward0>) lr:3e-04 "
        "kd_loss:tensor(1.25, device='cuda:0') tokens_per_second_per_gpu:1024 ",
        [(9, "loss", 0.43, None, "disklogger"), (9, "lr", 3e-04, None, "disklogger"),
         (9, "kd_loss", 1.25, None, "disklogger"),
         (9, "tokens_per_second_per_gpu", 1024.0, None, "disklogger")],
    ),
    # non-finite values are values
    (
        "Step 11 | loss:nan lr:inf grad_norm:-inf ",
        [(11, "loss", NAN, None, "disklogger"), (11, "lr", INF, None, "disklogger"),
         (11, "grad_norm", -INF, None, "disklogger")],
    ),
    # a bad field is skipped, the others kept
    (
        "Step 5 | loss:1.25 note:warmup lr:2e-05 ",
        [(5, "loss", 1.25, None, "disklogger"), (5, "lr", 2e-05, None, "disklogger")],
    ),
    ("Step 6 | ", []),  # log_dict({}) writes just the header
]


@pytest.mark.parametrize("line,want", DISKLOGGER)
def test_disklogger_line(line, want):
    assert_points(parse_disklogger_line(line), want)


def test_field_case_exactly():
    points = parse_disklogger_line("Step 7 | loss:2.0853 lr:2e-05 tokens_per_second_per_gpu:57.8 ")
    assert points == [
        MetricPoint(7, "loss", 2.0853, None, "disklogger"),
        MetricPoint(7, "lr", 2e-05, None, "disklogger"),
        MetricPoint(7, "tokens_per_second_per_gpu", 57.8, None, "disklogger"),
    ]


def test_ansi_field_case():
    plain = "Step 7 | loss:2.0853 lr:2e-05 tokens_per_second_per_gpu:57.8 "
    wrapped = (
        "\x1b[?25l\x1b[1m\x1b[31mStep 7 | \x1b[32mloss:2.0853\x1b[0m lr:2e-05 "
        "\x1b[33mtokens_per_second_per_gpu:57.8\x1b[39m \x1b[0m\x1b[?25h"
    )
    want = [
        MetricPoint(7, "loss", 2.0853, None, "disklogger"),
        MetricPoint(7, "lr", 2e-05, None, "disklogger"),
        MetricPoint(7, "tokens_per_second_per_gpu", 57.8, None, "disklogger"),
    ]
    assert parse_disklogger_line(wrapped) == want
    assert parse_text(wrapped + "\n")[0] == want
    assert strip_ansi(wrapped) == plain


@pytest.mark.parametrize(
    "raw,want",
    [
        ("\x1b[31mred\x1b[0m", "red"),
        ("\x1b[?25lhidden\x1b[?25h", "hidden"),
        ("\x1b[1;38;5;208mx\x1b[m", "x"),
        ("\x1b]0;title\x07text", "text"),
        ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),
        ("\x1b(Bplain\x1b7\x1b8", "plain"),
        ("\x1b[2K\x1b[1Aup", "up"),
        ("no escapes", "no escapes"),
    ],
)
def test_strip_ansi(raw, want):
    assert strip_ansi(raw) == want


MALFORMED = [
    "Step x | loss:1.0 ",
    "Step 3 loss:1.0 ",
    "Step | loss:1.0",
    "Step 3 | loss:abc ",
    "Step 3 | garbage",
    "Step 1.5 | loss:1.0 ",
]


@pytest.mark.parametrize("bad", MALFORMED)
def test_malformed_line_is_counted_not_fatal(bad):
    text = f"Step 1 | loss:2.5 \n{bad}\nStep 2 | loss:2.25 \n"
    points, parser = parse_text(text, strict=True)
    assert_points(points, [(1, "loss", 2.5, None, "disklogger"), (2, "loss", 2.25, None, "disklogger")])
    assert parser.stats.malformed == 1
    assert parser.stats.points == 2


def test_junk_in_metric_file_counted_in_strict_mode_only():
    text = "hello\nStep 1 | loss:2.5 \n\n{not json\n"
    _, strict = parse_text(text, strict=True)
    assert (strict.stats.malformed, strict.stats.points) == (2, 1)
    _, loose = parse_text(text, strict=False)
    assert (loose.stats.malformed, loose.stats.other, loose.stats.points) == (0, 2, 1)


def test_bad_fields_counted():
    _, parser = parse_text("Step 5 | loss:1.25 note:warmup :3 x lr:2e-05 \n", strict=True)
    assert parser.stats.bad_fields == 3
    assert parser.stats.malformed == 0


def _disk_line(step: int) -> tuple[str, list[tuple]]:
    """A DiskLogger line and its points, both written from the same hand-chosen numbers."""
    line = f"Step {step} | loss:{step}.5 lr:2e-05 tokens_per_second_per_gpu:{step * 2} "
    return line, [
        (step, "loss", step + 0.5, None, "disklogger"),
        (step, "lr", 2e-05, None, "disklogger"),
        (step, "tokens_per_second_per_gpu", float(step * 2), None, "disklogger"),
    ]


D = "disklogger"
ODD = [
    (None, [], 0),
    ("Step 100 | lr:1.0 loss:2.0 tokens_per_second_per_gpu:3.0 ",  # keys reordered
     [(100, "lr", 1.0, None, D), (100, "loss", 2.0, None, D), (100, "tokens_per_second_per_gpu", 3.0, None, D)], 0),
    ("Step 100 | loss:2.0 lr:1.0 ", [(100, "loss", 2.0, None, D), (100, "lr", 1.0, None, D)], 0),
    ("Step 100 | loss:2.0 lr:1.0 tokens_per_second_per_gpu:3.0 extra:4.0 ",
     [(100, "loss", 2.0, None, D), (100, "lr", 1.0, None, D), (100, "tokens_per_second_per_gpu", 3.0, None, D),
      (100, "extra", 4.0, None, D)], 0),
    ("Step 100 | loss:nan lr:1.0 tokens_per_second_per_gpu:tensor(3.0) ",
     [(100, "loss", NAN, None, D), (100, "lr", 1.0, None, D), (100, "tokens_per_second_per_gpu", 3.0, None, D)], 0),
    # two lines glued together: one record, the second header's tokens are bad fields
    ("Step 100 | loss:2.0 lr:1.0 tokens_per_second_per_gpu:3.0 Step 101 | loss:2.5 lr:1.5",
     [(100, "loss", 2.0, None, D), (100, "lr", 1.0, None, D), (100, "tokens_per_second_per_gpu", 3.0, None, D),
      (100, "loss", 2.5, None, D), (100, "lr", 1.5, None, D)], 0),
    # same key lengths, other key: only the key check tells
    ("Step 100 | loss:2.0 xy:1.0 tokens_per_second_per_gpu:3.0 ",
     [(100, "loss", 2.0, None, D), (100, "xy", 1.0, None, D), (100, "tokens_per_second_per_gpu", 3.0, None, D)], 0),
    # not at the line start: not a DiskLogger line, though its tokens line up
    (" Step 100 | loss:2.0 lr:1.0 tokens_per_second_per_gpu:3.0 ", [], 1),
    ("INFO some text", [], 1),
    ("Step 100 | loss:x lr:y tokens_per_second_per_gpu:z ", [], 1),
]


@pytest.mark.parametrize("odd,odd_points,malformed", ODD)
def test_bulk_parse_matches_hand_values(odd, odd_points, malformed):
    # 1,200 uniform lines take the column-wise path; an odd line sends its block through
    # the record-by-record path. Both must give the hand-known points, in record order.
    lines, want = [], []
    for step in range(1, 1201):
        line, pts = _disk_line(step)
        lines.append(line)
        want.append(pts)
    if odd is not None:
        lines.insert(700, odd)
        want.insert(700, odd_points)
    parser = LogParser(strict=True)
    assert_points(parser.feed_records(lines), [p for pts in want for p in pts])
    assert parser.stats.malformed == malformed
    assert parser.stats.records == len(lines)
    # the same lines as one text take the plain-run path (parse_plain)
    points, text_parser = parse_text("\n".join(lines) + "\n", strict=True)
    assert_points(points, [p for pts in want for p in pts])
    assert text_parser.stats == parser.stats


# -- JSON lines -------------------------------------------------------------------------------

JSONL = [
    ('{"step": 3, "loss": 1.5, "lr": 2e-05}', [(3, "loss", 1.5, None, "jsonl"), (3, "lr", 2e-05, None, "jsonl")]),
    (
        '{"step": 4, "loss": 2, "note": "warmup", "ok": true, "x": null, "nested": {"a": 1}, "lst": [1]}',
        [(4, "loss", 2.0, None, "jsonl")],
    ),
    ('{"step": 5, "loss": NaN, "gn": Infinity, "m": -Infinity}',
     [(5, "loss", NAN, None, "jsonl"), (5, "gn", INF, None, "jsonl"), (5, "m", -INF, None, "jsonl")]),
    ('{"step": 6, "loss": "nan", "lr": "inf"}', [(6, "loss", NAN, None, "jsonl"), (6, "lr", INF, None, "jsonl")]),
    ('{"loss": 1.0, "step": 7.0}', [(7, "loss", 1.0, None, "jsonl")]),
    ('{"step": 8}', []),
]


@pytest.mark.parametrize("line,want", JSONL)
def test_jsonl_line(line, want):
    assert_points(parse_jsonl_line(line), want)


@pytest.mark.parametrize("bad", ['{"loss": 1.0}', "[1, 2]", '{"step": "3", "loss": 1}', "{bad json",
                                 '{"step": true, "loss": 1}', '{"step": 2.5, "loss": 1}'])
def test_jsonl_malformed(bad):
    assert parse_jsonl_line(bad) is None
    points, parser = parse_text('{"step": 1, "loss": 0.5}\n' + bad + "\n", strict=True)
    assert_points(points, [(1, "loss", 0.5, None, "jsonl")])
    assert parser.stats.malformed == 1


# -- progress bar -----------------------------------------------------------------------------

PROGRESS = [
    ("1|10|Loss: 11.97315: 100%|####| 10/10 [00:11<00:00,  1.12s/it]", (1, 10, 11.97315)),
    ("2|105|Loss: nan:  50%|#####     | 5/10 [00:05<00:05,  1.00it/s]", (2, 105, NAN)),
    ("1|3|Loss: 2.5", (1, 3, 2.5)),
    ("[rank0]: 1|3|Loss: 2.5:  30%|###       | 3/10 [00:03<00:07,  1.00s/it]", (1, 3, 2.5)),
    ("1|4|Loss: tensor(2.25, device='cuda:0'):  40%|####      | 4/10 [00:04<00:06]", (1, 4, 2.25)),
    ("\x1b[?25l\x1b[36m3|7|Loss: 1.5e-01\x1b[0m:  70%|███████   | 7/10 [00:07<00:03]", (3, 7, 0.15)),
]


@pytest.mark.parametrize("line,want", PROGRESS)
def test_progress(line, want):
    info = parse_progress(line)
    assert info is not None
    assert (info.epoch, info.step) == want[:2] and same(info.loss, want[2])
    assert "\x1b" not in info.text
    points, parser = parse_text(line + "\n")
    assert_points(points, [(want[1], "loss", want[2], want[0], "progress")])
    assert parser.latest_progress == info.text


@pytest.mark.parametrize("line", ["Loss: 2.5", "Epoch 1|Loss: 2.0", "1|x|Loss: 2.0", "12|Loss: 1.0",
                                  "Tokenizing: 45%|####| 9/20 [00:01<00:02, 4.5it/s]"])
def test_not_progress(line):
    assert parse_progress(line) is None
    assert parse_text(line + "\n")[0] == []


def test_progress_redraws_with_carriage_returns():
    bar = " {p}%|{h}| {n}/4 [00:0{n}<00:00,  1.00it/s]"
    text = (
        "\x1b[?25l"
        + "\r1|1|Loss: 3.0:" + bar.format(p=25, h="#", n=1)
        + "\r1|2|Loss: 2.5:" + bar.format(p=50, h="##", n=2)
        + "\r1|2|Loss: 2.5:" + bar.format(p=50, h="##", n=2)
        + "\r2|3|Loss: 2.0:" + bar.format(p=75, h="###", n=3)
        + "\r2|4|Loss: inf:" + bar.format(p=100, h="####", n=4)
        + "\x1b[?25h\n"
        + "done\n"
    )
    lines: deque[str] = deque()
    points, parser = parse_text(text, lines=lines)
    assert_points(
        points,
        [(1, "loss", 3.0, 1, "progress"), (2, "loss", 2.5, 1, "progress"), (2, "loss", 2.5, 1, "progress"),
         (3, "loss", 2.0, 2, "progress"), (4, "loss", INF, 2, "progress")],
    )
    assert parser.latest_progress == "2|4|Loss: inf: 100%|####| 4/4 [00:04<00:00,  1.00it/s]"
    # the terminal shows only the last redraw
    assert list(lines) == ["2|4|Loss: inf: 100%|####| 4/4 [00:04<00:00,  1.00it/s]", "done"]


def test_generic_tqdm_bar_updates_progress_text_without_points():
    points, parser = parse_text("Tokenizing: 45%|####5     | 9/20 [00:01<00:02,  4.50it/s]\r")
    assert points == []
    assert parser.latest_progress == "Tokenizing: 45%|####5     | 9/20 [00:01<00:02,  4.50it/s]"


# -- Writing logs to ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "line,want",
    [
        ("Writing logs to /tmp/torchtune/llama3_2_1B/lora/logs/log_1732912345.txt",
         "/tmp/torchtune/llama3_2_1B/lora/logs/log_1732912345.txt"),
        ("Writing logs to out/logs/log_1.txt  ", "out/logs/log_1.txt"),
        ("[rank0]: Writing logs to /tmp/a/log_2.txt", "/tmp/a/log_2.txt"),
        ("\x1b[32mWriting logs to /tmp/my dir/log_3.txt\x1b[0m", "/tmp/my dir/log_3.txt"),
        ("Writing logs to", None),
        ("Writing config to /tmp/x.yaml", None),
    ],
)
def test_find_log_path(line, want):
    assert find_log_path(line) == want
    _, parser = parse_text(line + "\n")
    assert parser.log_path == want


# -- record splitting ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text,records,lines",
    [
        ("a\nb\n", ["a", "b"], ["a", "b"]),
        ("a\r\nb\r\n", ["a", "b"], ["a", "b"]),
        ("one\rtwo\rthree\n", ["one", "two", "three"], ["three"]),
        ("bar\r   \r\n", ["bar"], ["bar"]),  # tqdm's clearing blank redraw replaces nothing
        ("\n\n", [], ["", ""]),
        ("  \n", [], ["  "]),
        ("\x1b[31m\x1b[0m\rx\n", ["x"], ["x"]),
    ],
)
def test_splitter(text, records, lines):
    kept: list[str] = []
    s = RecordSplitter(lines=kept)
    assert s.feed(text) == records
    assert kept == lines


def test_splitter_cap_cuts_back_to_a_whole_field():
    kept: list[str] = []
    s = RecordSplitter(max_line_chars=40, lines=kept)
    line = "Step 3 | loss:1.25 lr:2e-05 tokens_per_second_per_gpu:57.812345 "
    # the first 40 characters end inside "tokens_per_second_per_gpu:..."
    assert s.feed(line + "\n") == ["Step 3 | loss:1.25 lr:2e-05"]
    points, _ = parse_text(line + "\n", strict=True, max_line_chars=40)
    assert_points(points, [(3, "loss", 1.25, None, "disklogger"), (3, "lr", 2e-05, None, "disklogger")])


def test_parse_file_streams(tmp_path):
    path = tmp_path / "log_1.txt"
    path.write_bytes(b"Step 1 | loss:2.5 lr:2e-05 \nStep 2 | loss:2.25 lr:2e-05 \nStep 3 | loss:2.0")
    batch, stats = parse_file(path, chunk_bytes=5)
    assert_points(
        list(batch),
        [(1, "loss", 2.5, None, "disklogger"), (1, "lr", 2e-05, None, "disklogger"),
         (2, "loss", 2.25, None, "disklogger"), (2, "lr", 2e-05, None, "disklogger"),
         (3, "loss", 2.0, None, "disklogger")],
    )
    assert (stats.records, stats.points, stats.malformed) == (3, 5, 0)


# -- property: the splitter and the plain fast path do not depend on chunking -------------------------

_run = st.builds(  # 16+ uniform DiskLogger lines: the column-wise path's input
    lambda start, n, v: "\n".join(f"Step {s} | loss:{v} lr:2e-05 " for s in range(start, start + n)),
    st.integers(0, 50),
    st.integers(14, 40),
    st.sampled_from(["1.5", "nan", "2e-05", "tensor(0.5)"]),
)
_prefix = st.sampled_from(["[default0]:", "[default1]:", "[rank0]: ", "[default0]:[rank0]: ", "[trainer2]:"])
_metric = st.one_of(
    st.builds(lambda s, v: f"Step {s} | loss:{v} lr:2e-05 ", st.integers(0, 50), st.sampled_from(["1.5", "nan", "2e-05"])),
    st.builds(lambda s: f'{{"step": {s}, "grad_norm": 0.5}}', st.integers(0, 50)),
    st.builds(lambda s: f"1|{s}|Loss: 2.5:  30%|###       | 3/10 [00:03<00:07,  1.00s/it]", st.integers(0, 50)),
)
_line = st.one_of(
    _run,
    st.builds(lambda s, v: f"Step {s} | loss:{v} lr:2e-05 ", st.integers(0, 50), st.sampled_from(["1.5", "nan", "2e-05"])),
    st.builds(lambda s: f"Step {s} | lr:2e-05 loss:1.5 ", st.integers(0, 50)),
    st.text(alphabet=st.sampled_from(list("ab |:Step01é✓")), max_size=12),
    st.sampled_from(["", "   ", "\x1b[31mred\x1b[0m", "x" * 45]),
    # torchrun --tee / excepthook prefixes, and a --tee line holding a cut piece and the next one
    st.builds(lambda p, m: p + m, _prefix, _metric),
    st.builds(lambda p, a, k, m: p + a[:k] + p + m, _prefix, _metric, st.integers(0, 40), _metric),
)
_sep = st.sampled_from(["\n", "\n", "\n", "\r", "\r\n"])


@settings(max_examples=100, deadline=None)
@given(
    parts=st.lists(st.tuples(_line, _sep), max_size=30),
    cuts=st.lists(st.integers(0, 30000), max_size=10),
    cap=st.sampled_from([4, 40, 64 * 1024]),
    maxlen=st.sampled_from([None, 0, 3]),
)
def test_splitter_and_plain_path_are_chunking_invariant(parts, cuts, cap, maxlen):
    text = "".join(a + b for a, b in parts)
    bounds = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})

    def lines_store():
        return deque(maxlen=maxlen) if maxlen is not None else []

    # reference: one feed(), record by record
    ref_lines = lines_store()
    ref = RecordSplitter(cap, ref_lines)
    ref_records = ref.feed(text) + ref.finish()
    ref_parser = LogParser(strict=False)
    ref_points = ref_parser.feed_records(ref_records)

    # chunked, through feed_plain()/parse_plain() as the follower does
    got_lines = lines_store()
    spl = RecordSplitter(cap, got_lines)
    parser = LogParser(strict=False)
    points = []
    for a, b in zip(bounds, bounds[1:]):
        records, plain = spl.feed_plain(text[a:b])
        points += parser.feed_records(records)
        points += list(parser.parse_plain(plain))
    points += parser.feed_records(spl.finish())

    key = [(p.step, p.name, repr(p.value), p.epoch, p.source) for p in points]
    assert key == [(p.step, p.name, repr(p.value), p.epoch, p.source) for p in ref_points]
    assert list(got_lines) == list(ref_lines)
    assert parser.stats == ref_parser.stats
    assert all(len(line) <= cap for line in got_lines)


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_markers_found_among_many_plain_lines(newline):
    # Blocks of plain INFO text are counted in bulk; a marker line inside one must still be seen.
    info = [f"INFO:torchtune.utils._logging:line {i}" for i in range(100)]
    lines = info[:40] + ["Writing logs to /tmp/run/log_5.txt"] + info[40:70] + [
        "Tokenizing: 45%|####5     | 9/20 [00:01<00:02,  4.50it/s]"] + info[70:]
    points, parser = parse_text(newline.join(lines) + newline)
    assert points == []
    assert parser.log_path == "/tmp/run/log_5.txt"
    assert parser.latest_progress == "Tokenizing: 45%|####5     | 9/20 [00:01<00:02,  4.50it/s]"
    assert (parser.stats.records, parser.stats.other, parser.stats.malformed) == (102, 102, 0)


# -- torch's line prefixes (torchrun --tee / --local-ranks-filter, the excepthook) ---------------

UNPREFIXED = [
    "Step 7 | loss:2.0853 lr:2e-05 tokens_per_second_per_gpu:57.8 ",  # DiskLogger / StdoutLogger
    "Step 3 | loss:tensor(0.4300, device='cuda:0', grad_fn=<DivBackward0>) lr:0.001 ",
    '{"step": 4, "loss": 1.5, "lr": 2e-05}',  # JSON lines
    "1|10|Loss: 11.97315: 100%|####| 10/10 [00:11<00:00,  1.12s/it]",  # the progress bar
    "Writing logs to /tmp/run/logs/log_17.txt",
]
PREFIXES = ["[default0]:", "[default3]:", "[rank1]: ", "[default1]:[rank1]: ", "[trainer0]:"]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("line", UNPREFIXED)
def test_every_form_parses_with_a_prefix(prefix, line):
    want, want_parser = parse_text(line + "\n")
    got, parser = parse_text(prefix + line + "\n")
    assert got == want and len(want) >= 1 or "Writing" in line
    assert (parser.log_path, parser.latest_progress) == (want_parser.log_path, want_parser.latest_progress)
    if line.startswith(("Step", "{")):  # a metric file too (tune-magic metrics --file)
        assert parse_text(prefix + line + "\n", strict=True)[0] == want


def test_prefixed_public_helpers():
    assert parse_disklogger_line("[default0]:Step 2 | loss:1.5 ") == [MetricPoint(2, "loss", 1.5)]
    assert parse_jsonl_line('[rank0]: {"step": 2, "loss": 1.5}') == [MetricPoint(2, "loss", 1.5, None, "jsonl")]
    assert parse_progress("[default0]:1|2|Loss: 1.5").text == "1|2|Loss: 1.5"
    assert strip_prefixes("[default1]:[rank1]:   File x") == (1, 1, "  File x")
    assert strip_prefixes("[rank3]: ValueError: x") == (3, None, "ValueError: x")
    assert strip_prefixes("[W1201 03:59:29.021000 10405 api.py:1028] x") == (None, None,
                                                                          "[W1201 03:59:29.021000 10405 api.py:1028] x")
    assert split_prefixed("[default0]:1|1|Loss: 9.0: 10%|#| 1/8 [00:00<00:00, 9.0it/s][default0]:Step 2 | ") == [
        ("[default0]:", "1|1|Loss: 9.0: 10%|#| 1/8 [00:00<00:00, 9.0it/s]"), ("[default0]:", "Step 2 | ")]
    assert split_prefixed("[default0]:[rank0]: Traceback") == [("[default0]:", "[rank0]: Traceback")]
    assert split_prefixed("plain") == []


def test_stdout_logger_line_cut_by_tee_keeps_lr():
    # torchrun's reader caught StdoutLogger's "Step 2 | loss:5.0 " before "lr:..." was written
    # (PYTHONUNBUFFERED: one write per print); the rest follows on the same physical line
    text = ("[default0]:Step 2 | loss:5.0 [default0]:lr:2e-05 tokens_per_second_per_gpu:102.0 \n"
            "[default0]:Step 3 | loss:3.5 [default1]:other rank\n[default0]:\n"
            "[default0]:1|3|Loss: 3.5:  38%|###8      | 3/8 [00:00<00:00, 29.78it/s][default0]:lr:1e-05 \n")
    points, _ = parse_text(text)
    assert_points(points, [(2, "loss", 5.0, None, "disklogger"), (2, "lr", 2e-05, None, "disklogger"),
                           (2, "tokens_per_second_per_gpu", 102.0, None, "disklogger"), (3, "loss", 3.5, 1, "progress"),
                           (3, "loss", 3.5, None, "disklogger"), (3, "lr", 1e-05, None, "disklogger")])


def test_line_glued_after_a_progress_bar_unprefixed():
    # stdout and stderr in one file: the bar has no line end until its next redraw
    text = "\r1|1|Loss: 10.0:  50%|#####     | 1/2 [00:00<00:00, 10922.67it/s]Step 2 | loss:5.0 lr:2e-05 \n"
    points, parser = parse_text(text)
    assert_points(points, [(1, "loss", 10.0, 1, "progress"), (2, "loss", 5.0, None, "disklogger"),
                           (2, "lr", 2e-05, None, "disklogger")])
    assert parser.latest_progress == "1|1|Loss: 10.0:  50%|#####     | 1/2 [00:00<00:00, 10922.67it/s]"


def test_other_ranks_piece_glued_in_a_block_of_prefixed_lines():
    # a block long enough for the fast paths (parse: 16+ records; parse_plain: a run), every line
    # [default0]:, one with rank 1's bar glued after rank 0's: that bar is a piece of its own
    bar = "0%|| 0/100 [00:01<00:02,  1.00it/s]"
    records = [f"[default0]:Step {s} | loss:{s}.5 " for s in range(1, 21)]
    records[4] = f"[default0]:1|5|Loss: 5.5:   {bar}[default1]:1|6|Loss: 9.0:   {bar}"
    want = [(s, "loss", s + 0.5, None, "disklogger") for s in range(1, 21)]
    want[4:5] = [(5, "loss", 5.5, 1, "progress"), (6, "loss", 9.0, 1, "progress")]
    for read in (LogParser.parse, LogParser.parse_plain):
        parser = LogParser()
        arg = records if read is LogParser.parse else "\n".join(records)
        assert_points(read(parser, arg).points(), want)
        assert parser.latest_progress == f"1|6|Loss: 9.0:   {bar}"


def _steps(n: int = 8) -> list[tuple]:
    """What capture_worker.py's metrics mode prints per step (loss 10/step, lr 2e-05,
    tokens_per_second_per_gpu 100+step, grad_norm 0.5*step)."""
    out = []
    for s in range(1, n + 1):
        out += [(s, "loss", 10.0 / s, None, "disklogger"), (s, "lr", 2e-05, None, "disklogger"),
                (s, "tokens_per_second_per_gpu", 100.0 + s, None, "disklogger"), (s, "grad_norm", 0.5 * s, None, "jsonl")]
    return out


@pytest.mark.parametrize("name", ["tee3_metrics", "tee3_filter0_metrics", "filter0_metrics"])
def test_captured_tee_and_rank_filter_logs(name):
    # real torchrun --tee 3 / --tee 3 --local-ranks-filter 0 / --local-ranks-filter 0 runs, 8 steps
    text = (DATA / f"{name}.log").read_text()
    points, parser = parse_text(text)
    metric = sorted((p for p in points if p.source != "progress"), key=lambda p: (p.step, p.source, p.name))
    assert_points(metric, sorted(_steps(), key=lambda w: (w[0], w[4], w[1])))
    progress = [p for p in points if p.source == "progress"]
    assert {p.step for p in progress} == set(range(1, 9))
    assert all(p.value == 10.0 / p.step and p.epoch == 1 for p in progress)
    assert parser.latest_progress.startswith("1|8|Loss: 1.25: 100%|")
    assert parser.log_path.endswith(".txt") and "Writing" not in parser.log_path


# -- property: torchrun --tee's interleaving loses nothing ------------------------------------------


def _tee(writes: list[tuple[str, str, str]], reads: list[bool]) -> str:
    """What torchrun's --tee console shows for a program's writes (prefix, stream, text).

    Models torch.distributed.elastic.multiprocessing.tail_log: one reader per (prefix, stream)
    file, reading with universal newlines at the moments ``reads`` says (after each write, for
    every file in turn) and writing prefix + each line it read, the last one unterminated when
    it was still being written. A trailing "\r" waits for the next read (it may be "\r\n").
    """
    bufs: dict[tuple[str, str], str] = {}
    out: list[str] = []
    moments = iter(reads)

    def read(key, final=False):
        text = bufs.get(key, "")
        held = "" if final or not text.endswith("\r") else "\r"
        text = text[: len(text) - len(held)]
        bufs[key] = held
        for line in text.replace("\r\n", "\n").replace("\r", "\n").splitlines(keepends=True):
            out.append(key[0] + line)

    for prefix, stream, text in writes:
        bufs[(prefix, stream)] = bufs.get((prefix, stream), "") + text
        for key in list(bufs):
            if next(moments, True):
                read(key)
    for key in list(bufs):
        read(key, final=True)
    return "".join(out)


@st.composite
def _programs(draw, prefix):
    """A torchtune recipe's writes on one rank: StdoutLogger lines (one write per print, as with
    PYTHONUNBUFFERED), JSON lines, the tqdm bar (each redraw one write starting with \\r) and
    logging records on stderr."""
    steps = draw(st.integers(1, 5))
    w = [(prefix, "err", "INFO:torchtune.utils._logging:Writing logs to /tmp/logs/log_1.txt\n")]
    w.append((prefix, "err", f"\r  0%|          | 0/{steps} [00:00<?, ?it/s]"))
    for step in range(1, steps + 1):
        loss = draw(st.sampled_from(["2.5", "1e-3", "nan", "11.97315"]))
        w.append((prefix, "out", f"Step {step} | "))
        for k in draw(st.lists(st.sampled_from(["loss", "lr", "tokens_per_second_per_gpu"]), min_size=1,
                               max_size=3, unique=True)):
            w.append((prefix, "out", f"{k}:{loss if k == 'loss' else '2e-05'} "))
        w.append((prefix, "out", "\n"))
        if draw(st.booleans()):
            w += [(prefix, "out", f'{{"step": {step}, "grad_norm": {step}.5}}'), (prefix, "out", "\n")]
        w.append((prefix, "err", f"\r1|{step}|Loss: {loss}: {100 * step // steps:3d}%|##| {step}/{steps} "
                                 f"[00:0{step}<00:00,  1.00it/s]"))
    w.append((prefix, "err", "\n"))
    if draw(st.booleans()):
        w.append((prefix, "err", "INFO:torchtune.utils._logging:Saving checkpoint\n"))
    return w


@settings(max_examples=150, deadline=None)
@given(programs=st.one_of(st.tuples(_programs("[default0]:")), st.tuples(_programs("[default0]:"), _programs("[default1]:"))),
       order=st.randoms(use_true_random=False),
       reads=st.lists(st.booleans(), max_size=200))
def test_tee_interleaving_gives_the_points_of_each_stream(programs, order, reads):
    # the ranks run at once: their writes interleave in any order, each rank's in its own order
    queues = [list(p) for p in programs]
    writes = []
    while any(queues):
        q = order.choice([q for q in queues if q])
        writes.append(q.pop(0))
    teed = _tee(writes, reads)
    want = []
    for stream in {(p, s) for p, s, _ in writes}:
        want += parse_text("".join(t for p, s, t in writes if (p, s) == stream))[0]
    got = parse_text(teed)[0]

    def key(points):
        return sorted((p.step, p.name, repr(p.value), p.epoch or 0, p.source) for p in points)

    assert key(got) == key(want), teed
