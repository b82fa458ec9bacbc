"""Where a whole run is, from the bar, the config and the metric file (tune_magic.logs.progress), and the
config keys that say how long a run is (configview, the record)."""

from __future__ import annotations

import json

import pytest

from tune_magic.errors import PlanError

from tune_magic.registry import store as jobstore
from tune_magic.job.launch import build_plan
from tune_magic.plan.configview import resolve_dirs
from tune_magic.registry.store import CorruptRecord, JobRecord
from tune_magic.logs.progress import (SAVED, SAVING, UNDECIDED, Bar, checkpoint_state, fmt_duration, fmt_rate, parse_bar,
                                 run_progress)

# torchtune 0.6.1's bar as captured in tests/data/lora_2proc_5steps/output.log (tqdm 4.x default format)
REAL_BAR = "1|4|Loss: 5.796189308166504:  80%|████████  | 4/5 [00:00<00:00,  4.97it/s]"


def test_parse_bar_reads_epoch_step_counters_and_rate():
    assert parse_bar(REAL_BAR) == Bar(epoch=1, step=4, n=4, total=5, rate=pytest.approx(4.97))
    # below one step a second tqdm prints seconds per step
    assert parse_bar("3|57|Loss: 1.5:  35%|███▌      | 7/20 [00:14<00:26,  2.00s/it]").rate == pytest.approx(0.5)
    # before the first rate; a redraw cut short; a log line glued after the bar
    assert parse_bar("1|1|Loss: 9.0:   5%|▌         | 1/20 [00:00<?, ?it/s]") == Bar(1, 1, 1, 20, None)
    assert parse_bar("1|2|Loss: 9.0:  10%|█") == Bar(1, 2)
    glued = REAL_BAR + "INFO:torchtune.utils._logging:Saving checkpoint. Retrieving full model state dict..."
    assert parse_bar(glued) == parse_bar(REAL_BAR)
    # prefixed by torchrun --tee
    assert parse_bar("[default0]:" + REAL_BAR) == parse_bar(REAL_BAR)
    assert parse_bar("Tokenizing:  45%|####  | 9/20 [00:01<00:02, 4.5it/s]") is None
    assert parse_bar(None) is None and parse_bar("") is None


def test_a_fifty_epoch_run_at_epoch_one_says_so():
    # the case: a 50-epoch job at epoch 1 showed only "13/20 65%"
    bar = parse_bar("1|13|Loss: 2.31:  65%|██████▌   | 13/20 [00:10<00:05,  1.30it/s]")
    run = run_progress(bar, epochs=50, max_steps_per_epoch=20, metric_step=12, throughput=1234.5)
    assert (run.epoch, run.epochs, run.step, run.total_steps, run.epoch_step, run.epoch_steps) == (1, 50, 13, 1000, 13, 20)
    assert run.rate == pytest.approx(1.3)
    # 7 steps left in this epoch, 49 epochs of 20 after it, at 1.3 steps a second
    assert run.eta_s == pytest.approx((7 + 49 * 20) / 1.3)
    assert run.eta_is_run and run.throughput == 1234.5 and run.checkpoint is None


def test_eta_without_a_known_epoch_count_is_this_epochs():
    run = run_progress(parse_bar("2|33|Loss: 2.0:  65%|██████▌   | 13/20 [00:10<00:05,  2.00it/s]"), epochs=None)
    assert run.eta_s == pytest.approx(7 / 2.0) and not run.eta_is_run and run.total_steps is None


def test_observed_rate_stands_in_when_the_bar_has_none():
    bar = parse_bar("1|4|Loss: 2.0:  20%|██        | 4/20 [00:10<?, ?it/s]")
    assert run_progress(bar, epochs=1).eta_s is None
    assert run_progress(bar, epochs=1, observed_rate=0.5).eta_s == pytest.approx(16 / 0.5)


def test_before_any_bar_only_the_config_and_metric_file_speak():
    run = run_progress(None, epochs=3, max_steps_per_epoch=10, metric_step=None)
    assert (run.epoch, run.epochs, run.step, run.epoch_steps, run.total_steps, run.eta_s) == (None, 3, None, 10, 30, None)
    assert run_progress(None, metric_step=7).step == 7


