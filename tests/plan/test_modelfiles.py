"""A config whose model is not downloaded is refused before anything starts, naming every missing
path at once (checkpoint_dir, the checkpoint files in it, the tokenizer) and the ``tune download``
command the config itself names in its header comment (torchtune 0.6.1's built-in configs)."""

from __future__ import annotations

import pytest

import tune_magic
from tune_magic.errors import PlanError
from tune_magic.plan.modelfiles import checkpoint_file_names, download_commands
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
    from tune_magic.plan.catalog import find_config

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
