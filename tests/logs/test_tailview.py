"""The card's form of a log's last lines (tune_magic.logs.cardtail): display only."""

from __future__ import annotations

import ast
import re
import sysconfig
from pathlib import Path

import pytest

from tune_magic.logs.failure import describe_failure
from tune_magic.logs.linefollow import LineFollower
from tune_magic.logs.lineformat import strip_prefixes
from tune_magic.logs.cardtail import CHECKPOINT_RULE, TailRule, apply_rule, display_tail
from tune_magic.schedulers.slurm.exits import TAIL_RULES as SLURM_TAIL_RULES

from jobhelpers import DATA, REPO


# torchrun's own traceback when it gets SIGTERM (torch 2.13, captured from a stopped toy job here)
SIGNAL_TRACEBACK = """\
W1201 05:38:51.259000 6395 .venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, shutting down workers
W1201 05:38:51.260000 6395 .venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 6424 closing signal SIGTERM
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 923, in _invoke_run
    time.sleep(monitor_interval)
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 6395 got signal: 15
""".splitlines()


def _lines_of(path: Path) -> list[str]:
    f = LineFollower(path, 1000)
    f.poll()
    return f.tail()


def test_bar_redraws_collapse_to_the_latest_and_glued_lines_keep_their_text():
    lines = [
        "INFO:torchtune.utils._logging:Learning rate scheduler is initialized.",
        "1|1|Loss: 10.0:  20%|██        | 1/5 [00:00<00:01,  2.50it/s]",
        "1|1|Loss: 10.0:  20%|██        | 1/5 [00:00<00:01,  2.50it/s][rank1]: Traceback (most recent call last):",
        "[rank1]:   File \"x.py\", line 3, in <module>",
        "1|2|Loss: 5.0:  40%|████      | 2/5 [00:00<00:00,  2.50it/s]",
        "1|3|Loss: 3.3:  60%|██████    | 3/5 [00:01<00:00,  2.50it/s]INFO:torchtune.utils._logging:Saving checkpoint...",
        "1|4|Loss: 2.5:  80%|████████  | 4/5 [00:01<00:00,  2.50it/s]",
        "toy recipe done",
    ]
    assert display_tail(lines) == [
        "INFO:torchtune.utils._logging:Learning rate scheduler is initialized.",
        "[rank1]: Traceback (most recent call last):",
        "[rank1]:   File \"x.py\", line 3, in <module>",
        "INFO:torchtune.utils._logging:Saving checkpoint...",
        "1|4|Loss: 2.5:  80%|████████  | 4/5 [00:01<00:00,  2.50it/s]",
        "toy recipe done",
    ]
    # a bar cut short by another rank's write (no counters yet) is a redraw too
    latest = "1|2|Loss: 5.0:  40%|████      | 2/5 [00:00<00:00,  2.50it/s]"
    assert display_tail(["1|1|Loss: 10.0: 20%|[rank1]: RuntimeError: boom", latest, "done"]) == [
        "[rank1]: RuntimeError: boom", latest, "done"]


def test_real_two_process_log_shows_one_bar_each_warning_once_and_no_noise():
    # captured from tiny/lora with 2 processes (tests/data/README.md): both ranks print the same warnings
    raw = _lines_of(DATA / "lora_2proc_5steps" / "output.log")
    shown = display_tail(raw)
    bars = [line for line in shown if "%|" in line]
    assert bars == ["1|5|Loss: 5.453219890594482: 100%|██████████| 5/5 [00:01<00:00,  4.63it/s]"]
    dtensor = [line for line in raw if "UserWarning: DTensor random operators" in line]
    assert len(dtensor) == 2  # the log keeps both
    i = shown.index(dtensor[0] + " (×2)")
    # its source line comes once, right under it
    assert shown[i + 1] == "  if not random._rng_tracker and is_rng_supported_mesh(mesh):"
    assert shown.count(shown[i + 1]) == 1
    # torch's set_vital deprecation (torchdata's StatefulDataLoader calls it) is gone, with its source line
    assert sum("'set_vital' is deprecated, please do not call" in line for line in raw) == 2
    assert sum("torch.set_vital(" in line for line in raw) == 2
    assert not any("set_vital" in line for line in shown)
    # the save's seven INFO lines are one
    assert sum("checkpoint" in line.lower() and line.startswith("INFO:") for line in raw) >= 7
    saves = [line for line in shown if re.search(r"checkpoint (saved|of size)|Saving|[Ss]aved in", line)]
    assert saves == ["checkpoint saved: epoch_0 (4 files, < 0.01 GiB) in 0.02 s"]


