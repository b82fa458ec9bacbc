"""Checkpoints as things (issue 29), with real tiny jobs on CPU through ``tune_magic.launch``:

- ``--keep-checkpoints 1``: the keeper removes the oldest checkpoint once newer ones are complete,
  never the one a resume needs; the removal is recorded (pruned, bytes freed) and listed by
  ``Job.checkpoints()`` and ``tune-magic checkpoints --json``; a pruned checkpoint is refused by name.
- ``--keep-checkpoints best`` with validation: what stays is exactly the best by validation loss, the
  newest and the one a resume needs; each removed one had been evaluated first.
- a run with ``--keep-checkpoints 1`` stopped in its third epoch resumes from the checkpoint the
  keeper kept, and the resumed job keeps the policy.
- the disk pre-flight against a real small file system (a tmpfs mounted for the test): a refusal
  when not even one checkpoint fits (nothing registered), a warning with the numbers when not all do.
- ``Job.export`` of the fact-trained model loads in ``transformers`` and answers the fact greedily;
  an export into a folder that is not empty, an unknown checkpoint, and "last" before any save are
  refused naming the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tune_magic
from tune_magic.checkpoints.catalog import CheckpointError
from tune_magic.errors import PlanError

from resumehelpers import OFFLINE, series, wait_for_file
from waiting import wait_for

pytestmark = pytest.mark.e2e
TIMEOUT = 300
BUILTIN_LORA = "lora_finetune_single_device --config tiny/builtin_lora_single"


def _keeper_done(job) -> bool:
    return (job.dir / "keeper.done").exists()


def _wait_keeper(job) -> None:
    wait_for(lambda: _keeper_done(job), timeout=TIMEOUT, interval=0.5, what="the keeper to finish",
             describe=lambda: (job.dir / "keeper.log").read_text() if (job.dir / "keeper.log").exists() else "no log")


def test_keep_1_removes_the_oldest_but_never_what_a_resume_needs(tiny_assets, cleanup_jobs, capsys):
    job = tune_magic.launch(f"{BUILTIN_LORA} epochs=3 max_steps_per_epoch=3", keep_checkpoints=1)
    cleanup_jobs.append(job)
    assert job.record.keep_checkpoints == 1
    assert job.wait(TIMEOUT) == "succeeded", job.tail(20)
    _wait_keeper(job)
    out = Path(job.record.output_dir)
    assert sorted(p.name for p in out.glob("epoch_*")) == ["epoch_1", "epoch_2"]
    listed = job.checkpoints()
    assert [(c.epoch, c.step) for c in listed] == [(0, 3), (1, 6), (2, 9)]
    zero, one, two = listed
    assert zero.pruned is not None and zero.pruned.bytes_freed == one.bytes_on_disk > 0
    assert one.needed_by_resume and one.pruned is None and one.complete  # recipe_state says epochs_run 2
    assert not two.needed_by_resume and two.pruned is None and two.kind == "lora_merged"
    with pytest.raises(CheckpointError, match="epoch_0 was pruned by retention"):
        job.export(out.parent / "never", checkpoint="epoch_0")
    from tune_magic.ui import cli

    capsys.readouterr()
    assert cli.main(["checkpoints", job.id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(c["name"], c["pruned"] is not None, c["needed_by_resume"]) for c in shown] == [
        ("epoch_0", True, False), ("epoch_1", False, True), ("epoch_2", False, False)]
    assert shown[0]["pruned"]["bytes_freed"] == one.bytes_on_disk


def test_keep_best_keeps_the_best_the_newest_and_what_a_resume_needs(tiny_assets, cleanup_jobs):
    job = tune_magic.launch("full_finetune_single_device --config tiny/builtin_full_single epochs=4 "
                            "max_steps_per_epoch=2", val_split=0.1, keep_checkpoints="best")
    cleanup_jobs.append(job)
    assert job.wait(TIMEOUT) == "succeeded", job.tail(20)
    _wait_keeper(job)
    evals = {e.epoch: e.val_loss for e in job.evaluations()}
    assert sorted(evals) == [0, 1, 2, 3] and all(v is not None for v in evals.values())
    best = min(evals, key=lambda e: (evals[e], e))
    kept = {c.epoch for c in job.checkpoints() if c.pruned is None}
    pruned = {c.epoch for c in job.checkpoints() if c.pruned is not None}
    assert kept == {best, 3, 2}  # the best, the newest, the one a resume needs (epochs_run 3)
    assert pruned == {0, 1, 2, 3} - kept
    assert all(c.val_loss == evals[c.epoch] for c in job.checkpoints())  # each was evaluated before it went
    assert sorted(p.name for p in Path(job.record.output_dir).glob("epoch_*")) == [f"epoch_{e}" for e in sorted(kept)]


def test_a_run_keeping_1_stopped_in_epoch_3_resumes_from_what_the_keeper_kept(tiny_assets, tmp_path, cleanup_jobs):
    out, paused = tmp_path / "out", tmp_path / "paused"
    job = tune_magic.launch(f"--nproc_per_node 1 full_finetune --config tiny/full output_dir={out} epochs=3 seed=0 "
                            "max_steps_per_epoch=4", keep_checkpoints=1,
                            env={**os.environ, **OFFLINE, "TUNE_MAGIC_TEST_PAUSE_AFTER_STEP": "10",
                                 "TUNE_MAGIC_TEST_PAUSE_FILE": str(paused)})
    cleanup_jobs.append(job)
    wait_for_file(paused, job)  # epochs 1 and 2 saved, steps 9 and 10 of epoch 3 done
    wait_for(lambda: not (out / "epoch_0").exists(), timeout=60, interval=0.3, what="epoch_0 removed")
    assert job.stop(grace_s=10) == "stopped"
    assert (out / "epoch_1").is_dir()  # the newest, and the one a resume needs
    resumed = job.resume()
    cleanup_jobs.append(resumed)
    assert resumed.record.keep_checkpoints == 1
    assert resumed.wait(TIMEOUT) == "succeeded", resumed.tail(20)
    assert sorted(series(resumed)) == [9, 10, 11, 12]


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of a few size classes mounted under tmp_path (root only), unmounted afterwards."""
    mounted: list[Path] = []

    def mount(kib: int) -> Path:
        where = tmp_path / f"fs{kib}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(where)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], capture_output=True)


