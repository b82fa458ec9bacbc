"""A sweep whose trials validate is ranked by validation loss, in every view, by one function
(issue 28): ``Sweep.best()``, ``Sweep.frame()``, the watcher's snapshot and its text (the card and
``jobs --sweep``), the card's HTML, ``tune-magic sweeps`` and its ``--json``, ``jobs --sweep --json``.
When a ranked trial has no validation loss, or evaluations of its checkpoints are still to finish,
every view ranks by final loss and says so.

No job runs here: the trials' logs are torchtune 0.6.1's progress bars and the ``Step N |
val_loss:X `` lines a DiskLogger prints (tune_magic's recipes validating in their loop), written by
hand; the evaluations of a trial that validates by checkpoints are records and ``val_loss.json``
files as the keeper and ``recipes/validate_checkpoint.py`` write them.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from types import SimpleNamespace

import pytest

from tune_magic.registry import store as jobstore
from tune_magic.registry.store import JobRecord
from tune_magic.sweeping import store as sweepstore
from tune_magic.sweeping.record import STARTED, SweepRecord, TrialState
from tune_magic.sweeping.results import BY_FINAL_LOSS, BY_VAL_LOSS, TrialResult, rank
from tune_magic.sweeping.sweep import Sweep

from ckptfolders import write_epoch

SWEEP_ID = "sweep-20261202-100000-abcdef"
NAN = float("nan")
IN_LOOP = {"mode": "in_loop", "every_n_steps": None}
CHECKPOINTS = {"mode": "checkpoints", "every_n_steps": None}


def _bar(step: int, loss: float, total: int = 3) -> str:
    return f"1|{step}|Loss: {loss}: {100 * step // total}%|###  | {step}/{total} [00:01<00:01,  1.00it/s]"


def _job(root, job_id: str, *, losses, val=(), validation=IN_LOOP, status="succeeded", trial=None, **fields) -> JobRecord:
    """A job's directory: its log (the bars, then one ``Step N | val_loss:X `` line per val point), its record."""
    d = root / job_id
    d.mkdir()
    log = d / "output.log"
    text = "\r".join(_bar(s, v) for s, v in enumerate(losses, 1)) + "\n"
    log.write_text(text + "".join(f"Step {s} | val_loss:{v} \n" for s, v in val))
    record = JobRecord(id=job_id, name=job_id, argv=["python", "x.py"], env={}, cwd=str(root.parent), started_at=1.0,
                       ended_at=61.0, log_path=str(log), status=status, returncode=0 if status == "succeeded" else 1,
                       validation=validation, **fields,
                       **({"sweep": {"id": SWEEP_ID, "trial": trial, "name": "val"}} if trial is not None else {}))
    jobstore.write_record(d, record)
    return record


def _sweep(root, trials: dict) -> Sweep:
    """A finished sweep of lr=0..n-1 over the jobs ``trials`` (index -> job id)."""
    n = len(trials)
    d = sweepstore.sweeps_root(create=True) / SWEEP_ID
    d.mkdir()
    sweepstore.write(d, SweepRecord(
        id=SWEEP_ID, name="val", created_at=1.0, cwd=str(root.parent), stop_requested_at=None,
        args=["x.py", "lr=" + ",".join(map(str, range(n)))],
        axes=[{"key": "lr", "texts": [str(i) for i in range(n)], "position": 1}],
        trials=[TrialState(index=i, name=f"lr={i}", words=[f"lr={i}"], status=STARTED, job_id=trials[i], started_at=1.0)
                for i in range(n)], slots=[None]))
    sweepstore.mark_done(d)
    return Sweep(d)


def _ids(n: int) -> dict[int, str]:
    return {i: f"20261202-10000{i}-bbbbb{i}" for i in range(n)}