def test_repeated_warnings_with_rank_prefixes_and_glog_headers_count_as_one():
    lines = ["[default0]:/x/a.py:3: UserWarning: slow path", "[default0]:  warn('slow path')",
             "[default1]:/x/a.py:3: UserWarning: slow path", "[default1]:  warn('slow path')",
             "[W1201 05:38:51.259 ProcessGroupGloo.cpp:12] Warning: no NCCL here",
             "[W1201 05:38:52.001 ProcessGroupGloo.cpp:12] Warning: no NCCL here",
             "step line"]
    assert display_tail(lines) == ["[default0]:/x/a.py:3: UserWarning: slow path (×2)", "[default0]:  warn('slow path')",
                                   "[W1201 05:38:51.259 ProcessGroupGloo.cpp:12] Warning: no NCCL here (×2)",
                                   "step line"]
    # runs of one identical line collapse too; different lines never do
    assert display_tail(["x", "x", "x", "y", "x"]) == ["x (×3)", "y", "x"]


def test_torchruns_signal_traceback_becomes_one_line():
    shown = display_tail(["1|7|Loss: 1.4:  35%|███▌      | 7/20 [00:02<00:04,  3.00it/s]"] + SIGNAL_TRACEBACK)
    assert not any("SignalException" in line or "Traceback" in line for line in shown)
    assert shown[-1] == "torchrun got SIGTERM (signal 15) and stopped its workers"
    assert shown[-3].endswith("Received 15 death signal, shutting down workers")
    # a rank's own traceback stays: only torchrun's SignalException one goes
    crash = ["Traceback (most recent call last):", '  File "r.py", line 1, in <module>', "RuntimeError: boom"]
    assert display_tail(crash) == crash


def test_n_keeps_the_last_lines():
    assert display_tail([str(i) for i in range(10)], 3) == ["7", "8", "9"]
    assert display_tail(["a"], 0) == []


# -- a failed job's tail (issue 19): the failing rank's lines last, torchrun's report gone --------

REPORT_WORDS = ("ChildFailedError", "Failures:", "Root Cause (first observed failure):", "error_file:", "exitcode  :",
                "traceback : ", "<NO_OTHER_FAILURES>", "==========", "----------", "local_rank: 0)")


@pytest.mark.parametrize("name, last", [
    ("torchrun_rank1_crash.log", "[rank1]: RuntimeError: boom on rank one"),
    ("torchrun_glued_traceback.log", "[rank1]: RuntimeError: toy recipe crashed on purpose"),
    ("two_agents_raise_first.log", "[rank0]: ValueError: rank zero raised on purpose"),
    ("tee3_raise.log", "[default1]:[rank1]: ValueError: learning rate must be positive, got -1"),
    ("record_error_file.log", "[rank1]: RuntimeError: boom inside @record"),
    ("pre_init_config_error.log", "    object_type=dict"),  # no rank prefix: found by its traceback
    ("bare_exception.log", None),
])
def test_a_failed_tail_ends_with_the_failing_ranks_lines_not_torchruns_report(name, last):
    raw = _lines_of(DATA / name)
    shown = display_tail(raw)
    assert any("ChildFailedError" in line for line in raw)  # the log keeps torchrun's report
    assert not [line for line in shown if any(word in line for word in REPORT_WORDS)]
    if last is not None:
        assert shown[-1] == last
    # the failing rank (as the card's failure line names it) wrote the last lines: its last traceback
    reason = describe_failure("\n".join(raw))
    tag = f"[rank{reason.rank}]: "
    unglued = [line[line.index(tag):] if tag in line and not line.startswith("[") else line for line in raw]
    own = [line for line in unglued if strip_prefixes(line)[0] == reason.rank]
    if own:
        heads = [i for i, line in enumerate(own) if strip_prefixes(line)[2] == "Traceback (most recent call last):"]
        assert shown[-(len(own) - heads[-1]):] == own[heads[-1]:]
    else:  # no rank prefix (it failed before init_process_group): its traceback, as the failure names it
        tb = [line.strip() for line in reason.traceback.splitlines() if line.strip()]
        assert [line.strip() for line in shown[-len(tb):]] == tb
    # and a card's five lines are its last five
    assert display_tail(raw, 5) == shown[-5:]


