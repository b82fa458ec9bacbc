"""The sweep card's widgets from a snapshot (no job runs here): the trial table, one chart for every
curve, the best trial marked, the Stop button, the text form; and a trial's name in the jobs table."""

from __future__ import annotations

import math
import threading

import pytest

from tune_magic.sweeping import store as sweepstore
from tune_magic.sweeping.record import SweepRecord, TrialState
from tune_magic.sweeping.sweep import Sweep
from tune_magic.ui.cards import SweepCard
from tune_magic.ui.charts import PALETTE, trial_colours
from tune_magic.ui.snapshot import table_text
from tune_magic.ui.snapshot import SweepSnapshot, TrialRow

SWEEP_ID = "sweep-20261201-100000-abcdef"


@pytest.fixture
def sweep(tmp_path):
    """A sweep record on disk, stopped (so no sweep process is ever started for it)."""
    d = tmp_path / SWEEP_ID
    d.mkdir()
    words = [("1e-3", "1"), ("1e-3", "2"), ("2e-3", "1"), ("2e-3", "2")]
    sweepstore.write(d, SweepRecord(
        id=SWEEP_ID, name="lr-grid", created_at=1.0, cwd=str(tmp_path), stop_requested_at=2.0,
        args=["lora_finetune", "--config", "tiny/lora", "optimizer.lr=1e-3,2e-3", "seed=1,2"],
        axes=[{"key": "optimizer.lr", "texts": ["1e-3", "2e-3"], "position": 3},
              {"key": "seed", "texts": ["1", "2"], "position": 4}],
        trials=[TrialState(index=i, name=f"lr={lr},seed={s}", words=[f"optimizer.lr={lr}", f"seed={s}"])
                for i, (lr, s) in enumerate(words)], slots=[None, None]))
    return Sweep(d)


def snapshot(status="running", best=1) -> SweepSnapshot:
    rows = (
        TrialRow(0, "lr=1e-3,seed=1", (("optimizer.lr", "1e-3"), ("seed", "1")), "succeeded", "20261201-100001-aaaaaa",
                 3, 2.5, 2.4, 65.0, steps=(1, 2, 3), losses=(3.0, 2.4, 2.5)),
        TrialRow(1, "lr=1e-3,seed=2", (("optimizer.lr", "1e-3"), ("seed", "2")), "running", "20261201-100002-bbbbbb",
                 2, 2.0, 2.0, 30.0, steps=(1, 2), losses=(2.9, 2.0)),
        TrialRow(2, "lr=2e-3,seed=1", (("optimizer.lr", "2e-3"), ("seed", "1")), "queued",
                 note="GPU 0 is used by running job x"),
        TrialRow(3, "lr=2e-3,seed=2", (("optimizer.lr", "2e-3"), ("seed", "2")), "queued"),
    )
    return SweepSnapshot(sweep_id=SWEEP_ID, name="lr-grid", status=status, keys=("optimizer.lr", "seed"),
                         max_parallel=2, slots=(None, None), rows=rows, best=best)


def test_the_card_shows_a_row_per_trial_one_chart_and_the_best_trial(sweep):
    card = SweepCard(sweep, watch=False)
    assert not card.watcher._thread  # nothing follows the sweep unless asked
    card.update(snapshot())
    table = card.table.value
    assert table.count("<tr class='tm-trial") == 4
    assert "<th>lr</th><th>seed</th>" in table  # short axis names
    assert "tm-best' data-trial='1'" in table and table.count("tm-best") == 1
    assert table.count(">queued</span>") == 2 and "GPU 0 is used by running job x" in table
    assert "2 running" not in card.header.value and "1 running" in card.header.value and "2 queued" in card.header.value
    # one Lines mark: a row per trial that logged a loss, NaN-padded to one length, one colour each
    assert card.chart.layout.display is None
    assert card.curves.colors == [PALETTE[0], PALETTE[1]]
    assert card.curves.labels == ["lr=1e-3,seed=1", "lr=1e-3,seed=2"]
    x, y = card.curves.x.tolist(), card.curves.y.tolist()
    assert x[0] == [1.0, 2.0, 3.0] and x[1][:2] == [1.0, 2.0] and math.isnan(x[1][2]) and math.isnan(y[1][2])
    assert (card.best_mark.x.tolist(), card.best_mark.y.tolist(), card.best_mark.visible) == ([2.0], [2.0], True)
    assert list(card.x_axis.tick_values) == [1, 2, 3]
    assert "lr=1e-3,seed=2 ◆ best" in card.legend.value
    assert card.stop_button.layout.display is None and not card.stop_button.disabled
    card.update(snapshot(status="finished", best=0))
    assert card.stop_button.layout.display == "none"
    assert card.best_mark.x.tolist() == [3.0] and "tm-best' data-trial='0'" in card.table.value
    card.close()


def test_text_form_lists_every_trial_and_says_which_is_best_and_why():
    text = table_text(snapshot())
    lines = text.splitlines()
    assert lines[0] == (f"sweep lr-grid ({SWEEP_ID}): running, 4 trials, 2 at a time: 1 succeeded, 1 running, "
                        "2 queued")
    assert lines[1].split() == ["TRIAL", "LR", "SEED", "STATUS", "STEP", "LOSS", "BEST", "LOSS", "ELAPSED", "JOB"]
    assert lines[3].split()[:6] == ["1*", "1e-3", "2", "running", "2", "2"]
    assert lines[4].split() == ["2", "2e-3", "1", "queued", "-", "-", "-", "-", "-"]
    assert lines[-1] == ("* best: trial 1 (lr=1e-3,seed=2), final loss 2 (best by final loss: the lowest final loss; "
                         "ties: lowest minimum loss)")


def test_opening_a_queued_trials_card_says_it_has_not_started(sweep):
    card = SweepCard(sweep, watch=False)
    assert card.open_trial(2) is None
    assert "trial 2 has not started" in card.trial_card.children[0].value
    assert [o[1] for o in card.trial_picker.options] == [0, 1, 2, 3]
    card.close()


def test_the_watcher_thread_only_sets_traits_and_ends_with_the_sweep(sweep):
    seen = []
    card = SweepCard(sweep, watch=False)
    card.watcher.sink = lambda snap: (seen.append(threading.current_thread().name), card.update(snap))
    card.watcher.start().join(10)
    assert seen and all(name == f"tune_magic-sweep-{SWEEP_ID}" for name in seen)
    assert card.snapshot.status == "stopped" and card.watcher.done  # stopped before any trial started
    assert [r.status for r in card.snapshot.rows] == ["cancelled"] * 4
    card.close()


def test_trial_colours_are_distinct():
    for n in (1, 4, 10, 11, 64):
        colours = trial_colours(n)
        assert len(colours) == n == len(set(colours))
