"""The launch panel's ``val split`` field (``--val-split``, issue 28), built in the test process (no
kernel): the preview shows the two overrides it adds, Launch passes it to :func:`tune_magic.launch`
(a sweep's to ``tune_magic.sweeping.create.sweep``), and a bad value is shown as the panel shows any
error. Nothing is started: launches are spied on and turned into dry runs."""

from __future__ import annotations

import html

import pytest

from tune_magic.job.launch import launch
from tune_magic.plan.model import JOB_ID_PLACEHOLDER
from tune_magic.ui import panel as panel_mod
from tune_magic.ui.panel import Panel


def form(tmp_path, val_split: str = "") -> Panel:
    panel = Panel(cwd=tmp_path)
    panel.recipe.value = "lora_finetune"
    panel.config.value = "tiny/lora"
    panel.overrides.value = "max_steps_per_epoch=4"
    panel.val_split.value = val_split
    return panel


def test_the_preview_shows_the_held_out_split_as_the_launch_builds_it(tmp_path):
    panel = form(tmp_path)
    assert "dataset_val" not in panel.command_preview.value  # blank: no validation
    panel.val_split.value = "0.1"
    plan = launch(["lora_finetune", "--config", "tiny/lora", "max_steps_per_epoch=4"], cwd=tmp_path, dry_run=True,
                  val_split=0.1)
    assert panel.command_preview.value == plan.command_line().replace(plan.job_id, JOB_ID_PLACEHOLDER)
    assert "dataset.split=train[:90%]" in panel.command_preview.value
    assert "dataset_val=" in panel.command_preview.value and "train[90%:]" in panel.command_preview.value
    assert not panel.launch_button.disabled and "tm-error" not in panel.error.value
    panel.val_split.value = "  "
    assert "dataset_val" not in panel.command_preview.value and not panel.launch_button.disabled


@pytest.mark.parametrize("value, words", [("abc", "--val-split 'abc': give the fraction"),
                                          ("1.5", "between 0 and 1"),
                                          ("0.123", "whole percents; give e.g. --val-split 0.12")])
def test_a_bad_fraction_is_shown_as_the_panels_errors_are_and_launch_is_disabled(tmp_path, value, words):
    panel = form(tmp_path, value)
    assert panel.launch_button.disabled and panel.command_preview.value == ""
    assert "class='tm-error'" in panel.error.value and words in html.unescape(panel.error.value), panel.error.value


def test_launch_passes_the_fraction_to_launch(tmp_path, monkeypatch):
    calls = []

    def spy(args, **kw):
        calls.append(kw)
        return launch(args, **{**kw, "dry_run": True})  # what would start, started nowhere

    monkeypatch.setattr(panel_mod, "launch", spy)
    panel = form(tmp_path, "0.25")
    calls.clear()
    panel.launch_button.click()
    (kw,) = calls
    assert kw["val_split"] == "0.25" and "dry run" in panel.error.value and panel.launched == []
    panel.val_split.value = ""
    calls.clear()
    panel.launch_button.click()
    assert "val_split" not in calls[0]  # blank: launch's default, no validation


def test_a_sweep_gets_the_fraction_in_its_preview_and_its_launch(tmp_path, monkeypatch):
    from tune_magic.sweeping import create

    panel = form(tmp_path, "0.1")
    panel.overrides.value = "max_steps_per_epoch=4\noptimizer.lr=1e-3,2e-3"
    panel.sweep_switch.value = True
    preview = panel.command_preview.value
    assert preview.startswith("# 2 trials") and "dataset.split=train[:90%]" in preview, preview
    calls = []
    monkeypatch.setattr(create, "sweep", lambda args, **kw: calls.append(kw) or create.preview(args, **{
        k: v for k, v in kw.items() if k != "name"}))
    panel.launch_button.click()
    assert calls[0]["val_split"] == "0.1" and "dry run" in panel.error.value


# -- the magic's and the CLI's --val-split hand on the word as typed --------------------------------

def test_the_magic_and_the_cli_read_val_split_as_typed(tmp_path, ip, capsys, monkeypatch):
    from tune_magic.ui import cli

    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    ip.run_cell_magic("tune_run", "--dry-run --val-split 0.1 lora_finetune --config tiny/lora", "max_steps_per_epoch=4")
    shown = capsys.readouterr().out
    assert "dataset.split=train[:90%]" in shown and "train[90%:]" in shown
    cli.main(["cmd", "--val-split", "0.2", "lora_finetune", "--config", "tiny/lora"])
    assert "dataset.split=train[:80%]" in capsys.readouterr().out
    assert cli.main(["cmd", "--val-split", "0.123", "lora_finetune", "--config", "tiny/lora"]) == 2
    assert "whole percents; give e.g. --val-split 0.12" in capsys.readouterr().err
