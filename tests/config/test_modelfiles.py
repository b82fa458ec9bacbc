"""A config whose model is not downloaded is refused before anything starts, naming every missing
path at once (checkpoint_dir, the checkpoint files in it, the tokenizer) and the ``tune download``
command the config itself names in its header comment (torchtune 0.6.1's built-in configs)."""

from __future__ import annotations

import pytest

import tune_magic
from tune_magic.errors import PlanError
from tune_magic.config.modelfiles import checkpoint_file_names, download_commands
from tune_magic.registry import store as jobstore

#: llama3_2/1B_lora.yaml's own header line (torchtune 0.6.1), read from the shipped file below
LLAMA_DOWNLOAD = ('tune download meta-llama/Llama-3.2-1B-Instruct --output-dir /tmp/Llama-3.2-1B-Instruct '
                  '--ignore-patterns "original/consolidated.00.pth"')


def _refusal(args: str, cwd) -> str:
    before = {r.id for r in jobstore.list_records()}
    with pytest.raises(PlanError) as caught:
        tune_magic.launch(args, cwd=cwd)
    assert {r.id for r in jobstore.list_records()} == before  # nothing registered
    return str(caught.value)


def test_a_builtin_config_without_its_model_names_every_missing_path_and_its_download_command(job_registry, tmp_path):
    model = tmp_path / "Llama-3.2-1B-Instruct"
    text = _refusal(f"--nproc_per_node 2 lora_finetune_distributed --config llama3_2/1B_lora "
                    f"checkpointer.checkpoint_dir={model} tokenizer.path={model}/original/tokenizer.model", tmp_path)
    assert f"checkpointer.checkpoint_dir {model}; tokenizer.path {model}/original/tokenizer.model do not exist" in text
    assert f"Download it as the config 1B_lora.yaml says: {LLAMA_DOWNLOAD}" in text
    assert "create it" not in text and text.endswith("Nothing was started")
    # the model's folder there, its weights and tokenizer not (an interrupted download): each file named
    (model / "original").mkdir(parents=True)
    text = _refusal(f"lora_finetune_single_device --config llama3_2/1B_lora_single_device "
                    f"checkpointer.checkpoint_dir={model} tokenizer.path={model}/original/tokenizer.model", tmp_path)
    assert (f"checkpointer.checkpoint_files {model}/model.safetensors; tokenizer.path "
            f"{model}/original/tokenizer.model do not exist") in text


def test_a_config_of_ones_own_without_a_header_says_to_download_and_point_the_keys(job_registry, tmp_path):
    (tmp_path / "r.py").write_text("")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model-00001-of-00002.safetensors").write_text("")
    (tmp_path / "c.yaml").write_text(
        "output_dir: out\ncheckpointer:\n  checkpoint_dir: model\n  checkpoint_files:\n"
        "    filename_format: model-{}-of-{}.safetensors\n    max_filename: '00002'\ntokenizer:\n  path: tok.model\n")
    text = _refusal("r.py --config c.yaml", tmp_path)
    assert (f"checkpointer.checkpoint_files {tmp_path}/model/model-00002-of-00002.safetensors; tokenizer.path "
            f"{tmp_path}/tok.model do not exist") in text
    assert "Download the model (e.g. tune download <model> --output-dir <dir>) and override tokenizer.path=..." in text


def test_the_header_commands_and_the_file_forms_read_as_torchtune_reads_them(tmp_path):
    from tune_magic.config.catalog import find_config

    assert download_commands(find_config("llama3_2/1B_lora").path) == [LLAMA_DOWNLOAD]
    kd = download_commands(find_config("llama3_2/8B_to_1B_KD_lora_single_device").path)
    assert len(kd) == 2 and all(c.startswith("tune download meta-llama/") for c in kd)  # student and teacher
    body = tmp_path / "c.yaml"
    body.write_text("output_dir: x\n# tune download later/model  (a comment after the settings is no header)\n")
    assert download_commands(body) == [] and download_commands(tmp_path / "missing.yaml") == []
    from torchtune.training.checkpointing._utils import FormattedCheckpointFiles

    form = {"filename_format": "model-{}-of-{}.safetensors", "max_filename": "00004"}
    assert checkpoint_file_names(form) == FormattedCheckpointFiles.from_dict(form).build_checkpoint_filenames()
    assert checkpoint_file_names(["a.pt", "b.pt"]) == ["a.pt", "b.pt"] and checkpoint_file_names(3) == []