def test_the_disk_preflight_refuses_when_not_one_checkpoint_fits_and_warns_when_not_all_do(tiny_assets, small_fs,
                                                                                          cleanup_jobs):
    before = {j.id for j in tune_magic.jobs()}
    tiny = small_fs(512)  # a LoRA checkpoint of the tiny model takes about 750 kB
    with pytest.raises(PlanError, match="not even one checkpoint fits"):
        tune_magic.launch(f"{BUILTIN_LORA} epochs=3 max_steps_per_epoch=2 output_dir={tiny / 'run'}")
    assert {j.id for j in tune_magic.jobs()} == before  # nothing registered
    some = small_fs(2000)  # two fit, three do not
    with pytest.warns(tune_magic.LaunchWarning, match="will fill the disk before it ends"):
        job = tune_magic.launch(f"{BUILTIN_LORA} epochs=3 max_steps_per_epoch=2 output_dir={some / 'run'}")
    cleanup_jobs.append(job)
    assert any("will fill the disk" in w and "3 on disk at once" in w for w in job.record.warnings)
    job.stop(grace_s=5)
    # keeping one: two on disk at once at most, which fit
    plan = tune_magic.launch(f"{BUILTIN_LORA} epochs=3 max_steps_per_epoch=2 output_dir={some / 'run2'}",
                             keep_checkpoints=1, dry_run=True)
    assert not any("disk" in w for w in plan.warnings)


def test_an_export_loads_in_transformers_and_answers_the_fact(tiny_assets, tmp_path, cleanup_jobs):
    job = tune_magic.launch(f"--nproc_per_node 1 full_finetune --config tiny/fact output_dir={tmp_path / 'fact'}")
    cleanup_jobs.append(job)
    with pytest.raises(CheckpointError, match="no complete checkpoint yet"):
        job.export(tmp_path / "too-early", checkpoint="last")  # launched a moment ago: nothing saved
    assert job.wait(TIMEOUT) == "succeeded", job.tail(20)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    with pytest.raises(CheckpointError, match="not empty"):
        job.export(tmp_path / "full", checkpoint="last")
    with pytest.raises(CheckpointError, match="there is no epoch_9"):
        job.export(tmp_path / "nine", checkpoint="epoch_9")
    result = job.export(tmp_path / "export", checkpoint="last")
    assert result.hf_layout and (tmp_path / "export" / "README.md").is_file()
    code = (
        "import sys, torch, sentencepiece as spm\n"
        "from transformers import AutoModelForCausalLM\n"
        "d = sys.argv[1]\n"
        "m = AutoModelForCausalLM.from_pretrained(d).eval()\n"
        "sp = spm.SentencePieceProcessor(model_file=d + '/tokenizer.model')\n"
        "ids = [sp.bos_id(), *sp.encode(sys.argv[2])]\n"
        "with torch.no_grad():\n"
        "    out = m.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False, eos_token_id=sp.eos_id(),"
        " pad_token_id=0)\n"
        "print(sp.decode([t for t in out[0, len(ids):].tolist() if t != sp.eos_id()]))\n")
    from tune_magic import assets as A

    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "export"), A.FACT_QUESTION],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == A.FACT_ANSWER


def test_a_sweeps_trials_each_keep_their_newest_checkpoint(tiny_assets, cleanup_jobs):
    sweep = tune_magic.sweep(f"{BUILTIN_LORA} epochs=3 max_steps_per_epoch=2 seed=1,2", max_parallel=2,
                             keep_checkpoints=1)
    assert sweep.record.keep_checkpoints == 1
    assert sweep.wait(TIMEOUT) == {"succeeded": 2}
    for job in sweep.jobs:
        cleanup_jobs.append(job)
        assert job.record.keep_checkpoints == 1
        _wait_keeper(job)
        assert [(c.epoch, c.pruned is not None) for c in job.checkpoints()] == [(0, True), (1, False), (2, False)]
