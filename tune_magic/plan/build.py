"""Turn ``tune run``-style arguments into the exact command that will be launched.

Pure: no process is started, no CUDA is touched, nothing is written. The input is what a user types
after ``%%tune_run`` (the same words as ``tune run``, torchtune 0.6.1)::

    [TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value | ~key ...]

and the output is a :class:`LaunchPlan`. The rendezvous policy is the heart of it: with no
rendezvous of the user's own, ``--standalone`` is added so torchrun takes an OS-chosen free port and
concurrent jobs on one node never collide; a rendezvous the user gave (flag or ``PET_*`` variable) is
kept exactly, and ``--standalone`` is never added on top of it.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from tune_magic.plan import catalog
from tune_magic.errors import PlanError
from tune_magic.paths import HOME_ENV, home
from tune_magic.plan.torchrun_options import TorchrunOption, lookup

#: Placeholder used in previews built without a job id, where the job id will go.
JOB_ID_PLACEHOLDER = "<job-id>"
#: Placeholder used in plans built without a job directory, where the job's directory will go.
JOB_DIR_PLACEHOLDER = "<job-dir>"

#: ``--nproc-per-node`` words torchrun accepts besides a positive integer (torch 2.13).
NPROC_WORDS = ("auto", "cpu", "gpu", "xpu")

# Options that change what the training script *is*; tune_magic always launches a recipe file.
_REFUSED = {
    "module": "tune_magic launches the recipe file itself; drop -m/--module",
    "no_python": "tune_magic launches the recipe with the kernel's Python; drop --no-python",
}
_USER_RDZV = ("rdzv_endpoint", "master_addr", "master_port")
_RDZV_DETAILS = ("rdzv_backend", "rdzv_id", "rdzv_conf")
_JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+|\[[^\]]*\])*$")




@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to launch one job, and nothing launched yet.

    Attributes:
        argv: the full command (``argv[0]`` is the kernel's own interpreter, ``sys.executable``).
            Distributed: ``[python, "-m", "torch.distributed.run", <torchrun options>, <recipe>,
            "--config", <config>, <overrides>]``; one process: ``[python, <recipe>, "--config", ...]``.
        env: variables to add to the caller's environment for this job only
            (``PYTHONUNBUFFERED``, ``PYTHONPATH``, ``TUNE_MAGIC_HOME``, ``CUDA_VISIBLE_DEVICES``).
        recipe: absolute path of the recipe file.
        recipe_name: the registry name when one was used, else ``None``.
        recipe_source: ``"torchtune"``, ``"tune_magic"`` or ``"path"``.
        config: absolute path of the config file.
        config_name: the registry name when one was used, else ``None``.
        distributed: ``True`` when launched through torchrun.
        rendezvous: ``"standalone"`` (OS-chosen port), ``"user"`` (the user's endpoint/master
            address/port, kept as given) or ``None`` for a one-process plan.
        endpoint: the user's endpoint (``host:port``) when they gave one, else ``None``.
        nproc_per_node: processes per node as torchrun will see it (``"2"``, ``"gpu"``), or
            ``None`` for one process.
        nnodes: torchrun's ``--nnodes`` value (``"1"``, ``"2:4"``), ``None`` for one process.
        gpus: GPU ids exposed to the job, or ``None``.
        torchrun_args: the torchrun options part of ``argv``.
        overrides: ``key=value`` / ``~key`` recipe overrides, in order (including an added
            ``output_dir``).
        output_dir: the ``output_dir`` override this plan added (per-job directory), else ``None``.
        job_id: the job id the plan was built for, else ``None``.
        rank_log_dir: torchrun's ``--log-dir`` (the user's, or the ``<job dir>/ranks`` this plan
            added for ``--redirects``/``--tee``), where each rank's stdout/stderr files go; ``None``
            when the workers write to the job's combined log only.
        scheduler: ``"local"`` or ``"slurm"``. For SLURM, ``argv`` is the command each node runs
            (one torchrun agent per node); it names ``${SLURM_JOB_NUM_NODES}``, ``${SLURM_JOB_ID}``
            and ``${TUNE_MAGIC_RDZV_ENDPOINT}``, which the batch script fills in; ``rendezvous`` is
            ``"scheduler"`` (the head node's address and a port picked there at start),
            ``"user"`` or ``"standalone"`` (one node).
        rdzv_conf: the user's ``--rdzv-conf`` under SLURM (merged on each node with the
            scheduler's ``is_host``), else ``None``.
        warnings: things a dry run should say (e.g. every node must reach your endpoint).
        batch_script, sbatch_argv: under SLURM, the batch script and the sbatch command that
            submits it (id-dependent paths as for ``output_dir``); ``None`` for local plans.
        cwd: the working directory the job runs in (relative paths were resolved from it).
    """

    argv: list[str]
    env: dict[str, str]
    recipe: str
    recipe_name: str | None
    recipe_source: str
    config: str
    config_name: str | None
    distributed: bool
    rendezvous: str | None
    endpoint: str | None
    nproc_per_node: str | None
    nnodes: str | None
    gpus: list[int] | None
    torchrun_args: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    output_dir: str | None = None
    job_id: str | None = None
    rank_log_dir: str | None = None
    scheduler: str = "local"
    rdzv_conf: str | None = None
    warnings: list[str] = field(default_factory=list)
    batch_script: str | None = None
    sbatch_argv: list[str] | None = None
    cwd: str | None = None

    def __repr__(self) -> str:
        mode = f"torchrun, rendezvous={self.rendezvous}" if self.distributed else "one process"
        return f"<LaunchPlan {self.recipe_name or self.recipe} ({mode}): {self.command_line()}>"

    def command_line(self) -> str:
        """Return one copy-pasteable shell line: ``VAR=value ... <shlex.join(argv)>`` (for a SLURM
        plan with its batch script written, the sbatch line)."""
        if self.sbatch_argv:
            return shlex.join(self.sbatch_argv)
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"{prefix} {shlex.join(self.argv)}" if prefix else shlex.join(self.argv)

    def to_dict(self) -> dict:
        """Return a JSON-ready dict of every field."""
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Small validators. Each raises PlanError with the fix in the message.