def test_the_report_alone_is_dropped_when_its_traceback_scrolled_out():
    raw = _lines_of(DATA / "torchrun_rank1_crash.log")
    report = raw[raw.index("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ") + 1:]
    assert report[0].startswith("=====") and report[-1].startswith("=====")
    assert display_tail(["step 9", *report]) == ["step 9"]


def test_signal_kills_keep_torchruns_lines_when_the_failing_rank_wrote_nothing():
    raw = _lines_of(DATA / "sigkill.log")  # rank 1 was SIGKILLed: no traceback of its own
    shown = display_tail(raw)
    assert not [line for line in shown if any(word in line for word in REPORT_WORDS)]
    assert "failed (exitcode: -9) local_rank: 1" in shown[-1]


# -- noise every card showed (issue 22) -----------------------------------------------------------


def test_torchruns_omp_banner_is_dropped_and_other_star_lines_kept():
    raw = _lines_of(DATA / "redirects3_metrics.log")  # torchrun's banner and nothing else
    assert any(line.startswith("Setting OMP_NUM_THREADS environment variable") for line in raw)
    assert display_tail(raw) == []
    assert display_tail(["*" * 41, "results", "*" * 41]) == ["*" * 41, "results", "*" * 41]


@pytest.mark.parametrize("lines, shown", [
    (["a", "", "", "b"], ["a", "", "b"]),  # today: ["a", " (×2)", "b"]
    (["a", "", "  ", "", "b"], ["a", "", "b"]),
    (["", "", "a", "", ""], ["a"]),
    (["[rank0]: x", "[rank0]: ", "[rank0]: ", "[rank0]: y"], ["[rank0]: x", "[rank0]: ", "[rank0]: y"]),
    (["x", "x", "", "x"], ["x (×2)", "", "x"]),
])
def test_blank_lines_are_never_counted(lines, shown):
    assert display_tail(lines) == shown
    assert not any(line.strip().startswith("(×") for line in display_tail(lines))


def test_no_shipped_log_shows_a_lone_count_or_noise():
    for path in sorted(DATA.rglob("*.log")):
        for line in display_tail(_lines_of(path)):
            body = strip_prefixes(line)[2]
            assert not body.strip().startswith("(×"), (path, line)
            assert "OMP_NUM_THREADS" not in body and "set_vital" not in body, (path, line)


