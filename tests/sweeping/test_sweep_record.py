"""The sweep record (sweeping/record.py, sweepstore.py) and a job record's optional ``sweep`` field."""

from __future__ import annotations

import json
import os

import pytest

from tune_magic.registry import store as jobstore
from tune_magic.sweeping import store as sweepstore
from tune_magic.registry.record import CorruptRecord, JobRecord
from tune_magic.sweeping.record import NOT_STARTED, QUEUED, STARTED, SweepRecord, TrialState


def record(**changes) -> SweepRecord:
    """A two-axis sweep (lr from the line, seed from a YAML body's sweep: mapping), 4 trials."""
    trials = [TrialState(index=i, name=f"lr={lr},seed={seed}", words=[f"optimizer.lr={lr}", f"seed={seed}"])
              for i, (lr, seed) in enumerate([("1e-3", "1"), ("1e-3", "2"), ("2e-3", "1"), ("2e-3", "2")])]
    base = dict(id="sweep-20261201-100000-abcdef", name="grid", created_at=1.0, cwd="/tmp",
                args=["lora_finetune", "--config", "tiny/lora", "optimizer.lr=1e-3,2e-3", "max_steps_per_epoch=4"],
                axes=[{"key": "optimizer.lr", "texts": ["1e-3", "2e-3"], "position": 3},
                      {"key": "seed", "texts": ["1", "2"], "position": None}],
                trials=trials, slots=[None, None], extra_overrides=["metric_logger.group=grid"])
    base.update(changes)
    return SweepRecord(**base)


def test_round_trip_keeps_every_field_and_the_unknown_ones():
    rec = record()
    data = rec.to_dict()
    data["from_a_later_release"] = {"x": 1}
    data["trials"][2]["later_trial_field"] = [1, 2]
    back = SweepRecord.from_dict(json.loads(json.dumps(data)))
    assert back == rec
    again = back.to_dict()
    assert again["from_a_later_release"] == {"x": 1} and again["trials"][2]["later_trial_field"] == [1, 2]
    assert back.max_parallel == 2 and back.keys == ["optimizer.lr", "seed"]
    assert back.counts() == {QUEUED: 4, STARTED: 0, NOT_STARTED: 0}


def test_trial_args_put_each_axis_word_in_place_and_append_body_axes_and_extra_overrides():
    rec = record()
    assert rec.trial_args(2) == ["lora_finetune", "--config", "tiny/lora", "optimizer.lr=2e-3", "max_steps_per_epoch=4",
                                 "seed=1", "metric_logger.group=grid"]
    assert rec.args[3] == "optimizer.lr=1e-3,2e-3"  # the record itself is untouched


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("trials"), "'trials' is missing"),
    (lambda d: d.update(args=[]), "'args' must be a non-empty list"),
    (lambda d: d["axes"][0].update(position=99), "points outside 'args'"),
    (lambda d: d["axes"][0].update(texts="1e-3"), "{key, texts, position}"),
    (lambda d: d["trials"][1].update(status="running"), "unknown state 'running'"),
    (lambda d: d["trials"][1].update(status="started"), "started without a job id"),
    (lambda d: d["trials"][1].update(index=5), "numbered 0, 1, 2"),
    (lambda d: d["trials"][1].update(words=["seed=1"]), "one key=value word per axis"),
    (lambda d: d.update(slots=[[0, "x"]]), "'slots' must hold GPU id lists"),
    (lambda d: d.update(created_at=float("nan")), "not a finite number"),
    (lambda d: d.update(force="yes"), "'force' has the wrong type"),
])
def test_a_damaged_record_is_refused_with_what_is_wrong(mutate, message):
    data = record().to_dict()
    mutate(data)
    with pytest.raises(CorruptRecord, match=message.replace("(", r"\(").replace(")", r"\)").replace("{", r"\{")
                       .replace("}", r"\}")):
        SweepRecord.from_dict(data)


def test_the_store_reads_writes_and_lists_without_following_links(tmp_path):
    root = tmp_path / "sweeps"
    d = root / "sweep-20261201-100000-abcdef"
    d.mkdir(parents=True)
    rec = record()
    sweepstore.write(d, rec)
    assert oct(os.stat(d / sweepstore.SWEEP_FILE).st_mode & 0o777) == "0o600"
    with sweepstore.locked(d) as r:
        r.trials[0].status, r.trials[0].job_id = STARTED, "20261201-100001-aaaaaa"
    assert sweepstore.read(d).trials[0].job_id == "20261201-100001-aaaaaa"
    assert [r.id for r in sweepstore.list_records(root)] == [rec.id]
    # a record naming another id, and a link where a sweep directory goes, are never taken for sweeps
    other = root / "sweep-20261201-100000-bbbbbb"
    other.mkdir()
    sweepstore.write(other, rec)
    (root / "sweep-20261201-100000-cccccc").symlink_to(d)
    skipped: list = []
    assert [r.id for r in sweepstore.list_records(root, skipped)] == [rec.id]
    assert skipped == [other]
    with pytest.raises(CorruptRecord):
        sweepstore.read(root / "sweep-20261201-100000-cccccc")
    assert sweepstore.is_sweep_id(rec.id) and not sweepstore.is_sweep_id("20261201-100000-abcdef")