def parse_gpus(gpus: str | Iterable[int] | None) -> list[int] | None:
    """Parse a GPU list (``"0,1"``, ``[2, 3]``, ``None``/``""`` for none).

    Only the syntax is checked here; whether the ids exist is checked at launch, so plans for GPU
    nodes can be built on a CPU machine.

    Raises:
        PlanError: not non-negative integers, duplicates, or ``"auto"`` (resolved at launch time).
    """
    if gpus is None:
        return None
    if isinstance(gpus, str):
        text = gpus.strip()
        if not text:
            return None
        if text == "auto":
            raise PlanError("gpus='auto' is resolved when launching; to build a plan, give ids such as --gpus 0,1")
        parts: list = [p.strip() for p in text.split(",")]
    elif isinstance(gpus, (bytes, bool, int, float, dict)) or not hasattr(gpus, "__iter__"):
        raise PlanError(f"gpus={gpus!r}: give a list of GPU ids such as [0, 1] or a string such as '0,1'")
    else:
        parts = list(gpus)
    ids = []
    for part in parts:
        if isinstance(part, bool) or not (
            (isinstance(part, int) and part >= 0) or (isinstance(part, str) and re.fullmatch(r"[0-9]+", part))
        ):
            raise PlanError(f"bad GPU id {part!r}: give non-negative integers, e.g. --gpus 0,1")
        ids.append(int(part))
    if not ids:
        return None
    if len(set(ids)) != len(ids):
        raise PlanError(f"GPU list {gpus!r} names a GPU twice; give each id once, e.g. --gpus 0,1")
    return ids


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
            value, what = _env_value(env, dest), "PET_" + dest.upper()
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


def check_job_id(job_id: str) -> str:
    """Validate a job id: letters, digits, ``_ . -``, no leading dot, no ``/`` or ``..``."""
    if not isinstance(job_id, str) or not _JOB_ID_RE.fullmatch(job_id) or ".." in job_id:
        raise PlanError(
            f"job id {job_id!r} is not valid: use letters, digits, '_', '-', '.' (no '/', no '..'), as shown by tune-magic jobs"
        )
    return job_id


# ---------------------------------------------------------------------------------------------
# Tokenising.


@dataclass
class _Parsed:
    torchrun_tokens: list[str] = field(default_factory=list)
    groups: list[tuple[str, list[str]]] = field(default_factory=list)  # (dest, its tokens) in order
    torchrun: dict[str, str | bool] = field(default_factory=dict)  # dest -> value (True for switches)
    recipe: str | None = None
    config: str | None = None
    overrides: list[str] = field(default_factory=list)


def split_args(args: str | Sequence[str]) -> list[str]:
    """Split a ``tune run``-style string with :func:`shlex.split`; a list is copied as is.

    Raises:
        PlanError: an unclosed quote, or a list holding non-strings.
    """
    if isinstance(args, str):
        try:
            return shlex.split(args, comments=False, posix=True)
        except ValueError as exc:  # "No closing quotation"
            raise PlanError(f"cannot split the arguments ({exc}); close every quote") from None
    if not all(isinstance(a, str) for a in args):
        raise PlanError("arguments must be strings")
    return list(args)


