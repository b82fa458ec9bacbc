"""squeue parsing and the SLURM state mapping, on recorded (22.05) and constructed (23.11) output.

Samples and how they were made: tests/data/slurm/README.md.
"""

from __future__ import annotations

import json

import pytest

from tune_magic.schedulers.slurm.status import (
    CANCELLED_OUTSIDE,
    SQUEUE_FORMAT,
    Outcome,
    SlurmJob,
    SqueueParseError,
    expand_hostlist,
    format_minutes,
    job_outcome,
    parse_squeue_format,
    parse_squeue_json,
    parse_scontrol_jobs,
    parse_time_limit,
    scontrol_invalid_id,
    squeue_argv,
)
from tune_magic.registry.status import Status

from jobhelpers import DATA as TEST_DATA

DATA = TEST_DATA / "slurm"
NODES = ("tmnode1", "tmnode2")


def sample(name: str) -> str:
    return (DATA / name).read_text()


JSON_LIVE = {"22.05": "squeue_22.05_live.json", "23.11": "squeue_23.11_live_constructed.json"}
JSON_ENDED = {"22.05": "squeue_22.05_ended.json", "23.11": "squeue_23.11_ended_constructed.json"}


def test_the_samples_have_both_job_state_shapes():
    live22 = json.loads(sample(JSON_LIVE["22.05"]))
    live23 = json.loads(sample(JSON_LIVE["23.11"]))
    assert live22["meta"]["Slurm"]["release"] == "22.05.8"
    assert [j["job_state"] for j in live22["jobs"]] == ["RUNNING", "PENDING", "PENDING"]
    assert live23["meta"]["slurm"]["release"] == "23.11.1"
    assert [j["job_state"] for j in live23["jobs"]] == [["RUNNING"], ["PENDING"], ["PENDING"]]


@pytest.mark.parametrize("version", ["22.05", "23.11"])
def test_live_jobs_running_and_pending_with_reasons(version):
    jobs = parse_squeue_json(sample(JSON_LIVE[version]), ["1", "2", "3"])
    assert jobs == {
        "1": SlurmJob("1", "tune_magic-20261201-000000-aaaaaa", "RUNNING", (), None, NODES, 2, None, 0, None),
        "2": SlurmJob("2", "tune_magic-20261201-000001-bbbbbb", "PENDING", (), "Resources", (), 2, 120, 0, None),
        "3": SlurmJob("3", "tune_magic-20261201-000002-cccccc", "PENDING", (), "Priority", (), 1, None, 0, None),
    }
    assert [job_outcome(jobs[i]) for i in "123"] == [
        Outcome(Status.RUNNING, None),
        Outcome(Status.PENDING, "Resources"),
        Outcome(Status.PENDING, "Priority"),
    ]


@pytest.mark.parametrize("version", ["22.05", "23.11"])
def test_ended_jobs_map_to_our_statuses_and_reasons(version):
    jobs = parse_squeue_json(sample(JSON_ENDED[version]), ["4", "5", "6", "7", "8"])
    got = {jobs[i].name: (jobs[i].state, jobs[i].exit_code, jobs[i].signal, job_outcome(jobs[i])) for i in jobs}
    assert got == {
        "completed": ("COMPLETED", 0, None, Outcome(Status.SUCCEEDED, None)),
        "failed": ("FAILED", 3, None, Outcome(Status.FAILED, "exit code 3")),
        "cancelled": ("CANCELLED", None, 15, Outcome(Status.STOPPED, CANCELLED_OUTSIDE)),
        "node_fail": ("NODE_FAIL", None, 15, Outcome(Status.FAILED, "NODE_FAIL: a node of the job failed")),
        "timeout": ("TIMEOUT", None, 15, Outcome(Status.FAILED, "hit the --time limit 0:01:00")),
    }


@pytest.mark.parametrize("version", ["22.05", "23.11"])
def test_cancelled_is_our_stop_or_someone_elses(version):
    job = parse_squeue_json(sample(JSON_ENDED[version]), ["6"])["6"]
    assert job_outcome(job, stopped_by_us=True) == Outcome(Status.STOPPED, None)
    assert job_outcome(job, stopped_by_us=False) == Outcome(Status.STOPPED, "cancelled outside tune_magic")