def test_env_is_kept_privately_and_a_damaged_one_reads_as_none(tmp_path):
    sweepstore.write_env(tmp_path, {"A": "1", "WANDB_API_KEY": "secret"})
    assert oct(os.stat(tmp_path / sweepstore.ENV_FILE).st_mode & 0o777) == "0o600"
    assert sweepstore.read_env(tmp_path) == {"A": "1", "WANDB_API_KEY": "secret"}
    (tmp_path / sweepstore.ENV_FILE).write_text('{"A": 1}')
    assert sweepstore.read_env(tmp_path) is None


def _job(**changes) -> dict:
    data = JobRecord(id="20261201-100001-aaaaaa", name="lr=1e-3,seed=1", argv=["python", "x.py"], env={}, cwd="/",
                     log_path="/x/output.log", started_at=1.0).to_dict()
    data.update(changes)
    return data


def test_a_job_record_names_its_sweep_and_records_without_the_field_still_load():
    old = _job()
    old.pop("sweep")
    assert JobRecord.from_dict(old).sweep is None
    trial = JobRecord.from_dict(_job(sweep={"id": "sweep-x", "trial": 3, "name": "grid", "slot": 1}))
    assert trial.sweep == {"id": "sweep-x", "trial": 3, "name": "grid", "slot": 1}
    assert sweepstore.trial_of(trial.sweep) == ("sweep-x", 3)
    for bad in ({"id": "sweep-x"}, {"id": 1, "trial": 0}, {"id": "s", "trial": True}, "sweep-x"):
        with pytest.raises(CorruptRecord, match="sweep"):
            JobRecord.from_dict(_job(sweep=bad))


def test_jobstore_round_trip_of_a_trial_record(tmp_path):
    rec = JobRecord.from_dict(_job(sweep={"id": "sweep-x", "trial": 0, "name": "grid"}))
    d = tmp_path / rec.id
    d.mkdir()
    jobstore.write_record(d, rec)
    assert jobstore.read(d).sweep == {"id": "sweep-x", "trial": 0, "name": "grid"}


def test_a_damaged_sweep_record_is_rebuilt_from_its_backup_and_its_trials_jobs(tmp_path, monkeypatch):
    # issue 30: sweep.json cut to half its length while trial 0 ran stopped the queue and hid the sweep
    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path / "home"))
    root = sweepstore.sweeps_root(create=True)
    d = root / "sweep-20261201-100000-abcdef"
    d.mkdir()
    rec = record()
    with_trial_0 = record()
    with_trial_0.trials[0].status, with_trial_0.trials[0].job_id = STARTED, "20261201-100001-aaaaaa"
    sweepstore.write(d, with_trial_0)
    assert sweepstore.read(d) == with_trial_0 and (d / sweepstore.BACKUP_FILE).is_file()
    # trial 1's job was registered by a process that died before it wrote the sweep record down
    for trial, job_id in ((0, "20261201-100001-aaaaaa"), (1, "20261201-100002-bbbbbb")):
        jd = jobstore.jobs_root(create=True) / job_id
        jd.mkdir()
        jobstore.write_record(jd, JobRecord.from_dict(_job(id=job_id, started_at=10.0 + trial, sweep={
            "id": rec.id, "trial": trial, "name": "grid", "slot": trial})))
    full = (d / sweepstore.SWEEP_FILE).read_bytes()
    (d / sweepstore.SWEEP_FILE).write_bytes(full[: len(full) // 2])
    back = sweepstore.read(d)
    assert [(t.status, t.job_id, t.slot) for t in back.trials] == [
        (STARTED, "20261201-100001-aaaaaa", None), (STARTED, "20261201-100002-bbbbbb", 1), (QUEUED, None, None),
        (QUEUED, None, None)]
    assert back.args == rec.args and back.axes == rec.axes and back.slots == rec.slots
    assert "sweep.json was damaged" in back.warnings[-1] and "rebuilt from sweep.backup.json" in back.warnings[-1]
    skipped: list = []
    assert [r.id for r in sweepstore.list_records(root, skipped)] == [rec.id] and skipped == []
    assert (d / sweepstore.SWEEP_FILE).read_bytes() == full[: len(full) // 2]  # reading never writes
    assert sweepstore.read_repaired(d) == back  # the sweep process writes it back whole, once
    assert json.loads((d / sweepstore.SWEEP_FILE).read_text())["trials"][1]["job_id"] == "20261201-100002-bbbbbb"
    # both copies damaged: refused as before, saying what is wrong with the record itself
    for name in (sweepstore.SWEEP_FILE, sweepstore.BACKUP_FILE):
        (d / name).write_text("{")
    with pytest.raises(CorruptRecord, match="unreadable sweep record .*sweep.json"):
        sweepstore.read(d)
    # a stopped sweep (its done marker) whose record and stale backup lose the stop is not revived
    sweepstore.write(d, rec)
    (d / sweepstore.SWEEP_FILE).write_text("")
    sweepstore.mark_done(d)
    assert sweepstore.read(d).done_at is not None
