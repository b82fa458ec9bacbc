"""schedulers/slurm/array.py: a sweep as one job array (sbatch --array, %A_%a files, squeue's task
ids, MaxArraySize). Pure; the squeue text is tests/data/slurm/squeue_22.05_array_constructed.txt."""

from __future__ import annotations


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tune_magic.errors import PlanError
from tune_magic.schedulers.slurm.array import (
    DEFAULT_MAX_ARRAY_SIZE,
    SQUEUE_ARRAY_ENV,
    ArrayLimits,
    ArrayTasks,
    array_option,
    array_tasks_from_json,
    check_array_size,
    escape_filename,
    expand_filename,
    parse_array_job_id,
    parse_array_limits,
    parse_task_list,
    task_output_pattern,
)
from tune_magic.schedulers.slurm.status import SqueueParseError, parse_squeue_format

from jobhelpers import DATA as TEST_DATA

DATA = TEST_DATA / "slurm"


def sections() -> dict[str, str]:
    out: dict[str, list[str]] = {}
    current = None
    for line in (DATA / "squeue_22.05_array_constructed.txt").read_text().splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            out[current] = []
        elif current and line and not line.startswith("#"):
            out[current].append(line)
    return {k: "\n".join(v) + "\n" for k, v in out.items()}


# --- sbatch --array -----------------------------------------------------------------------------

def test_array_option():
    assert array_option(6, 2) == "--array=0-5%2"
    assert array_option(6) == "--array=0-5"
    assert array_option(6, 6) == "--array=0-5"      # a limit that limits nothing is left out
    assert array_option(1) == "--array=0-0"
    for bad in ((0, None), (3, 0)):
        with pytest.raises(ValueError):
            array_option(*bad)


# --- file name patterns -------------------------------------------------------------------------

def test_task_output_pattern_escapes_the_users_percent_signs():
    pattern = task_output_pattern("/home/u/100%/sweep-", ".log")
    assert pattern == "/home/u/100%%/sweep-%A_%a.log"
    assert expand_filename(pattern, array_job_id=7, task_id=3) == "/home/u/100%/sweep-7_3.log"
    assert escape_filename("%j%%") == "%%j%%%%"


def test_a_backslash_is_refused_because_slurm_would_then_expand_nothing():
    with pytest.raises(PlanError, match="backslash"):
        task_output_pattern("/home/u/a\\b/")
    # what SLURM does with one (remove_path_slashes): no expansion, backslashes dropped
    assert expand_filename("/x\\y/%A_%a", array_job_id=7, task_id=3) == "/xy/%A_%a"


def test_expand_filename_widths_and_job_ids():
    assert expand_filename("t-%3a-%A-%j.out", array_job_id=7, task_id=3, job_id=12) == "t-003-7-12.out"
    assert expand_filename("%%a", array_job_id=7, task_id=3) == "%a"
    with pytest.raises(ValueError, match="cannot expand %N"):
        expand_filename("%N.out", array_job_id=7, task_id=3)
    with pytest.raises(ValueError, match="cannot expand %j"):
        expand_filename("%j.out", array_job_id=7, task_id=3)


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(list("ab/_-.%% 0Aaj")), max_size=20), st.text(st.sampled_from(list(".%lgo")), max_size=5),
       st.integers(1, 10**9), st.integers(0, 10**6))
def test_every_prefix_and_suffix_comes_back_around_the_task_id(prefix, suffix, job, task):
    pattern = task_output_pattern(prefix, suffix)
    assert expand_filename(pattern, array_job_id=job, task_id=task) == f"{prefix}{job}_{task}{suffix}"


# --- squeue's ids -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, tasks", [
    ("7_3", ArrayTasks("7", (3,))),
    ("  7_3", ArrayTasks("7", (3,))),                           # squeue's right-aligned column
    ("7_[2-5%2]", ArrayTasks("7", (2, 3, 4, 5), 2)),
    ("7_[2-5]", ArrayTasks("7", (2, 3, 4, 5))),
    ("4_[20%2]", ArrayTasks("4", (20,), 2)),
    ("9_[0-20:4]", ArrayTasks("9", (0, 4, 8, 12, 16, 20))),
    ("11_[1,3,5-7]", ArrayTasks("11", (1, 3, 5, 6, 7))),
    ("1080_[5-1024]", ArrayTasks("1080", tuple(range(5, 1025)))),
])
def test_parse_array_job_id(text, tasks):
    assert parse_array_job_id(text) == tasks


def test_a_cut_list_says_so_and_keeps_only_whole_items():
    text = "12_[1-2,4-5,7-8,10-11,13-14,16-17,19-20,22-23,25-26,28-29,31-32,...%4]"
    got = parse_array_job_id(text)
    assert got.truncated and got.max_running == 4
    assert got.task_ids == tuple(i for i in range(1, 33) if i % 3)
    # cut in the middle of an item, the item is dropped
    assert parse_task_list("0-3,5,17-1...") == ((0, 1, 2, 3, 5), None, True)
    # the cut squeue makes without dots (a merged record): 63 characters, the last item unsure
    merged = "100,103,106,109,112,115,118,121,124,127,130,133,136,139,142,145"
    assert len(merged) == 63
    ids, _, truncated = parse_task_list(merged)
    assert truncated and ids == tuple(range(100, 143, 3))
    assert SQUEUE_ARRAY_ENV == {"SLURM_BITSTR_LEN": "0"}


@pytest.mark.parametrize("text", ["7", "123456", "7+0", "7+1"])
def test_jobs_that_are_not_array_tasks(text):
    assert parse_array_job_id(text) is None


