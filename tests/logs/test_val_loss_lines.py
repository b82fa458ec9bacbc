"""``val_loss`` lines (issue 28) read as ``val_loss`` points at their step, the ``loss`` series untouched.

Real output in ``tests/data/val_loss/`` (see its README row): tune_magic's full_finetune with
``run_val_every_n_steps=3`` on 2 processes, and validate_checkpoint.py on that run's epoch_1. The
forms of torchtune's later recipes (after 0.6.1; ``validate()`` calls
``self._metric_logger.log_dict({"val_loss": v}, step=self.global_step)``, pytorch/torchtune
recipes/lora_finetune_distributed.py) are written below from its DiskLogger's code
(torchtune/training/metric_logging.py on main: ``txt`` is 0.6.1's line, ``jsonl`` is
``json.dump({"step": step} | payload)``). Expected values are copied from the files by hand.
"""

from __future__ import annotations

import pytest

from jobhelpers import DATA
from tune_magic.logs.metricstore import MetricStore
from tune_magic.logs.parse import LogParser
from tune_magic.logs.points import MetricPoint
from tune_magic.logs.readers import parse_file, parse_text

VAL = DATA / "val_loss"
# the run's val_loss lines: every 3 steps and at the epoch ends 4, 8, 12 (12 once)
VAL_POINTS = {3: 5.742932894998345, 4: 5.503184882077304, 6: 5.084752208930402, 8: 4.8033151784219035,
              9: 4.72434149891877, 12: 4.633189512678414}
LOSS_AT = {3: 5.96931266784668, 4: 5.672341346740723, 8: 4.9273786544799805, 12: 4.602355003356934}


def by_name(points, name: str) -> dict[int, float]:
    got = [(p.step, p.value) for p in points if p.name == name]
    assert len(got) == len({s for s, _ in got}), got
    return dict(got)


def test_the_metric_file_gives_val_loss_points_and_an_untouched_loss_series():
    batch, stats = parse_file(VAL / "full_2proc_metrics.txt")  # 18 lines: tried on the column-wise path first
    points = list(batch)
    assert stats.malformed == 0 and stats.bad_fields == 0
    assert {p.name for p in points} == {"loss", "lr", "tokens_per_second_per_gpu", "val_loss"}
    assert by_name(points, "val_loss") == VAL_POINTS
    loss = by_name(points, "loss")
    assert sorted(loss) == list(range(1, 13))
    assert {s: loss[s] for s in LOSS_AT} == LOSS_AT
    assert all(p.source == "disklogger" and p.epoch is None for p in points)


def test_a_val_loss_line_changes_no_loss_point_in_the_store():
    store = MetricStore()
    batch, _ = parse_file(VAL / "full_2proc_metrics.txt")
    store.add_batch(batch)
    store.take_changes()
    loss_before = store.series("loss", None)
    # a later val_loss-only line for step 4, which has a training line: only val_loss changes
    store.add_points(LogParser(strict=True).feed_records(["Step 4 | val_loss:5.5 "]))
    assert store.take_changes() == [MetricPoint(4, "val_loss", 5.5, None, "disklogger")]
    assert store.series("loss", None) == loss_before
    assert store.series("val_loss", None).steps == [3, 4, 6, 8, 9, 12]
    assert store.last("loss") == MetricPoint(12, "loss", 4.602355003356934, None, "disklogger")


def test_the_training_console_log_gives_only_the_progress_bar_loss():
    # rank 0's tqdm bar and the "Validation loss: 5.5032" INFO lines glued after it: no val_loss point
    # (that is in the metric file), no loss point from the INFO line
    points, parser = parse_text((VAL / "full_2proc_output.log").read_text())
    assert {p.name for p in points} == {"loss"}
    assert all(p.source == "progress" for p in points)
    loss = {p.step: p.value for p in points}
    assert sorted(loss) == list(range(1, 13)) and {s: loss[s] for s in LOSS_AT} == LOSS_AT
    assert parser.log_path.endswith("/out/logs/log_1796469400.txt")


def test_the_evaluation_recipe_output_is_one_val_loss_point_at_its_step():
    points, parser = parse_text((VAL / "validate_checkpoint_output.log").read_text())
    assert points == [MetricPoint(8, "val_loss", 4.803314981381755, None, "disklogger")]
    assert parser.log_path.endswith("/val/epoch_1/logs/log_1796469404.txt")
    batch, _ = parse_file(VAL / "validate_checkpoint_metrics.txt")
    assert list(batch) == points


@pytest.mark.parametrize("line,source", [
    ("Step 12 | val_loss:4.633189512678414 ", "disklogger"),  # DiskLogger/StdoutLogger log_dict (txt)
    ("Step 12 | val_loss:4.633189512678414", "disklogger"),  # DiskLogger.log (one metric, no trailing space)
    ('{"step": 12, "val_loss": 4.633189512678414}', "jsonl"),  # DiskLogger(output_fmt="jsonl"), main
])
def test_torchtune_later_recipes_val_loss_forms(line, source):
    for strict in (True, False):
        got = LogParser(strict=strict).feed_record(line)
        assert got == [MetricPoint(12, "val_loss", 4.633189512678414, None, source)]


def test_the_validation_info_line_is_no_metric():
    parser = LogParser(strict=False)
    assert parser.feed_record("INFO:torchtune.utils._logging:Validation loss: 4.6332") == []
    assert parser.stats.other == 1
