"""Table tests of the SLURM scheduler's option checks (tune_magic/schedulers/slurm/options.py)."""

from __future__ import annotations

import pytest

from tune_magic.errors import PlanError
from tune_magic.schedulers.slurm.options import (
    IGNORED_SBATCH_VARIABLES,
    OWNED_OPTIONS,
    check_count,
    check_nodes,
    check_sbatch_options,
    check_time,
    sbatch_env,
    time_limit_seconds,
)

# --- --time ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("120", 120 * 60),  # M
        ("2:00:00", 2 * 3600),  # H:M:S
        ("1-12", 36 * 3600),  # D-H
        ("30:15", 30 * 60 + 15),  # M:S
        ("1-2:30", 86400 + 2 * 3600 + 30 * 60),  # D-H:M
        ("1-2:30:05", 86400 + 2 * 3600 + 30 * 60 + 5),  # D-H:M:S
        ("90", 90 * 60),  # sbatch does not range-check fields
        ("1:90:00", 3600 + 90 * 60),
        (" 45 ", 45 * 60),
        ("UNLIMITED", None),
        ("unlimited", None),
        ("INFINITE", None),
        ("0", None),  # sbatch: zero means no limit
    ],
)
def test_check_time_accepts_sbatch_forms(text, seconds):
    assert check_time(text) == text.strip()
    assert time_limit_seconds(text) == seconds


@pytest.mark.parametrize("text", ["2h", "1:2:3:4", "-5", "", "   ", "-1", "1-", "1-2:3:4:5", "1.5", "2 h", "1--2", ":30", "a-1"])
def test_check_time_refuses_other_text_naming_the_forms(text):
    with pytest.raises(PlanError) as err:
        check_time(text)
    msg = str(err.value)
    assert msg.startswith(f"--time {text!r} is not a SLURM time limit")
    assert "2:00:00" in msg and "UNLIMITED" in msg and "D-H" in msg


@pytest.mark.parametrize("text", ["１２０", "1:٣٠", "1-２", "２:00:00", "ınfınıte", "unlımıted", "120\u00a0"])
def test_check_time_accepts_ascii_only(text):
    # sbatch reads ASCII digits and words: full-width/Arabic-Indic digits, a dotless i that
    # upper-cases to I, a no-break space are not a limit to it
    with pytest.raises(PlanError) as err:
        check_time(text)
    assert str(err.value).startswith(f"--time {text!r} is not a SLURM time limit")


# --- counts ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value, n", [(1, 1), (2, 2), ("2", 2), (" 8 ", 8), (64, 64)])
def test_check_nodes_accepts_whole_numbers(value, n):
    assert check_nodes(value) == n


@pytest.mark.parametrize("value", [0, -1, "0", "-1", "abc", "", 1.5, "2.0", True, None, "two"])
def test_check_nodes_refuses_non_positive_and_words(value):
    with pytest.raises(PlanError, match=r"^--nodes must be a whole number ≥ 1, not .*; e\.g\. --nodes 2$"):
        check_nodes(value)


@pytest.mark.parametrize("value", ["２", "\u0663", "1\u00a0", "²"])
def test_check_counts_accept_ascii_digits_only(value):
    with pytest.raises(PlanError, match=r"^--nodes must be a whole number ≥ 1"):
        check_nodes(value)
    with pytest.raises(PlanError, match=r"^--gpus-per-node must be a whole number ≥ 0"):
        check_count("--gpus-per-node", value, minimum=0)


def test_check_nodes_refuses_a_range_saying_why():
    with pytest.raises(PlanError, match=r"a range of nodes is not supported; give one number"):
        check_nodes("1-2")


def test_check_count_names_its_option_and_minimum():
    assert check_count("--gpus-per-node", "0", minimum=0) == 0
    with pytest.raises(PlanError, match=r"^--cpus-per-node must be a whole number ≥ 1, not 'x'"):
        check_count("--cpus-per-node", "x")


