"""Which processes a stop may signal (tune_magic.schedulers.local.procs.Owner and
tune_magic.registry.owner): this user's, carrying the job's own token. With a second real user:
tests/e2e/test_registry_owner.py."""

from __future__ import annotations

import os
import subprocess

import psutil

from tune_magic.registry import owner as owners
from tune_magic.schedulers.local import procs
from tune_magic.schedulers.local import LocalScheduler
from tune_magic.registry import store as jobstore


def _sleeper(**env):
    return subprocess.Popen(["sleep", "60"], env={**os.environ, **env})


def test_only_a_process_carrying_the_jobs_own_token_is_the_jobs():
    token = owners.new_token("20261201-000000-abcdef")
    assert owners.bound_token("20261201-000000-abcdef", token) == token
    assert owners.bound_token("20261201-000000-zzzzzz", token) is None  # copied into another job's record
    assert owners.bound_token("20261201-000000-abcdef", "20261201-000000-abcdef.") is None
    mine, stranger = _sleeper(**{owners.TOKEN_ENV: token}), _sleeper()
    try:
        a, b = psutil.Process(mine.pid), psutil.Process(stranger.pid)
        assert procs.Owner(token).allows(a) and not procs.Owner(token).allows(b)
        assert not procs.Owner("\0").allows(a)
        assert procs.Owner(None, legacy_ok=True).allows(b) and not procs.Owner(None, legacy_ok=False).allows(b)
    finally:
        for p in (mine, stranger):
            p.kill()
            p.wait()


def test_a_records_token_decides_and_a_token_less_record_counts_only_in_a_directory_of_ours(tmp_path):
    d = tmp_path / "20261201-000000-abcdef"
    d.mkdir()
    jobstore.write_procs(d, scheduler="local", token="20261201-000000-zzzzzz." + "0" * 32)
    assert LocalScheduler._owner(d, None).token == "\0"  # another job's token: matches no process
    (d / jobstore.PROCS).unlink()
    assert LocalScheduler._owner(d, None) == procs.Owner(None, legacy_ok=True)
    os.chown(d, 54321, 54321)  # a directory someone else made (root may hand it over; they could not)
    assert LocalScheduler._owner(d, None) == procs.Owner(None, legacy_ok=False)


def test_a_registry_others_may_write_warns_and_a_group_project_directory_does_not(tmp_path):
    d = tmp_path / "jobs"
    d.mkdir(mode=0o700)
    assert owners.open_to_others(d) is None
    d.chmod(0o777)
    assert "writable by its group and every user" in owners.open_to_others(d)
    d.chmod(0o2770)
    assert owners.open_to_others(d) is None
    d.chmod(0o770)
    assert "writable by its group" in owners.open_to_others(d)
