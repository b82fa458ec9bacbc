"""torchrun's arguments: value checks torchrun's parser leaves to its launcher, and the
rendezvous policy. Pure.

With no rendezvous of the user's own, ``--standalone`` is added so torchrun takes an OS-chosen free
port and concurrent jobs on one node never collide; a rendezvous the user gave (flag or ``PET_*``
variable) is kept exactly, and ``--standalone`` is never added on top of it.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from pathlib import Path
from typing import Mapping

from tune_magic.errors import PlanError
from tune_magic.plan.model import JOB_DIR_PLACEHOLDER
from tune_magic.config.torchrun_options import lookup

#: ``--nproc-per-node`` words torchrun accepts besides a positive integer (torch 2.13).
NPROC_WORDS = ("auto", "cpu", "gpu", "xpu")


_USER_RDZV = ("rdzv_endpoint", "master_addr", "master_port")


_RDZV_DETAILS = ("rdzv_backend", "rdzv_id", "rdzv_conf")


def check_port(text: str, what: str) -> int:
    """Return ``text`` as a TCP port (0-65535) or raise :class:`PlanError` naming ``what``."""
    try:
        port = int(text)
    except ValueError:
        raise PlanError(f"{what}: port {text!r} is not a number; use 0-65535, e.g. 29400") from None
    if not 0 <= port <= 65535:
        raise PlanError(f"{what}: port {port} is outside 0-65535; use e.g. 29400")
    return port


def check_endpoint(endpoint: str, what: str = "--rdzv-endpoint") -> str:
    """Validate a rendezvous endpoint ``host[:port]`` (IPv6 in brackets: ``[fe80::1]:29400``).

    Returns:
        The endpoint unchanged.

    Raises:
        PlanError: empty host, a port outside 0-65535, or a bare IPv6 address without brackets.
    """
    text = endpoint.strip()
    if text != endpoint or not text or any(c.isspace() for c in text):
        raise PlanError(f"{what} {endpoint!r} is not host[:port]; e.g. node0:29400 or [fe80::1]:29400")
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise PlanError(f"{what} {endpoint!r}: missing ']' after the IPv6 address; e.g. [fe80::1]:29400")
        host, rest = text[1:close], text[close + 1 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise PlanError(f"{what} {endpoint!r}: {host!r} in brackets is not an IPv6 address") from None
        if rest and not rest.startswith(":"):
            raise PlanError(f"{what} {endpoint!r} is not host[:port]; e.g. [fe80::1]:29400")
        port = rest[1:] if rest else None
    else:
        if "://" in text:
            raise PlanError(f"{what} {endpoint!r} is not host[:port]: drop the scheme, e.g. node0:29400")
        if text.count(":") > 1:
            raise PlanError(
                f"{what} {endpoint!r} looks like a bare IPv6 address; put it in brackets, e.g. [{text}] or [::1]:29400"
            )
        host, _, port = text.partition(":")
        port = port if ":" in text else None
        if not host:
            raise PlanError(f"{what} {endpoint!r} has an empty host; e.g. node0:29400")
    if port is not None:
        check_port(port, f"{what} {endpoint!r}")
    return endpoint


def check_nproc(value: str, what: str = "--nproc-per-node") -> str:
    """Validate ``--nproc-per-node``: a positive integer or one of :data:`NPROC_WORDS`."""
    if value in NPROC_WORDS:
        return value
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n <= 0:
        raise PlanError(f"{what} {value!r} must be a positive integer (or one of {', '.join(NPROC_WORDS)})")
    return value


def _whole(value: str) -> int | None:
    """``value`` as an int if it is ASCII digits with an optional sign (spaces around allowed)."""
    m = re.fullmatch(r"\s*([+-]?[0-9]+)\s*", value)
    return int(m[1]) if m else None


def _check_non_negative_int(value: str, what: str, example: str) -> str | None:
    n = _whole(value)
    return None if n is not None and n >= 0 else f"{what} {value!r} must be a whole number >= 0, e.g. {example}"


def _check_monitor_interval(value: str, what: str) -> str | None:
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if math.isfinite(seconds) and seconds > 0:
        return None
    return f"{what} {value!r} must be a number of seconds > 0, e.g. {what} 0.1 (torchrun's default)"


# torch.distributed.run (torch 2.13): <value> | <local rank>:<value>,... with values 0-3 and
# one-digit local ranks (Std.from_str's _VALUE_REGEX / _MAPPING_REGEX)
_STD_RE = re.compile(r"[0-3]|(?:[0-9]:[0-3],)*[0-9]:[0-3]")


def _check_std(value: str, what: str) -> str | None:
    if _STD_RE.fullmatch(value):
        return None
    return (f"{what} {value!r} must be 0-3 (0 none, 1 stdout, 2 stderr, 3 both) or LOCAL_RANK:VALUE pairs "
            f"such as 0:3,1:2")


def _check_ranks_filter(value: str, what: str) -> str | None:
    if value == "":
        return None  # torchrun: no filter
    parts = [_whole(p) for p in value.split(",")]
    if all(p is not None and p >= 0 for p in parts):
        return None
    return f"{what} {value!r} must be local ranks (whole numbers >= 0) separated by commas, e.g. 0 or 0,1"


#: Values of torchrun options that its parser takes but its launcher then refuses, with the
#: condition torch 2.13 checks (``torch/distributed/run.py`` ``config_from_args``,
#: ``launcher/api.py`` ``LaunchConfig``, ``agent/server/api.py`` ``WorkerSpec``,
#: ``multiprocessing/api.py`` ``Std.from_str``): dest -> check(value, shown name) -> problem or None.
_VALUE_CHECKS = {
    "max_restarts": lambda v, w: _check_non_negative_int(v, w, f"{w} 3"),  # AssertionError
    "monitor_interval": _check_monitor_interval,  # AssertionError (<= 0); sleep() fails on nan/inf
    "shutdown_timeout": lambda v, w: _check_non_negative_int(v, w, f"{w} 30"),  # ValueError
    "node_rank": lambda v, w: _check_non_negative_int(v, w, f"{w} 0"),
    "redirects": _check_std,  # ValueError
    "tee": _check_std,
    "local_ranks_filter": _check_ranks_filter,  # ValueError
}


def check_torchrun_values(opts: Mapping[str, str | bool], env: Mapping[str, str]) -> None:
    """Refuse torchrun option values that its parser accepts but that fail when torchrun starts.

    Each option given as a flag (``opts``: dest -> value) or as its ``PET_*`` variable in ``env``
    is checked: ``--max-restarts``, ``--shutdown-timeout``, ``--node-rank`` (whole numbers >= 0),
    ``--monitor-interval`` (seconds > 0), ``--redirects``/``--tee`` (0-3 or ``LOCAL_RANK:VALUE``
    pairs), ``--local-ranks-filter`` (local ranks >= 0, comma-separated). ``--nproc-per-node`` and
    ``--nnodes`` have their own checks (:func:`check_nproc`, :func:`parse_nnodes`).

    Raises:
        PlanError: the first bad value, naming the flag or variable and a valid example.
    """
    for dest, check in _VALUE_CHECKS.items():
        if dest in opts:
            value, what = opts[dest], lookup("--" + dest.replace("_", "-")).display
        else:
            value, what = env_value(env, dest), "PET_" + dest.upper()
        if isinstance(value, str):
            problem = check(value, what)
            if problem:
                raise PlanError(f"{problem}; torchrun would refuse it when it starts")


def parse_nnodes(value: str, what: str = "--nnodes") -> tuple[int, int]:
    """Parse ``--nnodes``: ``N`` or ``MIN:MAX``. Returns ``(min, max)``."""
    parts = value.split(":")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        nums = []
    if len(parts) not in (1, 2) or len(nums) != len(parts) or min(nums, default=0) < 1 or nums[0] > nums[-1]:
        raise PlanError(f"{what} {value!r} must be N or MIN:MAX with 1 <= MIN <= MAX, e.g. 2 or 2:4")
    return nums[0], nums[-1]


def env_value(env: Mapping[str, str], opt_dest: str) -> str | None:
    value = env.get("PET_" + opt_dest.upper())
    return value if value not in (None, "") else None


def truthy(value: str | bool | None) -> bool:
    if isinstance(value, bool):
        return value
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


def rank_log_dir(opts: Mapping[str, str | bool], env: Mapping[str, str], job_dir: str | os.PathLike | None,
                  cwd: Path) -> tuple[list[str], str | None]:
    """Return (options to add, torchrun's log dir) for ``--redirects``/``--tee``.

    torchrun writes redirected/teed worker output to ``<log dir>/<run id>_*/attempt_N/<local
    rank>/{stdout,stderr}.log``; without ``--log-dir`` it picks a fresh ``/tmp/torchelastic_*``
    that nothing records, so the job's own ``<job dir>/ranks`` is given instead.
    """
    given = opts.get("log_dir") or env_value(env, "log_dir")
    if given:
        return [], os.path.normpath(cwd / str(given))  # torchrun runs in the plan's cwd
    std = [opts.get(d) or env_value(env, d) for d in ("redirects", "tee")]
    if not any(v not in (None, "0") for v in std):
        return [], None
    log_dir = f"{str(job_dir).rstrip('/') if job_dir is not None else JOB_DIR_PLACEHOLDER}/ranks"
    return ["--log-dir", log_dir], log_dir


def rendezvous_policy(opts: Mapping[str, str | bool], env: Mapping[str, str]) -> tuple[str, str | None]:
    """Apply the rendezvous rules; return (mode, user endpoint or None)."""

    def given(dest: str) -> tuple[str | None, str]:
        if dest in opts:
            return str(opts[dest]), lookup("--" + dest.replace("_", "-")).display
        return env_value(env, dest), "PET_" + dest.upper()

    endpoint, endpoint_src = given("rdzv_endpoint")
    master_addr, addr_src = given("master_addr")
    master_port, port_src = given("master_port")
    if endpoint is not None:
        check_endpoint(endpoint, endpoint_src)
    if master_addr is not None and (not master_addr.strip() or any(c.isspace() for c in master_addr)):
        raise PlanError(f"{addr_src} {master_addr!r} is not a host name or address")
    if master_port is not None:
        check_port(master_port, port_src)
    user = endpoint is not None or master_addr is not None or master_port is not None

    standalone = truthy(opts.get("standalone")) or truthy(env.get("PET_STANDALONE"))
    nnodes_value, nnodes_src = given("nnodes")
    lo, hi = parse_nnodes(nnodes_value, nnodes_src) if nnodes_value is not None else (1, 1)

    if standalone and user:
        names = [s for v, s in ((endpoint, endpoint_src), (master_addr, addr_src), (master_port, port_src)) if v is not None]
        raise PlanError(
            f"--standalone picks its own port and would silently override {', '.join(names)}; "
            "drop --standalone to keep your rendezvous, or drop the rendezvous for an automatic port"
        )
    if hi > 1 and endpoint is None and master_addr is None:
        raise PlanError(
            f"{nnodes_src} {nnodes_value} is a multi-node run and needs a rendezvous endpoint every node can reach: "
            "add --rdzv-endpoint HOST:PORT --rdzv-backend c10d --rdzv-id RUN_ID (same on every node)"
        )
    if hi > 1 and standalone:
        raise PlanError(f"--standalone is single-node only; {nnodes_src} {nnodes_value} needs --rdzv-endpoint HOST:PORT")
    details = [src for dest in _RDZV_DETAILS for value, src in [given(dest)] if value is not None]
    if details and endpoint is None:
        raise PlanError(
            f"{', '.join(details)} without --rdzv-endpoint: add --rdzv-endpoint HOST:PORT, or drop "
            f"{', '.join(details)} to get an automatic port (--standalone would silently override them)"
        )
    if user:
        if endpoint is None:
            endpoint = f"{master_addr or '127.0.0.1'}:{master_port}" if master_port is not None else master_addr
        return "user", endpoint
    return "standalone", None