# --- --sbatch=OPT ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values, argv",
    [
        (["--qos=high"], ["--qos=high"]),
        (["--exclusive"], ["--exclusive"]),
        (["--exclusive=user"], ["--exclusive=user"]),
        (["--constraint=a100", "--mem=0"], ["--constraint=a100", "--mem=0"]),
        (["--constraint a100"], ["--constraint", "a100"]),  # a value as the next word of the same --sbatch=
        (["-C a100"], ["-C", "a100"]),
        (["-Ca100"], ["-Ca100"]),  # attached short value
        (["-H"], ["-H"]),
        (["-Hk"], ["-Hk"]),  # grouped flags
        (["--comment='two words'"], ["--comment=two words"]),
        (["--gres=gpu:a100:8"], ["--gres=gpu:a100:8"]),
        (["--signal=B:USR1@60"], ["--signal=B:USR1@60"]),
        (["--qo=high"], ["--qo=high"]),  # unique prefix of --qos: handed on as written
        (["--some-future-option=1"], ["--some-future-option=1"]),  # unknown to our table: sbatch judges
        ([], []),
        (None, []),
    ],
)
def test_sbatch_options_are_handed_on_as_written(values, argv):
    assert list(check_sbatch_options(values).argv) == argv


@pytest.mark.parametrize(
    "written, own",
    [
        ("-N2", "--nodes N sets it"),
        ("-N 2", "--nodes N sets it"),
        ("--nodes=2", "--nodes N sets it"),
        ("--nodes 2", "--nodes N sets it"),
        ("-n4", "--nodes N sets it"),
        ("--ntasks=4", "--nodes N sets it"),
        ("--ntasks-per-node=8", "--nodes N sets it"),
        ("--tasks-per-node=8", "--nodes N sets it"),  # sbatch's alias
        ("-o out.log", "the job's log is the output file in its job directory"),
        ("--output=out.log", "the job's log is the output file in its job directory"),
        ("--out=out.log", "the job's log is the output file in its job directory"),  # getopt prefix
        ("-e err.log", "the job's log is the output file in its job directory"),
        ("--error=err.log", "the job's log is the output file in its job directory"),
        ("--open-mode=append", "the job's log is the output file in its job directory"),
        ("-D /tmp", "tune_magic sets the job's working directory"),
        ("--chdir=/tmp", "tune_magic sets the job's working directory"),
        ("--export=NONE", "tune_magic passes the kernel's environment"),
        ("-a 1-3", "a sweep (--sweep) is one job array: run a sweep instead"),
        ("--array=1-3", "a sweep (--sweep) is one job array: run a sweep instead"),
        ("--wrap=hostname", "tune_magic writes the batch script"),
        ("-W", "use tune-magic run --wait"),
        ("--wait", "use tune-magic run --wait"),
        ("-HW", "use tune-magic run --wait"),  # hidden in a group of flags
        ("--parsable", "tune_magic sets it to read the SLURM job id"),
        ("-J x", "tune_magic names the job tune_magic-<id>"),
        ("--job-name=x", "tune_magic names the job tune_magic-<id>"),
    ],
)
def test_owned_sbatch_options_are_refused_naming_what_sets_them(written, own):
    with pytest.raises(PlanError) as err:
        check_sbatch_options(["--qos=high", written])
    msg = str(err.value)
    assert msg.startswith(f"--sbatch={written}: the scheduler owns sbatch's --")
    assert own in msg


def test_every_owned_option_of_the_issue_is_refused():
    # the issue's list: -N/--nodes -n/--ntasks --ntasks-per-node -o/--output -e/--error --open-mode
    # -D/--chdir --export -a/--array --wrap -W/--wait --parsable -J/--job-name
    for long_name in ("nodes", "ntasks", "ntasks-per-node", "output", "error", "open-mode", "chdir", "export",
                      "array", "wrap", "wait", "parsable", "job-name"):
        assert long_name in OWNED_OPTIONS
        value = "" if long_name in ("wait", "parsable") else "=1"
        with pytest.raises(PlanError, match="the scheduler owns"):
            check_sbatch_options([f"--{long_name}{value}"])
    for short in "NnoeDaWJ":
        with pytest.raises(PlanError, match="the scheduler owns"):
            check_sbatch_options([f"-{short}" + ("" if short == "W" else "1")])


@pytest.mark.parametrize(
    "written, own",
    [("-p gpu", "--partition"), ("--partition=gpu", "--partition"), ("-t 10", "--time"), ("--time=10", "--time"),
     ("-A acct", "--account"), ("--account=acct", "--account"), ("-c 8", "--cpus-per-node"),
     ("--cpus-per-task=8", "--cpus-per-node"), ("--gpus-per-node=8", "--gpus-per-node")],
)
def test_sbatch_options_with_an_own_tune_magic_option_name_it(written, own):
    with pytest.raises(PlanError, match=rf"^--sbatch={written}: use tune_magic's own {own} option instead"):
        check_sbatch_options([written])