@pytest.mark.parametrize("text", ["7_", "7_[", "7_[]", "7_[a-b]", "7_[5-2]", "7_[0-4:0]", "7_[1-3%x]", "x_3", "7_3_4"])
def test_bad_ids(text):
    with pytest.raises(SqueueParseError):
        parse_array_job_id(text)


def test_ids_for_scancel():
    assert parse_array_job_id("7_[2-4%2]").ids == ("7_2", "7_3", "7_4")


def test_squeue_lines_folded_and_expanded_name_the_same_tasks():
    data = sections()
    folded = parse_squeue_format(data["folded"])
    expanded = parse_squeue_format(data["expanded"])

    def tasks(jobs, state):
        return sorted(t for job_id, job in jobs.items() if job.state == state
                      for t in parse_array_job_id(job_id).task_ids)

    for state in ("PENDING", "RUNNING"):
        assert tasks(folded, state) == tasks(expanded, state)
    assert tasks(folded, "PENDING") == [2, 3, 4, 5] and tasks(folded, "RUNNING") == [0, 1]
    # the folded record answers for each of its tasks, by the id a task's record keeps (7_3)
    assert sorted(folded) == sorted(expanded) == ["7_0", "7_1", "7_2", "7_3", "7_4", "7_5"]
    assert folded["7_3"].reason == expanded["7_3"].reason == "JobArrayTaskLimit"
    assert folded["7_3"].job_id == "7_3"
    forms = parse_squeue_format(data["forms"])
    assert sorted(k for k in forms if k.startswith("9_")) == sorted(f"9_{t}" for t in (0, 4, 8, 12, 16, 20))
    assert sorted(k for k in forms if k.startswith("11_")) == ["11_1", "11_3", "11_5", "11_6", "11_7"]
    assert len([k for k in forms if k.startswith("1080_")]) == 1020 and "4_20" in forms
    assert sorted(int(k[3:]) for k in forms if k.startswith("12_")) == [i for i in range(1, 33) if i % 3]


def test_array_tasks_from_json():
    # squeue --json fields as src/plugins/openapi/v0.0.38/jobs.c writes them (22.05) and as
    # data_parser v0.0.40 does (23.11: numbers as {set, infinite, number}); constructed
    pending_22 = {"job_id": 13, "job_state": "PENDING", "array_job_id": 7, "array_task_id": None,
                  "array_max_tasks": 2, "array_task_string": "2-5%2"}
    running_22 = {"job_id": 8, "job_state": "RUNNING", "array_job_id": 7, "array_task_id": 1,
                  "array_max_tasks": 2, "array_task_string": None}
    plain_22 = {"job_id": 3, "job_state": "RUNNING", "array_job_id": 0, "array_task_id": None,
                "array_max_tasks": 0, "array_task_string": ""}
    assert array_tasks_from_json(pending_22) == ArrayTasks("7", (2, 3, 4, 5), 2)
    assert array_tasks_from_json(running_22) == ArrayTasks("7", (1,), 2)
    assert array_tasks_from_json(plain_22) is None

    def num(n):
        return {"set": n is not None, "infinite": False, "number": n or 0}

    pending_23 = {"job_id": num(13), "array_job_id": num(7), "array_task_id": num(None),
                  "array_max_tasks": num(2), "array_task_string": "2-5%2"}
    assert array_tasks_from_json(pending_23) == ArrayTasks("7", (2, 3, 4, 5), 2)
    assert array_tasks_from_json({**pending_23, "array_task_id": num(4), "array_task_string": ""}) == \
        ArrayTasks("7", (4,), 2)
    assert array_tasks_from_json({"array_job_id": num(0)}) is None
    with pytest.raises(SqueueParseError, match="neither array_task_id nor array_task_string"):
        array_tasks_from_json({"array_job_id": 7, "array_task_id": None, "array_task_string": ""})


# --- the cluster's limits -----------------------------------------------------------------------

SHOW_CONFIG = """\
Configuration data as of 2026-12-01T10:00:00
AccountingStorageBackupHost = (null)
MailProg                = /bin/mail
MaxArraySize            = 1001
MaxDBDMsgs              = 20008
MaxJobCount             = 10000
SchedulerParameters     = bf_continue,max_array_tasks=500,default_queue_depth=100
"""


def test_parse_array_limits():
    assert parse_array_limits(SHOW_CONFIG) == ArrayLimits(1001, 500)
    no_params = SHOW_CONFIG.replace("bf_continue,max_array_tasks=500,default_queue_depth=100", "(null)")
    assert parse_array_limits(no_params) == ArrayLimits(1001, None)
    with pytest.raises(SqueueParseError, match="no MaxArraySize"):
        parse_array_limits("MaxJobCount = 5\n")
    assert ArrayLimits() == ArrayLimits(DEFAULT_MAX_ARRAY_SIZE, None)


def test_check_array_size():
    check_array_size(1001, 1001)                                  # indexes 0-1000: the most MaxArraySize 1001 allows
    with pytest.raises(PlanError, match=r"1,002 trials needs array task indexes 0-1001, but this cluster's "
                                        r"MaxArraySize is 1,001 \(indexes 0-1000\): narrow the sweep to at most 1,001"):
        check_array_size(1002, 1001)
    with pytest.raises(PlanError, match=r"MaxArraySize = 0"):
        check_array_size(1, 0)
    check_array_size(500, ArrayLimits(1001, 500))
    with pytest.raises(PlanError, match=r"501 trials is more than this cluster's max_array_tasks \(500 tasks"):
        check_array_size(501, ArrayLimits(1001, 500))
