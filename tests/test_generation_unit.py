"""Generation without torch (issue 29): the checks made before anything starts, the checkpoint a
name picks (last, best by evaluations or in-loop validation at the save step, epoch_N, pruned,
incomplete, base, a path), the command built with the job's config and overrides, and the
kept-alive process's protocol against a stand-in server (a few lines of Python speaking the
recipe's JSON lines): reuse, streaming, an error answer, a restart after a kill or an idle end,
a crash's paragraph, a timeout, close, and the end at the caller's exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from ckptfolders import truncate, write_epoch
from tune_magic.checkpoints.catalog import CheckpointError
from tune_magic.errors import PlanError
from tune_magic.job import generators
from tune_magic.job.evaluate import Evaluation
from tune_magic.job.generate import (ChosenCheckpoint, GenerationError, GenOptions, check_checkpoint_name,
                                     check_prompt, choose_checkpoint, command, generation_recipe, recipe_error)
from tune_magic.logs.points import MetricPoint
from tune_magic.registry.owner import TOKEN_ENV


# -- the checks ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"max_new_tokens": 0}, "max_new_tokens=0: give a whole number >= 1"),
    ({"max_new_tokens": 2.5}, "max_new_tokens=2.5: give a whole number >= 1"),
    ({"max_new_tokens": True}, "max_new_tokens=True"),
    ({"temperature": -0.1}, "temperature=-0.1: give a number >= 0 (0 is greedy, exactly)"),
    ({"temperature": float("nan")}, "temperature=nan"),
    ({"temperature": "0.7"}, "temperature='0.7'"),
    ({"top_k": 0}, "top_k=0: give a whole number >= 1"),
    ({"seed": -1}, "seed=-1: give a whole number >= 0 and < 2**63"),
    ({"seed": 1 << 63}, "seed=9223372036854775808"),
])
def test_bad_options_are_refused_naming_the_option(kwargs, message):
    with pytest.raises(PlanError) as err:
        GenOptions.checked(**kwargs)
    assert message in str(err.value)


def test_good_options_become_the_recipes_words_and_request():
    opts = GenOptions.checked(max_new_tokens=8, temperature=1, top_k=5, seed=3)
    assert opts == GenOptions(8, 1.0, 5, 3) and isinstance(opts.temperature, float)
    assert opts.words() == ["generate.max_new_tokens=8", "generate.temperature=1.0", "generate.top_k=5",
                            "generate.seed=3"]
    assert GenOptions.checked().words()[2] == "generate.top_k=null"
    assert opts.request("hi", stream=True) == {"prompt": "hi", "max_new_tokens": 8, "temperature": 1.0, "top_k": 5,
                                               "seed": 3, "stream": True}


@pytest.mark.parametrize("prompt, message", [(None, "must be text (str), not NoneType"), ("  \n", "the prompt is empty"),
                                             (b"x", "not bytes")])
def test_a_prompt_must_be_text_with_something_in_it(prompt, message):
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_prompt(prompt)
    assert check_prompt(" What? ") == " What? "  # kept as written


@pytest.mark.parametrize("name", ["last", "best", "base", "epoch_0", "epoch_12", 3, "/x/epoch_1", "out/epoch_1",
                                  Path("epoch_1")])
def test_checkpoint_names_of_every_form_are_taken(name):
    assert check_checkpoint_name(name) is name


@pytest.mark.parametrize("name", ["latest", "epoch-1", "", -1, True, None, 1.5])
def test_a_checkpoint_name_of_no_form_is_refused_listing_the_forms(name):
    with pytest.raises(CheckpointError, match='say "last", "best", "epoch_N", "base"'):
        check_checkpoint_name(name)


def test_the_recipes_error_paragraph_is_its_last_error_line():
    log = "INFO: loading\ngenerate_text: error: first\nTraceback\ngenerate_text: error: the prompt is 71 tokens\n"
    assert recipe_error(log) == "the prompt is 71 tokens"
    assert recipe_error("INFO only\n") is None


# -- the checkpoint chosen ----------------------------------------------------------------------------

@pytest.fixture
def job(tmp_path, monkeypatch):
    """A registered, ended job (record written by hand) whose output_dir has epoch_0..2 complete and
    epoch_3 still being written (its shard cut short)."""
    from tune_magic.job import get_job
    from tune_magic.registry import store as jobstore
    from tune_magic.registry.store import JobRecord

    monkeypatch.setenv("TUNE_MAGIC_HOME", str(tmp_path / "home"))
    out = tmp_path / "runs" / "j1"
    for epoch in range(4):
        write_epoch(out, epoch)
    truncate(out / "epoch_3" / "model-00001-of-00001.safetensors")
    d = tmp_path / "home" / "jobs" / "j1"
    d.mkdir(parents=True)
    (d / "output.log").write_text("".join(f"{e}|{4 * e}|Loss: 1.0\n" for e in (1, 2, 3, 4)))
    jobstore.write_record(d, JobRecord(
        id="j1", name="fact", argv=["python", "r.py", "--config", "/cfg/fact.yaml", "seed=1", f"output_dir={out}"],
        env={"TUNE_MAGIC_HOME": "/h", "PYTHONPATH": "/repo", TOKEN_ENV: "secret"}, cwd=str(tmp_path),
        log_path=str(d / "output.log"), started_at=time.time() - 60, ended_at=time.time(), status="succeeded",
        returncode=0, output_dir=str(out), config="/cfg/fact.yaml", overrides=["seed=1", f"output_dir={out}"]))
    found = get_job("j1")
    found.evaluations = lambda: []
    found.validation_points = lambda: []
    return found


def test_last_is_the_newest_complete_checkpoint(job):
    chosen = choose_checkpoint(job, "last")
    assert (chosen.label, chosen.path, chosen.step) == ("epoch_2", str(Path(job.output_dir) / "epoch_2"), 12)
    assert choose_checkpoint(job).label == "epoch_2"  # the default
    assert (choose_checkpoint(job, "epoch_1").epoch, choose_checkpoint(job, 0).epoch) == (1, 0)
    with pytest.raises(CheckpointError, match=r"epoch_3 is not complete \(.*wait for its save to end"):
        choose_checkpoint(job, "epoch_3")
    with pytest.raises(CheckpointError, match=r"there is no epoch_7 \(checkpoints: epoch_0, epoch_1, epoch_2\)"):
        choose_checkpoint(job, "epoch_7")
    job.validation_points = lambda: pytest.fail("read without need")  # "last" alone reads no metrics
    assert choose_checkpoint(job, "last", losses=False) == ChosenCheckpoint("last", chosen.path, 2)


def test_best_is_the_lowest_evaluated_loss(job):
    with pytest.raises(CheckpointError, match="no checkpoint has a validation loss, so none is best"):
        choose_checkpoint(job, "best")
    job.evaluations = lambda: [Evaluation(0, 4, "e0", "succeeded", 2.0), Evaluation(1, 8, "e1", "succeeded", 1.5),
                               Evaluation(2, 12, "e2", "succeeded", 1.7), Evaluation(3, 16, "e3", "running")]
    chosen = choose_checkpoint(job, "best")
    assert (chosen.label, chosen.val_loss, chosen.step) == ("epoch_1", 1.5, 8)
    assert choose_checkpoint(job, "epoch_2").val_loss == 1.7


def test_best_in_loop_is_the_validation_at_each_save_step(job):
    # epoch_N is saved after the last step of bar epoch N + 1: steps 4, 8, 12; the 0.1 at step 6 is
    # mid-epoch (no checkpoint holds those weights) and never picks one
    job.validation_points = lambda: [MetricPoint(4, "val_loss", 1.2, None, "disklogger"),
                                     MetricPoint(6, "val_loss", 0.1, None, "disklogger"),
                                     MetricPoint(8, "val_loss", 0.9, None, "disklogger"),
                                     MetricPoint(12, "val_loss", 1.0, None, "disklogger")]
    chosen = choose_checkpoint(job, "best")
    assert (chosen.label, chosen.val_loss, chosen.step) == ("epoch_1", 0.9, 8)


def test_a_pruned_checkpoint_is_refused_and_never_best(job):
    import shutil

    shutil.rmtree(Path(job.output_dir) / "epoch_1")
    (job.dir / "pruned.jsonl").write_text(json.dumps({"epoch": 1, "at": 1.0e9, "bytes_freed": 4096}) + "\n" + "{torn")
    with pytest.raises(CheckpointError, match=r"epoch_1 was pruned by retention; use one that is kept \(epoch_0, "
                                              r"epoch_2\)"):
        choose_checkpoint(job, "epoch_1")
    with pytest.raises(CheckpointError, match="was pruned by retention"):  # by its path too
        choose_checkpoint(job, str(Path(job.output_dir) / "epoch_1"))
    job.evaluations = lambda: [Evaluation(0, 4, "e0", "succeeded", 2.0), Evaluation(1, 8, "e1", "succeeded", 0.5),
                               Evaluation(2, 12, "e2", "succeeded", 1.7)]
    assert choose_checkpoint(job, "best").label == "epoch_2"  # the best left


def test_no_checkpoint_says_why_and_what_to_do(job):
    """Waiting is the fix only while the job runs: an ended job without a complete checkpoint says so,
    and an evaluation job points to the job it evaluates (it saves none of its own)."""
    import shutil
    from types import SimpleNamespace

    from tune_magic.job.checkpoints import checkpoints_of, find_of
    from tune_magic.registry.status import Status

    for epoch in range(3):
        shutil.rmtree(Path(job.output_dir) / f"epoch_{epoch}")
    for name in ("last", "best", "epoch_0"):
        with pytest.raises(CheckpointError, match=r"job j1 ended \(succeeded\) without a complete checkpoint, so "
                                                  "there is nothing to load; .* run the job long enough"):
            choose_checkpoint(job, name)
    listed = checkpoints_of(job)
    running = SimpleNamespace(id="j1", record=SimpleNamespace(evaluates=None, state=Status.RUNNING))
    with pytest.raises(CheckpointError, match="no complete checkpoint yet .* wait for the first epoch to end"):
        find_of(running, listed, "last")
    evaluation = SimpleNamespace(id="e1", record=SimpleNamespace(evaluates={"job": "j0", "epoch": 2},
                                                                 state=Status.SUCCEEDED))
    with pytest.raises(CheckpointError, match="job e1 evaluates epoch_2 of job j0 and saves no checkpoint of its "
                                              "own; name job j0 instead"):
        find_of(evaluation, [], "best")


def test_a_checkpoint_named_by_its_digits_as_the_command_line_gives_them(job):
    assert choose_checkpoint(job, "1").epoch == choose_checkpoint(job, 1).epoch == 1


def test_base_and_paths(job, tmp_path):
    import shutil

    assert choose_checkpoint(job, "base") == ChosenCheckpoint("base", "base")
    assert choose_checkpoint(job, "base").label == "base"
    copy = tmp_path / "elsewhere" / "epoch_5"
    shutil.copytree(Path(job.output_dir) / "epoch_2", copy)
    chosen = choose_checkpoint(job, str(copy))
    assert (chosen.path, chosen.epoch, chosen.asked) == (str(copy), 5, str(copy))
    assert choose_checkpoint(job, "elsewhere/epoch_5").path == str(copy)  # relative to the job's cwd
    assert choose_checkpoint(job, Path(job.output_dir) / "epoch_0").step == 4  # one of its own: its step
    with pytest.raises(CheckpointError, match="torchtune names them epoch_<N>"):
        choose_checkpoint(job, str(tmp_path / "elsewhere"))
    with pytest.raises(CheckpointError, match="is not a directory"):
        choose_checkpoint(job, str(tmp_path / "nowhere" / "epoch_1"))


def test_the_command_is_the_recipe_with_the_jobs_config_and_overrides_here(job, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "kernel-token")
    chosen = choose_checkpoint(job, "epoch_1")
    argv, env = command(job, chosen, ["generate.serve=true"])
    assert argv == [sys.executable, generation_recipe(), "--config", "/cfg/fact.yaml", "seed=1",  # no output_dir=
                    f"generate.checkpoint_dir={chosen.path}", f"generate.output_dir={job.dir / 'generate'}",
                    "generate.serve=true"]
    assert Path(generation_recipe()).name == "generate_text.py" and Path(generation_recipe()).is_file()
    assert (env["TUNE_MAGIC_HOME"], env["PYTHONPATH"], env["PYTHONUNBUFFERED"]) == ("/h", "/repo", "1")
    assert env[TOKEN_ENV] == "kernel-token"  # the job's own stop token is never handed on
    assert env["PATH"] == os.environ["PATH"]


# -- the kept-alive process, against a stand-in server -------------------------------------------------

SERVER = textwrap.dedent("""
    import json, os, select, sys, time
    idle, marker = float(sys.argv[1]), sys.argv[2]
    n = 0
    while True:
        if not select.select([sys.stdin], [], [], idle)[0]:
            print(f"Serve: no request for {idle:g} s, ending", file=sys.stderr, flush=True)
            sys.exit(0)
        line = sys.stdin.readline()
        if not line:
            print("Serve: end of input, ending", file=sys.stderr, flush=True)
            sys.exit(0)
        req = json.loads(line)
        n += 1
        head = {"request": n, "id": req["id"]}
        prompt = req["prompt"]
        if prompt == "idle now" and not os.path.exists(marker):  # its idle timeout, right as a request came
            open(marker, "w").close()
            print("Serve: no request for 1 s, ending", file=sys.stderr, flush=True)
            sys.exit(0)
        if prompt == "crash":
            print("generate_text: error: the checkpoint does not fit the config's model", file=sys.stderr, flush=True)
            sys.exit(2)
        if prompt == "hang":
            time.sleep(60)
        if prompt == "too long":
            print(json.dumps({"error": "the prompt is 71 tokens, longer than max_seq_len (64)", **head}), flush=True)
            continue
        print("srun: a word of the engine's own", flush=True)
        print(json.dumps({"text": "late", "request": 0, "id": "tm-0"}), flush=True)  # not this request's
        text = prompt.upper()
        if req.get("stream"):
            for ch in text:
                print(json.dumps({"partial": ch, **head}), flush=True)
        print(json.dumps({"text": text, "loads": 1, "pid": os.getpid(), **head}), flush=True)
