"""Fault injection for tests that run as root: a read-only directory, a tiny disk that fills, uid 65534.

Tests and CI run as root, so ``chmod -w`` stops nothing and ext4 keeps blocks for root. Real faults
need the kernel's help instead:

- :class:`MountNamespace` starts a small holder process under ``unshare --mount --propagation
  private`` in which given directories are read-only bind mounts (``readonly=``) or tiny tmpfs
  disks of a few MiB holding a copy of what was there (``tmpfs=``); commands then run inside it
  through ``nsenter`` (:meth:`MountNamespace.run`, :meth:`~MountNamespace.popen`), and
  :meth:`~MountNamespace.fill` fills a tmpfs at any moment the test chooses. The mounts exist only
  in that namespace: the host's mount table never sees them, and the namespace dies with the last
  process in it; :meth:`~MountNamespace.close` kills, by pid, every process still inside it.
- ``as_nobody=True`` runs a command as uid/gid 65534 via ``setpriv`` (with or without a namespace).
- :func:`run_readonly`, :func:`run_tiny_disk` and :func:`run_as_nobody` are the one-shot forms.

Where namespaces or mounts are impossible (not root, no ``unshare``, a container without
CAP_SYS_ADMIN) :func:`require` skips the test with the reason; with ``TUNE_MAGIC_REQUIRE_FAULTS=1``
in the environment (CI sets it) it fails instead, so CI never passes by skipping.
"""

from __future__ import annotations

import functools
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import pytest

REQUIRE_ENV = "TUNE_MAGIC_REQUIRE_FAULTS"
NOBODY = 65534
FILL_NAME = ".tune_magic_fill"
DEFAULT_TIMEOUT_S = 120.0

# Runs as the namespace's first process (argv: pairs "ro DIR" / triples "tmpfs DIR KIB"). A tmpfs
# gets a copy of what the directory held: the shell's cwd keeps the covered directory reachable.
_SETUP = r"""
set -e
while [ "$#" -gt 0 ]; do
  case "$1" in
    ro) mount --bind "$2" "$2"; mount -o remount,bind,ro "$2"; shift 2 ;;
    tmpfs) cd "$2"; mount -t tmpfs -o "size=$3k" tmpfs "$2"
           chmod --reference=. "$2"; chown --reference=. "$2"; cp -a . "$2"/; cd /; shift 3 ;;
    *) echo "bad spec $1" >&2; exit 2 ;;
  esac
done
echo ready
exec cat >/dev/null
"""


class FaultSetupError(RuntimeError):
    """The namespace or its mounts could not be made although faults are available here."""


@dataclass(frozen=True)
class ChildResult:
    """What a child did: ``returncode`` (negative: killed by that signal), ``stdout``, ``stderr``.

    The streams are decoded as UTF-8 exactly (``\\r`` kept, undecodable bytes as surrogates), so
    ``stdout.encode("utf-8", "surrogateescape")`` gives back the bytes the child wrote.
    """

    returncode: int
    stdout: str
    stderr: str


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", "surrogateescape")


def python(snippet: str) -> list[str]:
    """Return the argv that runs a Python ``snippet`` with this interpreter (``sys.executable -c``)."""
    return [sys.executable, "-c", snippet]


@functools.lru_cache(maxsize=None)
def unavailable_reason(as_nobody: bool = False) -> str | None:
    """Return why mount-namespace faults (or, with ``as_nobody``, uid 65534 runs) cannot work here, or None."""
    if os.geteuid() != 0:
        return "fault tests need root (mount namespaces, setpriv)"
    tools = ["unshare", "nsenter", "mount", "env"] + (["setpriv"] if as_nobody else [])
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        return f"fault tests need {', '.join(missing)} (util-linux)"
    probe = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
             'd=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs "$d" && umount "$d" && rmdir "$d"']
    if as_nobody:
        probe = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", sys.executable, "-c", ""]
    try:
        r = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{probe[0]} cannot run here: {exc}"
    if r.returncode != 0:
        what = f"uid {NOBODY} cannot run {sys.executable}" if as_nobody else "cannot make a mount namespace with a tmpfs"
        return f"{what}: {r.stderr.strip() or r.returncode}"
    return None