# torchtune 0.6.1's own words for one save (see test_checkpoint_lines_are_torchtunes_own_words)
INFO = "INFO:torchtune.utils._logging:"
DISTRIBUTED_SAVE = [  # lora_finetune_distributed through the checkpoint client, an intermediate epoch
    "Saving checkpoint. This may take some time. Retrieving full model state dict...",
    "Getting full model state dict took 2.51 secs",
    "Getting optimizer state dict...",
    "Getting optimizer state dict took 0.84 secs",
    "Model checkpoint of size 4.60 GiB saved to /out/epoch_{e}/model-00001-of-00002.safetensors",
    "Model checkpoint of size 1.40 GiB saved to /out/epoch_{e}/model-00002-of-00002.safetensors",
    "Adapter checkpoint of size 0.01 GiB saved to /out/epoch_{e}/adapter_model.pt",
    "Recipe checkpoint of size 0.02 GiB saved to /out/recipe_state/recipe_state.pt",
    "Saving checkpoint took 12.34 secs",
]
SINGLE_DEVICE_SAVE = [  # lora_finetune_single_device, its last epoch
    "Starting checkpoint save...",
    "Adapter checkpoint of size 0.01 GiB saved to /out/epoch_{e}/adapter_model.safetensors",
    "Saving final epoch checkpoint.",
    "Please note that you have set adapter_only=True, so only adapter weights will be saved."
    "You need to merge the adapter weights into your base model for further use. "
    "See FullModelHFCheckpointer.save_checkpoint for more details.",
    "Checkpoint saved in 1.20 seconds.",
]
DCP_SAVE = [  # a DistributedCheckpointer (full_finetune_distributed with enable_async_checkpointing, final epoch)
    "Saving checkpoint. This may take some time. Retrieving full model state dict...",
    "DistributedCheckpointer is saving a checkpoint for the epoch {e}",
    "Saving model checkpoint synchronously to /out/epoch_{e}.",
    "The full model checkpoint, including all the weights and configurations, has been saved successfully by the "
    "DistributedCheckpointer. You can now use this checkpoint for further training.",
    "Saving checkpoint took 3.00 secs",
]


def _save(lines, epoch):
    return [INFO + line.format(e=epoch) for line in lines]


def test_each_checkpoint_save_of_a_long_job_is_one_line():
    log = []
    for epoch in range(3):
        log += [f"{epoch + 1}|{10 * epoch + s}|Loss: 2.0:  50%|█████     | {s}/10 [00:01<00:01,  5.00it/s]"
                for s in range(1, 11)]
        log += _save(DISTRIBUTED_SAVE, epoch)
    log += _save(SINGLE_DEVICE_SAVE, 3) + _save(DCP_SAVE, 4) + ["done"]
    shown = display_tail(log)
    assert [line for line in shown if "checkpoint" in line] == [
        "checkpoint saved: epoch_0 (4 files, 6.03 GiB) in 12.34 s",
        "checkpoint saved: epoch_1 (4 files, 6.03 GiB) in 12.34 s",
        "checkpoint saved: epoch_2 (4 files, 6.03 GiB) in 12.34 s",
        "checkpoint saved: epoch_3 (1 file, 0.01 GiB) in 1.20 s",
        "checkpoint saved: epoch_4 in 3.00 s",
    ]
    assert shown[-1] == "done" and len(shown) == 7  # the five saves, the latest bar, "done"


def test_a_save_in_progress_or_cut_off_says_so():
    saving = display_tail(["step 9", *_save(DISTRIBUTED_SAVE[:5], 2)])
    assert saving == ["step 9", "saving checkpoint: epoch_2 (1 file, 4.60 GiB) ..."]
    assert display_tail(_save(DISTRIBUTED_SAVE[:2], 2)) == ["saving checkpoint ..."]
    # its first lines scrolled out of the tail: the rest is still one line
    assert display_tail(_save(DISTRIBUTED_SAVE[6:], 1)) == ["checkpoint saved: epoch_1 (2 files, 0.03 GiB) in 12.34 s"]
    # under torchrun --tee the rank's prefix stays
    tee = ["[default0]:" + line for line in _save(SINGLE_DEVICE_SAVE, 0)]
    assert display_tail(tee) == ["[default0]:checkpoint saved: epoch_0 (1 file, 0.01 GiB) in 1.20 s"]


