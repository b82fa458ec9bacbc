"""The README and docs/ say only what is true of the code: every tune-magic command and magic they
show parses with the real parsers (the CLI's argparse parsers and tune_magic.plan.options' own
options, the magics' magic_arguments parsers, torchrun's words through tune_magic.config.launchwords), every
option they name exists, every code block parses (shell words with shlex, Python with ast after
IPython's own input transformation, YAML with yaml, TOML with tomllib), every internal link and
anchor resolves, the README stays a newcomer's page (under 12 KB), and its two set-up commands are
the scripts CI's .ci/run calls."""

from __future__ import annotations

import argparse
import ast
import re
import shlex
import tomllib
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
#: The README's set-up block, byte for byte: CI (.ci/run) runs its test command.
SETUP = ("```bash\n"
         "scripts/demo    # the demo: runs notebooks/quickstart.ipynb in a real kernel, prints a summary\n"
         "scripts/test    # the whole test suite (unit + end-to-end); add -m \"not e2e\" for the fast unit tests only\n"
         "```\n")
#: Options of other tools that the pages name (sbatch, srun, scancel, squeue, scontrol, jupyter,
#: pytest, pip), each a real option of that tool; everything else must be tune_magic's or torchrun's.
OTHER_TOOLS = {
    "sbatch": {"--parsable", "--array", "--output", "--error", "--job-name", "--nodes", "--requeue", "--no-requeue",
               "--signal", "--export", "--qos", "--exclusive", "--gres", "--ntasks-per-node", "--cpus-per-task"},
    "srun": {"--ntasks-per-node", "--export", "--ntasks", "--nodes"},
    "scancel": {"--signal", "--full", "--state"},
    "squeue": {"--jobs", "--json", "--format"},
    "torchrun": {"--local-addr", "--standalone"},
    "jupyter": {"--allow-root", "--no-browser", "--ip"},
    "pytest": {"--durations"},
    "bench/run.py": {"--quick", "--only", "--write"},
    "tune download": {"--output-dir"},
    "scripts/gpu-smoke": {"--cpu", "--dry-run"},
    "scripts/demo": {"--out"},
}


# --- the real parsers ----------------------------------------------------------------------------

class _Parsed(Exception):
    """Raised in place of running a command once its real parser has read the words."""

    def __init__(self, parser):
        self.parser = parser


@contextmanager
def _parse_only(check_words: bool):
    """argparse parsers built inside tune_magic's command functions parse for real (errors exit 2),
    then stop the command before it does anything; with ``check_words`` False they only report
    themselves (for their option list)."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        if check_words:
            original(self, args, namespace)
        raise _Parsed(self)

    argparse.ArgumentParser.parse_args = parse_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original


def _generic(kind: str) -> tuple:
    from tune_magic.job.launch import launch_options
    from tune_magic.plan import options as launchopts

    return launch_options({"run": launchopts.RUN, "cmd": launchopts.CMD, "resume": launchopts.RESUME}[kind])


def _torchrun_flags() -> set[str]:
    """torchrun's options (read from torch's own parser, once per install), and ``tune run``'s
    ``--config``, the other flag of a launch's words."""
    from tune_magic.config import torchrun_options

    return {s for opt in torchrun_options.options().values() for s in opt.spellings} | {"--config"}


def _own_flags(kind: str) -> set[str]:
    from tune_magic.plan.options import _table

    return set(_table(_generic(kind)))


def cli_flags(command: str) -> set[str]:
    """Every option ``tune-magic COMMAND`` takes, from its real parser."""
    from tune_magic.ui import cli

    if command in ("run", "cmd"):
        return _own_flags(command) | _torchrun_flags()
    if command == "resume":
        return _own_flags("resume")
    if command == "help":
        return set()
    with _parse_only(check_words=False), pytest.raises(_Parsed) as got:
        cli._COMMANDS[command][0](["--help"])
    return set(got.value.parser._option_string_actions)


def check_cli(words: list[str]) -> None:
    """Parse ``tune-magic WORDS`` with the real parsers; fail on any error."""
    from tune_magic.plan import options as launchopts
    from tune_magic.config.launchwords import tokenise
    from tune_magic.ui import cli

    command, rest = words[0], words[1:]
    assert command in cli._COMMANDS, f"tune-magic has no command {command!r}"
    if command in ("run", "cmd"):
        own, tail = launchopts.split_own(rest, _generic(command), f"tune-magic {command}")
        if tail:
            tokenise(tail)
        return
    if command == "resume":
        job, _, extra = launchopts.split_job_words(rest, _generic("resume"), "tune-magic resume")
        assert job is not None, words
        return
    if command == "help":
        assert not rest or rest[0] in cli._COMMANDS, words
        return
    with _parse_only(check_words=True):
        try:
            cli._COMMANDS[command][0](rest)
        except _Parsed:
            return
        except SystemExit as exc:
            pytest.fail(f"tune-magic {' '.join(words)}: argparse refused it (exit {exc.code})")
    pytest.fail(f"tune-magic {command} did not parse its words with argparse")