def test_checkpoint_state_follows_the_latest_deciding_line():
    start = "INFO:torchtune.utils._logging:Saving checkpoint. This may take some time. Retrieving full model state dict..."
    end = "INFO:torchtune.utils._logging:Saving checkpoint took 31.20 secs"
    assert checkpoint_state(["a", REAL_BAR]) == UNDECIDED  # no save among them
    assert checkpoint_state([REAL_BAR, start]) == SAVING
    assert checkpoint_state([REAL_BAR + start]) == SAVING  # torchtune's line glued to the open bar
    assert checkpoint_state([REAL_BAR, start, "INFO:...:Model checkpoint of size 0.00 GiB saved to /x"]) == SAVING
    assert checkpoint_state([REAL_BAR, start, end]) == SAVED
    # the next epoch's first step ends it; its empty bar before that step does not
    assert checkpoint_state([REAL_BAR + start, end, "  0%|          | 0/5 [00:00<?, ?it/s]"]) == SAVED
    assert checkpoint_state([REAL_BAR + start, end, "2|5|Loss: 5.0:  20%|██        | 1/5 [00:00<00:01,  4.00it/s]"]) is None
    assert checkpoint_state([REAL_BAR, start, "Step 5 | loss:1.0 lr:0.001"]) is None
    assert checkpoint_state([REAL_BAR, start, "Step 4 | loss:1.0 lr:0.001"]) == SAVING  # the metric of the same step
    # tqdm's closing redraw at the save's step after the last save (lora_2proc_5steps/output.log)
    assert checkpoint_state([REAL_BAR + start, "x", end, REAL_BAR]) == SAVED
    assert checkpoint_state([start, end, REAL_BAR]) is None  # a step, and no bar to say the save's step
    # lora_finetune_single_device's words, and the checkpoint client's asynchronous save
    assert checkpoint_state([REAL_BAR, "INFO:torchtune.utils._logging:Starting checkpoint save..."]) == SAVING
    assert checkpoint_state(["INFO:torchtune.utils._logging:Checkpoint saved in 1.20 seconds."]) == SAVED
    assert checkpoint_state(["Saving checkpoint asynchronously. Retrieving full state dict..."]) == SAVING
    assert checkpoint_state(["nothing", "to see"]) == UNDECIDED


def test_formats():
    assert [fmt_duration(s) for s in (0, 59.9, 61, 3600, 3 * 86400 + 62)] == ["0:00", "0:59", "1:01", "1:00:00",
                                                                             "3d 0:01:02"]
    assert [fmt_rate(v) for v in (1234.56, 100.0, 99.5, 0.123456)] == ["1,235", "100", "99.5", "0.123"]


def test_launch_config_gives_epochs_and_max_steps_per_epoch(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"output_dir: {tmp_path}/out\nepochs: 3\nmax_steps_per_epoch: null\n")
    (tmp_path / "r.py").write_text("")
    dirs = resolve_dirs(build_plan("r.py --config c.yaml", cwd=tmp_path, job_id="j"))
    assert (dirs.epochs, dirs.max_steps_per_epoch) == (3, None)
    dirs = resolve_dirs(build_plan("r.py --config c.yaml epochs=50 max_steps_per_epoch=20", cwd=tmp_path, job_id="j"))
    assert (dirs.epochs, dirs.max_steps_per_epoch) == (50, 20)
    for bad in ("epochs=0", "epochs=-2", "'epochs=!!float 1.5'", "epochs=true"):  # a float only when tagged
        assert resolve_dirs(build_plan(f"r.py --config c.yaml {bad}", cwd=tmp_path, job_id="j")).epochs is None, bad
    with pytest.raises(PlanError, match=r"the config has epochs: 3 \(an integer\), and the recipe would get the float"):
        build_plan("r.py --config c.yaml epochs=1.5", cwd=tmp_path, job_id="j")  # a float for an integer: refused
    with pytest.raises(PlanError, match="the config has epochs: 3 .a number."):  # text for a number: refused first
        build_plan("r.py --config c.yaml epochs=many", cwd=tmp_path, job_id="j")


def test_shipped_configs_give_their_length(session_home):
    dirs = resolve_dirs(build_plan("lora_finetune --config tiny/lora", job_id="j1"))
    assert (dirs.epochs, dirs.max_steps_per_epoch) == (1, 20)


def test_record_validates_epochs_fields(tmp_path):
    rec = JobRecord(id="j", name="n", argv=["x"], env={}, cwd="/", log_path="/l", started_at=1.0, epochs=50,
                    max_steps_per_epoch=20)
    back = JobRecord.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert (back.epochs, back.max_steps_per_epoch) == (50, 20)
    old = rec.to_dict()
    del old["epochs"], old["max_steps_per_epoch"]  # records written before these fields
    assert (JobRecord.from_dict(old).epochs, JobRecord.from_dict(old).max_steps_per_epoch) == (None, None)
    for key, value in (("epochs", 0), ("epochs", "3"), ("epochs", 2.5), ("epochs", True), ("max_steps_per_epoch", -1)):
        with pytest.raises(CorruptRecord, match=key):
            JobRecord.from_dict({**rec.to_dict(), key: value})
    assert jobstore.SCHEMA == 3  # optional fields with defaults: no new schema (3 moved engine fields)