def test_checkpoint_lines_are_torchtunes_own_words():
    """Every fixed part of the lines above is in torchtune 0.6.1's installed source, or the project's recipes."""
    site = Path(sysconfig.get_paths()["purelib"])
    files = [*(site / "torchtune" / "training" / "checkpointing").glob("*.py"),
             site / "recipes" / "lora_finetune_single_device.py", site / "recipes" / "lora_finetune_distributed.py",
             *(REPO / "recipes").glob("*.py")]
    # the string literals of the source (adjacent ones joined, f-strings' fixed parts), one per line
    source = "\n".join(node.value for p in files for node in ast.walk(ast.parse(p.read_text()))
                       if isinstance(node, ast.Constant) and isinstance(node.value, str))
    for line in DISTRIBUTED_SAVE + SINGLE_DEVICE_SAVE + DCP_SAVE:
        for sentence in re.split(r"(?<=\.) ?(?=[A-Z])", line):  # torchtune writes them glued or apart
            for part in re.split(r"[\d.]+ (?:GiB|secs|seconds)|/out/\S*|\{e\}|FullModelHFCheckpointer", sentence):
                assert part.strip() in source, part
    assert CHECKPOINT_RULE.member.search("Saving checkpoint. Retrieving full model state dict...")  # recipes/*.py


# -- rules a caller adds (a scheduler's) ----------------------------------------------------------

SLURM_CANCEL = [  # SLURM 22.05, scancel of job 7 running on n1
    "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-12-01T10:00:00 ***",
    "srun: Job step aborted: Waiting up to 12 seconds for job step to finish.",
    "srun: error: n1: task 0: Killed",
    "srun: launch/slurm: _step_signal: Terminating StepId=7.0",
]


def test_a_caller_adds_its_own_rules():
    rule = TailRule(name="x", member=re.compile(r"^noise (\d+)$"), summary=lambda ms, p: [f"{p}noise ×{len(ms)}"])
    assert display_tail(["a", "noise 1", "b", "[rank0]: noise 2"], rules=[rule]) == ["a", "noise ×2", "b"]
    assert apply_rule(["a", "b"], rule) == ["a", "b"]
    assert display_tail(["a", "noise 1"]) == ["a", "noise 1"]  # only when asked


def test_a_slurm_cancel_reads_as_a_stop():
    log = ["1|7|Loss: 1.4:  35%|███▌      | 7/20 [00:02<00:04,  3.00it/s]", *SLURM_CANCEL[:1], *SIGNAL_TRACEBACK,
           *SLURM_CANCEL[1:]]
    shown = display_tail(log, rules=SLURM_TAIL_RULES)
    assert shown[-1] == "torchrun got SIGTERM (signal 15) and stopped its workers"
    assert "SLURM cancelled job 7 on n1 at 2026-12-01T10:00:00; srun stopped its tasks" in shown
    assert not any(line.startswith(("slurmstepd:", "srun:")) for line in shown)
    # without the scheduler's rules the lines stay as they are
    assert [line for line in display_tail(log) if line.startswith(("slurmstepd:", "srun:"))] == SLURM_CANCEL


def test_a_slurm_cancel_line_written_into_a_progress_bars_line_still_reads_as_a_stop():
    # measured on the two-node test cluster: slurmstepd's line lands mid-line in the shared log
    log = ["1|13|Loss: 0.7692:   0%|          | 13/100000 [00:02<5:35:56,  4.96it/s]",
           "1|14|Loss: 0.71428571428slurmstepd-tmnode1: error: *** JOB 59 ON tmnode1 CANCELLED AT 2026-12-03T13:33:09 ***",
           "srun: forcing job termination",
           "57143:   0%|          | 14/100000 [00:02<5:35:52,  4.96it/s]", *SIGNAL_TRACEBACK]
    shown = display_tail(log, rules=SLURM_TAIL_RULES)
    assert "SLURM cancelled job 59 on tmnode1 at 2026-12-03T13:33:09; srun stopped its tasks" in shown
    assert not any("slurmstepd" in line or line.startswith("srun:") for line in shown), shown


