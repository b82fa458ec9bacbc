"""Failure reasons read from real logs.

Logs named ``tests/data/<scenario>.log`` were captured here from real torchrun (or one-process)
runs of tests/data/capture_worker.py; tests/data/capture_logs.py re-captures them (see
tests/data/README.md). Tests whose name says ``quoted`` use verbatim excerpts of public GitHub
issues (their URL is next to them) for what cannot happen on this machine (CUDA, NCCL).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tune_magic.logs.failure import Evidence, FailureReason, describe_failure, failure_line
from tune_magic.logs.reports import parse_reports
from tune_magic.logs.logfiles import read_rank_logs
from tune_magic.logs.oom import OomEvidence

from jobhelpers import DATA


COLLECTIVE = "waiting for the other ranks (one of them stalled, crashed, or ran different code); " \
             "the limit is init_process_group's timeout"
PORT_HINT = "another job or program listens on it; leave the endpoint out (no --master-port / --rdzv-endpoint) " \
            "and a free port is picked"


def log(name: str) -> str:
    return (DATA / f"{name}.log").read_text()


def check(reason: FailureReason | None, line: str, *, kind: str, rank, exc_type) -> FailureReason:
    assert reason is not None
    assert (reason.line, reason.kind, reason.rank, reason.exc_type) == (line, kind, rank, exc_type)
    return reason


# -- exceptions ---------------------------------------------------------------------------------


def test_rank_raised_after_init_prefixed():
    # 2-process toy recipe, rank 1 raised; rank 0 then raised too ("Connection closed by peer")
    # but torchrun's report names rank 1 as the root cause and rank 0 as SIGTERMed
    r = check(describe_failure(log("torchrun_rank1_crash")), "rank 1: RuntimeError: boom on rank one",
              kind="exception", rank=1, exc_type="RuntimeError")
    assert (r.local_rank, r.host, r.exitcode, r.pid) == (1, "localhost", 1, 4462)
    assert r.traceback.startswith("Traceback (most recent call last):\n  File ")
    assert r.traceback.endswith("\nRuntimeError: boom on rank one") and "[rank1]" not in r.traceback


def test_a_traceback_glued_to_another_ranks_progress_line_is_found_whole():
    # rank 0's bar had no newline yet when rank 1's excepthook wrote: "...20%|[rank1]: Traceback ..."
    text = log("torchrun_glued_traceback")
    assert "Loss: 10.0: 20%|[rank1]: Traceback (most recent call last):\n" in text
    r = check(describe_failure(text), "rank 1: RuntimeError: toy recipe crashed on purpose", kind="exception", rank=1,
              exc_type="RuntimeError")
    assert r.traceback.startswith("Traceback (most recent call last):\n  File ")
    assert r.traceback.endswith('raise RuntimeError(cfg.get("crash_message", "toy recipe crashed on purpose"))\n'
                                "RuntimeError: toy recipe crashed on purpose")
    # the same for an unprefixed traceback (a rank failing before init_process_group)
    plain = log("pre_init_import_error").replace("Traceback (most recent call last):",
                                                 "1|1|Loss: 10.0: 20%|Traceback (most recent call last):", 1)
    assert describe_failure(plain).traceback.startswith("Traceback (most recent call last):\n  File ")


@pytest.mark.parametrize("name,line,rank,exc_type", [
    ("pre_init_import_error", "rank 1: ModuleNotFoundError: No module named 'tune_magic_no_such_module'", 1,
     "ModuleNotFoundError"),
    # both ranks read the missing file: the first one torchrun saw, and how many failed
    ("pre_init_missing_file", "rank 0 failed first; 2 ranks failed: FileNotFoundError: [Errno 2] No such file or "
     "directory: '/nonexistent/tune_magic/train.json'", 0, "FileNotFoundError"),
    ("pre_init_config_error",
     "rank 0: omegaconf.errors.ConfigAttributeError: Key 'batch_sizee' is not in struct. Did you mean: 'batch_size'?",
     0, "omegaconf.errors.ConfigAttributeError"),
    ("bare_exception", "rank 1: Exception: x", 1, "Exception"),
])
def test_rank_raised_before_init_process_group_has_no_prefix(name, line, rank, exc_type):
    # no [rankN]: prefix exists before init_process_group; the report names the rank
    text = log(name)
    assert "[rank" not in text
    r = check(describe_failure(text), line, kind="exception", rank=rank, exc_type=exc_type)
    assert r.traceback.startswith("Traceback (most recent call last):") and r.exitcode == 1


def test_multi_line_message_is_kept_whole():
    r = describe_failure(log("pre_init_config_error"))
    assert r.message == "Key 'batch_sizee' is not in struct. Did you mean: 'batch_size'?\n" \
                        "full_key: batch_sizee\nobject_type=dict"
    assert r.traceback.endswith("    full_key: batch_sizee\n    object_type=dict")


@pytest.mark.parametrize("name,line,exc_type", [
    ("one_process_raise", "ValueError: learning rate must be positive, got -1", "ValueError"),
    ("one_process_bare_exception", "Exception: x", "Exception"),
])
def test_one_process_job(name, line, exc_type):
    r = check(describe_failure(log(name)), line, kind="exception", rank=None, exc_type=exc_type)
    assert r.traceback.splitlines()[-1] == line


def test_bare_exception_line_outside_a_traceback():
    # nothing before "Exception": found as the log's last exception line
    r = describe_failure("starting\nException: x\nbye\n")
    check(r, "Exception: x", kind="exception", rank=None, exc_type="Exception")


def test_tee_prefixes_default_and_rank():
    # --tee 3: "[default1]:[rank1]: ValueError: ..."
    assert "[default1]:[rank1]: ValueError" in log("tee3_raise")
    r = check(describe_failure(log("tee3_raise")), "rank 1: ValueError: learning rate must be positive, got -1",
              kind="exception", rank=1, exc_type="ValueError")
    assert "[default" not in r.traceback and "[rank" not in r.traceback


def test_redirects_need_the_rank_files():
    # --redirects 3: the combined log has only torchrun's report; the traceback is in the rank's file
    text = log("redirects3_raise")
    check(describe_failure(text), "rank 1: exited with code 1", kind="exit_code", rank=1, exc_type=None)
    rank_logs = read_rank_logs(DATA / "redirects3_raise")
    assert sorted(rank_logs) == [0, 1]
    r = check(describe_failure(text, rank_logs=rank_logs),
              "rank 1: ValueError: learning rate must be positive, got -1", kind="exception", rank=1,
              exc_type="ValueError")
    assert "raise ValueError" in r.traceback


def test_record_error_file_is_read(tmp_path):
    # @record: torchrun's report names <log dir>/.../attempt_0/1/error.json; here the capture's copy
    text = log("record_error_file")
    [captured] = {e.error_file for e in parse_reports(text) if e.rank == 1}
    run_dir = captured.split("/attempt_0/")[0]
    local = tmp_path / "ranks"
    shutil.copytree(DATA / "record_error_file", local)
    [copied] = local.glob("*/attempt_0/1/error.json")
    stack = json.loads(copied.read_text())["message"]["extraInfo"]["py_callstack"]
    r = check(describe_failure(text.replace(run_dir, str(copied.parents[2]))),
              "rank 1: RuntimeError: boom inside @record", kind="exception", rank=1, exc_type="RuntimeError")
    assert r.traceback == stack  # the file's text, trailing newline included


def test_record_error_file_gone_uses_the_report_traceback():
    # the captured path (a temporary directory) no longer exists: the report's traceback field
    r = check(describe_failure(log("record_error_file")), "rank 1: RuntimeError: boom inside @record",
              kind="exception", rank=1, exc_type="RuntimeError")
    assert r.traceback.startswith("Traceback (most recent call last):\n  File ")
    assert r.traceback.endswith("RuntimeError: boom inside @record")


# -- several agents in one log ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["two_agents_raise_first", "two_agents_signal_first"])
def test_two_agents_a_raise_wins_over_a_signal_in_either_order(name):
    text = log(name)
    roots = [(e.rank, e.exitcode) for e in parse_reports(text) if e.root]
    order = [(0, 1), (1, -9)] if name == "two_agents_raise_first" else [(1, -9), (0, 1)]
    assert roots == order
    # both failed on their own; "first" only where the raise came first (rank 1's SIGKILL was 3 s earlier)
    first = " failed first" if name == "two_agents_raise_first" else ""
    r = check(describe_failure(text), f"rank 0{first}; 2 ranks failed: ValueError: rank zero raised on purpose",
              kind="exception", rank=0, exc_type="ValueError")
    assert r.host == "localhost"  # one host in the log: not named in the line


def test_two_agents_a_raise_caused_by_a_dead_peer_loses_to_the_signal():
    # rank 1 was killed; rank 0 then raised "Connection closed by peer" (a consequence)
    text = log("two_agents_peer_killed")
    assert [(e.rank, e.exitcode) for e in parse_reports(text)] == [(1, -9), (0, 1)]
    check(describe_failure(text), "rank 1: killed by SIGKILL (signal 9)", kind="signal", rank=1, exc_type=None)


def test_root_cause_that_only_lost_its_peer_yields_to_the_killed_rank():
    # --monitor-interval 2: by torchrun's next look rank 0 had raised "Connection closed by peer",
    # so the report's root cause is rank 0; rank 1, killed by SIGKILL, is the failure
    text = log("sigkill_slow_monitor")
    assert [(e.rank, e.exitcode, e.root) for e in parse_reports(text)] == [(1, -9, False), (0, 1, True)]
    r = check(describe_failure(text), "rank 1: killed by SIGKILL (signal 9)", kind="signal", rank=1, exc_type=None)
    assert r.pid == 24151


def test_several_hosts_are_named():
    text = log("two_agents_raise_first").replace("host      : localhost", "host      : node-a", 1)
    r = describe_failure(text)
    assert (r.line, r.host) == ("rank 0 on node-a failed first; 2 ranks failed: ValueError: rank zero raised on purpose",
                                "node-a")


def test_the_rank_that_raised_first_is_named_though_its_report_comes_second():
    # two agents (nodes) append to one log, as srun's do: rank 0 (node 0) raised at .2 s, rank 2
    # (node 1) at .5 s of the same second; node 0's report is printed 2 s later (its rank 1 is slow
    # to stop), so the reports' order and their whole-second times both point at rank 2
    text = log("two_agents_both_raise")
    entries = parse_reports(text)
    assert [(e.rank, e.exitcode, e.root) for e in entries] == [(2, 1, True), (1, 143, False), (0, 1, True)]
    assert entries[0].time == entries[2].time  # the same second
    assert text.index("[rank0]: ValueError") < text.index("[rank2]: ValueError")  # raised first
    check(describe_failure(text), "rank 0 failed first; 2 ranks failed: ValueError: rank 0 raised on purpose",
          kind="exception", rank=0, exc_type="ValueError")  # rank 1's exit 143 is its stop, not a failure
    on_nodes = text.replace("host      : localhost", "host      : n2", 1)  # node 1's report comes first
    r = describe_failure(on_nodes)
    assert (r.line, r.host) == ("rank 0 on localhost failed first; 2 ranks failed: ValueError: rank 0 raised on "
                                "purpose", "localhost")


def test_the_tracebacks_order_wins_over_report_seconds_across_a_seconds_edge():
    # rank 0 raised first (its traceback is first in the log), but its agent saw it just after the
    # second turned, so its report says :51 and rank 2's :50 (the captured log, that time edited)
    text = log("two_agents_both_raise")
    first, second = (m.start() for m in re.finditer(r"time      : 2026-12-01_21:35:50", text))
    assert first < text.index("rank      : 2") < second < text.index("rank      : 0 (local")  # rank 2, then rank 0
    edited = text[:second] + "time      : 2026-12-01_21:35:51" + text[second + len("time      : 2026-12-01_21:35:50"):]
    assert [e.time for e in parse_reports(edited) if e.root] == ["2026-12-01_21:35:50", "2026-12-01_21:35:51"]
    assert describe_failure(edited).line == "rank 0 failed first; 2 ranks failed: ValueError: rank 0 raised on purpose"


def test_a_rank_that_raised_first_without_a_report_is_still_named_first():
    # node 0's agent is stopped before it prints its report (srun --kill-on-bad-exit ends the other
    # nodes' agents once one node's fails): the log ends after node 1's report (the captured log, cut there)
    text = log("two_agents_both_raise")
    cut = text[:text.index("E1201 21:35:52.496000")]
    assert [e.rank for e in parse_reports(cut)] == [2]  # rank 0 raised (first), but no report names it
    r = describe_failure(cut)
    assert (r.line, r.rank, r.exc_type) == ("rank 0 failed first; 2 ranks failed: ValueError: rank 0 raised on purpose",
                                            0, "ValueError")
    # a rank that only lost its peer does not count, reported or not (rank 0's report cut off here)
    peer = log("two_agents_peer_killed")
    peer = peer[:peer.index("E1201 04:09:23.186000")]
    assert [e.rank for e in parse_reports(peer)] == [1] and "[rank0]: RuntimeError" in peer
    assert describe_failure(peer).line == "rank 1: killed by SIGKILL (signal 9)"


def test_one_rank_failing_says_nothing_of_others():
    # rank 0 was stopped by torchrun (SIGTERM) after rank 1 raised: one failure
    assert describe_failure(log("torchrun_rank1_crash")).line == "rank 1: RuntimeError: boom on rank one"


# -- signals and the OOM killer -----------------------------------------------------------------


def test_signal_says_which_signal():
    r = check(describe_failure(log("sigkill")), "rank 1: killed by SIGKILL (signal 9)", kind="signal", rank=1,
              exc_type=None)
    assert (r.exitcode, r.pid) == (-9, 10669)


def test_oom_killer_only_with_evidence():
    text = log("sigkill")
    named = OomEvidence(pids=frozenset({10669}), kernel_log_read=True, cgroup_limited=frozenset({10669}),
                        lines=("Memory cgroup out of memory: Killed process 10669 (python)",))
    r = check(describe_failure(text, evidence=Evidence(oom=named)),
              "rank 1: killed by the OOM killer (its memory cgroup reached its limit; SIGKILL)", kind="oom_killer", rank=1,
              exc_type=None)
    assert r.traceback == "Memory cgroup out of memory: Killed process 10669 (python)"
    # the kernel log names another pid: not this rank
    other = OomEvidence(pids=frozenset(), cgroup_kills=1, cgroup_read=True, kernel_log_read=True)
    assert failure_line(text, evidence=Evidence(oom=other)) == "rank 1: killed by SIGKILL (signal 9)"
    # no kernel log, but the job's cgroup counted a kill
    counted = OomEvidence(cgroup_kills=1, cgroup_read=True)
    assert failure_line(text, evidence=Evidence(oom=counted)) == \
        "rank 1: killed by the OOM killer (its memory cgroup reached its limit; SIGKILL)"
    # a job the user stopped never says OOM
    assert failure_line(text, evidence=Evidence(stopped=True, oom=named)) == "rank 1: killed by SIGKILL (signal 9)"


def test_one_process_job_killed_by_a_signal():
    assert describe_failure("") is None
    r = describe_failure("", evidence=Evidence(returncode=-9, pid=4321))
    check(r, "killed by SIGKILL (signal 9)", kind="signal", rank=None, exc_type=None)
    oom = OomEvidence(pids=frozenset({4321}), kernel_log_read=True)
    assert failure_line("", evidence=Evidence(returncode=-9, pid=4321, oom=oom)) == \
        "killed by the OOM killer (the machine ran out of memory; SIGKILL)"
    assert failure_line("", evidence=Evidence(returncode=3)) == "exited with code 3"


# -- a traceback the process survived ---------------------------------------------------------

HANDLED = "CUDA out of memory (RuntimeError: CUDA out of memory. Tried to allocate 2 GiB (handled))"


@pytest.mark.parametrize("name,returncode,line,kind", [
    # the recipe printed a handled exception's traceback (print_exc), went on with its progress
    # bar, then ended some other way: that way is the reason
    ("one_process_survived_exit3", 3, "exited with code 3", "exit_code"),
    ("one_process_survived_sigkill", -9, "killed by SIGKILL (signal 9)", "signal"),
    # the same traceback as the last thing it printed before sys.exit(3): it is the reason
    ("one_process_print_exc_exit3", 3, HANDLED, "cuda_oom"),
])
def test_one_process_traceback_it_survived_is_not_the_failure(name, returncode, line, kind):
    text = log(name)
    assert text.count("RuntimeError: CUDA out of memory. Tried to allocate 2 GiB (handled)") == 1
    r = check(describe_failure(text, evidence=Evidence(returncode=returncode, pid=4321)), line, kind=kind, rank=None,
              exc_type="RuntimeError" if kind == "cuda_oom" else None)
    assert r.exitcode == returncode


def test_one_process_traceback_it_survived_without_a_return_code():
    # no report, no return code: nothing explains the end (the caller says so)
    assert describe_failure(log("one_process_survived_exit3")) is None
    # exit code 1 is not explained by a traceback the process went on from either
    assert failure_line(log("one_process_survived_exit3"), evidence=Evidence(returncode=1)) == "exited with code 1"


def test_an_unprefixed_traceback_another_rank_survived_is_not_the_failing_ranks():
    # rank 0 printed the handled traceback and kept printing its progress bar; rank 1 exited 3
    text = log("survived_rank1_exit3")
    assert [(e.rank, e.exitcode, e.root) for e in parse_reports(text)] == [(0, -15, False), (1, 3, True)]
    r = check(describe_failure(text, evidence=Evidence(returncode=1)), "rank 1: exited with code 3",
              kind="exit_code", rank=1, exc_type=None)
    assert r.traceback is None


def test_an_unprefixed_traceback_that_is_the_last_output_explains_a_plain_exit_code():
    # rank 1 printed the traceback and exited 3; rank 0 printed nothing more before torchrun ended it
    text = log("rank1_print_exc_exit3")
    assert [(e.rank, e.exitcode) for e in parse_reports(text)] == [(0, -15), (1, 3)]
    r = check(describe_failure(text), f"rank 1: {HANDLED}", kind="cuda_oom", rank=1, exc_type="RuntimeError")
    assert r.exitcode == 3 and r.traceback.endswith("RuntimeError: CUDA out of memory. Tried to allocate 2 GiB (handled)")


def test_a_prefixed_traceback_the_rank_survived_is_not_the_failure():
    # the captured crash with more [rank1]: output of that rank after its traceback: it went on
    text = log("torchrun_rank1_crash")
    last = [i for i, line in enumerate(text.splitlines()) if line.startswith("[rank1]: RuntimeError")][-1]
    lines = text.splitlines()
    lines.insert(last + 1, "[rank1]: 1|3|Loss: 2.5")
    check(describe_failure("\n".join(lines)), "rank 1: exited with code 1", kind="exit_code", rank=1, exc_type=None)
    # torch's own C++ log lines after it are not the rank's output
    lines[last + 1] = "[rank1]:[W1201 03:59:43.187000 ProcessGroup.cpp:1] Warning: destroy_process_group() was not called"
    assert failure_line("\n".join(lines)) == "rank 1: RuntimeError: boom on rank one"


# -- timeouts and ports -------------------------------------------------------------------------


def test_gloo_timeout():
    # real run: init_process_group(timeout=3 s), rank 1 stalls, rank 0's all_reduce times out
    r = check(describe_failure(log("gloo_timeout")), f"rank 0: gloo recv timed out after 3 s {COLLECTIVE}",
              kind="gloo_timeout", rank=0, exc_type="RuntimeError")
    assert "Timed out waiting 3000ms for recv operation" in r.message


def test_rendezvous_timeout():
    # real run: --nnodes 2 with one agent and --rdzv-conf join_timeout=5
    check(describe_failure(log("rendezvous_timeout")),
          "rendezvous timed out: not every node's torchrun joined within the join timeout; start one torchrun "
          "per node with the same --nnodes, --rdzv-endpoint and --rdzv-id (--rdzv-conf join_timeout=SECONDS "
          "waits longer)", kind="rendezvous_timeout", rank=None,
          exc_type="torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError")


@pytest.mark.parametrize("name", ["eaddrinuse", "torchrun_eaddrinuse"])
def test_eaddrinuse_names_the_port(name):
    # real runs: torchrun --master-port 29511 while that port was taken
    r = check(describe_failure(log(name)), f"port 29511 is already in use (EADDRINUSE): {PORT_HINT}",
              kind="eaddrinuse", rank=None, exc_type="torch.distributed.DistNetworkError")
    assert "address already in use" in r.message


# -- quoted from public reports (no GPU here) ----------------------------------------------------

# https://github.com/antgroup/echomimic_v2/issues/115
CUDA_OOM_NEW = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.22 GiB. GPU 0 has a total capacity of 15.69 GiB "
    "of which 3.71 GiB is free. Including non-PyTorch memory, this process has 11.14 GiB memory in use. Of the "
    "allocated memory 10.14 GiB is allocated by PyTorch, and 771.43 MiB is reserved by PyTorch but unallocated. If "
    "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
)
# https://github.com/One-2-3-45/One-2-3-45/issues/25
CUDA_OOM_OLD = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.69 GiB (GPU 0; 14.56 GiB total capacity; "
    "649.97 MiB already allocated; 1.31 GiB free; 1.01 GiB reserved in total by PyTorch) If reserved memory is >> "
    "allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory "
    "Management and PYTORCH_CUDA_ALLOC_CONF\n"
    "Mesh saved to: /home/joni/joni/test/One-2-3-45/exp/00_zero123_lysol/mesh.ply\n"
)
ADVICE = "lower the batch size or sequence length, or turn on activation checkpointing"


def test_cuda_oom_quoted():
    check(describe_failure(CUDA_OOM_NEW),
          f"CUDA out of memory on GPU 0: tried to allocate 4.22 GiB with 3.71 GiB free of 15.69 GiB "
          f"(torch.OutOfMemoryError); {ADVICE}", kind="cuda_oom", rank=None, exc_type="torch.OutOfMemoryError")
    check(describe_failure(CUDA_OOM_OLD),
          f"CUDA out of memory on GPU 0: tried to allocate 1.69 GiB with 1.31 GiB free of 14.56 GiB "
          f"(torch.cuda.OutOfMemoryError); {ADVICE}", kind="cuda_oom", rank=None,
          exc_type="torch.cuda.OutOfMemoryError")


def test_cuda_oom_in_a_torchrun_report_quoted():
    # the new-format message as a rank's traceback line, inside a captured report: rank named
    text = log("tee3_raise").replace("[default1]:[rank1]: ValueError: learning rate must be positive, got -1",
                                     "[default1]:[rank1]: " + CUDA_OOM_NEW.strip())
    r = describe_failure(text)
    assert (r.kind, r.rank) == ("cuda_oom", 1)
    assert r.line.startswith("rank 1: CUDA out of memory on GPU 0: tried to allocate 4.22 GiB with 3.71 GiB free")


# https://github.com/huggingface/picotron_tutorial/issues/6 (two excerpts of the one log in it)
NCCL_PICOTRON = """\
[E ProcessGroupNCCL.cpp:915] [Rank 2] NCCL watchdog thread terminated with exception: [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=120000) ran for 120822 milliseconds before timing out.
terminate called after throwing an instance of 'std::runtime_error'
  what():  [Rank 2] NCCL watchdog thread terminated with exception: [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=120000) ran for 120822 milliseconds before timing out.
