"""Which GPUs a job may use, without initialising CUDA in the calling process.

A ``torch.cuda.*`` call in a notebook kernel creates a CUDA context that holds GPU memory and breaks
later forked launches, so the kernel asks ``nvidia-smi`` (a separate process) instead. On a machine
without ``nvidia-smi`` the answer is 0 GPUs.

GPU ids a user types are relative to what the kernel may see. JupyterHub spawners and SLURM
allocations set ``CUDA_VISIBLE_DEVICES`` for the kernel; with ``CUDA_VISIBLE_DEVICES=2,3``, ``--gpus 0,1``
means physical GPUs 2 and 3, exactly as ``cuda:0``/``cuda:1`` would inside the kernel. Three kinds of
id appear here:

- *typed*: what the user types (``--gpus 0,1``): positions in the kernel's visible list;
- *entry*: the kernel's ``CUDA_VISIBLE_DEVICES`` entry for that position (``"2"``, ``"GPU-8932f937"``,
  ``"MIG-…"``); the job's ``CUDA_VISIBLE_DEVICES`` is made of these, so it sees a subset of what the
  kernel sees, named the same way;
- *physical*: the ``nvidia-smi`` index (an ``int``), or a MIG id as given (a ``str``: ``nvidia-smi
  --query-gpu`` lists parent GPUs only). Busy/clash checks compare these, so two kernels with
  different ``CUDA_VISIBLE_DEVICES`` still see each other's jobs on the same card.

``CUDA_VISIBLE_DEVICES`` is read the way CUDA reads it (CUDA C Programming Guide, "CUDA Environment
Variables"; the edge cases as ``torch.cuda._parse_visible_devices`` mimics them, torch 2.13):
unset means every GPU; empty means none; entries are indices, ``GPU-`` UUIDs (a unique prefix is
enough) or ``MIG-`` ids; the first invalid entry (negative, unknown, or of another kind than the
first entry) ends the list; a GPU named twice leaves CUDA with no GPU at all.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterable, Literal, Mapping, Sequence

from tune_magic.errors import PlanError

NVIDIA_SMI_TIMEOUT_S = 10.0
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

Physical = int | str
"""A physical GPU: an ``nvidia-smi`` index, or a MIG id string (``"MIG-…"``) as given."""


class GpuError(PlanError):
    """GPU ids that do not exist, are not visible to the kernel, or are busy. The message names the fix."""


# ---------------------------------------------------------------------------------------------
# What nvidia-smi lists (the one place that runs it)


@dataclass(frozen=True)
class PhysicalGpu:
    """One GPU as ``nvidia-smi --query-gpu=index,uuid --format=csv,noheader`` lists it.

    Attributes:
        index: ``nvidia-smi``'s index (PCI bus order).
        uuid: ``"GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"``, or ``None`` when not listed.
    """

    index: int
    uuid: str | None = None


@dataclass(frozen=True)
class SmiResult:
    """The GPUs ``nvidia-smi`` listed, and why the list is empty when something went wrong.

    Attributes:
        gpus: in ``nvidia-smi``'s order.
        problem: ``None``, or a phrase for error messages (``"nvidia-smi was not found on PATH"``).
    """

    gpus: list[PhysicalGpu]
    problem: str | None = None


def query_gpus(env: Mapping[str, str] | None = None) -> SmiResult:
    """Ask ``nvidia-smi`` for the machine's GPUs (index and UUID). Never touches CUDA.

    Args:
        env: environment whose ``PATH`` is searched for ``nvidia-smi``; default ``os.environ``.

    Returns:
        The GPUs (``[]`` without ``nvidia-smi``, or when it fails or times out after
        :data:`NVIDIA_SMI_TIMEOUT_S` seconds) and the reason when there are none.
    """
    exe = shutil.which("nvidia-smi", path=None if env is None else env.get("PATH"))
    if exe is None:
        return SmiResult([], "nvidia-smi was not found on PATH")
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=index,uuid", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return SmiResult([], f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT_S:g} s")
    except OSError as exc:
        return SmiResult([], f"nvidia-smi could not run ({exc.strerror or exc})")
    if proc.returncode != 0:
        said = next((l.strip() for l in (proc.stdout + "\n" + proc.stderr).splitlines() if l.strip()), "")
        return SmiResult([], f"nvidia-smi failed with exit code {proc.returncode}" + (f": {said}" if said else ""))
    gpus = []
    for line in proc.stdout.splitlines():
        index, _, uuid = (part.strip() for part in line.partition(","))
        if index.isdigit():
            gpus.append(PhysicalGpu(int(index), uuid or None))
    return SmiResult(gpus, None if gpus else "nvidia-smi listed no GPU")


def gpu_ids(env: Mapping[str, str] | None = None) -> list[int]:
    """Return the indices of this machine's GPUs, as ``nvidia-smi`` lists them (``[]`` if none).

    This is every GPU of the machine, whatever ``CUDA_VISIBLE_DEVICES`` says; what a job may use is
    :func:`visible_gpus`.

    Args:
        env: environment whose ``PATH`` is searched for ``nvidia-smi``; default ``os.environ``.
    """
    return [g.index for g in query_gpus(env).gpus]


def count_gpus(env: Mapping[str, str] | None = None) -> int:
    """Return the number of GPUs on this machine (0 without ``nvidia-smi``)."""
    return len(gpu_ids(env))


_ID_RANGE = re.compile(r"([0-9]+)\s*-\s*([0-9]+)")


def parse_gpu_spec(gpus: "str | Iterable[int] | None") -> list[int] | None:
    """Parse a GPU list with ranges: ``"0-7"``, ``"0-3,6,7"``, ``"0,1"``, ``[2, 3]``; ``None`` or
    ``""`` for none.

    Ranges are inclusive (``0-3`` is 0, 1, 2, 3) and keep their order (``4-7,0-3`` is 4..7 then
    0..3). Only the syntax is checked: whether the ids exist is checked at launch.

    Returns:
        The ids in the order given, or ``None`` for no list.

    Raises:
        PlanError: not non-negative integers or ``A-B`` ranges with A <= B, a GPU named twice
            (also through overlapping ranges), or ``"auto"`` (resolved at launch time).
    """
    if gpus is None:
        return None
    if isinstance(gpus, str):
        text = gpus.strip()
        if not text:
            return None
        if text == "auto":
            raise PlanError("gpus='auto' is resolved when launching; to build a plan, give ids such as --gpus 0,1 "
                            "or 0-3")
        ids: list[int] = []
        for part in (p.strip() for p in text.split(",")):
            m = _ID_RANGE.fullmatch(part)
            if m:
                lo, hi = int(m[1]), int(m[2])
                if lo > hi:
                    raise PlanError(f"GPU range {part!r} runs backwards; write the lower id first, e.g. --gpus "
                                    f"{hi}-{lo}")
                ids.extend(range(lo, hi + 1))
            elif re.fullmatch(r"[0-9]+", part):
                ids.append(int(part))
            else:
                raise PlanError(f"bad GPU id {part!r}: give non-negative integers or ranges, e.g. --gpus 0,1 or "
                                "--gpus 0-3,6")
    elif isinstance(gpus, (bytes, bool, int, float, dict)) or not hasattr(gpus, "__iter__"):
        raise PlanError(f"gpus={gpus!r}: give a list of GPU ids such as [0, 1] or a string such as '0,1' or '0-3'")
    else:
        ids = []
        for part in gpus:
            if isinstance(part, bool) or not (
                    (isinstance(part, int) and part >= 0) or (isinstance(part, str) and re.fullmatch(r"[0-9]+", part))):
                raise PlanError(f"bad GPU id {part!r}: give non-negative integers, e.g. --gpus 0,1")
            ids.append(int(part))
    if not ids:
        return None
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise PlanError(f"GPU list {gpus!r} names GPU {', '.join(map(str, twice))} twice; give each id once, "
                        "e.g. --gpus 0-3")
    return ids


# ---------------------------------------------------------------------------------------------
# What the kernel may see (pure: CUDA_VISIBLE_DEVICES + nvidia-smi's list -> visible GPUs)


@dataclass(frozen=True)
class VisibleGpu:
    """One GPU the kernel may use.

    Attributes:
        typed: the id users type (``--gpus 0``): its position in the kernel's visible list.
        physical: the ``nvidia-smi`` index, or the MIG id as given.
        entry: the kernel's ``CUDA_VISIBLE_DEVICES`` entry naming it (``"2"``, ``"GPU-…"``,
            ``"MIG-…"``); the index as text when ``CUDA_VISIBLE_DEVICES`` is unset.
    """

    typed: int
    physical: Physical
    entry: str

    @property
    def label(self) -> str:
        """``"0 (physical 2)"``, or ``"2"`` when the typed and physical ids are the same."""
        return str(self.typed) if self.physical == self.typed else f"{self.typed} (physical {self.physical})"


@dataclass(frozen=True)
class Visibility:
    """The GPUs the kernel may use, and how that was decided.

    Attributes:
        gpus: the visible GPUs, ``typed`` 0, 1, ... in order.
        setting: the kernel's ``CUDA_VISIBLE_DEVICES`` (``None`` when unset).
        note: why fewer GPUs are visible than the setting names (an entry CUDA stops at, a GPU named
            twice, an ``nvidia-smi`` problem), else ``None``.
    """

    gpus: list[VisibleGpu]
    setting: str | None
    note: str | None = None

    def describe(self) -> str:
        """A phrase for messages: ``"CUDA_VISIBLE_DEVICES='2,3' lets this kernel use 2 GPUs: 0 (physical 2), 1 (physical 3)"``."""
        if self.setting is None:
            where = "nvidia-smi lists"
        else:
            where = f"{CUDA_VISIBLE_DEVICES}={self.setting!r} lets this kernel use"
        if self.gpus:
            what = f"{len(self.gpus)} GPU{'s' if len(self.gpus) != 1 else ''}: " + ", ".join(g.label for g in self.gpus)
        else:
            what = "no GPU"
        return f"{where} {what}" + (f" ({self.note})" if self.note else "")


_STRTOUL = re.compile(r"\s*([+-]?)(\d+)")


def _index_entry(entry: str) -> int | None:
    """An index entry as CUDA reads it (strtoul: ``"1gpu"`` is 1), or ``None`` when it is not one."""
    m = _STRTOUL.match(entry)
    if m is None or m.group(1) == "-":
        return None
    return int(m.group(2))


def _entry_kind(entry: str) -> str:
    return "uuid" if entry.startswith("GPU-") else "mig" if entry.startswith("MIG-") else "index"


def parse_visible(setting: str | None, smi: SmiResult) -> Visibility:
    """Map the kernel's ``CUDA_VISIBLE_DEVICES`` onto ``nvidia-smi``'s GPUs, the way CUDA reads it.

    Pure: no process is run.

    Args:
        setting: the kernel's ``CUDA_VISIBLE_DEVICES`` value, or ``None`` when unset.
        smi: what :func:`query_gpus` returned.

    Returns:
        The visible GPUs. Unset: every GPU ``nvidia-smi`` lists, typed id = index. Empty (or only
        spaces): none. Otherwise the entries up to the first one CUDA stops at (see the module
        docstring), or none when a GPU is named twice; ``note`` says which rule applied.
    """
    if setting is None:
        return Visibility([VisibleGpu(g.index, g.index, str(g.index)) for g in smi.gpus], None, smi.problem)
    if not setting.strip():
        return Visibility([], setting, None)
    entries = [e.strip() for e in setting.split(",")]
    first_kind = _entry_kind(entries[0])
    if first_kind != "mig" and not smi.gpus:
        return Visibility([], setting, smi.problem or "nvidia-smi listed no GPU")
    by_index = {g.index: g for g in smi.gpus}
    uuids = [g for g in smi.gpus if g.uuid]
    gpus: list[VisibleGpu] = []
    note = None
    for entry in entries:
        kind = _entry_kind(entry)
        physical: Physical | None = None
        if kind != first_kind:
            note = f"entry {entry!r} is of another kind than the first entry, so CUDA ignores it and every entry after it"
            break
        if kind == "mig":
            physical, job_entry = entry, entry
        elif kind == "uuid":
            matches = [g for g in uuids if g.uuid.lower().startswith(entry.lower())]
            if len(matches) == 1:
                physical, job_entry = matches[0].index, entry
            else:
                why = "matches no GPU nvidia-smi lists" if not matches else "matches several GPUs"
                note = f"entry {entry!r} {why}, so CUDA ignores it and every entry after it"
        else:
            index = _index_entry(entry)
            if index is not None and index in by_index:
                physical, job_entry = index, str(index)
            else:
                why = "is not a GPU index" if index is None else "is not a GPU nvidia-smi lists"
                note = f"entry {entry!r} {why}, so CUDA ignores it and every entry after it"
        if physical is None:
            break
        if any(g.physical == physical for g in gpus):
            return Visibility([], setting, f"it names GPU {physical} twice, and CUDA then shows no GPU at all")
        gpus.append(VisibleGpu(len(gpus), physical, job_entry))
    return Visibility(gpus, setting, note)


def visibility(env: Mapping[str, str] | None = None) -> Visibility:
    """Return the GPUs a kernel with environment ``env`` may use (runs ``nvidia-smi`` when needed).

    ``nvidia-smi`` is not run when ``CUDA_VISIBLE_DEVICES`` is empty or names MIG devices only
    (their ids are taken as given).

    Args:
        env: the kernel's environment (``CUDA_VISIBLE_DEVICES``, ``PATH``); default ``os.environ``.
    """
    env = os.environ if env is None else env
    setting = env.get(CUDA_VISIBLE_DEVICES)
    if setting is not None and (not setting.strip() or setting.strip().startswith("MIG-")):
        return parse_visible(setting, SmiResult([]))
    return parse_visible(setting, query_gpus(env))


def visible_gpus(env: Mapping[str, str] | None = None) -> list[VisibleGpu]:
    """Return the GPUs a job launched from this kernel may use, each labelled with its physical id.

    For the panel's GPU list: ``[g.label for g in visible_gpus()]`` gives ``"0 (physical 2)"``.

    Args:
        env: the kernel's environment; default ``os.environ``.
    """
    return visibility(env).gpus


# ---------------------------------------------------------------------------------------------
# Resolving a job's GPUs at launch


@dataclass(frozen=True)
class ResolvedGpus:
    """The GPUs a job gets.

    Attributes:
        typed: ids as the user typed them (or as ``"auto"`` picked them), relative to the kernel's
            visible list. The record's ``gpus``.
        physical: the same GPUs as ``nvidia-smi`` indices (MIG ids as strings). The record's
            ``physical_gpus``; busy/clash checks compare these.
        cuda_visible_devices: the job's ``CUDA_VISIBLE_DEVICES``: the kernel's entries for these
            GPUs, comma-separated (``"2,3"``, ``"GPU-…,GPU-…"``).
    """

    typed: list[int]
    physical: list[Physical]
    cuda_visible_devices: str

    @property
    def label(self) -> str:
        """``"GPUs 0,1 (physical 2,3)"``, or ``"GPUs 0,1"`` when typed and physical are the same."""
        return gpus_label(self.typed, self.physical)


def gpus_label(typed: Sequence[int] | None, physical: Sequence[Physical] | None = None) -> str:
    """Format a job's GPUs for cards and tables.

    Args:
        typed: the record's ``gpus``.
        physical: the record's ``physical_gpus`` (``None`` for records made before it existed).

    Returns:
        ``"GPUs 0,1 (physical 2,3)"`` when they differ, ``"GPUs 0,1"`` (``"GPU 0"`` for one) when
        they are the same or ``physical`` is unknown, ``""`` when the job asked for no GPU.
    """
    if not typed:
        return ""
    head = ("GPU " if len(typed) == 1 else "GPUs ") + ",".join(map(str, typed))
    if physical is None or [_norm(p) for p in physical] == list(typed):
        return head
    return f"{head} (physical {','.join(map(str, physical))})"


def _norm(p: Physical) -> Physical:
    """One spelling per physical GPU: index text becomes an int (JSON keys are strings)."""
    if isinstance(p, str) and p.strip().isdigit():
        return int(p)
    return p.strip() if isinstance(p, str) else p


def _check_requested(requested: object) -> list[int]:
    if isinstance(requested, (str, bytes)) or not isinstance(requested, Iterable):
        raise GpuError(f"gpus={requested!r}: give a list of GPU ids such as [0, 1], or 'auto'")
    ids = list(requested)
    if not ids:
        raise GpuError("gpus=[]: give at least one GPU id, 'auto', or leave --gpus out")
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise GpuError(f"bad GPU id {i!r}: give non-negative integers, e.g. --gpus 0,1")
    dup = next((i for n, i in enumerate(ids) if i in ids[:n]), None)
    if dup is not None:
        raise GpuError(f"GPU list {','.join(map(str, ids))} names GPU {dup} twice; give each id once, e.g. --gpus 0,1")
    return ids


def resolve_with(
    requested: Sequence[int] | Literal["auto"],
    nproc: int,
    busy_physical: Mapping[Physical, str],
    visible: Visibility,
    *,
    force: bool = False,
) -> ResolvedGpus:
    """Pure core of :func:`resolve_gpus`: the same, given the kernel's :class:`Visibility`."""
    busy = {_norm(k): v for k, v in busy_physical.items()}
    if requested == "auto":
        if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
            raise GpuError(f"gpus='auto' needs a process count of at least 1, got {nproc!r}")
    else:
        ids = _check_requested(requested)
    if not visible.gpus:
        if visible.setting is not None and not visible.setting.strip():
            why = (f"{CUDA_VISIBLE_DEVICES} is empty in this kernel's environment, so it may use no GPU; "
                   "leave --gpus out, or start the kernel with GPUs (ask the spawner or allocation for them)")
        else:
            why = (f"{visible.describe()}; leave --gpus out, or launch from a kernel that has GPUs")
        asked = "auto" if requested == "auto" else ",".join(map(str, ids))
        raise GpuError(f"--gpus {asked}: {why}")
    if requested == "auto":
        free = [g for g in visible.gpus if g.physical not in busy]
        if len(free) < nproc:
            used = "; ".join(f"GPU {g.label} is used by job {busy[g.physical]}" for g in visible.gpus if g.physical in busy)
            raise GpuError(
                f"gpus='auto' needs {nproc} free GPU{'s' if nproc != 1 else ''} but {len(free)} of the "
                f"{len(visible.gpus)} visible are free ({visible.describe()}" + (f"; {used}" if used else "") +
                "); stop a job or give --gpus explicitly (with --force to share)"
            )
        chosen = free[:nproc]
    else:
        by_typed = {g.typed: g for g in visible.gpus}
        missing = [i for i in ids if i not in by_typed]
        if missing:
            valid = ",".join(str(g.typed) for g in visible.gpus)
            if visible.setting is None:
                where = f"does not exist on this machine: {visible.describe()}"
            else:
                where = (f"is not visible to this kernel: {visible.describe()} "
                         "(--gpus counts from 0 within the kernel's CUDA_VISIBLE_DEVICES)")
            raise GpuError(f"GPU {missing[0]} {where}; pick ids among {valid}, or leave --gpus out")
        chosen = [by_typed[i] for i in ids]
        if not force:
            for g in chosen:
                if g.physical in busy:
                    raise GpuError(f"GPU {g.label} is used by running job {busy[g.physical]}; pick another GPU, "
                                   "stop that job, or pass --force / force=True to share it")
    return ResolvedGpus(
        typed=[g.typed for g in chosen], physical=[g.physical for g in chosen],
        cuda_visible_devices=",".join(g.entry for g in chosen),
    )


