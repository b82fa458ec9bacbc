"""The card's form of a log's last lines (tune_magic.logs.tailview): display only."""

from __future__ import annotations

from pathlib import Path

from tune_magic.logs.follow import LineFollower
from tune_magic.logs.tailview import display_tail

DATA = Path(__file__).parent / "data"

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


def test_real_two_process_log_shows_one_bar_and_each_warning_once():
    # captured from tiny/lora with 2 processes (tests/data/README.md): both ranks print the same warnings
    raw = _lines_of(DATA / "lora_2proc_5steps" / "output.log")
    shown = display_tail(raw)
    bars = [line for line in shown if "%|" in line]
    assert bars == ["1|5|Loss: 5.453219890594482: 100%|██████████| 5/5 [00:01<00:00,  4.63it/s]"]
    warnings = [line for line in raw if "UserWarning: 'set_vital' is deprecated" in line]
    assert len(warnings) == 2  # the log keeps both
    shown_warnings = [line for line in shown if "UserWarning: 'set_vital' is deprecated" in line]
    assert shown_warnings == [warnings[0] + " (×2)"]
    # its source line comes once, right under it
    i = shown.index(shown_warnings[0])
    assert shown[i + 1] == '  torch.set_vital("Dataloader", "enabled", "True")  # type: ignore[attr-defined]'
    assert shown.count(shown[i + 1]) == 1
    assert "INFO:torchtune.utils._logging:Saving checkpoint. Retrieving full model state dict..." in shown


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
