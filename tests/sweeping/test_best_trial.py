"""The best trial of a sweep is one answer in every view, on a tie too: ``Sweep.best()``, the watcher's
snapshot (the card and ``jobs --sweep``), ``tune-magic sweeps`` and its ``--json``, ``jobs --sweep --json``.

Two finished trials end at the same final loss (1.0); trial 1's lowest loss (0.5) is below trial 0's
(0.9), so trial 1 is best by the measure (ties broken by the lowest minimum loss). The logs are
progress bars written by hand in torchtune 0.6.1's format (no job runs here)."""

from __future__ import annotations

import json

import pytest

from tune_magic.registry import store as jobstore
from tune_magic.sweeping import store as sweepstore
from tune_magic.registry.store import JobRecord
from tune_magic.sweeping.record import STARTED, SweepRecord, TrialState
from tune_magic.sweeping.sweep import Sweep

SWEEP_ID = "sweep-20261201-100000-abcdef"
LOSSES = {0: [2.0, 0.9, 1.0], 1: [2.0, 0.5, 1.0], 2: [3.0, 2.0, 1.5]}


def _bar(step: int, loss: float, total: int = 3) -> str:
    return f"1|{step}|Loss: {loss}: {100 * step // total}%|###  | {step}/{total} [00:01<00:01,  1.00it/s]"


@pytest.fixture
def tied_sweep(job_registry):
    home = job_registry.parent
    ids = {i: f"20261201-10000{i}-aaaaa{i}" for i in LOSSES}
    for i, losses in LOSSES.items():
        d = job_registry / ids[i]
        d.mkdir()
        log = d / "output.log"
        log.write_text("\r".join(_bar(s, v) for s, v in enumerate(losses, 1)) + "\n")
        jobstore.write_record(d, JobRecord(
            id=ids[i], name=f"lr={i}", argv=["python", "x.py"], env={}, cwd=str(home), started_at=1.0, ended_at=61.0,
            log_path=str(log), status="succeeded", returncode=0,
            sweep={"id": SWEEP_ID, "trial": i, "name": "tie"}))
    d = sweepstore.sweeps_root(create=True) / SWEEP_ID
    d.mkdir()
    sweepstore.write(d, SweepRecord(
        id=SWEEP_ID, name="tie", created_at=1.0, cwd=str(home), stop_requested_at=2.0,
        args=["x.py", "lr=0,1,2"], axes=[{"key": "lr", "texts": ["0", "1", "2"], "position": 1}],
        trials=[TrialState(index=i, name=f"lr={i}", words=[f"lr={i}"], status=STARTED, job_id=ids[i], started_at=1.0)
                for i in LOSSES], slots=[None]))
    sweepstore.mark_done(d)
    return Sweep(d)


def test_every_view_names_the_same_best_trial_on_a_tie(tied_sweep, capsys):
    from tune_magic.ui import cli
    from tune_magic.ui.snapshot import table_text
    from tune_magic.ui.watch import SweepWatcher

    best = tied_sweep.best()
    assert (best.trial.index, best.final_loss, best.min_loss, best.steps) == (1, 1.0, 0.5, 3)
    snap = SweepWatcher(tied_sweep).poll_once()
    assert snap.best == 1
    assert "* best: trial 1 (lr=1), final loss 1 (best by final loss: the lowest final loss" in table_text(snap)
    assert "VAL_LOSS" not in table_text(snap)  # no trial validates: no column for it

    capsys.readouterr()
    assert cli.main(["sweeps", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["best"] == {"trial": 1, "final_loss": 1.0, "min_loss": 0.5, "best_val_loss": None,
                              "ranked_by": "final_loss"}
    assert (listed["ranked_by"], listed["ranking"], listed["ranking_note"]) == ("final_loss", "best by final loss", None)
    assert cli.main(["sweeps"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith(SWEEP_ID)]
    assert "1 final loss (trial 1)" in row
    assert cli.main(["jobs", "--sweep", SWEEP_ID, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["best"] == 1
    assert cli.main(["jobs", "--sweep", SWEEP_ID]) == 0
    assert "* best: trial 1 (lr=1)" in capsys.readouterr().out


def test_the_summary_keeps_the_lowest_loss_of_the_source_it_reports(tmp_path):
    """The summary's ``min_loss`` (what the ranking reads) is the lowest finite loss of the metric
    file once it has losses, else of the progress bar; ``nan`` is never the lowest."""
    from tune_magic.logs.summary import SummaryTracker

    log = tmp_path / "output.log"
    log.write_text("\r".join([_bar(1, 2.0), _bar(2, float("nan")), _bar(3, 0.7)]) + "\n")
    rec = JobRecord(id="j", name="j", argv=["x"], env={}, cwd=str(tmp_path), log_path=str(log), started_at=1.0)
    tracker = SummaryTracker(rec)
    tracker.advance(final=True)
    assert (tracker.summary.step, tracker.summary.loss, tracker.summary.min_loss) == (3, 0.7, 0.7)
    with log.open("a") as f:  # the run's own metric lines (as a DiskLogger prints them to stdout) win
        f.write("Step 1 | loss:1.25 lr:0.001 \nStep 2 | loss:nan lr:0.001 \nStep 3 | loss:1.5 lr:0.001 \n")
    tracker.advance(final=True)
    assert (tracker.summary.loss, tracker.summary.min_loss) == (1.5, 1.25)


def test_a_sweep_is_named_by_its_id_or_name_in_the_magics_and_the_cli_alike(tied_sweep, ip, capsys):
    """Issue 27: one rule for what a command names (tune_magic.ui.targets): %tune_logs and
    tune-magic logs take the sweep by its id or its name, and show the same table of trials."""
    from tune_magic.ui import cli
    from tune_magic.ui.cards import SweepCard
    from tune_magic.ui.targets import find, is_sweep

    assert is_sweep(SWEEP_ID) and is_sweep("tie") and not is_sweep("lr=1")
    assert find("tie").id == SWEEP_ID and find("lr=1").id == "20261201-100001-aaaaa1"
    capsys.readouterr()
    for spec in (SWEEP_ID, "tie"):
        shown = ip.run_line_magic("tune_logs", spec)
        assert shown.id == SWEEP_ID
        assert cli.main(["logs", spec]) == 0
        out = capsys.readouterr().out
        assert f"sweep tie ({SWEEP_ID}): finished, 3 trials" in out and "* best: trial 1 (lr=1)" in out
    card = SweepCard(tied_sweep, watch=False)
    try:
        card.update(card.watcher.poll_once())
        bundle = card._repr_mimebundle_()
        assert bundle["text/plain"].startswith(f"sweep tie ({SWEEP_ID}): finished")
        assert f"see sweep {SWEEP_ID} again with %tune_logs {SWEEP_ID}" in bundle["text/plain"]
    finally:
        card.close()
    assert cli.main(["logs", "--error", "tie"]) == 2
    assert f"{SWEEP_ID} is a sweep" in capsys.readouterr().err