def require(as_nobody: bool = False, *, reason: str | None = None, env: Mapping[str, str] | None = None) -> None:
    """Skip the calling test where faults cannot be injected; fail instead when ``TUNE_MAGIC_REQUIRE_FAULTS=1``.

    Args:
        as_nobody: also need uid 65534 runs via ``setpriv``.
        reason: the reason to act on (default :func:`unavailable_reason`); tests of this function pass one.
        env: environment to read ``TUNE_MAGIC_REQUIRE_FAULTS`` from (default ``os.environ``).
    """
    reason = reason if reason is not None else unavailable_reason(as_nobody)
    if reason is None:
        return
    env = os.environ if env is None else env
    if env.get(REQUIRE_ENV, "") not in ("", "0"):
        pytest.fail(f"{reason}; {REQUIRE_ENV}=1 requires the fault tests to run", pytrace=False)
    pytest.skip(f"{reason} (set {REQUIRE_ENV}=1 to make this a failure)")


def _nobody_prefix() -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]


def _result(proc: subprocess.CompletedProcess) -> ChildResult:
    return ChildResult(proc.returncode, _decode(proc.stdout), _decode(proc.stderr))


class MountNamespace:
    """A private mount namespace with read-only and tiny-tmpfs directories; a context manager.

    Args:
        readonly: directories to make read-only bind mounts of themselves.
        tmpfs: ``{directory: size in KiB}``; each becomes a tmpfs of that size holding a copy of
            what the directory held (its mode and owner too). 2048-4096 KiB suits "a disk that
            fills"; what is copied must fit.

    Raises:
        FaultSetupError: the holder did not get ready within 30 s (its stderr is in the message).
    """

    def __init__(self, readonly: Sequence[str | os.PathLike] = (), tmpfs: Mapping[str | os.PathLike, int] | None = None):
        spec: list[str] = []
        for d in readonly:
            spec += ["ro", str(Path(d).resolve())]
        for d, kib in (tmpfs or {}).items():
            if not isinstance(kib, int) or kib <= 0:
                raise ValueError(f"tmpfs size for {d} must be a positive number of KiB, got {kib!r}")
            spec += ["tmpfs", str(Path(d).resolve()), str(kib)]
        self._extra: list[subprocess.Popen] = []
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _SETUP, "sh", *spec],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        ready, _, _ = select.select([self.holder.stdout], [], [], 30)
        line = self.holder.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self._stop_holder()
            err = self.holder.stderr.read().decode(errors="replace").strip()
            raise FaultSetupError(f"mount namespace setup failed ({spec}): {err or 'no output'}")
        self.mnt_ns = os.readlink(f"/proc/{self.holder.pid}/ns/mnt")

    # -- running things inside ---------------------------------------------------------------------
    def argv(self, argv: Sequence[str], *, cwd: str | os.PathLike | None = None, as_nobody: bool = False) -> list[str]:
        """Return ``argv`` wrapped to run inside the namespace (working directory ``cwd``, default ours)."""
        wd = str(Path(cwd if cwd is not None else os.getcwd()).resolve())
        # chdir inside the namespace: nsenter --wd (and an inherited cwd) would keep the directory
        # *under* a new mount, where writes still succeed
        prefix = ["nsenter", f"--target={self.holder.pid}", "--mount", "--", "env", f"--chdir={wd}", "--"]
        return prefix + (_nobody_prefix() if as_nobody else []) + [str(a) for a in argv]

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
            as_nobody: bool = False, timeout: float = DEFAULT_TIMEOUT_S, input: str | None = None) -> ChildResult:
        """Run ``argv`` inside the namespace and wait; return its exit code, stdout and stderr.

        Raises:
            subprocess.TimeoutExpired: it ran past ``timeout`` seconds (it is killed first).
        """
        return _result(subprocess.run(self.argv(argv, cwd=cwd, as_nobody=as_nobody), env=None if env is None else dict(env),
                                      capture_output=True, timeout=timeout,
                                      input=None if input is None else input.encode()))

    def python(self, snippet: str, **kwargs) -> ChildResult:
        """Run a Python snippet inside the namespace (see :meth:`run` for the keyword arguments)."""
        return self.run(python(snippet), **kwargs)

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
              as_nobody: bool = False, **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside the namespace without waiting; :meth:`close` kills it if it still runs."""
        proc = subprocess.Popen(self.argv(argv, cwd=cwd, as_nobody=as_nobody), env=None if env is None else dict(env),
                                **kwargs)
        self._extra.append(proc)
        return proc

    def fill(self, directory: str | os.PathLike, leave_bytes: int = 0) -> int:
        """Fill the tmpfs at ``directory`` with one file (``.tune_magic_fill``) until the disk is full,
        then give back ``leave_bytes``. Returns the bytes the file holds. Fill again to take the rest.

        Raises:
            FaultSetupError: the disk did not fill (``directory`` is not one of this namespace's tmpfs).
        """
        snippet = (
            "import errno, os, sys\n"
            f"path = os.path.join(sys.argv[1], {FILL_NAME!r}); leave = int(sys.argv[2])\n"
            "st = os.statvfs(sys.argv[1])\n"
            "if st.f_blocks * st.f_frsize > 64 << 20:  # never fill a real disk by mistake\n"
            "    sys.exit(f'{sys.argv[1]} is not a tiny disk ({st.f_blocks * st.f_frsize} bytes)')\n"
            "fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600); block = b'\\0' * 65536\n"
            "while True:\n"
            "    try:\n"
            "        os.write(fd, block)\n"
            "    except OSError as exc:\n"
            "        if exc.errno != errno.ENOSPC:\n"
            "            raise\n"
            "        try:\n"
            "            while True:\n"
            "                os.write(fd, b'\\0' * 512)\n"
            "        except OSError as exc2:\n"
            "            if exc2.errno != errno.ENOSPC:\n"
            "                raise\n"
            "        break\n"
            "size = os.fstat(fd).st_size; os.ftruncate(fd, max(0, size - leave)); os.fsync(fd)\n"
            "print(os.fstat(fd).st_size)\n"
        )
        r = self.run([sys.executable, "-c", snippet, str(Path(directory).resolve()), str(int(leave_bytes))], timeout=60)
        if r.returncode != 0:
            raise FaultSetupError(f"could not fill {directory}: {r.stderr.strip()}")
        return int(r.stdout.strip())

    def pids(self) -> list[int]:
        """Pids of every process inside this namespace, the holder excluded."""
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != self.holder.pid:
                try:
                    if os.readlink(f"/proc/{entry}/ns/mnt") == self.mnt_ns:
                        out.append(int(entry))
                except OSError:
                    continue
        return out

    # -- teardown ------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every process still inside the namespace (by pid), then its holder; the mounts go with it."""
        for _ in range(3):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    if os.readlink(f"/proc/{pid}/ns/mnt") == self.mnt_ns:  # still the same process's namespace
                        os.kill(pid, signal.SIGKILL)
                except OSError:
                    continue
            time.sleep(0.05)
        for proc in self._extra:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - killed above
                proc.kill()
        self._stop_holder()

    def _stop_holder(self) -> None:
        if self.holder.poll() is None:
            try:
                self.holder.stdin.close()  # its `cat` ends on EOF
                self.holder.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.holder.kill()
                self.holder.wait(timeout=10)
        for stream in (self.holder.stdout, self.holder.stderr):
            stream.close()

    def __enter__(self) -> "MountNamespace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_readonly(directory: str | os.PathLike, argv: Sequence[str], **kwargs) -> ChildResult:
    """Run ``argv`` in a child that sees ``directory`` as a read-only bind mount (see :meth:`MountNamespace.run`)."""
    with MountNamespace(readonly=[directory]) as ns:
        return ns.run(argv, **kwargs)


def run_tiny_disk(directory: str | os.PathLike, argv: Sequence[str], *, size_kib: int = 2048,
                  fill: bool = False, leave_bytes: int = 0, **kwargs) -> ChildResult:
    """Run ``argv`` in a child that sees ``directory`` as a ``size_kib`` tmpfs holding a copy of it;
    with ``fill``, the disk is first filled to ``leave_bytes`` free (see :meth:`MountNamespace.fill`)."""
    with MountNamespace(tmpfs={directory: size_kib}) as ns:
        if fill:
            ns.fill(directory, leave_bytes)
        return ns.run(argv, **kwargs)


def run_as_nobody(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                  timeout: float = DEFAULT_TIMEOUT_S) -> ChildResult:
    """Run ``argv`` as uid/gid 65534 (``setpriv``), no namespace; paths it needs must be open to others."""
    return _result(subprocess.run(_nobody_prefix() + [str(a) for a in argv], env=None if env is None else dict(env),
                                  cwd=cwd, capture_output=True, timeout=timeout))


def mount_lines_mentioning(path: str | os.PathLike) -> list[str]:
    """Lines of this process's ``/proc/self/mountinfo`` whose mount point is ``path`` or below it."""
    target = str(Path(path).resolve())
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == target or point.startswith(target.rstrip("/") + "/"):
                out.append(line)
    return out