# trial 0: the lowest final loss among those that succeeded; trial 1: the lowest validation loss;
# trial 2: a NaN validation loss (validated, never best); trial 3 failed early with the lowest values of all
FINALS = {0: [2.0, 1.2, 1.0], 1: [2.0, 1.8, 1.6], 2: [2.0, 1.4, 1.3], 3: [0.1]}
VALS = {0: [(3, 3.0)], 1: [(2, 2.75), (3, 2.5)], 2: [(3, NAN)], 3: [(1, 0.05)]}


@pytest.fixture
def val_sweep(job_registry):
    ids = _ids(4)
    for i in FINALS:
        _job(job_registry, ids[i], losses=FINALS[i], val=VALS[i], trial=i, status="failed" if i == 3 else "succeeded")
    return _sweep(job_registry, ids)


def views(sweep: Sweep, capsys) -> dict:
    """What every view says: {view: (best trial, measure, note)}, plus their texts."""
    from tune_magic.ui import cli
    from tune_magic.ui.cards import SweepCard
    from tune_magic.ui.snapshot import table_text
    from tune_magic.ui.watch import SweepWatcher

    out = {}
    best = sweep.best()
    ranking = sweep.ranking()
    out["best()"] = (best.trial.index, best.ranked_by, ranking.note)
    df = sweep.frame()
    out["frame"] = (df.attrs["best"], df.attrs["ranked_by"], df.attrs["note"])
    snap = SweepWatcher(sweep).poll_once()
    out["snapshot"] = (snap.best, snap.ranked_by, snap.ranking_note)
    card = SweepCard(sweep, watch=False)
    try:
        card.update(card.watcher.poll_once())
        out["card.html"], out["card.text"] = card.table.value, card.text()
    finally:
        card.close()
    capsys.readouterr()
    assert cli.main(["sweeps", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    out["sweeps --json"] = (listed["best"]["trial"], listed["ranked_by"], listed["ranking_note"])
    out["sweeps.best"] = listed["best"]
    assert cli.main(["sweeps"]) == 0
    got = capsys.readouterr()
    (out["sweeps.row"],) = [line for line in got.out.splitlines() if line.startswith(SWEEP_ID)]
    out["sweeps.err"] = got.err
    assert cli.main(["jobs", "--sweep", SWEEP_ID, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    out["jobs --sweep --json"] = (listed["best"], listed["ranked_by"], listed["ranking_note"])
    out["jobs.trials"] = listed["trials"]
    assert cli.main(["jobs", "--sweep", SWEEP_ID]) == 0
    out["jobs.text"] = capsys.readouterr().out
    out["frame.df"], out["table_text"] = df, table_text(snap)
    return out


SAME = ("best()", "frame", "snapshot", "sweeps --json", "jobs --sweep --json")


def test_every_view_ranks_by_validation_loss_when_every_trial_has_one(val_sweep, capsys):
    v = views(val_sweep, capsys)
    assert {v[k] for k in SAME} == {(1, BY_VAL_LOSS, None)}, {k: v[k] for k in SAME}
    best = val_sweep.best()
    assert (best.best_val_loss, best.val_step, best.value, best.final_loss) == (2.5, 3, 2.5, 1.6)
    df = v["frame.df"]
    assert df.attrs["ranking"] == "best by val_loss"
    assert df["best_val_loss"].tolist()[:2] == [3.0, 2.5] and math.isnan(df.loc[2, "best_val_loss"])
    assert df.loc[3, "best_val_loss"] == 0.05  # the failed trial's own value; it is not ranked
    assert df.loc[1, "best_val_loss"] == df.loc[df["status"] == "succeeded", "best_val_loss"].min()
    assert v["sweeps.best"] == {"trial": 1, "final_loss": 1.6, "min_loss": 1.6, "best_val_loss": 2.5,
                                "ranked_by": "val_loss"}
    assert "2.5 val_loss (trial 1)" in v["sweeps.row"] and "ranking" not in v["sweeps.err"]
    assert [t["best_val_loss"] for t in v["jobs.trials"]] == [3.0, 2.5, None, 0.05]
    for text in (v["table_text"], v["card.text"], v["jobs.text"]):
        assert "* best: trial 1 (lr=1), val_loss 2.5 (best by val_loss: the lowest validation loss)" in text, text
        assert "BEST VAL_LOSS" in text.splitlines()[1]
    assert "◆ best by val_loss" in v["card.html"] and "<th>best val_loss</th>" in v["card.html"]


def test_a_trial_without_a_validation_loss_ranks_every_view_by_final_loss_and_says_so(job_registry, capsys):
    ids = _ids(3)
    for i in range(3):  # trial 2 validates (its record says so) but logged no val_loss: it has none
        _job(job_registry, ids[i], losses=FINALS[i], val=VALS[i] if i < 2 else (), trial=i)
    sweep = _sweep(job_registry, ids)
    v = views(sweep, capsys)
    note = "ranked by final loss: trial 2 without a validation loss"
    assert {v[k] for k in SAME} == {(0, BY_FINAL_LOSS, note)}, {k: v[k] for k in SAME}
    assert sweep.best().value == 1.0 and v["frame.df"].attrs["ranking"] == "best by final loss"
    assert v["sweeps.best"]["ranked_by"] == "final_loss" and "1 final loss (trial 0)" in v["sweeps.row"]
    assert f"tune-magic sweeps: {SWEEP_ID}: {note}" in v["sweeps.err"]
    for text in (v["table_text"], v["card.text"], v["jobs.text"]):
        assert (f"* best: trial 0 (lr=0), final loss 1 (best by final loss: the lowest final loss; ties: lowest "
                f"minimum loss); {note}") in text, text
    assert "◆ best by final loss" in v["card.html"] and note in v["card.html"]


def _evaluation(root, job_id: str, of: str, epoch: int, step: int, val_loss: float) -> None:
    """A finished evaluation of ``of``'s ``epoch_<epoch>``: its record and val_loss.json, and its
    line in ``of``'s evaluations.jsonl."""
    out = root.parent / "runs" / f"{of}-val-epoch_{epoch}"
    out.mkdir(parents=True)
    (out / "val_loss.json").write_text(json.dumps({"epoch": epoch, "step": step, "val_loss": val_loss}))
    _job(root, job_id, losses=[], validation=None, output_dir=str(out),
         evaluates={"job": of, "epoch": epoch, "step": step})
    with open(root / of / "evaluations.jsonl", "a") as f:
        f.write(json.dumps({"epoch": epoch, "step": step, "job": job_id}) + "\n")


def test_evaluations_still_to_finish_keep_the_ranking_on_final_loss_until_they_have(job_registry, capsys):
    """Trials validated by checkpoints: trial 0's one checkpoint is evaluated; trial 1's is saved and
    its keeper (alive: the test holds its lock) has not launched its evaluation yet."""
    ids = _ids(2)
    runs = job_registry.parent / "runs"
    for i in range(2):
        _job(job_registry, ids[i], losses=FINALS[i], validation=CHECKPOINTS, trial=i, output_dir=str(runs / ids[i]))
        write_epoch(runs / ids[i], 0)
        os.utime(runs / ids[i] / "epoch_0", (100.0, 100.0))  # saved after the job started (1.0)
    _evaluation(job_registry, "20261202-110000-cccccc", ids[0], 0, 3, 3.0)
    (job_registry / ids[0] / "keeper.done").touch()
    fd = os.open(job_registry / ids[1] / "keeper.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # trial 1's keeper runs: nothing starts another
    try:
        sweep = _sweep(job_registry, ids)
        assert [r.val_pending for r in sweep.results()] == [0, 1]
        v = views(sweep, capsys)
        note = "ranking by final loss until 1 evaluation finishes"
        assert {v[k] for k in SAME} == {(0, BY_FINAL_LOSS, note)}, {k: v[k] for k in SAME}
        assert [t["val_pending"] for t in v["jobs.trials"]] == [0, 1]
        assert "pending" in v["table_text"].splitlines()[3] and note in v["card.html"]

        _evaluation(job_registry, "20261202-110001-dddddd", ids[1], 0, 3, 2.0)
        (job_registry / ids[1] / "keeper.done").touch()
        v = views(sweep, capsys)
        assert {v[k] for k in SAME} == {(1, BY_VAL_LOSS, None)}, {k: v[k] for k in SAME}
        assert sweep.best().best_val_loss == 2.0
    finally:
        os.close(fd)


def _row(index: int, status: str, final, minimum=None, *, best_val=None, validated=None, pending=0,
         validates=True) -> TrialResult:
    trial = SimpleNamespace(index=index, status=status, name=f"t{index}", job=None)
    return TrialResult(trial, 3, final, minimum, validates=validates, best_val_loss=best_val,
                       validated=best_val is not None if validated is None else validated, val_pending=pending)


def _ranked(rows) -> tuple:
    r = rank(rows)
    return (None if r.best is None else r.best.trial.index, r.measure, r.pending, r.without_val)


def test_the_one_ranking():
    ok = "succeeded"
    # by validation loss: the lowest; a tie broken by the lowest final loss, then by trial order
    assert _ranked([_row(0, ok, 1.0, best_val=3.0), _row(1, ok, 2.0, best_val=2.0)]) == (1, BY_VAL_LOSS, 0, ())
    assert _ranked([_row(0, ok, 2.0, best_val=2.0), _row(1, ok, 1.0, best_val=2.0)])[0] == 1
    assert _ranked([_row(0, ok, 1.0, best_val=2.0), _row(1, ok, 1.0, best_val=2.0)])[0] == 0
    # a NaN validation loss is a value (evaluated) but never best; all NaN: no best
    assert _ranked([_row(0, ok, 0.1, best_val=None, validated=True), _row(1, ok, 2.0, best_val=2.0)])[:2] == (
        1, BY_VAL_LOSS)
    assert _ranked([_row(0, ok, 0.1, best_val=None, validated=True)])[:2] == (None, BY_VAL_LOSS)
    # one ranked trial without a validation loss, or evaluations still to finish: final loss, saying why
    assert _ranked([_row(0, ok, 1.0, best_val=1.0), _row(1, ok, 0.5)]) == (1, BY_FINAL_LOSS, 0, (1,))
    assert _ranked([_row(0, ok, 1.0, best_val=1.0), _row(1, ok, 0.5, best_val=0.1, pending=2)]) == (
        1, BY_FINAL_LOSS, 2, ())
    # the failed trial is not ranked while one succeeded: its missing validation loss does not count
    assert _ranked([_row(0, "failed", 0.1), _row(1, ok, 2.0, best_val=2.0)]) == (1, BY_VAL_LOSS, 0, ())
    # no trial validates: today's rule, said plainly (no note)
    plain = [_row(0, ok, 2.0, 1.5, validates=False), _row(1, ok, 1.0, 0.9, validates=False),
             _row(2, ok, 1.0, 0.8, validates=False)]
    assert _ranked(plain) == (2, BY_FINAL_LOSS, 0, ()) and rank(plain).note is None
    assert rank(plain).label == "best by final loss"
    # among the trials that succeeded while any has; else among every trial with a loss
    assert _ranked([_row(0, "failed", 0.1, 0.1, validates=False), _row(1, ok, 1.0, 1.0, validates=False),
                    _row(2, "running", 0.5, 0.5, validates=False)])[0] == 1
    assert _ranked([_row(0, "failed", 0.1, 0.1, validates=False), _row(1, "running", 0.5, 0.5, validates=False)])[0] == 0
    # NaN and infinite final losses are never best; none finite: no best
    assert _ranked([_row(0, ok, NAN, 1.0, validates=False), _row(1, ok, 3.0, 3.0, validates=False)])[0] == 1
    assert _ranked([_row(0, ok, math.inf, validates=False)])[0] is None
    assert _ranked([_row(0, "queued", None, validates=False)]) == (None, BY_FINAL_LOSS, 0, ())
    # the best carries the measure it won by; the others do not
    r = rank([_row(0, ok, 1.0, best_val=3.0), _row(1, ok, 2.0, best_val=2.0)])
    assert (r.best.ranked_by, r.best.value, r.label) == (BY_VAL_LOSS, 2.0, "best by val_loss")


def test_each_trials_best_checkpoint_is_shown_and_follows_new_evaluations(job_registry, capsys):
    """Trials validated by checkpoints, two each: the card and the text table name each trial's
    checkpoint with the lowest validation loss (the one ``checkpoint="best"`` loads), and a later,
    better evaluation moves it on the next look of the same watcher."""
    from tune_magic.ui.cards import SweepCard
    from tune_magic.ui.snapshot import table_rows

    ids = _ids(2)
    runs = job_registry.parent / "runs"
    for i in range(2):
        _job(job_registry, ids[i], losses=FINALS[i], validation=CHECKPOINTS, trial=i, output_dir=str(runs / ids[i]))
        for epoch in (0, 1):
            write_epoch(runs / ids[i], epoch)
            os.utime(runs / ids[i] / f"epoch_{epoch}", (100.0 + epoch, 100.0 + epoch))
        (job_registry / ids[i] / "keeper.done").touch()
    # trial 0 is best at epoch_0 (2.0 < 2.5); trial 1 has only epoch_0 evaluated so far
    _evaluation(job_registry, "20261202-110000-cccccc", ids[0], 0, 3, 2.0)
    _evaluation(job_registry, "20261202-110001-dddddd", ids[0], 1, 6, 2.5)
    _evaluation(job_registry, "20261202-110002-eeeeee", ids[1], 0, 3, 3.0)
    sweep = _sweep(job_registry, ids)
    card = SweepCard(sweep, watch=False)
    try:
        snap = card.watcher.poll_once()
        assert [r.best_checkpoint for r in snap.rows] == ["epoch_0", "epoch_0"]
        _evaluation(job_registry, "20261202-110003-ffffff", ids[1], 1, 6, 1.5)
        snap = card.watcher.poll_once()
        assert [r.best_checkpoint for r in snap.rows] == ["epoch_0", "epoch_1"]
        card.update(snap)
        assert [c.split(">")[-1] for c in card.table.value.split("</code></td>")[:-1]
                if "tm-trial-ckpt" in c.rsplit("<td", 1)[-1]] == ["epoch_0", "epoch_1"]
        assert "<th>best checkpoint</th>" in card.table.value
    finally:
        card.close()
    head, *rows = table_rows(snap)
    col = head.index("BEST CHECKPOINT")
    assert [r[col] for r in rows] == ["epoch_0", "epoch_1"]
    assert head[col - 1] == "BEST VAL_LOSS" and [r[col - 1] for r in rows] == ["2", "1.5"]
    from tune_magic.ui import cli

    capsys.readouterr()
    assert cli.main(["jobs", "--sweep", SWEEP_ID, "--json"]) == 0
    assert [t["best_checkpoint"] for t in json.loads(capsys.readouterr().out)["trials"]] == ["epoch_0", "epoch_1"]


def test_trials_without_a_checkpoint_show_no_best_checkpoint_column(val_sweep):
    """In-loop validation and no ``epoch_N`` folder: no trial has a best checkpoint, no column."""
    from tune_magic.ui.snapshot import table_rows
    from tune_magic.ui.watch import SweepWatcher

    snap = SweepWatcher(val_sweep).poll_once()
    assert [r.best_checkpoint for r in snap.rows] == [None] * 4
    assert "BEST CHECKPOINT" not in table_rows(snap)[0]
