"""The package's public surface."""

import subprocess
import sys

from tune_magic.job.launch import build_plan
from tune_magic.ui.watch import progress_summary


def test_public_functions_stay_callable_after_submodules_load():
    # regression: a submodule named like a public function (tune_magic.jobs) replaced the function
    code = ("import tune_magic, json\n"
            "tune_magic.Job; tune_magic.launch; tune_magic.Panel\n"
            "import tune_magic.ui.magics, tune_magic.ui.views, tune_magic.ui.cli\n"
            "print(json.dumps([callable(tune_magic.jobs), callable(tune_magic.get_job), callable(tune_magic.launch),"
            " isinstance(tune_magic.jobs(), list)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[true, true, true, true]", out.stderr


def test_launch_plan_repr_is_one_short_line():
    plan = build_plan("--nproc_per_node 2 lora_finetune_distributed --config llama3_2/1B_lora", gpus="0,1")
    text = repr(plan)
    assert text.startswith("<LaunchPlan lora_finetune_distributed (torchrun, rendezvous=standalone): PYTHONUNBUFFERED=1 ")
    assert "\n" not in text and "argv=" not in text


def test_progress_summary():
    line = "1|5|Loss: 5.4532: 100%|██████████| 5/5 [00:00<00:00,  7.12it/s]INFO:torchtune.utils._logging:Saving"
    assert progress_summary(line) == "5/5 100% [00:00<00:00,  7.12it/s]"
    assert progress_summary("1|2|Loss: 3.1:  40%|####      | 2/5") == "2/5 40%"
    assert progress_summary("not a bar") == "not a bar"
    assert progress_summary(None) == ""


def test_every_exception_the_python_api_page_names_is_public():
    """docs/python-api.md's errors paragraph names each exception a user may catch; each one is
    ``tune_magic.<Name>`` (``except tune_magic.CheckpointError`` once raised AttributeError)."""
    import re
    from pathlib import Path

    import tune_magic

    text = (Path(__file__).resolve().parents[1] / "docs" / "python-api.md").read_text()
    para = text[text.index("Every exception tune_magic raises on purpose"):text.index("## Warnings")]
    names = {n for n in re.findall(r"`(?:tune_magic\.)?([A-Z]\w+)`", para)} - {"ValueError", "LookupError",
                                                                                "UsageError", "RuntimeError"}
    assert {"CheckpointError", "GenerationError", "JobNotFound", "StateDirError"} <= names, names
    missing = sorted(n for n in names if not isinstance(getattr(tune_magic, n, None), type))
    assert missing == [], missing