def test_slurm_lines_of_a_time_limit_two_nodes_and_no_cancel():
    two = ["slurmstepd: error: *** JOB 8 ON n1 CANCELLED AT 2026-12-01T11:00:00 DUE TO TIME LIMIT ***",
           "slurmstepd: error: *** JOB 8 ON n2 CANCELLED AT 2026-12-01T11:00:00 DUE TO TIME LIMIT ***",
           "srun: error: n2: tasks 0-1: Terminated"]
    assert display_tail(two, rules=SLURM_TAIL_RULES) == [
        "SLURM cancelled job 8 on n1, n2 at 2026-12-01T11:00:00 (time limit); srun stopped its tasks"]
    # srun's kill line with no cancel among the lines (e.g. the OOM killer): shown as is
    assert display_tail(["x", "srun: error: n1: task 0: Killed"], rules=SLURM_TAIL_RULES) == [
        "x", "srun: error: n1: task 0: Killed"]


def test_a_failed_tail_and_the_failure_line_name_the_same_rank_whatever_the_window():
    # a card keeps the log's last lines only: here they hold rank 2's traceback but not rank 0's,
    # which raised first (tests/data/two_agents_both_raise.log: the two nodes' reports)
    text = (DATA / "two_agents_both_raise.log").read_text()
    lines = text.splitlines()
    window = lines[lines.index("[rank2]: Traceback (most recent call last):"):]  # 81 of its 91 lines
    assert not any("[rank0]: " in line for line in window)
    assert display_tail(window, 15)[-1] == "[rank2]: ValueError: rank 2 raised on purpose"  # the window alone
    reason = describe_failure(text)  # the job's failure.json: what the card's first line says
    assert reason.line.startswith("rank 0 failed first; 2 ranks failed: ")
    shown = display_tail(window, 15, failure=reason)
    assert shown[-1] == "[rank0]: ValueError: rank 0 raised on purpose"
    assert shown[-len(reason.traceback.splitlines()):] == [f"[rank0]: {t}" for t in reason.traceback.splitlines()]
    assert not [line for line in shown if any(word in line for word in REPORT_WORDS)]
    whole = display_tail(text.splitlines(), 15, failure=reason)  # the whole log: the same ending
    assert whole[-6:] == shown[-6:]


def test_a_stop_slurm_cancelled_nothing_of_reads_as_a_stop():
    # a stop through tune_magic on the two-node test cluster (SLURM 22.05): both agents got SIGTERM
    # and stopped their workers, then srun reported each node's task (verbatim, ids and hosts as measured)
    log = ["1|6|Loss: 1.6667:  0%|          | 6/100000 [00:19<...]", *SIGNAL_TRACEBACK,
           "srun: error: tmnode1: task 0: Exited with exit code 1",
           "srun: launch/slurm: _step_signal: Terminating StepId=1.0",
           "srun: error: tmnode2: task 1: Exited with exit code 1"]
    shown = display_tail(log, rules=SLURM_TAIL_RULES)
    assert shown[-1] == "torchrun got SIGTERM (signal 15) and stopped its workers"
    assert not any(line.startswith(("srun:", "slurmstepd")) or "Traceback" in line for line in shown), shown
    # a node that names itself (slurmstepd-n1:) and a kill after the grace period
    hard = [*SIGNAL_TRACEBACK, "slurmstepd-tmnode1: error: *** JOB 7 ON tmnode1 CANCELLED AT 2026-12-01T21:47:19 ***",
            "srun: error: tmnode1: task 0: Killed", "srun: error: tmnode2: task 1: Exited with exit code 143"]
    assert display_tail(hard, rules=SLURM_TAIL_RULES)[-2:] == [
        "SLURM cancelled job 7 on tmnode1 at 2026-12-01T21:47:19; srun stopped its tasks",
        "torchrun got SIGTERM (signal 15) and stopped its workers"]
    # a task that failed on its own (no stop among the lines) is shown as it is
    assert display_tail(["x", "srun: error: n2: task 1: Exited with exit code 1"], rules=SLURM_TAIL_RULES) == [
        "x", "srun: error: n2: task 1: Exited with exit code 1"]


# -- issue 26: the card's tail begins at a meaningful line, in the log's order ---------------------

