"""%tune_generate, %tune_compare and tune-magic generate without a model (issue 29): the prompt read
off a magic's line as typed, the text shown as it arrives, the comparison table, and every refusal
(no prompt, two prompts, a sweep, a bad option) said before anything starts."""

from __future__ import annotations

import re
import time

import pytest
from IPython.core.error import UsageError

from tune_magic.errors import PlanError
from tune_magic.ui.generation import TextShower, compare_html, split_prompt_line


@pytest.mark.parametrize("line, job, words, prompt", [
    ("fact What is the capital of Xyzzy?", "fact", [], "What is the capital of Xyzzy?"),
    ("fact --checkpoint best What's the  capital?", "fact", ["--checkpoint", "best"], "What's the  capital?"),
    ("fact --max-new-tokens=8 --seed 3 Say {x} and $y", "fact", ["--max-new-tokens=8", "--seed", "3"],
     "Say {x} and $y"),
    ('fact "What is it?"', "fact", [], "What is it?"),  # one quoted word: without its quotes
    ("fact 'a' and 'b'", "fact", [], "'a' and 'b'"),  # more than one word: as typed
    ("--checkpoint epoch_1 fact hi", "fact", ["--checkpoint", "epoch_1"], "hi"),
    ("fact -- --help me", "fact", [], "--help me"),
    ("fact -5 degrees?", "fact", [], "-5 degrees?"),
    ('"my job" --temperature 0.5', "my job", ["--temperature", "0.5"], None),
    ("fact", "fact", [], None),
    ("", None, [], None),
])
def test_a_magics_line_is_the_job_the_options_and_the_prompt_as_typed(line, job, words, prompt):
    assert split_prompt_line(line) == (job, words, prompt)


@pytest.mark.parametrize("line, message", [("'fact hi", "a quote is never closed"),
                                           ("fact --top-k", "--top-k needs a value")])
def test_a_line_that_cannot_be_split_says_why(line, message):
    with pytest.raises(PlanError, match=message):
        split_prompt_line(line)


def test_the_text_is_shown_as_it_arrives_and_ends_as_the_answer():
    out: list[str] = []
    show = TextShower(out.append)
    for piece in ("Pl", "ugh", " is"):
        show(piece)
    show.finish("Plugh is here.")
    assert "".join(out) == "Plugh is here.\n"
    out.clear()
    show = TextShower(out.append)
    show("Ab")
    show.finish("A b")  # the pieces were rewritten: the answer whole, on a line of its own
    assert "".join(out) == "Ab\nA b\n"


def test_the_comparison_table_escapes_and_wraps_the_text():
    rows = [{"job_id": "j1", "name": "lr=1e-4", "val_loss": 0.123456, "text": "<b>x</b>\ny", "error": None},
            {"job_id": "j2", "name": "lr=3e-4", "val_loss": float("nan"), "text": None, "error": "no checkpoint"}]
    html = compare_html(rows, ["job_id", "name", "val_loss", "text", "error"], pending=1)
    assert "&lt;b&gt;x&lt;/b&gt;\ny" in html and "<b>x" not in html and "white-space:pre-wrap" in html
    assert ">0.1235<" in html and ">nan<" not in html and "no checkpoint" in html
    assert html.count("<tr>") == 3 and "1 more to generate" in html


# -- the magics ---------------------------------------------------------------------------------------

def test_tune_generate_refuses_before_anything_starts(ip, monkeypatch):
    import tune_magic.job as jobmod

    looked_up = []
    monkeypatch.setattr(jobmod, "get_job", lambda spec: looked_up.append(spec))
    for line, cell, message in [
        ("fact", None, "give a prompt: %tune_generate JOB [OPTIONS] PROMPT"),
        ("fact hi", "and a body", "on the line or as the cell body, not both"),
        ("fact --temperature -1 hi", None, "temperature=-1.0: give a number >= 0"),
        ("fact --top-k 0 hi", None, "top_k=0"),
        ("fact --checkpoint latest hi", None, "names no checkpoint"),
        ("fact --max-new-tokens many hi", None, "invalid int value: 'many'"),
        ("fact --bogus hi", None, "unrecognized arguments: --bogus"),
    ]:
        with pytest.raises(UsageError, match=re.escape(message)):
            if cell is None:
                ip.run_line_magic("tune_generate", line)
            else:
                ip.run_cell_magic("tune_generate", line, cell)
    assert looked_up == []


def test_tune_generate_refuses_a_sweep_pointing_to_compare(ip, monkeypatch):
    import tune_magic.ui.targets as targets

    monkeypatch.setattr(targets, "is_sweep", lambda spec: spec == "sweep-1")
    with pytest.raises(UsageError, match=r"sweep-1 is a sweep: .*%tune_compare sweep-1 PROMPT"):
        ip.run_line_magic("tune_generate", "sweep-1 What?")


def test_tune_generate_help_shows_the_options(ip, capsys):
    assert ip.run_line_magic("tune_generate", "--help") is None
    out = capsys.readouterr().out
    assert "%%tune_generate JOB [OPTIONS]" in out and "300 s" in out


# -- the command ----------------------------------------------------------------------------------------

def _record(home, job_id: str) -> None:
    from tune_magic.registry import store as jobstore
    from tune_magic.registry.store import JobRecord

    d = home / "jobs" / job_id
    d.mkdir(parents=True)
    (d / "output.log").write_text("")
    jobstore.write_record(d, JobRecord(id=job_id, name="fact", argv=["python", "r.py", "--config", "c.yaml"], env={},
                                       cwd=str(home), log_path=str(d / "output.log"), started_at=time.time() - 9,
                                       ended_at=time.time(), status="succeeded", returncode=0,
                                       output_dir=str(home / "out"), config="c.yaml", overrides=[]))


@pytest.mark.parametrize("words, message", [
    (["j1", "--prompt", "hi", "--temperature", "-2"], "temperature=-2.0: give a number >= 0 (0 is greedy, exactly)"),
    (["j1", "--prompt", " ", "--seed", "1"], "the prompt is empty"),
    (["j1", "--prompt", "hi", "--checkpoint", "newest"], "checkpoint='newest' names no checkpoint"),
    (["j9", "--prompt", "hi"], "no job 'j9'"),
    # j1 ended without saving any: waiting would not help, so the message says so (not "wait")
    (["j1", "--prompt", "hi"], "job j1 ended (succeeded) without a complete checkpoint, so there is nothing to load"),
    (["j1", "--prompt", "hi", "--checkpoint", "epoch_2"], "job j1 ended (succeeded) without a complete checkpoint"),
])
def test_generate_exits_2_with_one_paragraph(tmp_path, monkeypatch, capsys, words, message):
    from tune_magic.ui import cli

    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path))
    _record(tmp_path, "j1")
    capsys.readouterr()
    assert cli.main(["generate", *words]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("tune-magic generate: error: ")
    assert message in err
    assert not (tmp_path / "jobs" / "j1" / "generate").exists()  # nothing started, nothing written


def test_generate_refuses_a_sweep_pointing_to_compare(tmp_path, monkeypatch, capsys):
    from tune_magic.ui import cli, clitargets

    monkeypatch.setattr(clitargets, "is_sweep", lambda spec: spec == "my-sweep")
    assert cli.main(["generate", "my-sweep", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "my-sweep is a sweep" in err and "tune_magic.compare(sweep, prompt)" in err
    assert "tune-magic jobs --sweep my-sweep" in err