@pytest.mark.parametrize("version", ["22.05", "23.11"])
def test_timeout_names_the_users_time_limit(version):
    job = parse_squeue_json(sample(JSON_ENDED[version]), ["8"])["8"]
    assert job.time_limit_minutes == 1
    assert job_outcome(job, time_limit="1") == Outcome(Status.FAILED, "hit the --time limit 1")


def test_constructed_23_11_flags_completing_and_out_of_memory():
    jobs = parse_squeue_json(sample(JSON_ENDED["23.11"]), ["101", "102"])
    assert jobs["101"].state == "CANCELLED" and jobs["101"].flags == ("COMPLETING",)
    assert job_outcome(jobs["101"]) == Outcome(Status.RUNNING, None)  # its processes are still ending
    assert (jobs["102"].state, jobs["102"].signal) == ("OUT_OF_MEMORY", 9)
    assert job_outcome(jobs["102"]) == Outcome(Status.FAILED, "OUT_OF_MEMORY: a process of the job ran out of memory")


def test_22_05_json_lists_every_job_so_the_parser_keeps_the_ids_asked_for():
    text = sample(JSON_ENDED["22.05"])
    assert sorted(parse_squeue_json(text), key=int) == [str(i) for i in range(1, 9)]  # squeue ignored --jobs
    assert sorted(parse_squeue_json(text, ["4", "999999"])) == ["4"]  # 999999: gone, simply absent
    assert parse_squeue_json(text, []) == {}


@pytest.mark.parametrize(
    "state, outcome",
    [
        ("PENDING", Outcome(Status.PENDING, None)),
        ("CONFIGURING", Outcome(Status.RUNNING, None)),
        ("COMPLETING", Outcome(Status.RUNNING, None)),
        ("RUNNING", Outcome(Status.RUNNING, None)),
        ("SUSPENDED", Outcome(Status.RUNNING, "suspended")),
        ("REQUEUED", Outcome(Status.PENDING, "requeued")),
        ("REQUEUE_HOLD", Outcome(Status.PENDING, "requeued")),
        ("COMPLETED", Outcome(Status.SUCCEEDED, None)),
        ("FAILED", Outcome(Status.FAILED, None)),
        ("OUT_OF_MEMORY", Outcome(Status.FAILED, "OUT_OF_MEMORY: a process of the job ran out of memory")),
        ("BOOT_FAIL", Outcome(Status.FAILED, "BOOT_FAIL: a node of the job failed to boot")),
        ("PREEMPTED", Outcome(Status.FAILED, "PREEMPTED: SLURM preempted the job")),
        ("DEADLINE", Outcome(Status.FAILED, "DEADLINE: the job reached its --deadline")),
        ("?", Outcome(Status.UNKNOWN, "SLURM state ?")),
        (["PENDING", "REQUEUED"], Outcome(Status.PENDING, "requeued")),
        (["RUNNING", "CONFIGURING"], Outcome(Status.RUNNING, None)),
        (["COMPLETED", "COMPLETING"], Outcome(Status.RUNNING, None)),
        (["FAILED", "LAUNCH_FAILED"], Outcome(Status.FAILED, None)),
        (["RUNNING", "SIGNALING"], Outcome(Status.RUNNING, None)),
    ],
)
def test_every_slurm_state_string_or_list(state, outcome):
    raw = {"jobs": [{"job_id": 9, "name": "x", "job_state": state, "state_reason": "None", "nodes": ""}]}
    assert job_outcome(parse_squeue_json(json.dumps(raw))["9"]) == outcome


def test_timeout_without_a_user_limit_prints_squeues_limit():
    job = SlurmJob("9", "x", "TIMEOUT", time_limit_minutes=36 * 60)
    assert job_outcome(job) == Outcome(Status.FAILED, "hit the --time limit 1-12:00:00")
    assert job_outcome(SlurmJob("9", "x", "TIMEOUT")) == Outcome(Status.FAILED, "hit the --time limit")