def resolve_gpus(
    requested: Sequence[int] | Literal["auto"],
    nproc: int,
    busy_physical: Mapping[Physical, str],
    env: Mapping[str, str] | None = None,
    *,
    force: bool = False,
) -> ResolvedGpus:
    """Turn the GPU ids a user typed into the GPUs the job gets, at launch (never for a plan).

    Args:
        requested: typed ids relative to the kernel's ``CUDA_VISIBLE_DEVICES`` (``[0, 1]``, as
            :func:`parse_gpu_spec` returns them), or ``"auto"``.
        nproc: processes per node; ``"auto"`` picks this many GPUs (ignored for explicit ids).
        busy_physical: physical GPU (``nvidia-smi`` index, or MIG id) -> id of the running job using
            it. Index keys may be ints or digit strings.
        env: the kernel's environment (``CUDA_VISIBLE_DEVICES``, ``PATH`` for ``nvidia-smi``);
            default ``os.environ``.
        force: allow explicit ids that a running job uses (``"auto"`` still picks free ones).

    Returns:
        The typed ids, their physical ids, and the job's ``CUDA_VISIBLE_DEVICES``.

    Raises:
        GpuError: the kernel may use no GPU (``CUDA_VISIBLE_DEVICES`` empty, no ``nvidia-smi``), an id
            outside the visible list (the message lists the visible ids and their physical ids),
            bad or repeated ids, a busy GPU without ``force``, or too few free GPUs for ``"auto"``.
    """
    return resolve_with(requested, nproc, busy_physical, visibility(env), force=force)