# torchao 0.11's words at import without Triton, as `python -c "import torchao"` prints them here
NO_TRITON = "WARNING:torchao.kernel.intmm:Warning: Detected no triton, on systems without Triton certain kernels will not work"


def test_torchaos_no_triton_warning_is_noise_and_dropped():
    raw = _lines_of(DATA / "lora_2proc_5steps" / "output.log")
    assert raw.count(NO_TRITON) == 2  # the log keeps it: once per process
    assert not any("triton" in line for line in display_tail(raw))
    # with torchrun's rank prefix (--tee) too, and a line that only mentions triton stays
    tee = _lines_of(DATA / "tee3_filter0_metrics.log")
    assert any(line.startswith("[default0]:" + NO_TRITON) for line in tee)
    assert not any("Detected no triton" in line for line in display_tail(tee))
    assert display_tail(["triton kernels compiled", NO_TRITON]) == ["triton kernels compiled"]


def test_torchtunes_config_dump_is_one_line_and_a_cut_dump_is_dropped():
    # torchtune 0.6.1's log_config: "Running <Recipe> with resolved config:", a blank line, the YAML
    raw = _lines_of(DATA / "lora_2proc_5steps" / "output.log")
    head = raw.index("INFO:torchtune.utils._logging:Running LoRAFinetuneRecipe with resolved config:")
    yaml_end = raw.index("", head + 2)
    assert raw[head + 2] == "assets_dir: /tmp/tmh/assets" and yaml_end - head - 2 == 74
    shown = display_tail(raw)
    assert ("INFO:torchtune.utils._logging:Running LoRAFinetuneRecipe with resolved config: (74 lines, in the full log)"
            in shown)
    assert not any(line.startswith(("assets_dir:", "  num_heads:", "tune_magic_home:")) for line in shown)
    # a window that opens inside the dump (its head older than the lines read) begins after it
    for start in (head + 3, head + 40, yaml_end - 3):
        window = display_tail(raw[start:], 15)
        assert window[0] == "DEBUG:torchtune.utils._logging:Setting manual seed to local seed 0. Local seed is seed + rank = 0 + 0"
    # YAML-looking lines that are no dump stay: a traceback's, and a run of "key: value" lines mid-log
    crash = ["Traceback (most recent call last):", '  File "r.py", line 1, in <module>', "RuntimeError: boom"]
    assert display_tail(crash) == crash
    assert display_tail(["step 1", "lr: 0.1", "loss: 2.0"]) == ["step 1", "lr: 0.1", "loss: 2.0"]
    unsorted = ["step: 3", "loss: 2.0", "lr: 0.1", "", "done"]  # not to_yaml's sorted keys
    assert display_tail(unsorted) == unsorted


def test_the_last_step_comes_before_the_checkpoint_saved_after_it_as_in_the_log():
    raw = _lines_of(DATA / "lora_2proc_5steps" / "output.log")
    save = next(i for i, line in enumerate(raw) if "Saving checkpoint. Retrieving full model state dict" in line)
    # the log: step 5's bar (the save's first line glued after it), the save, then tqdm's closing redraw
    assert "1|5|Loss: 5.453219890594482: 100%" in raw[save] and raw[-1].startswith("1|5|Loss: 5.453219890594482: 100%")
    shown = display_tail(raw)
    assert shown[-2:] == ["1|5|Loss: 5.453219890594482: 100%|██████████| 5/5 [00:01<00:00,  4.63it/s]",
                          "checkpoint saved: epoch_0 (4 files, < 0.01 GiB) in 0.02 s"]
    # a new step after the save is drawn after it
    later = raw + ["2|6|Loss: 5.1: 20%|██        | 1/5 [00:00<00:01,  2.20it/s]"]
    assert display_tail(later)[-2:] == ["checkpoint saved: epoch_0 (4 files, < 0.01 GiB) in 0.02 s",
                                        "2|6|Loss: 5.1: 20%|██        | 1/5 [00:00<00:01,  2.20it/s]"]