@pytest.mark.parametrize("written", ["--help", "-h", "--usage", "-V", "--version", "--test-only", "-M other", "--clusters=other"])
def test_sbatch_options_that_submit_nothing_or_elsewhere_are_refused(written):
    with pytest.raises(PlanError, match=rf"^--sbatch={written}: sbatch's --[a-z-]+ is not supported: "):
        check_sbatch_options([written])


@pytest.mark.parametrize(
    "written, message",
    [
        ("--partition", None),  # refused as own option before the missing value matters
        ("--qos", "sbatch's --qos needs a value: write --sbatch=--qos=VALUE"),
        ("-q", "sbatch's -q (--qos) needs a value: write --sbatch=--qos=VALUE"),
        ("--hold=yes", "sbatch's --hold takes no value"),
        ("--gpu=1", "--gpu is ambiguous in sbatch (--gpu-bind, --gpu-freq, --gpus"),
        ("-Z", "sbatch has no option -Z"),
        ("gpu", "'gpu' is not an sbatch option; each --sbatch= holds one option with its value"),
        ("--qos=high extra", "'extra' is not an sbatch option"),
        ("--comment='open", "No closing quotation; quote the value as a shell would"),
        ("", "--sbatch= is empty"),
    ],
)
def test_malformed_sbatch_options_are_refused(written, message):
    with pytest.raises(PlanError) as err:
        check_sbatch_options([written])
    if message:
        assert message in str(err.value)


def test_a_missing_value_never_takes_the_next_sbatch_option():
    # --sbatch=--qos --sbatch=--hold would hand sbatch "--qos --hold": qos "--hold"
    with pytest.raises(PlanError, match="needs a value"):
        check_sbatch_options(["--qos", "--hold"])


@pytest.mark.parametrize(
    "values, requeue",
    [([], False), (["--requeue"], True), (["--requeue", "--no-requeue"], False), (["--no-requeue", "--requeue"], True),
     (["--req"], True), (["--qos=high"], False)],
)
def test_requeue_is_reported_last_one_wins(values, requeue):
    assert check_sbatch_options(values).requeue is requeue


# --- the environment sbatch runs with ---------------------------------------------------------


def test_sbatch_env_drops_the_kernels_job_variables_and_warns_about_owned_sbatch_ones():
    env = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "SLURM_CONF": "/etc/slurm/test.conf",
        "SLURM_JOB_ID": "1",
        "SLURM_CPUS_PER_TASK": "7",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SBATCH_TIMELIMIT": "1",
        "SBATCH_PARTITION": "debug",
        "SBATCH_OUTPUT": "/tmp/x.out",
        "SBATCH_ERROR": "/tmp/x.err",
        "SBATCH_EXPORT": "NONE",
        "SBATCH_WAIT": "1",
    }
    before = dict(env)
    out, warnings = sbatch_env(env)
    assert out == {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "SLURM_CONF": "/etc/slurm/test.conf",
        "SBATCH_TIMELIMIT": "1",
        "SBATCH_PARTITION": "debug",
    }
    assert warnings == [
        "SBATCH_OUTPUT=/tmp/x.out is ignored: the job's log is the output file in its job directory",
        "SBATCH_ERROR=/tmp/x.err is ignored: the job's log is the output file in its job directory",
        "SBATCH_EXPORT=NONE is ignored: the job gets the kernel's environment",
        "SBATCH_WAIT=1 is ignored: tune_magic submits without waiting; use run --wait or job.wait()",
    ]
    assert env == before  # the caller's mapping is not changed


def test_sbatch_env_without_slurm_variables_is_unchanged_and_silent():
    env = {"PATH": "/usr/bin", "LANG": "C.UTF-8"}
    assert sbatch_env(env) == (env, [])


def test_every_ignored_sbatch_variable_warns():
    env = {name: "x" for name in IGNORED_SBATCH_VARIABLES}
    out, warnings = sbatch_env(env)
    assert out == {}
    assert [w.split("=")[0] for w in warnings] == list(IGNORED_SBATCH_VARIABLES)