def _match_option(token: str) -> tuple[TorchrunOption | None, str | None]:
    """Return (option, attached value) for an option token, e.g. ``--nnodes=2`` or ``-r3``."""
    name, eq, value = token.partition("=")
    opt = lookup(name)
    if opt is not None:
        return opt, (value if eq else None)
    if not token.startswith("--") and len(token) > 2:  # -r3: short option with its value attached
        opt = lookup(token[:2])
        if opt is not None and opt.takes_value:
            return opt, token[2:]
    return None, None


def _unknown_option(token: str) -> PlanError:
    from tune_magic.plan.torchrun_options import abbreviation_of, options

    name = token.split("=")[0]
    full = abbreviation_of(name)
    if full:
        return PlanError(f"{name!r} abbreviates {' or '.join(full)}; write the option in full "
                         "(torchrun's parser may reject abbreviations)")
    close = difflib.get_close_matches(name, list(options()), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return PlanError(f"{token!r} is not a torchrun option.{hint} See python -m torch.distributed.run --help.")


def _tokenise(tokens: list[str]) -> _Parsed:
    parsed = _Parsed()
    i = 0
    while i < len(tokens) and tokens[i].startswith("-") and tokens[i] != "-":
        token = tokens[i]
        if token == "--config" or token.startswith("--config="):
            raise PlanError("--config comes after the recipe: [torchrun options] RECIPE --config CONFIG [key=value ...]")
        opt, value = _match_option(token)
        if opt is None:
            raise _unknown_option(token)
        if opt.dest in _REFUSED:
            raise PlanError(_REFUSED[opt.dest])
        group = [token]
        if opt.takes_value and value is None:
            if i + 1 >= len(tokens):
                raise PlanError(f"{token} needs a value, e.g. {opt.display} VALUE")
            value = tokens[i + 1]
            group.append(value)
        elif not opt.takes_value:
            if value is not None:
                raise PlanError(f"{opt.display} takes no value; write it alone")
            value = True
        i += len(group)
        if isinstance(value, str):
            problem = opt.check(value)
            if problem:
                raise PlanError(f"{problem}; see python -m torch.distributed.run --help")
        if opt.dest in parsed.torchrun:
            if parsed.torchrun[opt.dest] != value:
                raise PlanError(
                    f"{opt.display} is given twice with different values "
                    f"({parsed.torchrun[opt.dest]!r} and {value!r}); keep one"
                )
            continue  # the same flag again (maybe the other spelling): pass it through once
        parsed.torchrun[opt.dest] = value
        parsed.torchrun_tokens += group
        parsed.groups.append((opt.dest, group))
    if i >= len(tokens) or not tokens[i].strip():
        empty = f" (the recipe is the empty word {tokens[i]!r})" if i < len(tokens) else ""
        raise PlanError(f"no recipe given{empty}: [torchrun options] RECIPE --config CONFIG [key=value ...]; "
                        "see tune-magic ls")
    parsed.recipe = tokens[i]
    i += 1
    while i < len(tokens):
        token = tokens[i]
        if token == "--config" or token.startswith("--config="):
            if parsed.config is not None:
                raise PlanError("--config is given twice; keep one")
            if token == "--config":
                if i + 1 >= len(tokens) or tokens[i + 1].startswith("-"):
                    raise PlanError("--config needs a value: --config NAME_OR_PATH (see tune-magic ls)")
                parsed.config = tokens[i + 1]
                i += 2
            else:
                parsed.config = token.split("=", 1)[1]
                i += 1
            if not parsed.config:
                raise PlanError("--config needs a value: --config NAME_OR_PATH (see tune-magic ls)")
            continue
        if token.startswith("-") and not token.startswith("~"):
            opt, _ = _match_option(token)
            if opt is not None:
                raise PlanError(
                    f"torchrun option {token} comes after the recipe {parsed.recipe!r}, where it would be handed to the "
                    f"recipe; move it before the recipe: {token} ... {parsed.recipe} --config ..."
                )
            raise PlanError(
                f"{token!r} after the recipe is neither --config nor key=value; recipes take only --config and overrides"
            )
        parsed.overrides.append(check_override(token))
        i += 1
    if parsed.config is None:
        raise PlanError(
            f"missing --config: write {parsed.recipe} --config NAME_OR_PATH (tune-magic ls lists the configs)"
        )
    return parsed


def with_config(tokens: list[str], path: str) -> tuple[list[str], str | None]:
    """Return ``tokens`` with ``--config`` set to ``path`` (replaced, or appended after the recipe
    arguments), and the value it replaced (``None`` when there was none)."""
    out, old, i = [], None, 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--config" and i + 1 < len(tokens):
            old = tokens[i + 1]
            i += 2
        elif token.startswith("--config="):
            old = token.split("=", 1)[1]
            i += 1
        else:
            out.append(token)
            i += 1
    return out + ["--config", path], old


# the last part of a key that names a file or directory: output_dir, log_dir, checkpoint_dir,
# path, vocab_path, merges_file, checkpoint_files (an index such as [0] after it is ignored)
_PATH_KEY_RE = re.compile(r"(?:^|[._])(?:dir|path|file|files)(?:\[[^\]]*\])*$")


def is_path_key(key: str) -> bool:
    """Whether an override or config key names a file or directory (``output_dir``, ``*_dir``,
    ``path``, ``*.path``, ``*_path``, ``*_file``, ``*_files``; a trailing index such as ``[0]``
    ignored): an empty value there is refused (see :func:`check_override`)."""
    return _PATH_KEY_RE.search(key) is not None


def check_override(token: str) -> str:
    """Return ``token`` if a torchtune 0.6.1 recipe reads it as typed, else raise :class:`PlanError`.

    The value is checked by :func:`tune_magic.plan.overrides.check_value` (YAML as OmegaConf reads it).
    An empty value (``key=``, or only spaces) is null to the recipe: accepted, except for a key
    that names a file or directory (``output_dir``, ``*_dir``, ``*.path``, ``*_path``, ``*_file``,
    ``*_files``), where null becomes the path ``None`` (``./None/...``) or a crash; a quoted empty
    string there (``output_dir=""``) is refused too. An explicit ``null`` stays accepted.
    """
    from tune_magic.plan import overrides

    bad = next((c for c in token if _unsafe_char(c)), None)
    if bad is not None:
        raise PlanError(f"override {token[:60]!r} contains {_char_name(bad)}; remove it")
    if token.startswith("~"):
        if "=" in token or not _KEY_RE.match(token[1:]):
            raise PlanError(f"override {token!r}: a deletion is ~key with no value, e.g. ~model.lora_rank")
        if "_component_" in token:  # torchtune 0.6.1 refuses it when the recipe starts
            raise PlanError(f"override {token!r}: torchtune cannot remove a component; override it instead, "
                            f"e.g. {token[1:]}=torchtune.models.OTHER")
        return token
    key, eq, value = token.partition("=")
    if not eq or not _KEY_RE.match(key):
        raise PlanError(
            f"override {token!r} is not key=value; write e.g. batch_size=4 or metric_logger.name=\"my run\" "
            "(quote values with spaces)"
        )
    path_key = is_path_key(key)
    if path_key and not value.strip():  # before check_value, whose advice (quote the spaces) does not fit a path
        raise PlanError(f"override {token!r} leaves {key} empty: " + empty_path_fix(key, None, "=", "override"))
    overrides.check_value(key, value)
    if path_key:
        read = overrides.recipe_value(key, value)
        if isinstance(read, str) and not read.strip():
            raise PlanError(f"override {token!r} leaves {key} empty: " + empty_path_fix(key, read, "=", "override"))
    return token


def empty_path_fix(key: str, read: object, sep: str, what: str) -> str:
    """The end of the message refusing an empty value for a path key: what the recipe reads and
    the fix (``sep``: ``=`` for an override, ``: `` for a config line; ``what`` names the thing
    to drop)."""
    reads = "null (a path of None, e.g. ./None/...)" if read is None else "an empty path"
    return f"the recipe reads {reads}; give a path ({key}{sep}PATH), or drop the {what} to keep the config's value"


def _unsafe_char(c: str) -> bool:
    # C0/C1 controls but tab, YAML's own line breaks (NEL U+0085, U+2028, U+2029), a byte-order mark,
    # and lone surrogates (bytes that are not UTF-8, as Python decodes them from argv)
    o = ord(c)
    return (o < 32 and c != "\t") or 0x7F <= o <= 0x9F or c in "\u2028\u2029\ufeff" or 0xD800 <= o <= 0xDFFF


def _char_name(c: str) -> str:
    if 0xD800 <= ord(c) <= 0xDFFF:
        return "bytes that are not UTF-8 text"
    return f"a control character or line break ({c!r}; NUL, newline, ...)"


# ---------------------------------------------------------------------------------------------
# Resolution.


def _resolve_recipe(name: str, cwd: Path) -> tuple[Path, str | None, str, bool | None]:
    """Return (path, registry name, source, supports_distributed or None for custom)."""
    try:
        entry = catalog.find_recipe(name)
    except catalog.AmbiguousNameError as exc:
        raise PlanError(str(exc)) from None
    if entry is not None:
        return entry.path, entry.name, entry.source, entry.supports_distributed if entry.source == catalog.TORCHTUNE else None
    path = cwd / Path(name).expanduser()
    if path.is_file():
        if path.suffix != ".py":  # torchrun runs it with Python; tune run imports it as a module
            raise PlanError(f"recipe {name!r} ({path}) is not a Python file: a custom recipe must be a .py file; "
                            "give the recipe's .py file or a name from tune-magic ls")
        return path.absolute(), None, "path", None
    if path.is_dir():
        raise PlanError(f"recipe {name!r} is a directory ({path}); give the recipe's .py file")
    looks_like_path = name.endswith(".py") or "/" in name or os.sep in name
    if looks_like_path:
        raise PlanError(f"recipe file {name!r} not found (looked at {path}); check the path or use a name from tune-magic ls")
    close = difflib.get_close_matches(name, [r.name for r in catalog.recipes()], n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise PlanError(f"unknown recipe {name!r}.{hint} tune-magic ls lists the recipes; a custom recipe is a .py path")


def resolve_config(name: str, cwd: Path) -> tuple[Path, str | None]:
    """Resolve a config name or path (relative to ``cwd``) to (absolute file, registry name or None).

    Raises:
        PlanError: neither a known name nor an existing file; a name in both registries.
    """
    try:
        entry = catalog.find_config(name)
    except catalog.AmbiguousNameError as exc:
        raise PlanError(str(exc)) from None
    if entry is not None:
        return entry.path, entry.name
    path = cwd / Path(name).expanduser()
    if path.is_file():
        return path.absolute(), None
    if path.is_dir():
        raise PlanError(f"config {name!r} is a directory ({path}); give a .yaml file")
    close = difflib.get_close_matches(name, [c.name for c in catalog.configs()], n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise PlanError(f"config {name!r} not found: not a config name and no file {path}.{hint} tune-magic ls lists the configs")


def _config_output_dir(config: Path) -> str | None:
    """Return the config's ``output_dir`` exactly as written (interpolations unresolved).

    Raises:
        PlanError: the file cannot be read, is not UTF-8 YAML, or its document is not a non-empty
            mapping (empty, a list, or a scalar such as a plain text file).
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    import yaml

    from tune_magic.plan.overrides import _yaml_loader

    try:
        # OmegaConf.load turns a top-level scalar into {scalar: None}: look at the document itself
        with open(config, encoding="utf-8") as f:
            top = yaml.compose(f, Loader=_yaml_loader())  # OmegaConf's loader, as torchtune reads it
        cfg = OmegaConf.load(config) if isinstance(top, yaml.MappingNode) else None
    except UnicodeDecodeError:
        raise PlanError(f"config {config} is not a text (UTF-8) YAML file; give a .yaml config") from None
    except OSError as exc:
        raise PlanError(f"config {config} cannot be read ({exc.strerror or exc}); give a readable .yaml config") from None
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PlanError(f"config {config} is not valid YAML ({first}); fix the file or give another config") from None
    if cfg is None or not OmegaConf.is_dict(cfg) or len(cfg) == 0:
        what = ("empty" if top is None or isinstance(top, yaml.MappingNode) else
                "a list" if isinstance(top, yaml.SequenceNode) else "a single scalar: plain text, not key: value lines")
        raise PlanError(f"config {config} is not a YAML mapping of keys to values (it is {what}); give a "
                        "torchtune config (key: value lines)")
    raw = OmegaConf.to_container(cfg, resolve=False).get("output_dir")
    # only a non-empty string is a directory we can give each job its own child of
    return raw if isinstance(raw, str) and raw.strip() else None


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _env_value(env: Mapping[str, str], opt_dest: str) -> str | None:
    value = env.get("PET_" + opt_dest.upper())
    return value if value not in (None, "") else None


def _truthy(value: str | bool | None) -> bool:
    if isinstance(value, bool):
        return value
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


# ---------------------------------------------------------------------------------------------


def build_plan(
    args: str | Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    gpus: str | Iterable[int] | None = None,
    job_id: str | None = None,
    job_dir: str | os.PathLike | None = None,
    scheduler: str = "local",
    nodes: int | None = None,
    gpus_per_node: int | None = None,
) -> LaunchPlan:
    """Build the launch plan for ``tune run``-style arguments, without starting anything.

    Args:
        args: ``[TORCHRUN-OPTIONS] RECIPE --config CONFIG [key=value | ~key ...]`` as one string
            (split with :func:`shlex.split`) or a list of strings (taken as is). ``--config=X`` is
            accepted like ``--config X``. RECIPE is a torchtune recipe name, a shipped recipe name
            (``tune-magic ls``) or a ``.py`` path relative to ``cwd``; CONFIG likewise, without
            ``.yaml`` for names.
        env: the job's whole environment (the caller's ``os.environ`` plus the job's additions);
            ``PET_*`` variables in it count like the torchrun flags. Default ``os.environ``.
        cwd: directory that relative paths are resolved from; default the current directory.
        gpus: GPU ids for the job (``"0,1"`` or ``[0, 1]``); sets ``CUDA_VISIBLE_DEVICES`` in the
            plan's env and implies that many processes per node.
        job_id: when given, and the user set no ``output_dir``, the plan adds
            ``output_dir=<config's output_dir>/<job_id>`` so concurrent jobs never share a
            directory. Without it, previews show :data:`JOB_ID_PLACEHOLDER` in its place.
        job_dir: the job's directory (its record and logs). When ``--redirects``/``--tee`` send
            worker output to files and no ``--log-dir`` is given, the plan adds
            ``--log-dir <job_dir>/ranks`` so the files can be found (:data:`JOB_DIR_PLACEHOLDER`
            in its place when ``None``).
        scheduler: ``"local"`` (this machine) or ``"slurm"``: the plan is then what each node of
            one SLURM job runs (see :class:`LaunchPlan`); rendezvous flags the scheduler sets per
            node are refused, ``--nnodes`` must agree with ``nodes``.
        nodes: SLURM nodes (default 1, or ``--nnodes``).
        gpus_per_node: SLURM GPUs per node: the processes per node unless ``--nproc_per_node``.

    Returns:
        The :class:`LaunchPlan`.

    Raises:
        PlanError: any bad input (unknown recipe, missing ``--config``, a multi-node run with no
            endpoint, a malformed endpoint, a torchrun flag after the recipe, ...). The message
            names the fix. Nothing has been started.
    """
    env = dict(os.environ if env is None else env)
    cwd_path = Path(os.getcwd() if cwd is None else cwd).expanduser().absolute()
    if not cwd_path.is_dir():
        raise PlanError(f"working directory {str(cwd_path)!r} does not exist; pass an existing cwd")
    if job_id is not None:
        check_job_id(job_id)
    gpu_ids = parse_gpus(gpus)
    for dest, why in _REFUSED.items():
        if _truthy(env.get("PET_" + dest.upper())):
            raise PlanError(f"PET_{dest.upper()} is set in the environment: {why.split(';')[0]}; unset it")
    parsed = _tokenise(split_args(args))
    opts = parsed.torchrun
    check_torchrun_values(opts, env)

    recipe_path, recipe_name, recipe_source, supports_distributed = _resolve_recipe(parsed.recipe, cwd_path)
    config_path, config_name = resolve_config(parsed.config, cwd_path)

    # -- distributed or one process
    from tune_magic.plan.torchrun_options import options as _torchrun_options

    # a PET_* variable is a torchrun option given through the environment: it means torchrun too
    pet_given = sorted({o.env_var for o in _torchrun_options().values() if _env_value(env, o.dest) is not None})
    wants_torchrun = bool(opts) or bool(pet_given) or (gpu_ids is not None and len(gpu_ids) > 1)
    if supports_distributed is False and wants_torchrun:
        given = " ".join(parsed.torchrun_tokens) or (" ".join(pet_given) if pet_given else _gpus(len(gpu_ids)))
        raise PlanError(
            f"recipe {recipe_name} runs on one device and does not support torchrun options ({given}); "
            f"drop them, or use a *_distributed recipe"
        )
    distributed = supports_distributed is True or wants_torchrun

    overrides = list(parsed.overrides)
    added_output_dir = None
    base = _config_output_dir(config_path)  # also refuses a config that is not a mapping
    if not any(o.split("=", 1)[0] in ("output_dir", "~output_dir") for o in overrides):
        if base is not None:
            added_output_dir = f"{base.rstrip('/')}/{job_id or JOB_ID_PLACEHOLDER}"
            overrides.append(f"output_dir={added_output_dir}")

    plan_env = {"PYTHONUNBUFFERED": "1", HOME_ENV: str(home(env))}
    path_entries = [str(cwd_path)]
    if recipe_source == "path":
        path_entries.insert(0, str(recipe_path.parent))
    if env.get("PYTHONPATH"):
        path_entries.append(env["PYTHONPATH"])
    plan_env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path_entries))
    if gpu_ids is not None:
        plan_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))

    recipe_args = [str(recipe_path), "--config", str(config_path), *overrides]
    common = dict(env=plan_env, recipe=str(recipe_path), recipe_name=recipe_name, recipe_source=recipe_source,
                  config=str(config_path), config_name=config_name, gpus=gpu_ids, overrides=overrides,
                  output_dir=added_output_dir, job_id=job_id, cwd=str(cwd_path))
    if scheduler == "slurm":
        if gpu_ids is not None:
            raise PlanError("--gpus picks GPUs of this machine; under --scheduler slurm SLURM allocates them: "
                            "give --gpus-per-node G instead")
        return _slurm_plan(parsed, env, common, recipe_args, recipe_name, supports_distributed, nodes=nodes,
                           gpus_per_node=gpus_per_node, job_dir=job_dir, cwd=cwd_path)
    if not distributed:
        return LaunchPlan(argv=[sys.executable, *recipe_args], distributed=False, rendezvous=None, endpoint=None,
                          nproc_per_node=None, nnodes=None, torchrun_args=[], **common)

    torchrun_args = list(parsed.torchrun_tokens)
    rendezvous, endpoint = _rendezvous_policy(opts, env)
    if rendezvous == "standalone" and "standalone" not in opts:
        torchrun_args.insert(0, "--standalone")
    added_log_dir, rank_log_dir = _rank_log_dir(opts, env, job_dir, cwd_path)
    torchrun_args += added_log_dir

    nproc = opts.get("nproc_per_node") or _env_value(env, "nproc_per_node")
    source = "--nproc-per-node" if "nproc_per_node" in opts else "PET_NPROC_PER_NODE"
    if nproc is not None:
        check_nproc(str(nproc), source)
        if gpu_ids is not None and str(nproc).isdigit() and int(nproc) != len(gpu_ids):
            raise PlanError(
                f"{source} {nproc} disagrees with --gpus {','.join(map(str, gpu_ids))} ({_gpus(len(gpu_ids))}); "
                f"drop {source} (the GPU list sets it) or give {_gpus(int(nproc))}"
            )
    else:
        nproc = str(len(gpu_ids)) if gpu_ids else "1"
        torchrun_args += ["--nproc_per_node", nproc]
    nnodes = opts.get("nnodes") or _env_value(env, "nnodes") or "1"
    return LaunchPlan(argv=[sys.executable, "-m", "torch.distributed.run", *torchrun_args, *recipe_args],
                      distributed=True, rendezvous=rendezvous, endpoint=endpoint, nproc_per_node=str(nproc),
                      nnodes=str(nnodes), torchrun_args=torchrun_args, rank_log_dir=rank_log_dir, **common)


#: torchrun options the SLURM scheduler sets on each node itself: refused under SLURM.
_SLURM_REFUSED = ("node_rank", "master_addr", "master_port", "local_addr", "standalone")
#: torchrun options the SLURM scheduler takes from the user and places itself.
_SLURM_PLACED = ("nnodes", "nproc_per_node", "rdzv_endpoint", "rdzv_backend", "rdzv_id", "rdzv_conf")


def _slurm_plan(parsed: _Parsed, env: Mapping[str, str], common: dict, recipe_args: list[str],
                recipe_name: str | None, supports_distributed: bool | None, *, nodes: int | None,
                gpus_per_node: int | None, job_dir, cwd: Path) -> LaunchPlan:
    """The per-node command of a SLURM job (one torchrun agent per node), from the same words."""
    opts = parsed.torchrun

    def given(dest: str) -> tuple[str | None, str]:
        if dest in opts:
            return str(opts[dest]), lookup("--" + dest.replace("_", "-")).display
        return _env_value(env, dest), "PET_" + dest.upper()

    for dest in _SLURM_REFUSED:
        value, src = given(dest)
        if value is not None and (dest != "standalone" or _truthy(value)):
            fix = f"unset {src}" if src.startswith("PET_") else f"drop {src}"
            raise PlanError(f"{src} is set per node by the SLURM scheduler (head address, a free port, each node's "
                            f"address); {fix}, or use --scheduler local")
    nnodes, nnodes_src = given("nnodes")
    if nnodes is not None:
        lo, hi = parse_nnodes(nnodes, nnodes_src)
        if lo != hi:
            raise PlanError(f"{nnodes_src} {nnodes}: an elastic range is not supported under SLURM, which allocates "
                            "a fixed number of nodes; give --nodes N")
        if nodes is not None and nodes != lo:
            raise PlanError(f"{nnodes_src} {nnodes} and --nodes {nodes} differ; give one of them (they mean the same)")
        nodes = lo
    nodes = nodes or 1
    warnings = []
    endpoint, endpoint_src = given("rdzv_endpoint")
    if endpoint is not None:
        check_endpoint(endpoint, endpoint_src)
        warnings.append(f"every node must reach your rendezvous endpoint {endpoint} ({endpoint_src}); it goes "
                        "unchanged to every node (leave it out and the scheduler uses the head node and a free port)")
    backend = given("rdzv_backend")[0] or "c10d"
    rdzv_id, id_src = given("rdzv_id")
    if rdzv_id is not None:
        warnings.append(f"{id_src} {rdzv_id} is replaced by the SLURM job id ($SLURM_JOB_ID): one id per job")
    conf = given("rdzv_conf")[0]
    nproc, nproc_src = given("nproc_per_node")
    if nproc is not None:
        check_nproc(nproc, nproc_src)
    else:
        nproc = str(gpus_per_node) if gpus_per_node else "1"
    if supports_distributed is False and (nodes > 1 or nproc not in ("1",)):
        raise PlanError(f"recipe {recipe_name} runs on one device and cannot use {nodes} node(s) x {nproc} processes; "
                        "use a *_distributed recipe")
    keep = [t for dest, group in parsed.groups if dest not in _SLURM_REFUSED + _SLURM_PLACED for t in group]
    added_log_dir, rank_log_dir = _rank_log_dir(opts, env, job_dir, cwd)
    keep += added_log_dir
    if nodes == 1 and endpoint is None:
        torchrun_args = ["--standalone", "--nproc_per_node", nproc, *keep]
        rendezvous = "standalone"
    else:
        torchrun_args = ["--nnodes", "${SLURM_JOB_NUM_NODES}", "--nproc_per_node", nproc, "--rdzv-backend", backend,
                         "--rdzv-endpoint", endpoint or "${TUNE_MAGIC_RDZV_ENDPOINT}", "--rdzv-id", "${SLURM_JOB_ID}",
                         *keep]
        rendezvous = "user" if endpoint is not None else "scheduler"
    return LaunchPlan(argv=[sys.executable, "-m", "torch.distributed.run", *torchrun_args, *recipe_args],
                      distributed=True, rendezvous=rendezvous, endpoint=endpoint, nproc_per_node=nproc,
                      nnodes=str(nodes), torchrun_args=torchrun_args, rank_log_dir=rank_log_dir, scheduler="slurm",
                      rdzv_conf=conf, warnings=warnings, **common)


def _rank_log_dir(opts: Mapping[str, str | bool], env: Mapping[str, str], job_dir: str | os.PathLike | None,
                  cwd: Path) -> tuple[list[str], str | None]:
    """Return (options to add, torchrun's log dir) for ``--redirects``/``--tee``.

    torchrun writes redirected/teed worker output to ``<log dir>/<run id>_*/attempt_N/<local
    rank>/{stdout,stderr}.log``; without ``--log-dir`` it picks a fresh ``/tmp/torchelastic_*``
    that nothing records, so the job's own ``<job dir>/ranks`` is given instead.
    """
    given = opts.get("log_dir") or _env_value(env, "log_dir")
    if given:
        return [], os.path.normpath(cwd / str(given))  # torchrun runs in the plan's cwd
    std = [opts.get(d) or _env_value(env, d) for d in ("redirects", "tee")]
    if not any(v not in (None, "0") for v in std):
        return [], None
    log_dir = f"{str(job_dir).rstrip('/') if job_dir is not None else JOB_DIR_PLACEHOLDER}/ranks"
    return ["--log-dir", log_dir], log_dir


def _rendezvous_policy(opts: Mapping[str, str | bool], env: Mapping[str, str]) -> tuple[str, str | None]:
    """Apply the rendezvous rules; return (mode, user endpoint or None)."""

    def given(dest: str) -> tuple[str | None, str]:
        if dest in opts:
            return str(opts[dest]), lookup("--" + dest.replace("_", "-")).display
        return _env_value(env, dest), "PET_" + dest.upper()

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

    standalone = _truthy(opts.get("standalone")) or _truthy(env.get("PET_STANDALONE"))
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