RESUME_CASES = {
    # name: (files in output_dir, checkpointer.adapter_checkpoint, resume_from_checkpoint, checkpoint_files)
    "fresh_run_reads_checkpoint_dir": ([], None, False, ["model.safetensors"]),
    "full_resume_reads_output_dir": (["epoch_0/model.safetensors"], None, True, ["epoch_0/model.safetensors"]),
    "full_resume_file_missing_in_output_dir": ([], None, True, ["epoch_0/model.safetensors"]),
    "full_resume_named_as_in_checkpoint_dir": (["epoch_0/model.safetensors"], None, True, ["model.safetensors"]),
    "lora_resume_adapter_in_last_epoch_reads_checkpoint_dir": (
        ["epoch_0/adapter_model.pt", "epoch_1/adapter_model.pt"], None, True, ["model.safetensors"]),
    "lora_resume_adapter_only_in_an_earlier_epoch": (["epoch_0/adapter_model.pt", "epoch_1/x"], None, True,
                                                     ["model.safetensors"]),
    "adapter_checkpoint_named_reads_checkpoint_dir": ([], "epoch_0/adapter_model.pt", True, ["model.safetensors"]),
}


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_checkpoint_files_are_looked_for_where_torchtune_reads_them(case, tmp_path):
    """torchtune 0.6.1's own get_model_checkpoint_path (after its get_adapter_checkpoint_path, as its
    checkpointers call them) is the oracle: a launch is refused for missing checkpoint files exactly
    when torchtune would fail to find them, and names the directory it looked in."""
    from omegaconf import OmegaConf
    from torchtune.training.checkpointing._utils import get_adapter_checkpoint_path, get_model_checkpoint_path

    from tune_magic.plan.configview import _select
    from tune_magic.config.modelfiles import FILES_KEY, RESUMED_FILES_KEY, missing_model_paths

    out_files, adapter, resume, files = RESUME_CASES[case]
    model, out = tmp_path / "model", tmp_path / "out"
    model.mkdir()
    out.mkdir()
    (model / "model.safetensors").write_text("")
    (model / "tok.model").write_text("")
    for name in out_files:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("")
    cfg = OmegaConf.create({"output_dir": str(out), "resume_from_checkpoint": resume, "tokenizer": {"path": str(model / "tok.model")},
                            "checkpointer": {"checkpoint_dir": str(model), "checkpoint_files": files,
                                             "output_dir": "${output_dir}", "adapter_checkpoint": adapter}})
    try:
        has_adapter = get_adapter_checkpoint_path(out, adapter, resume) is not None
        read = get_model_checkpoint_path(files, model, out, resume, has_adapter)
    except (ValueError, TypeError):  # TypeError: resuming into an output_dir without epoch_N (it joins None)
        read = None
        has_adapter = adapter is not None
    missing = missing_model_paths(cfg, str(tmp_path), _select)
    if read is not None:
        assert missing == []
    else:
        label = RESUMED_FILES_KEY if resume and not has_adapter else FILES_KEY
        where = out if label == RESUMED_FILES_KEY else model
        assert missing == [(label, str(where / f)) for f in files]


def test_a_resumed_full_finetune_missing_its_checkpoint_is_told_where_torchtune_looks(job_registry, tmp_path):
    (tmp_path / "r.py").write_text("")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_text("")
    (tmp_path / "tok.model").write_text("")
    (tmp_path / "out").mkdir()
    (tmp_path / "c.yaml").write_text(
        "output_dir: out\nresume_from_checkpoint: true\ncheckpointer:\n  checkpoint_dir: model\n"
        "  checkpoint_files: [epoch_0/model.safetensors]\n  output_dir: ${output_dir}\ntokenizer:\n  path: tok.model\n")
    text = _refusal(f"r.py --config c.yaml output_dir={tmp_path}/out", tmp_path)
    assert text.startswith("the checkpoint this resumed job reads is not here, so every rank would fail at start-up: "
                           f"checkpointer.checkpoint_files (read from checkpointer.output_dir: "
                           f"resume_from_checkpoint=True) {tmp_path}/out/epoch_0/model.safetensors does not exist")
    assert "tune-magic assets" not in text and text.endswith("Nothing was started")
    (tmp_path / "out" / "epoch_0").mkdir()
    (tmp_path / "out" / "epoch_0" / "model.safetensors").write_text("")
    plan = tune_magic.launch(f"r.py --config c.yaml output_dir={tmp_path}/out", cwd=tmp_path, dry_run=True)  # now where torchtune reads it
    assert plan.config.endswith("c.yaml")
