"""torchtune 0.6.1's own lora_finetune_single_device and full_finetune_single_device, unmodified,
run on CPU (tiny/builtin_lora_single, tiny/builtin_full_single), resumed with the pre-flight's
overrides from epoch 1's checkpoint (epoch_1/ and the recipe state of an uninterrupted 3-epoch run
copied into a fresh output_dir), every run a real job through ``tune_magic.launch``.

They resume from the checkpoint's weights (the first resumed loss is far below the base model's
first loss), and the pre-flight names the case it sees. Measured here, and asserted so that a
change shows:

* full_finetune_single_device resumes exactly (losses within 1e-6, same LRs and step numbers);
* lora_finetune_single_device with a truncating max_steps_per_epoch resumes exactly too, when its
  checkpoint save does not merge LoRA into the live model: with save_adapter_weights_only=True.
  With the default (False) on CPU, every epoch-end save adds the LoRA product into the model's own
  base weights (``.cpu()`` of a CPU tensor is that tensor, and ``get_merged_lora_ckpt`` adds in
  place), so the uninterrupted run trains on a changed base and the resumed run, which starts from
  the clean base and the saved adapter, differs from it (4.09 vs 2.96 at step 9 on these assets);
  the data order is the same (0.6.1 never reloads its saved data-loader state);
* lora_finetune_single_device with max_steps_per_epoch=null logs Step 1 again and restarts the LR
  warm-up: the global step is set only when max_steps_per_epoch truncates an epoch. Its first
  resumed loss equals the uninterrupted run's first loss of epoch 3 (same weights, same batch).
"""

from __future__ import annotations

import pytest

from resumehelpers import assert_same, copy_checkpoint, preflight_of, run_job, series
from tune_magic.checkpoints import preflight as R

pytestmark = pytest.mark.e2e

FAR_BELOW = 1.0  # a resumed first loss at least this much under the base model's first loss


def _runs(recipe, config, ov_ref, tmp_path, cleanup, epoch=1):
    ref_out = tmp_path / "ref"
    ref = run_job(f"{recipe} --config {config} output_dir={ref_out} " + " ".join(ov_ref), cleanup=cleanup)
    fresh = copy_checkpoint(ref_out, tmp_path / "resumed", epoch=epoch)
    return ref, fresh


@pytest.mark.parametrize("adapter_only", [True, False], ids=["adapter_only", "merged_default"])
def test_lora_single_device_resumes_from_its_checkpoint(adapter_only, tiny_assets, tmp_path, cleanup_jobs):
    ov = ["epochs=3", "max_steps_per_epoch=4", f"save_adapter_weights_only={adapter_only}"]
    ref, fresh = _runs("lora_finetune_single_device", "tiny/builtin_lora_single", ov, tmp_path, cleanup_jobs)
    ref_loss, ref_lr = series(ref), series(ref, "lr")
    assert sorted(ref_loss) == list(range(1, 13))
    ov_resume = [f"output_dir={fresh}", *ov]
    p = preflight_of(ref, fresh, ov_resume)
    assert p.support.name == "lora_finetune_single_device" and p.case == R.CASE_CONTINUES
    assert p.overrides == ("resume_from_checkpoint=True", "checkpointer.adapter_checkpoint=epoch_1/adapter_model.pt",
                           "checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt")
    assert any("only if max_steps_per_epoch=4 is below the epoch's number of batches" in w for w in p.warnings)
    merge_warned = any("merges the LoRA weights into the live model's base weights" in w for w in p.warnings)
    assert merge_warned is (not adapter_only)

    resumed = run_job("lora_finetune_single_device --config tiny/builtin_lora_single "
                      + " ".join(p.resumed_overrides(ov_resume)), cleanup=cleanup_jobs)
    loss, lr = series(resumed), series(resumed, "lr")
    assert sorted(loss) == [9, 10, 11, 12]
    assert loss[9] < ref_loss[1] - FAR_BELOW, (loss[9], ref_loss[1])
    assert_same(lr, ref_lr, range(9, 13), tol=1e-12)
    if adapter_only:
        assert_same(loss, ref_loss, range(9, 13))
    else:  # torchtune's in-place merge on CPU changed the uninterrupted run's base weights
        assert abs(loss[9] - ref_loss[9]) > 1e-3, (loss[9], ref_loss[9])


def test_lora_single_device_without_max_steps_restarts_its_step_count(tiny_assets, tmp_path, cleanup_jobs):
    # 2 epochs of 8 steps (batch_size 16); resumed from epoch_0/, it redoes nothing and runs epoch 2
    ov = ["epochs=2", "max_steps_per_epoch=null", "batch_size=16", "save_adapter_weights_only=True"]
    ref, fresh = _runs("lora_finetune_single_device", "tiny/builtin_lora_single", ov, tmp_path, cleanup_jobs, epoch=0)
    ref_loss, ref_lr = series(ref), series(ref, "lr")
    assert sorted(ref_loss) == list(range(1, 17))
    ov_resume = [f"output_dir={fresh}", *ov]
    p = preflight_of(ref, fresh, ov_resume)
    assert p.case == R.CASE_STEPS_RESTART and p.first_step == 1
    assert "logs Step 1 again and restarts the LR schedule with its warm-up" in p.summary()

    resumed = run_job("lora_finetune_single_device --config tiny/builtin_lora_single "
                      + " ".join(p.resumed_overrides(ov_resume)), cleanup=cleanup_jobs)
    loss, lr = series(resumed), series(resumed, "lr")
    assert sorted(loss) == list(range(1, 9))  # steps 9-16 of the run, numbered 1-8
    assert abs(loss[1] - ref_loss[9]) <= 1e-6  # the checkpoint's weights, epoch 2's first batch
    assert loss[1] < ref_loss[1] - FAR_BELOW
    # the LR schedule starts over: the resumed run's LRs are those of the run's first 8 steps (warm-up
    # included), not of its steps 9-16
    assert_same(lr, ref_lr, range(1, 9), tol=1e-12)
    assert lr[2] != pytest.approx(ref_lr[10])


def test_full_single_device_resumes_exactly(tiny_assets, tmp_path, cleanup_jobs):
    ov = ["epochs=3", "max_steps_per_epoch=4"]
    ref, fresh = _runs("full_finetune_single_device", "tiny/builtin_full_single", ov, tmp_path, cleanup_jobs)
    ref_loss, ref_lr = series(ref), series(ref, "lr")
    ov_resume = [f"output_dir={fresh}", *ov]
    p = preflight_of(ref, fresh, ov_resume)
    assert p.case == R.CASE_CONTINUES and p.first_step == 9
    assert "checkpointer.checkpoint_files=[epoch_1/model-00001-of-00001.safetensors]" in p.overrides
    resumed = run_job("full_finetune_single_device --config tiny/builtin_full_single "
                      + " ".join(p.resumed_overrides(ov_resume)), cleanup=cleanup_jobs)
    loss = series(resumed)
    assert loss[9] < ref_loss[1] - FAR_BELOW, (loss[9], ref_loss[1])
    assert_same(loss, ref_loss, range(9, 13))
    assert_same(series(resumed, "lr"), ref_lr, range(9, 13), tol=1e-12)
    # it read the model from output_dir/epoch_1 (0.6.1's resume path), not from checkpoint_dir
    assert f"{fresh}/epoch_1/model-00001-of-00001.safetensors" in "\n".join(resumed.tail(400))
