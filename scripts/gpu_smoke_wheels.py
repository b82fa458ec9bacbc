"""Prepare ``.whl/``: the wheels scripts/gpu-smoke installs on a GPU machine that has no network.

Run through ``scripts/gpu-smoke-wheels`` (it uses the project's .venv for ``pip`` and ``packaging``).

The lent GPU machine (this workplace's ``nvidia-h200`` kind) has Python 3.12 with a CUDA torch and
many packages, but not torchtune, torchao, omegaconf or datasets, and no network. Starting from
:data:`ROOTS`, this script downloads, for that machine's Python and platform, every package whose
requirement the machine does not already meet, reading each wheel's ``Requires-Dist`` (markers
evaluated for Linux x86-64 CPython 3.12, extras followed) until nothing is missing. Versions are
the project's pins (``constraints.txt``) where they fit, so the GPU run uses what the CPU runs use.

It writes, next to the wheels:

- ``on-device.txt``: the requirements left to the machine's own packages (``name specifier`` per
  line); scripts/gpu-smoke checks them there with ``importlib.metadata`` before starting anything,
  because for most packages only the name (not the version) of what is installed there is known;
- ``MANIFEST.txt``: each wheel, its size, and why it is carried.

Exit status: 0 when the set is complete and under :data:`LIMIT_BYTES`; 1 otherwise (the reason printed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent

#: What the smoke test imports that the machine lacks: torchtune's pins for this project, and
#: tune_magic's own needs (omegaconf; psutil, numpy, sentencepiece, safetensors, PyYAML are there).
ROOTS = ["torchtune==0.6.1", "torchao==0.11.0", "omegaconf"]

#: The machine's Python and platform (KINDS.md, nvidia-h200: "python3 is Python 3.12.3").
PYTHON_VERSION = "3.12"
PYTHON_FULL_VERSION = "3.12.3"
#: manylinux tags pip may match (the device README's list, plus the glibc levels wheels of this
#: set use); pip matches each N exactly.
PLATFORMS = ["manylinux_2_39_x86_64", "manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]
MARKER_ENV = {
    "python_version": PYTHON_VERSION, "python_full_version": PYTHON_FULL_VERSION, "os_name": "posix",
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
    "platform_python_implementation": "CPython", "implementation_name": "cpython",
    "implementation_version": PYTHON_FULL_VERSION, "platform_release": "", "platform_version": "",
}

#: Packages already on the machine: KINDS.md, "Python packages already there" (read on a machine
#: running the 'cuda' image, 2026-11-17). Versions where its "pip list" row gives them, else None
#: (then scripts/gpu-smoke checks the requirement there, from on-device.txt).
DEVICE_PACKAGES: dict[str, str | None] = {name: None for name in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split()}
DEVICE_PACKAGES.update({  # KINDS.md, nvidia-h200, "pip list, as a session saw it" (2026-11)
    "accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
    "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "tokenizers": "0.23.2", "torch": "2.11.0",
    "torchvision": "0.26.0", "transformers": "5.17.0", "triton": "3.6.0",
})

#: What ``.whl/`` may weigh: well under the device tool's 64 MiB for the whole travelling tree.
LIMIT_BYTES = 32 * 1024 * 1024


def set_python(full_version: str) -> None:
    """Aim at another Python (``"3.11.7"``): sets :data:`PYTHON_VERSION` and the marker environment."""
    global PYTHON_VERSION, PYTHON_FULL_VERSION
    PYTHON_FULL_VERSION = full_version
    PYTHON_VERSION = ".".join(full_version.split(".")[:2])
    MARKER_ENV.update(python_version=PYTHON_VERSION, python_full_version=full_version,
                      implementation_version=full_version)


def read_pins(path: Path) -> dict[str, Version]:
    """``name==version`` lines of a constraints file, by canonical name."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonicalize_name(name)] = Version(version.strip())
    return pins


def pip_download(spec: str, dest: Path) -> Path:
    """Download one wheel (no dependencies) for the machine's platform into ``dest``; return its path."""
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", PYTHON_VERSION, "--implementation", "cp",
           *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(dest), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        said = [l for l in proc.stderr.splitlines() if "is ignored" not in l]
        raise SystemExit(f"gpu-smoke-wheels: pip could not download {spec}:\n" + "\n".join(said[-10:]))
    name = canonicalize_name(Requirement(spec).name)
    new = [w for w in set(dest.glob("*.whl")) - before if parse_wheel_filename(w.name)[0] == name]
    if not new:  # already there from an earlier run
        new = [w for w in dest.glob("*.whl") if parse_wheel_filename(w.name)[0] == name]
    return new[0]


def requires_dist(wheel: Path) -> list[Requirement]:
    """The wheel's ``Requires-Dist`` requirements (its ``*.dist-info/METADATA``)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        msg = Parser().parsestr(z.read(meta).decode())
    return [Requirement(r) for r in msg.get_all("Requires-Dist") or []]


def applies(req: Requirement, extras: set[str]) -> bool:
    """Whether ``req`` applies on the machine, for a package installed with ``extras``."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**MARKER_ENV, "extra": e}) for e in (extras or {""}))