def preview_cuda_visible_devices(typed: Sequence[int], env: Mapping[str, str] | None = None) -> str | None:
    """The job's ``CUDA_VISIBLE_DEVICES`` for a plan preview, without running ``nvidia-smi``.

    Dry runs must not check ids (plans for GPU nodes are built on CPU machines), so this only maps
    positions through the kernel's entries: ``CUDA_VISIBLE_DEVICES=2,3`` and ``[0, 1]`` give
    ``"2,3"``; unset gives the typed ids. ``None`` when an id has no entry (the launch will refuse it).

    Args:
        typed: ids as typed.
        env: the kernel's environment; default ``os.environ``.
    """
    env = os.environ if env is None else env
    setting = env.get(CUDA_VISIBLE_DEVICES)
    if setting is None:
        return ",".join(map(str, typed))
    entries = [e.strip() for e in setting.split(",")] if setting.strip() else []
    if any(not 0 <= i < len(entries) for i in typed):
        return None
    return ",".join(entries[i] for i in typed)


# ---------------------------------------------------------------------------------------------
# Superseded by resolve_gpus (they ignore CUDA_VISIBLE_DEVICES); kept until jobctl switches over.


def check_gpus(wanted: Iterable[int], busy: Mapping[int, str], *, force: bool = False,
               env: Mapping[str, str] | None = None) -> None:
    """Check that every wanted ``nvidia-smi`` index exists and, unless ``force``, is not busy.

    Superseded by :func:`resolve_gpus`, which honours the kernel's ``CUDA_VISIBLE_DEVICES``.

    Raises:
        GpuError: an id that does not exist, or a busy one without ``force``.
    """
    present = gpu_ids(env)
    for gpu in wanted:
        if gpu not in present:
            found = f"{len(present)} GPU(s): {', '.join(map(str, present))}" if present else "0 GPUs"
            raise GpuError(f"GPU {gpu} does not exist on this machine ({found} found by nvidia-smi); "
                           "pick existing ids or leave --gpus out")
        if gpu in busy and not force:
            raise GpuError(f"GPU {gpu} is used by running job {busy[gpu]}; pick another GPU, stop that job, "
                           "or pass --force / force=True to share it")


def pick_free(n: int, busy: Mapping[int, str], env: Mapping[str, str] | None = None) -> list[int]:
    """Return the ``n`` lowest-numbered ``nvidia-smi`` indices not used by a running job.

    Superseded by ``resolve_gpus("auto", n, ...)``, which picks among the visible GPUs only.

    Raises:
        GpuError: fewer than ``n`` free GPUs.
    """
    present = gpu_ids(env)
    free = [g for g in present if g not in busy]
    if len(free) < n:
        raise GpuError(f"gpus='auto' needs {n} free GPU(s) but {len(free)} of {len(present)} are free; "
                       "stop a job or give --gpus explicitly (with --force to share)")
    return free[:n]