def test_failed_by_a_signal_says_so():
    assert job_outcome(SlurmJob("9", "x", "FAILED", signal=9)) == Outcome(
        Status.FAILED, "the batch script was killed by signal 9"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "printed no JSON"),
        ("slurm_load_jobs error: Unable to contact slurm controller", "printed no JSON"),
        ('{"meta": {}}', "no 'jobs' list"),
        ('{"jobs": [], "errors": [{"error": "Unable to contact slurm controller", "error_number": 1}]}', "reported errors"),
        ('{"jobs": [{"name": "x"}]}', "without job_id/job_state"),
        ('{"jobs": [{"job_id": 1, "job_state": 3}]}', "neither a string nor a list"),
    ],
)
def test_unreadable_json_raises_with_the_start_of_the_output(text, message):
    with pytest.raises(SqueueParseError, match=message):
        parse_squeue_json(text)


# --- the plain --format fallback --------------------------------------------------------------


def test_format_fallback_reads_the_recorded_live_and_ended_jobs():
    live = parse_squeue_format(sample("squeue_22.05_live.txt"))
    assert live == {
        "2": SlurmJob("2", "tune_magic-20261201-000001-bbbbbb", "PENDING", (), "Resources", (), 2, 120),
        "3": SlurmJob("3", "tune_magic-20261201-000002-cccccc", "PENDING", (), "Priority", (), 1, None),
        "1": SlurmJob("1", "tune_magic-20261201-000000-aaaaaa", "RUNNING", (), None, NODES, 2, None),
    }
    ended = parse_squeue_format(sample("squeue_22.05_ended.txt"))
    assert {j.name: job_outcome(j).status for j in ended.values()} == {
        "cancelled": Status.STOPPED,
        "completed": Status.SUCCEEDED,
        "failed": Status.FAILED,
        "node_fail": Status.FAILED,
        "timeout": Status.FAILED,
    }
    assert ended["8"].time_limit_minutes == 1 and ended["8"].nodes == ("tmnode1",)


def test_json_and_format_agree_on_what_matters():
    by_json = parse_squeue_json(sample(JSON_ENDED["22.05"]), ["4", "5", "6", "7", "8"])
    by_format = parse_squeue_format(sample("squeue_22.05_ended.txt"))
    for job_id, j in by_json.items():
        f = by_format[job_id]
        assert (f.name, f.state, f.reason, f.nodes, f.num_nodes, f.time_limit_minutes) == (
            j.name, j.state, j.reason, j.nodes, j.num_nodes, j.time_limit_minutes
        )


def test_format_keeps_a_bar_in_the_job_name():
    assert parse_squeue_format("5|RUNNING|None|1|n1|UNLIMITED|a|b\n")["5"].name == "a|b"


def test_format_refuses_a_line_without_its_fields():
    with pytest.raises(SqueueParseError, match="without the"):
        parse_squeue_format("JOBID PARTITION NAME\n")


@pytest.mark.parametrize(
    "text, minutes",
    [("1:00", 1), ("2:00:00", 120), ("1-12:00:00", 36 * 60), ("0:30", 1), ("UNLIMITED", None), ("NOT_SET", None)],
)
def test_time_limit_as_squeue_prints_it(text, minutes):
    assert parse_time_limit(text) == minutes


def test_format_minutes_prints_like_slurm():
    assert [format_minutes(m) for m in (1, 120, 36 * 60 + 5)] == ["0:01:00", "2:00:00", "1-12:05:00"]


# --- the command --------------------------------------------------------------------------------


def test_squeue_argv_asks_once_for_all_jobs_in_both_forms():
    assert squeue_argv(["12", "13"]) == ["squeue", "--jobs=12,13", "--states=all", "--json"]
    assert squeue_argv(("12",), json_output=False) == [
        "squeue", "--jobs=12", "--states=all", "--array", "--noheader", f"--format={SQUEUE_FORMAT}"
    ]


@pytest.mark.parametrize("ids", [[], ["12", "x"], ["1;rm"]])
def test_squeue_argv_refuses_non_ids(ids):
    with pytest.raises(ValueError):
        squeue_argv(ids)


