"""A JobStartError names a supervisor log that still exists and says why the start failed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tune_magic
from tune_magic.errors import JobStartError

from jobhelpers import toy_args


def test_start_error_points_at_a_log_that_exists(tmp_path):
    # a tune_magic that cannot be imported in the job's working directory, which `python -m` puts
    # first on the supervisor's sys.path: the supervisor dies at once
    fake = tmp_path / "fake" / "tune_magic"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('planted: this supervisor cannot start')\n")
    with pytest.raises(JobStartError) as err:
        tune_magic.launch(toy_args("steps=1", "step_s=0", nproc=None), cwd=fake.parent)
    named = re.search(r"see (\S+)$", str(err.value))
    assert named, str(err.value)
    log = Path(named[1])
    assert log.is_file(), f"{err.value} names a log that does not exist"
    assert "planted: this supervisor cannot start" in log.read_text()