def _upper_bound(req: Requirement) -> bool:
    """Whether ``req`` caps the version (``<``, ``<=``, ``==``, ``~=``): then a machine package of
    unknown version may be too new, and the pinned one is carried instead (fsspec for datasets)."""
    return any(s.operator in ("<", "<=", "==", "~=", "===") for s in req.specifier)


def resolve(dest: Path, pins: dict[str, Version], meta_cache: Path) -> tuple[dict, list, list]:
    """Download the carried set into ``dest``.

    Returns:
        ``(carried, on_device, problems)``: carried = canonical name -> (wheel path, why);
        on_device = (name, specifier, needed by) left to the machine's packages; problems = messages.
    """
    carried: dict[str, tuple[Path, str]] = {}
    on_device: list[tuple[str, str, str]] = []
    problems: list[str] = []
    queue: list[tuple[Requirement, str]] = [(Requirement(r), "the smoke test") for r in ROOTS]
    extras_done: dict[str, set[str]] = {}  # name -> extras whose requirements were queued
    while queue:
        req, by = queue.pop(0)
        name = canonicalize_name(req.name)
        device_version = DEVICE_PACKAGES.get(name, "absent")
        if name in carried:
            wheel = carried[name][0]
            version = parse_wheel_filename(wheel.name)[1]
            if version not in req.specifier:
                problems.append(f"{by} needs {req}, but {name} {version} is carried")
        elif device_version != "absent" and (
            Version(device_version) in req.specifier if device_version is not None else not _upper_bound(req)
        ):
            on_device.append((name, str(req.specifier), by))
            if not req.extras:
                continue
            if device_version is None:
                problems.append(f"{by} needs {req}, but the version of {name} on the machine is unknown, "
                                "so its extras cannot be looked up")
                continue
            wheel = pip_download(f"{name}=={device_version}", meta_cache)  # only to read its extras
            extras_done.setdefault(name, set())  # its own requirements are the machine's business
        else:
            pin = pins.get(name)
            spec = f"{name}=={pin}" if pin is not None and pin in req.specifier else f"{name}{req.specifier}"
            wheel = pip_download(spec, dest)
            carried[name] = (wheel, f"needed by {by} ({req}); on the machine: {device_version or 'version unknown'}")
        first = name not in extras_done
        new_extras = set(req.extras) - extras_done.get(name, set())
        extras_done.setdefault(name, set()).update(req.extras)
        version = parse_wheel_filename(wheel.name)[1]
        deps = requires_dist(wheel)
        for extra in sorted(new_extras):
            if not any(d.marker is not None and "extra" in str(d.marker) and applies(d, {extra}) for d in deps):
                print(f"gpu-smoke-wheels: note: {name} {version} has no extra {extra!r} ({by} asks for {req})")
        for dep in deps:
            uses_extra = dep.marker is not None and "extra" in str(dep.marker)
            if (first and not uses_extra and applies(dep, set())) or (uses_extra and applies(dep, new_extras)):
                dep.marker = None
                queue.append((dep, f"{name} {version}"))
    return carried, on_device, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-smoke-wheels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=REPO / ".whl", help="folder for the wheels (default: .whl)")
    parser.add_argument("--python-version", default=PYTHON_FULL_VERSION, metavar="X.Y.Z",
                        help="the target Python (default %(default)s, the GPU machine's); another one only "
                             "to rehearse the install on a machine that has that Python")
    ns = parser.parse_args(argv)
    set_python(ns.python_version)
    dest: Path = ns.dest
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):  # one version of each: two stop the whole install there
        old.unlink()
    pins = read_pins(REPO / "constraints.txt")
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-meta-") as cache:
        carried, on_device, problems = resolve(dest, pins, Path(cache))
    total = sum(w.stat().st_size for w, _ in carried.values())
    lines = [f"{w.name}  {w.stat().st_size / 2**20:.2f} MiB  {why}" for w, why in sorted(carried.values())]
    (dest / "MANIFEST.txt").write_text(
        f"# wheels for Python {PYTHON_FULL_VERSION}, Linux x86-64, written by scripts/gpu-smoke-wheels\n"
        + "\n".join(lines) + f"\n# total {total / 2**20:.2f} MiB\n")
    merged: dict[str, SpecifierSet] = {}
    for n, spec, _ in on_device:
        merged[n] = merged.get(n, SpecifierSet()) & SpecifierSet(spec)
    wanted = sorted(merged.items())
    (dest / "on-device.txt").write_text(
        "# requirements the GPU machine's own packages must meet (checked there by scripts/gpu-smoke)\n"
        + "".join(f"{n}{s}\n" for n, s in wanted))
    print("\n".join(lines))
    print(f"\n{len(carried)} wheels, {total / 2**20:.2f} MiB in {dest} (limit {LIMIT_BYTES / 2**20:.0f} MiB); "
          f"{len(wanted)} requirements left to the machine's packages (on-device.txt)")
    if total > LIMIT_BYTES:
        problems.append(f"the wheels weigh {total / 2**20:.1f} MiB, over {LIMIT_BYTES / 2**20:.0f} MiB")
    for p in problems:
        print(f"gpu-smoke-wheels: problem: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