# --- host lists ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("tmnode[1-2]", ["tmnode1", "tmnode2"]),
        ("tmnode1", ["tmnode1"]),
        ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("gpu-a[1-2],cpu7", ["gpu-a1", "gpu-a2", "cpu7"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("n[1-2]x", ["n1x", "n2x"]),
        ("a,b", ["a", "b"]),
        ("", []),
        ("(null)", []),
        (None, []),
    ],
)
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["n[1-2", "n1-2]", "n[3-1]", "n[a-b]", "n[1-]"])
def test_expand_hostlist_refuses_malformed_lists(text):
    with pytest.raises(SqueueParseError):
        expand_hostlist(text)


@pytest.mark.parametrize("state, verdict", [
    ("COMPLETED", "completed"), ("CANCELLED", "cancelled"), ("TIMEOUT", "timeout"), ("FAILED", "failed"),
    ("NODE_FAIL", "node_fail"), ("OUT_OF_MEMORY", "out_of_memory"), ("BOOT_FAIL", "failed"), ("PREEMPTED", "failed"),
    ("PENDING", None), ("RUNNING", None),
])
def test_ended_states_carry_the_verdict_the_outcome_rule_reads(state, verdict):
    assert job_outcome(SlurmJob("9", "x", state)).verdict == verdict


# --- array tasks (a sweep's trials), recorded on the test cluster --------------------------------


def test_array_tasks_are_keyed_by_their_task_ids_in_every_form():
    """RECORDED (SLURM 22.05.8, tests/data/slurm/squeue_22.05_array_*): an ``--array=0-3%2`` job
    (array id 8): tasks 0 and 1 running under their own job ids 9 and 10, tasks 2-3 folded into
    the pending record that keeps id 8; then every task cancelled (the pending record loses its
    task list)."""
    live = parse_squeue_json((DATA / "squeue_22.05_array_live.json").read_text(), ["8_0", "8_1", "8_2", "8_3", "8"])
    assert sorted(live) == ["8_0", "8_1", "8_2", "8_3"]  # never the array's own id, which a task holds too
    assert [live[k].state for k in ("8_0", "8_1", "8_2", "8_3")] == ["RUNNING", "RUNNING", "PENDING", "PENDING"]
    assert live["8_3"].reason == "JobArrayTaskLimit" and live["8_3"].job_id == "8_3"
    plain = parse_squeue_format((DATA / "squeue_22.05_array_live.txt").read_text())
    assert {k: (j.state, j.reason) for k, j in plain.items()} == {k: (j.state, j.reason) for k, j in live.items()}
    gone = parse_squeue_json((DATA / "squeue_22.05_array_cancelled.json").read_text(), ["8_0", "8_1", "8_2", "8_3"])
    assert sorted(gone) == ["8_0", "8_1"] and gone["8_1"].state == "CANCELLED"
    # the emptied record of the pending tasks answers for the array's own id: they were cancelled
    gone = parse_squeue_json((DATA / "squeue_22.05_array_cancelled.json").read_text(), ["8_2", "8"])
    assert list(gone) == ["8"] and gone["8"].state == "CANCELLED" and gone["8"].job_id == "8"
    # tasks that never started have no exit code (the record says 0): cancelled, never "succeeded"
    assert gone["8"].exit_code is None and live["8_3"].exit_code is None and live["8_0"].exit_code == 0


def test_scontrol_names_an_array_task_by_its_task_id():
    line = ("JobId=8 ArrayJobId=8 ArrayTaskId=3 ArrayTaskThrottle=2 JobName=tune_magic-sweep-s1 JobState=PENDING "
            "Reason=JobArrayTaskLimit Restarts=0 ExitCode=0:0 TimeLimit=UNLIMITED NumNodes=1 NodeList=")
    job = parse_scontrol_jobs(line)
    assert list(job) == ["8_3"] and job["8_3"].reason == "JobArrayTaskLimit"
    # 22.05, measured: a task cancelled while pending is "not found", like an unknown job id
    assert scontrol_invalid_id(1, "Job 8_3 not found\n") and not scontrol_invalid_id(0, "Job 8_3 not found")