[E ProcessGroupNCCL.cpp:488] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.
[E ProcessGroupNCCL.cpp:494] To avoid data inconsistency, we are taking the entire process down.
...
  exitcode  : -6 (pid: 3437)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 3437
[7]:
  time      : 2025-05-01_11:12:35
  host      : 472a4389fceb
  rank      : 7 (local_rank: 7)
  exitcode  : -6 (pid: 3438)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 3438
-----------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-05-01_11:12:35
  host      : 472a4389fceb
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 3431)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 3431
=====================================================
"""

# https://github.com/XPixelGroup/BasicSR/issues/737
NCCL_BASICSR = """\
[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.
[rank1]:[E626 06:24:44.906457629 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 1] Exception (either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811, last completed NCCL work: 807.
[rank0]:[E626 06:24:44.159932949 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600030 milliseconds before timing out.
"""


def test_nccl_timeout_quoted():
    r = check(describe_failure(NCCL_PICOTRON),
              f"rank 0: NCCL allreduce timed out after 120 s {COLLECTIVE}; the process was ended by SIGABRT",
              kind="nccl_timeout", rank=0, exc_type=None)
    assert (r.exitcode, r.pid) == (-6, 3431) and "[Rank 2] Watchdog caught" in r.traceback
    # no report in the excerpt: the first rank whose watchdog fired
    check(describe_failure(NCCL_BASICSR), f"rank 1: NCCL allreduce timed out after 600 s {COLLECTIVE}",
          kind="nccl_timeout", rank=1, exc_type=None)


# -- no failure -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tee3_metrics", "redirects3_metrics", "filter0_metrics"])
def test_successful_runs_have_no_reason(name):
    assert describe_failure(log(name)) is None
    assert failure_line(log(name)) is None


def test_no_failure_in_log():
    assert describe_failure("1|3|Loss: 2.0\nall good\n") is None


def test_reason_is_its_line_as_a_string():
    r = describe_failure(log("sigkill"))
    assert str(r) == r.line == failure_line(log("sigkill"))
    assert r.to_dict()["kind"] == "signal"


def test_a_rank_traceback_glued_after_the_bar_is_found_whole():
    # captured here (toy recipe, 2 processes, crash_rank=1): rank 1's traceback begins on the line of
    # rank 0's open tqdm bar, so its first line does not start the line; regression: the traceback
    # was cut down to its last line
    text = (
        "INFO:torchtune.utils._logging:Writing logs to /tmp/h/runs/toy/j/logs/log_1796105474.txt\n"
        "1|1|Loss: 10.0:  20%|██        | 1/5 [00:00<00:00,  4.99it/s][rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/w/tests/recipes/toy_recipe.py", line 119, in <module>\n'
        "[rank1]:     main(sys.argv[1:])\n"
        '[rank1]:   File "/w/tests/recipes/toy_recipe.py", line 92, in main\n'
        '[rank1]:     raise RuntimeError(cfg.get("crash_message", "toy recipe crashed on purpose"))\n'
        "[rank1]: RuntimeError: toy recipe crashed on purpose\n"
        "1|2|Loss: 5.0:  40%|████      | 2/5 [00:00<00:00,  4.99it/s]1|3|Loss: 3.33:  60%|██████    | 3/5 "
        "[00:00<00:00,  4.99it/s][rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/w/tests/recipes/toy_recipe.py", line 112, in main\n'
        "[rank0]:     dist.barrier()\n"
        "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:20677.\n"
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-01_06:11:16\n  host      : localhost\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 31164) \n  error_file: <N/A>\n"
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
        "============================================================\n")
    reason = describe_failure(text)
    assert reason.line == "rank 1: RuntimeError: toy recipe crashed on purpose"
    assert reason.traceback.splitlines() == [
        "Traceback (most recent call last):",
        '  File "/w/tests/recipes/toy_recipe.py", line 119, in <module>',
        "    main(sys.argv[1:])",
        '  File "/w/tests/recipes/toy_recipe.py", line 92, in main',
        '    raise RuntimeError(cfg.get("crash_message", "toy recipe crashed on purpose"))',
        "RuntimeError: toy recipe crashed on purpose",
    ]


# -- an exception whose message spans lines -----------------------------------------------------

INSTANTIATION = ("torchtune.config._errors.InstantiationError: Error loading "
                 "'torchtune.utils.metric_logging.DiskLogger': ModuleNotFoundError(\"No module named "
                 "'torchtune.utils.metric_logging'\")")
INSTANTIATION_MESSAGE = ("Error loading 'torchtune.utils.metric_logging.DiskLogger':\n"
                         "ModuleNotFoundError(\"No module named 'torchtune.utils.metric_logging'\")\n"
                         "Are you sure that 'metric_logging' is importable from module 'torchtune.utils'?")


@pytest.mark.parametrize("name, report", [
    # the project's lora_finetune on the tiny model with metric_logger._component_=
    # torchtune.utils.metric_logging.DiskLogger (a path of torchtune before 0.6): one process, no
    # torchrun report, exit code 1; then the same with --nproc_per_node 2 (torchrun's report)
    ("instantiation_error", False),
    ("instantiation_error_2proc", True),
])
def test_a_message_over_unindented_lines_is_the_exception_of_the_failure(name, report):
    text = log(name)
    assert bool(parse_reports(text)) == report
    r = check(describe_failure(text, evidence=Evidence(returncode=1)), f"rank 0: {INSTANTIATION}", kind="exception",
              rank=0, exc_type="torchtune.config._errors.InstantiationError")
    assert r.message == INSTANTIATION_MESSAGE
    assert r.traceback.endswith("InstantiationError: " + INSTANTIATION_MESSAGE)
    assert "ModuleNotFoundError: No module named 'torchtune.utils.metric_logging'" in r.traceback  # the chain


def _python(tmp_path, code: str) -> tuple[str, int]:
    """Run ``code`` in a real Python, stdout and stderr in one file as a job's log; (log, exit code)."""
    import subprocess
    import sys

    out = tmp_path / "out.log"
    with out.open("wb") as f:
        code = "import sys, traceback\nsys.stdout.reconfigure(line_buffering=True)\n" + code
        rc = subprocess.run([sys.executable, "-c", code], stdout=f, stderr=subprocess.STDOUT, timeout=60).returncode
    return out.read_text(), rc


@pytest.mark.parametrize("code, line, exc_type, message", [
    # the whole kind: the last exception of a real traceback, whatever its message's shape
    ("raise ValueError('bad value:\\nx=3 is below 4\\nraise x')", "ValueError: bad value: x=3 is below 4",
     "ValueError", "bad value:\nx=3 is below 4\nraise x"),
    ("raise ValueError('first\\n\\nafter a blank line')", "ValueError: first", "ValueError",
     "first\n\nafter a blank line"),
    ("class Diverged(Exception):\n    pass\nraise Diverged('loss is nan:\\nat step 3')", "Diverged: loss is nan: at step 3",
     "Diverged", "loss is nan:\nat step 3"),
    # a chain whose first message spans lines: the last exception is the one named
    ("try:\n    raise KeyError('inner\\nline two')\nexcept KeyError as e:\n    raise RuntimeError('outer\\nwhy') from e",
     "RuntimeError: outer", "RuntimeError", "outer\nwhy"),
    ("try:\n    raise OSError('one\\ntwo')\nexcept OSError:\n    raise ValueError('three')",
     "ValueError: three", "ValueError", "three"),
])
def test_the_last_exception_of_a_real_traceback_whatever_its_message(tmp_path, code, line, exc_type, message):
    text, rc = _python(tmp_path, "print('Step 1 | loss:2.0 lr:0.001 ')\n" + code)
    assert rc == 1
    r = check(describe_failure(text, evidence=Evidence(returncode=rc)), line, kind="exception", rank=None,
              exc_type=exc_type)
    assert r.message == message and r.traceback.startswith("Traceback (most recent call last):")
    if "from e" in code or "except OSError" in code:
        assert r.traceback.count("Traceback (most recent call last):") == 2


@pytest.mark.parametrize("code, rc, line", [
    # a traceback the process printed and went on from stays survived, multi-line message or not
    ("try:\n    raise ValueError('a\\nb')\nexcept ValueError:\n    traceback.print_exc()\n"
     "print('Step 2 | loss:1.0 lr:0.001 ')\nsys.exit(3)", 3, "exited with code 3"),
    ("try:\n    raise ValueError('a\\nb')\nexcept ValueError:\n    traceback.print_exc()\n"
     "print('1|2|Loss: 1.0: 20%|##  | 2/10')\nsys.exit(1)", 1, "exited with code 1"),
    # printed as the last thing before sys.exit(3): its lines are its message (nothing came after)
    ("try:\n    raise ValueError('a\\nb')\nexcept ValueError:\n    traceback.print_exc()\nsys.exit(3)", 3,
     "ValueError: a"),
])
def test_a_multi_line_traceback_the_process_went_on_from_is_not_its_failure(tmp_path, code, rc, line):
    text, got = _python(tmp_path, code)
    assert got == rc
    assert failure_line(text, evidence=Evidence(returncode=rc)) == line


def test_an_error_files_message_over_several_lines_keeps_its_type(tmp_path):
    """torchelastic's ``@record`` writes ``"<type>: <str(exc)>"``: for the InstantiationError, three
    lines; its type is still the exception's (it used to read as a plain ``Exception``)."""
    from tune_magic.logs.tracebacks import split_exception

    text = "torchtune.config._errors.InstantiationError: " + INSTANTIATION_MESSAGE
    assert split_exception(text) == ("torchtune.config._errors.InstantiationError", INSTANTIATION_MESSAGE)
    assert split_exception("RuntimeError: boom") == ("RuntimeError", "boom")
    assert split_exception("not an exception at all\nsecond") == ("Exception", "not an exception at all\nsecond")
