"""Ask ``sinfo`` whether a SLURM controller answers from here, and which partitions it has.

``sbatch`` on PATH says only that SLURM's client tools are installed; whether a controller answers
is another matter (a login node's config missing, a controller down, a machine outside the
cluster). ``sinfo -h -o %P`` answers both questions at once: the partitions, or why not (SLURM
22.05 prints e.g. ``slurm_load_partitions: Unable to contact slurm controller (connect failure)``
after retrying for about 9 s, or ``sinfo: fatal: Could not establish a configuration source``
at once without a config). One answer is kept for :data:`ANSWER_TTL_S` seconds per environment,
so a panel's scheduler note and its partition list cost one run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from typing import Mapping

#: Seconds ``sinfo`` may take; a slower answer counts as none.
SINFO_TIMEOUT_S = 5.0
#: Seconds an answer is reused for the same PATH and SLURM_CONF.
ANSWER_TTL_S = 10.0

_lock = threading.Lock()
_answers: dict[tuple, tuple[float, str | None, str]] = {}


def ask(env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """Run ``sinfo -h -o %P`` (at most once per :data:`ANSWER_TTL_S` for the same PATH and
    SLURM_CONF). Returns ``(its stdout, "")`` when it answered, else ``(None, why)``: ``why`` is
    sinfo's last line of complaint, ``"sinfo is not on PATH"``, or that it did not answer in time."""
    env = os.environ if env is None else env
    key = (env.get("PATH"), env.get("SLURM_CONF"))
    with _lock:
        kept = _answers.get(key)
        if kept is not None and time.monotonic() - kept[0] < ANSWER_TTL_S:
            return kept[1], kept[2]
    exe = shutil.which("sinfo", path=env.get("PATH"))
    if exe is None:
        out, why = None, "sinfo is not on PATH"
    else:
        try:
            r = subprocess.run([exe, "-h", "-o", "%P"], capture_output=True, text=True, timeout=SINFO_TIMEOUT_S,
                               stdin=subprocess.DEVNULL, env=dict(env))
            lines = [line.strip() for line in (r.stderr or r.stdout).splitlines() if line.strip()]
            last = lines[-1].removeprefix("sinfo: ").removeprefix("fatal: ").removeprefix("error: ") if lines else ""
            out, why = (r.stdout, "") if r.returncode == 0 else (None, last or f"sinfo exited with {r.returncode}")
        except subprocess.TimeoutExpired:
            out, why = None, f"sinfo did not answer within {SINFO_TIMEOUT_S:g} s"
        except OSError as exc:
            out, why = None, f"sinfo could not run ({exc.strerror or exc})"
    with _lock:
        _answers[key] = (time.monotonic(), out, why)
    return out, why


def partitions(env: Mapping[str, str] | None = None) -> list[str]:
    """The partitions sinfo lists (the default one's ``*`` removed, the default first), or ``[]``
    when sinfo is missing, fails or takes longer than :data:`SINFO_TIMEOUT_S` seconds."""
    out, _ = ask(env)
    names, default = [], None
    for line in (out or "").splitlines():
        name = line.strip()
        if name.endswith("*"):
            name = default = name[:-1]
        if name and name not in names:
            names.append(name)
    return ([default] if default else []) + [n for n in names if n != default]


def controller_note(env: Mapping[str, str] | None = None) -> str | None:
    """``None`` when a controller answers sinfo, else one line saying that none does and why."""
    out, why = ask(env)
    if out is not None:
        return None
    return f"sbatch is here, but no SLURM controller answers ({why}): a job sent to slurm would not start"