def magic_flags(magic: str) -> set[str]:
    """Every option of ``%magic`` (``%%tune_run`` included), from its real parser."""
    from tune_magic.ui.magics import TuneMagics

    if magic == "tune_run":
        return _own_flags("run") | _torchrun_flags()
    if magic == "tune_resume":
        return _own_flags("resume")
    func = getattr(TuneMagics, magic, None)
    assert func is not None and hasattr(func, "parser"), f"no magic %{magic}"
    return set(func.parser._option_string_actions)


def check_magic(magic: str, words: list[str]) -> None:
    """Parse ``%magic WORDS`` as the magic does; fail on any error."""
    from tune_magic.plan import options as launchopts
    from tune_magic.config.launchwords import tokenise
    from tune_magic.ui.magics import TuneMagics

    if magic == "tune_run":
        own, tail = launchopts.split_own(words, _generic("run"), "%%tune_run")
        tokenise(tail)
        return
    if magic == "tune_resume":
        job, _, _ = launchopts.split_job_words(words, _generic("resume"), "%tune_resume")
        assert job is not None, words
        return
    func = getattr(TuneMagics, magic, None)
    assert func is not None and hasattr(func, "parser"), f"no magic %{magic}"
    try:
        func.parser.parse_args(words)
    except Exception as exc:  # magic_arguments' parser raises UsageError
        pytest.fail(f"%{magic} {' '.join(words)}: {exc}")


# --- reading the pages -----------------------------------------------------------------------------

FENCE = re.compile(r"^( *)```([^\n`]*)\n(.*?)^\1```", re.M | re.S)
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9_-]*)")
PLACEHOLDER = re.compile(r"[\[\]|()]|\.\.\.|\b[A-Z][A-Z_]+\b")


def blocks(page: Path) -> list[tuple[str, str]]:
    return [(m.group(2).strip(), m.group(3)) for m in FENCE.finditer(page.read_text())]


def prose(page: Path) -> str:
    return FENCE.sub("", page.read_text())


def spans(page: Path) -> list[str]:
    return SPAN.findall(prose(page))


def _is_synopsis(text: str) -> bool:
    """A usage line (``[--name N]``, ``JOB``, ``...``) rather than a command to run."""
    return bool(PLACEHOLDER.search(text))


def _check_flags(flags: set[str], known: set[str], where: str) -> None:
    unknown = sorted(f for f in flags if f not in known)
    assert not unknown, f"{where}: no such option {unknown}"


