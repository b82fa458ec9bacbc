"""Read what a checkpoint file holds without loading it: pure Python, never torch, never whole files.

Two formats, as torchtune 0.6.1's checkpointers write them:

* ``torch.save`` files (``recipe_state.pt``, ``adapter_model.pt``, ``*.bin``): torch's zip format
  (torch ≥ 1.6 default; ``<archive>/data.pkl`` is a pickle of the object with every tensor
  storage replaced by a persistent id ``("storage", <StorageType>, "<key>", "<location>", numel)``
  whose bytes live in the zip entry ``<archive>/data/<key>``). :func:`read_torch_file` reads the
  zip's central directory and ``data.pkl`` only, with :class:`_InertUnpickler`: every global the
  pickle names is replaced by an inert stand-in, so unpickling runs no code from the file and
  imports nothing (not torch); a tensor comes back as a :class:`TensorStub` (dtype, shape, which
  storage), its bytes never read. That is why a 70B full fine-tune's ``recipe_state.pt``
  (hundreds of GB of optimizer state) is read in milliseconds: only its ~100 KB ``data.pkl`` is
  touched. (``torch.load(..., weights_only=True, mmap=True)`` would be as safe, but needs
  ``import torch``: seconds in a fresh subprocess, and never in a notebook kernel.)
* safetensors files (``model-00001-of-00004.safetensors``, ``adapter_model.safetensors``): an
  8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and
  ``data_offsets``, then the data. :func:`read_safetensors_header` reads the header only and
  checks that the file is long enough to hold every tensor it names.

Both raise :class:`CheckpointFileError` with a plain reason ("truncated: ...", "not a torch
file: ...") for a file that cannot be what it claims.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tune_magic.errors import TuneMagicError

#: Largest ``data.pkl`` read (bytes). A recipe state's is ~100 KB even for a 70B model (one small
#: record per tensor); anything near this is not a recipe state.
MAX_PICKLE_BYTES = 256 << 20
#: Largest safetensors JSON header read (bytes); the format itself caps it at 100 MB.
MAX_SAFETENSORS_HEADER = 100 << 20

_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTO = b"\x80"

# bytes per element of torch's storage types (torch/storage.py names, as data.pkl spells them)
_STORAGE_ITEMSIZE = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
    "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
    "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8, "QInt8Storage": 1, "QUInt8Storage": 1,
    "QInt32Storage": 4, "QUInt4x2Storage": 1, "QUInt2x4Storage": 1, "UntypedStorage": 1,
}


class CheckpointFileError(TuneMagicError, ValueError):
    """A checkpoint file is truncated, damaged, or not in the format its name says."""


@dataclass(frozen=True)
class StorageRef:
    """One tensor storage a ``torch.save`` pickle refers to (its bytes are never read).

    Attributes:
        key: the storage's record name (``data/<key>`` in the zip).
        dtype: torch's storage type name without ``Storage`` (``Float``, ``BFloat16``...).
        location: the device it was saved from (``cpu``, ``cuda:0``).
        numel: elements, as the pickle records them.
    """

    key: str
    dtype: str
    location: str
    numel: int


@dataclass(frozen=True)
class TensorStub:
    """A tensor of a ``torch.save`` file, described, not loaded.

    Attributes:
        storage: the storage it views (``None`` when the file did not say).
        offset: its storage offset (elements).
        shape: its size, a tuple of ints.
    """

    storage: StorageRef | None
    offset: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        """Elements in the tensor (product of ``shape``; 1 for a 0-d tensor)."""
        n = 1
        for d in self.shape:
            n *= int(d)
        return n


@dataclass
class Opaque:
    """Stand-in for any other object a pickle builds (its class is never imported).

    Attributes:
        name: ``module.qualname`` of the class or function the pickle named.
        args: the arguments it was called with.
        state: what ``__setstate__``/``BUILD`` gave it, or ``None``.
        items: what the pickle appended or set on it (list and dict subclasses).
    """

    name: str
    args: tuple = ()
    state: Any = None
    items: list = field(default_factory=list)

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def append(self, value: Any) -> None:
        self.items.append(value)

    def extend(self, values: Any) -> None:
        self.items.extend(values)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items.append((key, value))


class _StorageType:
    """What ``data.pkl``'s ``torch.FloatStorage`` (etc.) becomes: its name only."""

    def __init__(self, name: str) -> None:
        self.name = name


