"""Paths a job on several machines must not keep on one machine's own disk. Pure, apart from
reading the plan's config.

A SLURM job runs on nodes that share only what the cluster mounts on every node (home and project
directories, a parallel filesystem); ``/tmp``, ``/dev/shm`` and the scheduler's ``$TMPDIR`` are
each node's own. A job that writes its ``output_dir`` there leaves its checkpoints and metric
logs spread over the nodes' own disks, where this kernel (which follows the job from the
submitting machine) sees only its own node's part, if any; a ``TUNE_MAGIC_HOME`` there holds the
job's record, log and exit code where the nodes cannot write them for this kernel; a Python (the
kernel's virtualenv, which every node runs) there is missing on the other nodes. Each is a
warning, not a refusal: a cluster may share such a directory after all (the test cluster's nodes
are one machine). The 70B example config writes ``/tmp/torchtune/...``.
"""

from __future__ import annotations

import os
from typing import Mapping

from tune_magic.plan.configview import written_paths

#: Directories each node has for itself (with the submitting process's ``$TMPDIR``).
NODE_LOCAL = ("/tmp", "/dev/shm")

_SHARE = "a directory on a filesystem every node shares (your home or project directory)"


def node_local_roots(env: Mapping[str, str]) -> list[str]:
    """:data:`NODE_LOCAL` and ``$TMPDIR`` (when set to something else than ``/``), normalised."""
    roots = list(NODE_LOCAL)
    tmpdir = (env.get("TMPDIR") or "").strip()
    if tmpdir and os.path.normpath(tmpdir) != "/":
        roots.append(os.path.normpath(tmpdir))
    return list(dict.fromkeys(roots))


def node_local_root(path: str, roots: list[str]) -> str | None:
    """The root of ``roots`` that ``path`` is in (as written, or with links resolved), else ``None``."""
    for candidate in dict.fromkeys((os.path.normpath(os.path.abspath(path)), os.path.realpath(path))):
        for root in roots:
            if candidate == root or candidate.startswith(root.rstrip("/") + "/"):
                return root
    return None


def node_local_warnings(plan, env: Mapping[str, str], *, home: str, python: str) -> list[str]:
    """Warnings for a job of ``plan`` run on several machines: the paths its config writes (see
    :func:`tune_magic.plan.configview.written_paths`), ``TUNE_MAGIC_HOME`` (``home``) and the
    Python every node runs (``python``, the kernel's ``sys.executable``) on a node's own disk.

    Returns:
        One line per kind of path (empty when none is node-local).
    """
    roots = node_local_roots(env)
    out = []
    written = [(key, path, root) for key, path in written_paths(plan, plan.cwd)
               for root in [node_local_root(path, roots)] if root is not None]
    if written:
        key, path, root = written[0]
        others = [k for k, _, _ in written[1:]]
        also = f" (also {', '.join(others)})" if others else ""
        out.append(f"{key} {path}{also} is under {root}, which each node has for itself: each node would keep "
                   f"its own part of what the job writes, and this machine would see only its own node's; write to "
                   f"{_SHARE}, e.g. {key}=$HOME/runs/...")
    root = node_local_root(home, roots)
    if root is not None:
        out.append(f"TUNE_MAGIC_HOME {home} is under {root}, which each node has for itself: the job's log, "
                   f"record and exit code would be written where this machine cannot see them; point "
                   f"TUNE_MAGIC_HOME at {_SHARE}")
    root = node_local_root(python, roots)
    if root is not None:
        out.append(f"the Python every node runs, {python}, is under {root}, which each node has for itself: "
                   f"the other nodes would not have it; make the virtualenv in {_SHARE}")
    return out
