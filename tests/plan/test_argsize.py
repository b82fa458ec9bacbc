"""Inputs the machine cannot take are refused before anything starts, saying what is wrong: an
override longer than Linux passes as one argument, a command over ARG_MAX, a FIFO given as the
config, a cell body too large (or with more nodes than OmegaConf reads)."""

from __future__ import annotations

import os
import time

import pytest

import tune_magic
from tune_magic.plan import argsize
from tune_magic.errors import PlanError
from tune_magic.registry import store as jobstore

from jobhelpers import TOY_CONFIG, TOY_RECIPE, toy_args


def _ids() -> set[str]:
    return {r.id for r in jobstore.list_records()}


def test_a_1_mb_override_is_refused_before_anything_starts_naming_it():
    before = _ids()
    big = "x" * (1 << 20)
    with pytest.raises(PlanError) as err:
        # words as a list: shlex.split (a string's words) alone takes 26 s over 1 MB
        tune_magic.launch(toy_args("steps=1", nproc=None).split() + [f"crash_message={big}"])
    msg = str(err.value)
    assert msg.startswith("the override crash_message=... is 1,048,590 bytes long"), msg[:300]
    assert f"({argsize.MAX_ARG_STRLEN:,} bytes, MAX_ARG_STRLEN)" in msg and "YAML cell body" in msg
    assert _ids() == before  # nothing registered, nothing left
    with pytest.raises(PlanError, match="the override crash_message=... is 1,048,590 bytes long"):
        tune_magic.launch(toy_args("steps=1", nproc=None).split() + [f"crash_message={big}"], dry_run=True)


def test_the_same_value_in_a_cell_body_is_fine():
    body = "crash_message: " + "x" * (1 << 20) + "\n"
    plan = tune_magic.launch(f"{TOY_RECIPE} --config {TOY_CONFIG}", config_overlay=body, dry_run=True)
    assert not [w for w in plan.warnings if "refuse" in w]
    assert max(len(a) for a in plan.argv) < 4096  # the value went to a file, not onto the command line


def test_a_command_over_arg_max_is_refused(monkeypatch):
    monkeypatch.setattr(os, "sysconf", lambda name: 64 * 1024 if name == "SC_ARG_MAX" else os.sysconf(name))
    many = [f"+tag{i}={'v' * 1000}" for i in range(100)]  # each fine alone, 100 KB together
    with pytest.raises(PlanError, match=r"command and environment take [\d,]+ bytes, more than Linux passes .*ARG_MAX"):
        argsize.check_command_size(tune_magic.build_plan(toy_args("steps=1", *many, nproc=None)), {})


def test_a_fifo_given_as_the_config_says_it_is_a_fifo(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(PlanError) as err:
        tune_magic.launch(f"{TOY_RECIPE} --config {fifo}", dry_run=True)
    assert "is a FIFO, not a regular file" in str(err.value) and "not found" not in str(err.value)
    assert time.monotonic() - t0 < 10  # nothing opened the FIFO (that would block for ever)


def test_a_14_mb_cell_body_is_refused_for_its_size_at_once():
    body = "".join(f"k{i}: {'v' * 60}\n" for i in range(220_000))  # 14 MB, no alias anywhere
    with pytest.raises(PlanError) as err:
        tune_magic.launch(f"{TOY_RECIPE} --config {TOY_CONFIG}", config_overlay=body, dry_run=True)
    assert str(err.value).startswith("the cell body is 14.") and "MiB; a YAML body holds a config, at most 4 MiB" in str(
        err.value)
    assert "alias" not in str(err.value)


def test_a_body_with_more_nodes_than_omegaconf_reads_says_so_not_aliases():
    body = "".join(f"k{i}: {i}\n" for i in range(12_000))  # 150 KB: small, but 24,000 nodes
    with pytest.raises(PlanError) as err:
        tune_magic.launch(f"{TOY_RECIPE} --config {TOY_CONFIG}", config_overlay=body, dry_run=True)
    assert str(err.value).startswith("the cell body has more than 10000 YAML nodes"), str(err.value)
    assert "alias" not in str(err.value)