def _opaque_factory(name: str):
    def make(*args: Any) -> Opaque:
        return Opaque(name, args)

    return make


def _rebuild_tensor(storage: Any, offset: Any = 0, size: Any = (), *_: Any) -> TensorStub:
    shape = tuple(int(d) for d in size) if isinstance(size, (tuple, list)) else ()
    return TensorStub(storage if isinstance(storage, StorageRef) else None, int(offset or 0), shape)


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    return data


def _torch_size(dims: Any = ()) -> tuple:
    return tuple(dims)


# The only globals mapped to something other than an Opaque stand-in; none runs code from the file.
_KNOWN: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): dict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("_codecs", "encode"): lambda text, encoding="latin1": str(text).encode(encoding),  # protocol-2 bytes
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch", "Size"): _torch_size,
}


class _InertUnpickler(pickle.Unpickler):
    """Unpickles ``data.pkl`` without importing or calling anything named in it.

    ``find_class`` is the only way a pickle reaches code (GLOBAL, STACK_GLOBAL, INST, OBJ, then
    REDUCE/NEWOBJ call what it returned); here it returns plain containers, the stub builders
    above, or :class:`Opaque` makers. ``persistent_load`` returns a :class:`StorageRef` and reads
    no storage bytes.
    """

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.storages: dict[str, StorageRef] = {}

    def find_class(self, module: str, name: str) -> Any:
        known = _KNOWN.get((module, name))
        if known is not None:
            return known
        if module == "torch" and name.endswith("Storage"):
            return _StorageType(name)
        return _opaque_factory(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            kind = pid[1].name if isinstance(pid[1], _StorageType) else str(getattr(pid[1], "name", pid[1]))
            ref = StorageRef(str(pid[2]), kind.removesuffix("Storage"), str(pid[3]), int(pid[4]))
            self.storages[ref.key] = ref
            return ref
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r:.80}")


@dataclass(frozen=True)
class TorchFile:
    """What :func:`read_torch_file` found.

    Attributes:
        path: the file.
        size: its size (bytes, as ``stat`` reports; a sparse file's apparent size).
        obj: the unpickled object, tensors as :class:`TensorStub`, other objects as :class:`Opaque`.
        storages: every storage the pickle refers to, by key.
        storage_bytes: total bytes of those storages' zip entries (the tensors' data).
        entries: number of zip entries.
    """

    path: Path
    size: int
    obj: Any
    storages: dict[str, StorageRef]
    storage_bytes: int
    entries: int


def _describe_start(head: bytes) -> str:
    if not head:
        return "it is empty"
    if head.startswith(_PICKLE_PROTO):
        return "it is a bare pickle (torch's legacy non-zip format, or not torch at all)"
    shown = head[:8].hex(" ")
    return f"it starts with bytes {shown}, not a zip header"