""")


@pytest.fixture
def server(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SERVER)

    def make(idle_s: float = 60.0) -> generators.ServeProcess:
        argv = [sys.executable, str(script), str(idle_s), str(tmp_path / "marker")]
        return generators.ServeProcess(("j1", "base"), argv, dict(os.environ), str(tmp_path), tmp_path / "g" / "s.log")

    made: list[generators.ServeProcess] = []
    yield lambda *a: made.append(make(*a)) or made[-1]
    for p in made:
        p.close(grace_s=1)


def test_the_process_is_started_once_and_reused(server):
    p = server()
    first = p.ask({"prompt": "hello"})
    pid = p.pid
    pieces: list[str] = []
    second = p.ask({"prompt": "again", "stream": True}, pieces.append)
    assert (first["text"], first["request"], second["text"], second["request"]) == ("HELLO", 1, "AGAIN", 2)
    assert first["pid"] == second["pid"] == pid and p.starts == 1 and p.last == second
    assert pieces == list("AGAIN")  # the engine's own word and a stale answer were skipped


def test_a_refused_request_raises_its_paragraph_and_the_process_goes_on(server):
    p = server()
    p.ask({"prompt": "a"})
    pid = p.pid
    with pytest.raises(GenerationError, match=r"^the prompt is 71 tokens, longer than max_seq_len \(64\)$"):
        p.ask({"prompt": "too long"})
    assert p.ask({"prompt": "b"})["pid"] == pid


def test_a_killed_or_idle_ended_process_is_started_again(server):
    p = server(0.5)
    pid = p.ask({"prompt": "a"})["pid"]
    psutil.Process(pid).kill()
    psutil.Process(pid).wait(5)
    answer = p.ask({"prompt": "b"})
    assert answer["text"] == "B" and answer["pid"] != pid and p.starts == 2
    time.sleep(1.5)  # its idle timeout (0.5 s) ends it
    assert not p.alive and "no request for 0.5 s" in p.log_path.read_text()
    assert p.ask({"prompt": "c"})["text"] == "C" and p.starts == 3
    # ended by its idle timeout just as a request went: started again, asked once more
    assert p.ask({"prompt": "idle now"})["text"] == "IDLE NOW" and p.starts == 4


def test_a_crash_raises_the_recipes_own_paragraph(server):
    p = server()
    with pytest.raises(GenerationError, match="^the checkpoint does not fit the config's model$"):
        p.ask({"prompt": "crash"})
    assert not p.alive and p.proc.returncode == 2 and p.starts == 1  # a fresh process: never tried twice
    p.ask({"prompt": "a"})
    with pytest.raises(GenerationError, match="^the checkpoint does not fit the config's model$"):
        p.ask({"prompt": "crash"})
    assert p.starts == 3  # a process that ran before: started again once, which crashed too


def test_a_process_killed_right_before_a_request_is_started_again(server):
    p = server()
    for n in range(3):  # SIGKILL lands before or after the request is written: either way, one answer
        pid = p.ask({"prompt": f"x{n}"})["pid"]
        os.kill(pid, 9)
        assert p.ask({"prompt": "y"})["text"] == "Y" and p.pid != pid


def test_a_request_that_takes_too_long_ends_its_process(server):
    p = server()
    start = time.monotonic()
    with pytest.raises(GenerationError, match=r"no answer within 1 s: the generation process was ended; its log is"):
        p.ask({"prompt": "hang"}, timeout_s=1)
    assert time.monotonic() - start < 10 and not p.alive
    assert p.ask({"prompt": "d"})["text"] == "D" and p.starts == 2  # a late answer is never read as this one's


def test_a_process_that_cannot_start_says_why_and_shows_its_command(tmp_path):
    p = generators.ServeProcess(("j1", "base"), [sys.executable, "x.py", "it's"], dict(os.environ),
                                str(tmp_path / "gone"), tmp_path / "g" / "s.log")
    with pytest.raises(GenerationError, match=r"cannot start the generation process \(No such file or directory: "
                                              r".*gone\): .* x\.py 'it'\"'\"'s'$"):
        p.ask({"prompt": "a"})
    assert "pid=None starts=0" in repr(p) and repr(p).endswith("x.py 'it'\"'\"'s'>")


def test_close_ends_it_through_its_input(server):
    p = server()
    pid = p.ask({"prompt": "a"})["pid"]
    assert p.close() is True and not p.alive and not psutil.pid_exists(pid)
    assert "Serve: end of input, ending" in p.log_path.read_text()
    assert p.close() is False


def test_generate_checks_first_then_reuses_the_jobs_process_until_closed(job, tmp_path, monkeypatch):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    built = []

    def fake_command(job_, chosen, words):
        built.append((chosen.path, words))
        return [sys.executable, str(script), "60", str(tmp_path / "m")], dict(os.environ)

    monkeypatch.setattr(generators, "command", fake_command)
    with pytest.raises(PlanError):
        job.generate("hi", checkpoint="base", top_k=0)
    with pytest.raises(CheckpointError):
        job.generate("hi", checkpoint="epoch_9")
    assert built == [] and generators.generators("j1") == []  # nothing started
    try:
        assert job.generate("hi", checkpoint="base") == "HI"
        assert job.generate("ho", checkpoint="base") == "HO"
        assert job.generate("hu", checkpoint="epoch_1") == "HU"
        assert [(p.key[1], p.starts, p.last["request"]) for p in generators.generators("j1")] == [
            ("base", 1, 2), (str(Path(job.output_dir) / "epoch_1"), 1, 1)]
        assert built[0] == ("base", ["generate.serve=true", "generate.idle_timeout_s=300"])
        pids = [p.pid for p in generators.generators("j1")]
    finally:
        assert job.close_generation() == 2
    assert generators.generators("j1") == [] and not any(psutil.pid_exists(pid) for pid in pids)


def test_the_process_ends_when_the_python_that_started_it_exits(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    code = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from tune_magic.job import generators
        p = generators.ServeProcess(("j", "base"), [sys.executable, {str(script)!r}, "600", "m"], dict(os.environ),
                                    {str(tmp_path)!r}, Path({str(tmp_path / 'x.log')!r}))
        generators._PROCESSES[p.key] = p
        print(p.ask({{"prompt": "x"}})["pid"], flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    pid = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert "Serve: end of input, ending" in (tmp_path / "x.log").read_text()