def check_command_text(text: str, where: str, whole: bool = True) -> bool:
    """Check one command line of a page (shell or magic): its options exist, and, when ``whole``
    (a code block's line, not a usage line), it parses as the command would parse it. A span in
    prose is a fragment (``%%tune_run --sweep``): only its options are checked. Returns whether
    ``text`` was such a command."""
    text = text.strip()
    magic = re.match(r"%%?(tune_\w+)(\s|$)(.*)", text, re.S)
    if magic:
        name, rest = magic.group(1), magic.group(3)
        _check_flags({f.split("=")[0] for f in FLAG.findall(rest)}, magic_flags(name) | {"--help", "-h"}, where)
        if whole and not _is_synopsis(rest):
            check_magic(name, shlex.split(rest))
        return True
    if text.startswith("tune-magic"):
        words = shlex.split(text, comments=True)
        if len(words) < 2 or words[1].endswith(":"):  # `tune-magic run: warning: ...` is its output
            return True
        known = set().union(*(cli_flags(c) for c in words[1].split("/"))) | {"--help", "-h"}
        _check_flags({f.split("=")[0] for f in FLAG.findall(text.split("#")[0])}, known, where)
        if whole and not _is_synopsis(text.split("#")[0]):
            check_cli(words[1:])
        return True
    return False


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = prose(page)
    found = {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
    return found | set(re.findall(r'<a id="([^"]+)"', text))


# --- the tests -------------------------------------------------------------------------------------

def test_the_readme_is_a_newcomers_page_under_12_kb():
    size = len(README.read_bytes())
    assert size < 12 * 1024, f"README.md is {size} bytes: move reference into docs/"
    text = README.read_text()
    for page in ("magics-and-cli", "overrides", "sweeps", "resume", "slurm", "registry", "python-api",
                 "setup-and-testing", "notebooks", "layout", "architecture"):
        assert f"(docs/{page}.md)" in text, f"the README does not link docs/{page}.md"


def test_the_readmes_two_commands_are_the_ones_ci_runs():
    text = README.read_text()
    assert SETUP in text, "the README's set-up block changed: CI's .ci/run runs its test command"
    for script in ("scripts/demo", "scripts/test"):
        path = REPO / script
        assert path.is_file() and path.stat().st_mode & 0o111, f"{script} is not an executable file"
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert "scripts/test" in [line.strip() for line in ci], ".ci/run no longer runs the README's test command"
    assert 'pytest --durations=15 "$@"' in (REPO / "scripts" / "test").read_text()  # -m "not e2e" reaches pytest


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_internal_link_and_anchor_resolves(page):
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: link to {target} names no file"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.name}: {target}: {dest.name} has no heading #{anchor}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_code_block_parses(page):
    from IPython.core.inputtransformer2 import TransformerManager

    for info, body in blocks(page):
        where = f"{page.name} ```{info} block starting {body.splitlines()[0]!r}"
        first = body.lstrip().splitlines()[0] if body.strip() else ""
        if info == "python":
            ast.parse(TransformerManager().transform_cell(body))  # %magics as IPython runs them
            for line in body.splitlines():
                if line.lstrip().startswith("%tune"):
                    check_command_text(line.split("#")[0], where)
        elif info == "bash":
            for line in body.splitlines():
                words = shlex.split(line, comments=True)
                if not words:
                    continue
                if words[0] == "tune-magic":
                    check_command_text(line, where)
                elif words[0].startswith("scripts/"):
                    assert (REPO / words[0]).is_file(), f"{where}: no {words[0]}"
        elif info == "toml":
            tomllib.loads(body)
        elif info in ("", "yaml") and first.startswith("%"):
            check_command_text(first, where)  # the cell's line; the body is its overrides
            magic = first.split()[0]
            if magic == "%%tune_run":
                from tune_magic.config.cellbody import parse_cell_body

                parse_cell_body("\n".join(body.splitlines()[1:]) + "\n")
        elif info in ("", "yaml") and re.match(r"[\w.]+:", first):
            assert isinstance(yaml.safe_load(body), dict), where
        elif info in ("", "text", "imports", "debt"):
            continue  # output shown as printed, a tree; architecture.md's blocks (tests/test_house.py reads them)
        else:
            pytest.fail(f"{where}: no check for ```{info} blocks")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_and_option_in_the_prose_exists(page):
    known = set().union(*(cli_flags(c) for c in ("run", "cmd", "resume", "jobs", "sweeps", "logs", "stop", "rm",
                                                 "metrics", "ls", "assets", "demo", "generate")),
                        *(magic_flags(m) for m in ("tune_jobs", "tune_stop", "tune_logs", "tune_panel", "tune_generate",
                                                   "tune_compare")),
                        *OTHER_TOOLS.values())
    for text in spans(page):
        where = f"{page.name}: `{text}`"
        if check_command_text(text, where, whole=False):
            continue
        for flag in FLAG.findall(text):
            assert flag.split("=")[0] in known, f"{where}: no tune_magic, torchrun or named tool option {flag}"


def test_the_checks_catch_what_they_are_for():
    """The checks fail on a wrong option, a bad command and a broken anchor (a check that cannot
    fail checks nothing)."""
    with pytest.raises(AssertionError, match="no such option"):
        check_command_text("tune-magic jobs [--runnning]", "here")
    with pytest.raises(pytest.fail.Exception):
        check_command_text("tune-magic jobs --last zero", "here")
    with pytest.raises(Exception, match="put it first"):
        check_command_text("%%tune_run lora_finetune --config tiny/lora --name a", "here")
    with pytest.raises(AssertionError, match="no such option"):
        check_command_text("%tune_stop --every", "here")
    assert "the-outcome-rule" not in anchors(REPO / "docs" / "registry.md")
    assert "how-a-job-ends-the-outcome-rule" in anchors(REPO / "docs" / "registry.md")


def test_the_command_line_reference_lists_every_command_and_the_runs_options():
    """docs/magics-and-cli.md's command-line block names each ``tune-magic`` command (``checkpoints``
    and ``export`` were missing), and the run/cmd lines show every option of the launch's own."""
    from tune_magic.ui import cli

    text = (REPO / "docs" / "magics-and-cli.md").read_text()
    block = text[text.index("## The command line"):text.index("## What a launch runs")]
    listed = set(re.findall(r"^tune-magic (\w+)", block, re.M))
    assert listed == set(cli._COMMANDS), (sorted(set(cli._COMMANDS) - listed), sorted(listed - set(cli._COMMANDS)))
    for flag in ("--val-split", "--keep-checkpoints", "--max-resumes"):
        assert re.search(rf"^tune-magic run .*{flag}", block, re.M), flag
        (synopsis,) = re.findall(r"^`%%tune_run \[.*$", text, re.M)
        assert f"[{flag}" in synopsis, flag