def _read_index(p: Path, size: int) -> tuple[bytes, list, str]:
    """Check a torch zip file's directory against its size and read its ``data.pkl``; return
    (the pickle's bytes, the zip entries, the entries' common prefix).

    Raises:
        CheckpointFileError: see :func:`read_torch_file`.
    """
    with open(p, "rb") as f:
        head = f.read(4)
        if not head.startswith(_ZIP_MAGIC):
            raise CheckpointFileError(f"{p} is not a torch file: {_describe_start(head)}")
        try:
            zf = zipfile.ZipFile(f)
        except zipfile.BadZipFile as exc:
            raise CheckpointFileError(
                f"{p} is truncated or damaged: it starts as a torch (zip) file but its zip directory is "
                f"missing or unreadable ({exc}); {size} bytes on disk"
            ) from None
        with zf:
            infos = zf.infolist()
            pkl = [i for i in infos if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"]
            if len(pkl) != 1:
                raise CheckpointFileError(f"{p} is a zip file but not a torch file (no single data.pkl among "
                                          f"{len(infos)} entries)")
            prefix = pkl[0].filename[: -len("data.pkl")]
            for info in infos:
                # local header (30 bytes + name + extra, bounded by 64 KiB) then the data
                if info.header_offset + info.compress_size > size:
                    raise CheckpointFileError(
                        f"{p} is truncated: entry {info.filename} runs to byte "
                        f"{info.header_offset + info.compress_size}, past the file's end at {size}")
            if pkl[0].file_size > MAX_PICKLE_BYTES:
                raise CheckpointFileError(f"{p}: data.pkl is {pkl[0].file_size} bytes, far more than a checkpoint's "
                                          "index of tensors; not read")
            try:
                data = zf.read(pkl[0])
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                raise CheckpointFileError(f"{p} is damaged: its data.pkl cannot be read ({exc})") from None
    return data, infos, prefix


def read_torch_file(path: str | os.PathLike[str]) -> TorchFile:
    """Read a ``torch.save`` zip file's structure and its ``data.pkl``, never the tensor bytes.

    Args:
        path: the file (e.g. ``<output_dir>/recipe_state/recipe_state.pt``).

    Returns:
        A :class:`TorchFile`.

    Raises:
        FileNotFoundError: no such file.
        CheckpointFileError: the file is truncated (no zip directory at its end, or an entry that
            runs past its end), damaged (a pickle that does not read back), or not a torch zip file
            (the reason names which).
    """
    p = Path(path)
    size = p.stat().st_size
    data, infos, prefix = _read_index(p, size)
    unpickler = _InertUnpickler(data)
    try:
        obj = unpickler.load()
    except Exception as exc:  # any failure to read the pickle back means a damaged file
        raise CheckpointFileError(f"{p} is damaged: its data.pkl does not unpickle ({type(exc).__name__}: {exc})") from None
    names = {i.filename: i for i in infos}
    storage_bytes = 0
    for key in unpickler.storages:
        info = names.get(f"{prefix}data/{key}")
        if info is None:
            raise CheckpointFileError(f"{p} is damaged: tensor storage {key} has no data/{key} entry")
        storage_bytes += info.file_size
    return TorchFile(p, size, obj, dict(unpickler.storages), storage_bytes, len(infos))


@dataclass(frozen=True)
class SafetensorsHeader:
    """A safetensors file's header.

    Attributes:
        path: the file.
        size: its size (bytes).
        tensors: ``{name: (dtype, shape)}`` for every tensor (``__metadata__`` left out).
        metadata: the ``__metadata__`` mapping (e.g. ``{"format": "pt"}``), or ``{}``.
        data_bytes: bytes of tensor data the header declares.
    """

    path: Path
    size: int
    tensors: dict[str, tuple[str, tuple[int, ...]]]
    metadata: dict[str, str]
    data_bytes: int


def read_safetensors_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Read a safetensors file's header and check the file holds every tensor it declares.

    Format (safetensors 0.4): ``u64`` little-endian header length N, N bytes of JSON
    ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then
    the data, offsets relative to its start.

    Raises:
        FileNotFoundError: no such file.
        CheckpointFileError: too short for its header or its data (truncated), or not safetensors.
    """
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointFileError(f"{p} is truncated or not a safetensors file: {size} bytes")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_SAFETENSORS_HEADER:
            raise CheckpointFileError(f"{p} is not a safetensors file: header length {n} is impossible")
        if 8 + n > size:
            raise CheckpointFileError(f"{p} is truncated: its {n}-byte header runs past the file's end at {size}")
        text = f.read(n)
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointFileError(f"{p} is not a safetensors file or is damaged: bad header ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointFileError(f"{p} is not a safetensors file: the header is not a mapping")
    meta = header.pop("__metadata__", None) or {}
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    end = 0
    try:
        for name, spec in header.items():
            begin, stop = (int(x) for x in spec["data_offsets"])
            tensors[name] = (str(spec["dtype"]), tuple(int(d) for d in spec["shape"]))
            end = max(end, stop)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointFileError(f"{p} is not a safetensors file or is damaged: bad tensor entry ({exc})") from None
    if 8 + n + end > size:
        raise CheckpointFileError(
            f"{p} is truncated: its header declares {end} bytes of tensor data, the file ends after "
            f"{max(0, size - 8 - n)}")
    return SafetensorsHeader(p, size, tensors, dict(meta) if isinstance(meta, dict) else {}, end)
