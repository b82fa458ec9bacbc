"""A real two-node SLURM cluster on this one machine, for tests (not a test module).

One ``slurmctld`` and two ``slurmd`` "nodes", each with its own config, munge key and socket, run
directory and ports (never 6817/6818), so no real cluster is ever contacted. Two modes:

``netns`` (the closest to real nodes; what ``TUNE_MAGIC_REQUIRE_SLURM=1`` requires)
    A bridge on the host carries the controller's address; each node is a network namespace joined
    to it by a veth pair (its end renamed ``eth0``), with its own address, and a UTS + mount
    namespace with its own host name and its own ``/etc/hosts`` bind-mounted over the machine's.
    That file has Debian's ``127.0.1.1 <hostname>`` line for the node itself and nothing for
    its peers (there is no DNS here), so ``hostname --ip-address`` says 127.0.1.1, a node name
    published to another node does not resolve, and each of the three multi-node rendezvous
    traps of ``/work/shared/notes/slurm-and-multinode.md`` makes a two-node torchrun fail unless
    it is handled (measured with tests/slurm/torchrun_node.sh: without ``is_host`` on the head
    or without ``--local-addr`` the gloo job hangs, without ``GLOO_SOCKET_IFNAME`` it hangs on
    one node and fails on the other; with all three it runs). The daemons are started with
    ``nsenter --net=/run/netns/X unshare --uts --mount ...``; ``ip netns exec`` is not used
    because it remounts /sys without cgroups and slurmd 22.05 then dies.

``loopback`` (only for machines that cannot make namespaces)
    Two ``slurmd -N`` on 127.0.0.1 with distinct ports. Network mistakes stay invisible here, so
    tests that depend on the traps skip in this mode.

The machine's filesystem is shared by every namespace: it stands in for a cluster's shared
filesystem (jobs use :attr:`SlurmCluster.shared_dir`, and run the test's own interpreter).

Every name this module makes carries a random suffix (``tm<sfx>...``), so a leftover of a crashed
run never collides with a new one. :meth:`SlurmCluster.stop` removes exactly what
:func:`start_cluster` made: the daemons and every process still inside a node (by pid), the
namespaces, veths and the bridge (by name), and the run directory. Each cluster records what it
made in ``<run dir>/cluster.json``; :func:`reap_stale_clusters` tears down the clusters of test
sessions that died without cleaning up.

Facts used (Debian 12, slurm 22.05.8, munge 0.5.15): slurmd does not create its spool dir;
``SlurmdParameters=config_overrides`` lets a node declare more CPUs than the machine has;
``slurmctld -c`` starts without old jobs.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

#: Prefixes of the variables that steer SLURM's clients (``SQUEUE_FORMAT`` changes squeue's output,
#: ``SBATCH_PARTITION`` where a job goes, ``SLURM_CONF`` which cluster is asked).
CLIENT_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "SCANCEL_", "SACCT_", "SCONTROL_")

#: Daemons and client tools the cluster needs (Debian: slurm-wlm, munge).
REQUIRED_PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol")

NETNS_DIR = Path("/run/netns")
RUN_DIR_PREFIX = "tm-slurm-"
NODE_CPUS = 4  # per node; more than this machine has (config_overrides), so two small jobs share a node
PARTITION = "debug"


class ClusterError(RuntimeError):
    """The test cluster could not be started (the message says which step and shows its log)."""


def scrub_env(env: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """Return a copy of ``env`` (default ``os.environ``) fit for SLURM clients of the test cluster.

    Removes every variable that steers SLURM's clients (:data:`CLIENT_ENV_PREFIXES`, which covers
    an inherited ``SLURM_CONF`` or ``SLURM_JOB_ID``) and ``TUNE_MAGIC_SCHEDULER``, then adds ``extra``.
    """
    out = {
        k: v
        for k, v in (os.environ if env is None else env).items()
        if not k.startswith(CLIENT_ENV_PREFIXES) and k != "TUNE_MAGIC_SCHEDULER"
    }
    out.update(extra)
    return out


def missing_programs() -> list[str]:
    """Return the programs of :data:`REQUIRED_PROGRAMS` not found on PATH (or in /usr/sbin)."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
    return [p for p in REQUIRED_PROGRAMS if shutil.which(p, path=path) is None]


def _exe(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin")
    if found is None:
        raise ClusterError(f"{name} not found; run scripts/install-slurm")
    return found


def free_port() -> int:
    """Return a TCP port that is free on the host right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def _netns_inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


@dataclass
class SlurmNode:
    """One slurmd "node": its SLURM node name (= its host name), address, slurmd port and pid."""

    name: str
    address: str
    port: int
    netns: str | None = None  #: network namespace name (netns mode), e.g. ``tmab12n1``
    pid: int | None = None  #: slurmd's pid; its namespaces are the node's
    hosts_file: Path | None = None  #: the node's own /etc/hosts (netns mode)


@dataclass
class SlurmCluster:
    """A running test cluster. Use :func:`start_cluster`; stop with :meth:`stop` (idempotent).

    Attributes:
        mode: ``"netns"`` or ``"loopback"``.
        suffix: the random part of every name this cluster made.
        run_dir: private directory: config, munge key and socket, state, spool, logs.
        conf: the cluster's ``slurm.conf``; clients find it through :attr:`env`.
        shared_dir: a directory on the filesystem every node sees, for jobs' files.
        controller_address: the controller's address (the bridge's, or 127.0.0.1).
        controller_port: ``SlurmctldPort``.
        nodes: the two nodes, head (first of the partition) first.
        partition: the only (default) partition's name.
        env: environment for SLURM clients: :func:`scrub_env` of ``os.environ`` plus this
            cluster's ``SLURM_CONF``.
    """

    mode: str
    suffix: str
    run_dir: Path
    conf: Path
    shared_dir: Path
    controller_address: str
    controller_port: int
    nodes: list[SlurmNode]
    partition: str = PARTITION
    env: dict[str, str] = field(default_factory=dict)
    bridge: str | None = None
    pids: dict[str, int] = field(default_factory=dict)  #: daemon name -> pid
    why_loopback: str = ""  #: why the loopback mode was used (set by the test fixture)
    start_s: float = 0.0  #: seconds start_cluster took
    stop_s: float | None = None  #: seconds the last stop() took
    _made_netns_dir: bool = False
    _stopped: bool = False

    # ---- using it -------------------------------------------------------------------------------

    @property
    def node_names(self) -> list[str]:
        """The nodes' names, head first (also their host names in netns mode)."""
        return [n.name for n in self.nodes]

    @property
    def node_addresses(self) -> list[str]:
        """The nodes' addresses, head first (both 127.0.0.1 in loopback mode)."""
        return [n.address for n in self.nodes]

    def node(self, name: str) -> SlurmNode:
        """Return the node called ``name``.

        Raises:
            KeyError: no such node.
        """
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def client(self, argv: list[str], timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run a SLURM client (``sbatch``, ``squeue``...) against this cluster; text output captured.

        Raises:
            subprocess.CalledProcessError: it exited non-zero and ``check`` is true.
        """
        env = dict(self.env)
        env.update(kw.pop("env", {}))
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=check, **kw)

    def in_node_argv(self, node: str | SlurmNode, argv: list[str]) -> list[str]:
        """Return ``argv`` wrapped to run inside ``node``'s network, UTS and mount namespaces.

        In loopback mode the nodes have no namespaces of their own: ``argv`` is returned as is.
        """
        n = node if isinstance(node, SlurmNode) else self.node(node)
        if self.mode != "netns":
            return list(argv)
        return [_exe("nsenter"), f"--target={n.pid}", "--net", "--uts", "--mount", "--", *argv]

    def run_in_node(self, node: str | SlurmNode, argv: list[str], timeout: float = 30, check: bool = True, **kw):
        """Run ``argv`` inside ``node``'s namespaces (see :meth:`in_node_argv`); text output captured.

        Raises:
            subprocess.CalledProcessError: it exited non-zero and ``check`` is true.
        """
        return subprocess.run(
            self.in_node_argv(node, argv), env=kw.pop("env", self.env), capture_output=True, text=True,
            timeout=timeout, check=check, **kw,
        )

    def node_processes(self, node: str | SlurmNode) -> list[psutil.Process]:
        """Every live process "on" ``node`` except its slurmd: what jobs left there.

        netns mode: processes in the node's network namespace. Loopback mode: processes whose
        environment says they belong to a job on that node (``SLURMD_NODENAME``), which misses a
        process that cleared its environment; the netns mode has no such gap.
        """
        n = node if isinstance(node, SlurmNode) else self.node(node)
        out = []
        want = _netns_inode(f"/proc/{n.pid}/ns/net") if self.mode == "netns" else None
        for p in psutil.process_iter(["pid", "status"]):
            if p.pid == n.pid or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            try:
                if want is not None:
                    if _netns_inode(f"/proc/{p.pid}/ns/net") == want:
                        out.append(p)
                elif p.environ().get("SLURMD_NODENAME") == n.name and p.environ().get("SLURM_CONF") == str(self.conf):
                    out.append(p)
            except psutil.Error:
                continue
        return out

    def sbatch(self, argv: list[str], **kw) -> str:
        """Submit with ``sbatch --parsable ARGV`` (output into :attr:`shared_dir` unless ARGV says);
        return the SLURM job id.

        Raises:
            subprocess.CalledProcessError: sbatch refused the job.
        """
        out = [] if any(a.startswith(("--output", "-o")) for a in argv) else [f"--output={self.shared_dir}/%j.out"]
        return self.client(["sbatch", "--parsable", *out, *argv], **kw).stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        """Return the job's state as ``squeue -o %T`` prints it ("" once squeue forgets it)."""
        done = self.client(["squeue", f"--jobs={job_id}", "--states=all", "--noheader", "--format=%T"], check=False)
        return done.stdout.strip()

    def wait_job(self, job_id: str, timeout: float = 120, states: tuple[str, ...] | None = None) -> str:
        """Poll squeue every 0.3 s until the job reaches one of ``states`` (default: any end state).

        Faster than ``sbatch --wait``, whose polling backs off to about 30 s (measured).

        Returns:
            The state reached, e.g. ``COMPLETED``.

        Raises:
            TimeoutError: not reached within ``timeout`` seconds (the message has the last state).
        """
        ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                 "DEADLINE", "PREEMPTED")
        want = states or ended
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in want:
                return state
            time.sleep(0.3)
        raise TimeoutError(f"SLURM job {job_id} is {state or 'gone'}, not {'/'.join(want)}, after {timeout} s")

    def log(self, which: str) -> str:
        """Return a daemon's log text (``slurmctld``, ``munged`` or a node name); "" if none yet."""
        path = self.run_dir / "log" / f"{which}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_idle(self, timeout: float = 30) -> None:
        """Wait until no job is queued or running and every node is idle.

        Raises:
            ClusterError: still busy after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            jobs = self.client(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
            states = self.client(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.split()
            if not jobs and states and all(s == "idle" for s in states):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"cluster not idle after {timeout} s: jobs {jobs}, node states {states}")
            time.sleep(0.2)

    # ---- controller faults (a restart, a failover, an overloaded controller) ---------------------

    def pause_controller(self) -> None:
        """Freeze ``slurmctld`` (SIGSTOP, by its recorded pid): clients then wait and time out, as
        with an overloaded or failing-over controller."""
        os.kill(self.pids["slurmctld"], signal.SIGSTOP)

    def resume_controller(self) -> None:
        """Let a paused ``slurmctld`` go on (SIGCONT, by its recorded pid)."""
        os.kill(self.pids["slurmctld"], signal.SIGCONT)

    def kill_controller(self) -> None:
        """Kill ``slurmctld`` (SIGTERM, by its recorded pid: it writes its state, then exits) and
        wait until it is gone: clients then fail with "Unable to contact slurm controller"; running
        jobs go on on their nodes. Not SIGKILL: slurmctld saves a job's start only now and then, so
        one killed outright may come back with a job that started 20 s earlier as PENDING
        (measured on the test cluster after other tests' jobs): SLURM's own loss, which no client
        can see. This is a crash right after a state save."""
        pid = self.pids["slurmctld"]
        try:
            proc = psutil.Process(pid)
            proc.terminate()
            try:
                proc.wait(30)
            except psutil.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        except psutil.Error:
            pass

    def restart_controller(self, timeout: float = 30) -> None:
        """Start ``slurmctld`` again, without ``-c``: it recovers its jobs from StateSaveLocation, as
        a restarted controller does. Its new pid replaces the old one in :attr:`pids` and
        ``cluster.json`` (what :meth:`stop` removes). Returns once it answers.

        Raises:
            ClusterError: it exited, or did not answer within ``timeout`` seconds.
        """
        _spawn(self, "slurmctld", [_exe("slurmctld"), "-D", "-f", str(self.conf)])
        self.wait_controller(timeout)

    def wait_controller(self, timeout: float = 30) -> None:
        """Wait until the controller answers ``squeue`` again.

        Raises:
            ClusterError: slurmctld exited, or did not answer within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            if not _alive(self.pids["slurmctld"]):
                raise ClusterError(_daemon_failed(self, "slurmctld"))
            if self.client(["squeue", "-h"], check=False, timeout=10).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"slurmctld does not answer after {timeout} s; its log ends:\n"
                                   f"{self.log('slurmctld')[-2000:]}")
            time.sleep(0.2)

    def heal_controller(self) -> None:
        """After a test: a paused controller goes on, a killed one is started again."""
        pid = self.pids.get("slurmctld")
        try:
            if pid and psutil.Process(pid).status() == psutil.STATUS_STOPPED:
                self.resume_controller()
        except psutil.Error:
            pass
        if not pid or not _alive(pid):
            self.restart_controller()

    # ---- tearing down ---------------------------------------------------------------------------

    def stop(self, keep_run_dir: bool = False) -> float:
        """Remove exactly what :func:`start_cluster` made, even half of it; return the seconds taken.

        Order: cancel every job; kill whatever is left inside each node (by pid); stop slurmd,
        slurmctld, munged (by pid: TERM, then KILL after 5 s); delete the veths' host ends, the
        namespaces, the bridge (by name) and /run/netns if this cluster made it and it is empty;
        remove the run directory unless ``keep_run_dir``. Idempotent.
        """
        if self._stopped:
            return self.stop_s or 0.0
        t0 = time.monotonic()
        try:
            if self.pids.get("slurmctld") and _alive(self.pids["slurmctld"]):
                subprocess.run(
                    ["scancel", "--full", "--signal=KILL", f"--partition={self.partition}"],
                    env=self.env, capture_output=True, timeout=10,
                )
        except (OSError, subprocess.TimeoutExpired):
            pass
        for n in self.nodes:
            _kill_all(self.node_processes(n) if n.pid and _alive(n.pid) else [])
        _kill_all([psutil.Process(pid) for pid in self.pids.values() if _alive(pid)])
        if self.mode == "loopback":
            # slurmstepd and job processes outlive slurmd; in this mode they are found by environment
            _kill_all(_processes_with_env("SLURM_CONF", str(self.conf)))
        for i, n in enumerate(self.nodes, 1):
            # the host end by name: a veth only goes with its namespace once the kernel frees that,
            # which can be later than `ip netns delete` returns
            _delete_link(f"tm{self.suffix}h{i}")
            if n.netns and (NETNS_DIR / n.netns).exists():
                subprocess.run(["ip", "netns", "delete", n.netns], capture_output=True)
        if self.bridge:
            _delete_link(self.bridge)
        if self._made_netns_dir:
            _remove_netns_dir()
        if not keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        self._stopped = True
        self.stop_s = time.monotonic() - t0
        return self.stop_s

    def record(self) -> dict:
        """What this cluster made, as written to ``<run_dir>/cluster.json``."""
        return {
            "owner_pid": os.getpid(),
            "owner_create_time": psutil.Process().create_time(),
            "mode": self.mode,
            "suffix": self.suffix,
            "conf": str(self.conf),
            "bridge": self.bridge,
            "netns": [n.netns for n in self.nodes if n.netns],
            "pids": {k: [v, _create_time(v)] for k, v in self.pids.items()},
        }

    def _save_record(self) -> None:
        (self.run_dir / "cluster.json").write_text(json.dumps(self.record(), indent=1))


def _is_mount_point(path: Path) -> bool:
    # os.path.ismount misses a bind mount of a directory onto itself (same device)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


def _remove_netns_dir() -> None:
    """Remove /run/netns if it is empty: `ip netns add` made it and bind-mounted it on itself."""
    for _ in range(5):  # each `ip netns add` into a fresh dir may have stacked one mount
        if not NETNS_DIR.exists() or any(NETNS_DIR.iterdir()):
            return  # someone else's namespaces live there now: leave it
        if not _is_mount_point(NETNS_DIR):
            break
        if subprocess.run(["umount", str(NETNS_DIR)], capture_output=True).returncode != 0:
            return
    try:
        NETNS_DIR.rmdir()
    except OSError:
        pass


def _delete_link(name: str) -> None:
    if Path(f"/sys/class/net/{name}").exists():
        subprocess.run(["ip", "link", "delete", name], capture_output=True)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _kill_all(procs: list[psutil.Process], grace_s: float = 5.0) -> None:
    """TERM every process in ``procs``, KILL those still alive after ``grace_s``, reap our children."""
    procs = [p for p in procs if p.pid != os.getpid()]
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def _processes_with_env(key: str, value: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.environ().get(key) == value:
                out.append(p)
        except psutil.Error:
            continue
    return out


# ---- starting -----------------------------------------------------------------------------------


def _pick_subnet() -> str:
    """Return ``10.A.B`` for a /24 that no route of the host covers (the bridge's subnet)."""
    routes = subprocess.run(["ip", "-4", "-o", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    for _ in range(50):
        a, b = 100 + secrets.randbelow(150), secrets.randbelow(254) + 1
        if f"10.{a}.{b}." not in routes and f"10.{a}.0.0/16" not in routes:
            return f"10.{a}.{b}"
    raise ClusterError("no free 10.x.y.0/24 subnet for the test bridge")


def _hosts_text(node: SlurmNode) -> str:
    # Debian's default for a machine: its own name on 127.0.1.1. Nothing else resolves (no DNS
    # here, no peers listed): SLURM reaches nodes by NodeAddr, and a job that needs an address
    # must take it from SLURM or a route, never from a name (that is what makes trap 2 bite).
    return f"127.0.0.1\tlocalhost\n127.0.1.1\t{node.name}\n::1\tlocalhost ip6-localhost ip6-loopback\n"


def _slurm_conf(c: SlurmCluster, ctl_host: str, cpus: int) -> str:
    r = c.run_dir
    lines = [
        "# Written by tests/slurmcluster.py: a private two-node test cluster.",
        f"ClusterName=tm{c.suffix}",
        f"SlurmctldHost={ctl_host}({c.controller_address})",
        f"SlurmctldPort={c.controller_port}",
        f"SlurmdPort={c.nodes[0].port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={r / 'munge' / 'munge.socket'}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={r / 'state'}",
        f"SlurmdSpoolDir={r / 'spool'}/%n",
        f"SlurmctldPidFile={r / 'slurmctld.pid'}",
        f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={r / 'log'}/%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "ReturnToService=2",
        "KillWait=10",
        "MinJobAge=300",
        "InactiveLimit=0",
        "SlurmdParameters=config_overrides",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    for n in c.nodes:
        port = f" Port={n.port}" if c.mode == "loopback" else ""
        lines.append(f"NodeName={n.name} NodeAddr={n.address} CPUs={cpus}{port} State=UNKNOWN")
    lines.append(f"PartitionName={c.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _spawn(c: SlurmCluster, name: str, argv: list[str]) -> int:
    log = open(c.run_dir / "log" / f"{name}.out", "ab")
    try:
        # own session: a Ctrl-C in the test terminal reaches pytest, which then stops us in order
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             env=c.env, start_new_session=True)
    except OSError as exc:
        raise ClusterError(f"cannot start {name}: {exc}") from exc
    finally:
        log.close()
    c.pids[name] = p.pid
    c._save_record()
    return p.pid


def _daemon_failed(c: SlurmCluster, name: str) -> str:
    text = ""
    for suffix in (".out", ".log"):
        f = c.run_dir / "log" / f"{name}{suffix}"
        if f.exists():
            text += f.read_text(errors="replace")[-2000:]
    return f"{name} exited during start-up; its log ends:\n{text}"


def _make_network(c: SlurmCluster, subnet: str) -> None:
    if not NETNS_DIR.exists():
        c._made_netns_dir = True
    c.bridge = f"tm{c.suffix}br"
    c._save_record()
    _run(["ip", "link", "add", c.bridge, "type", "bridge"])
    _run(["ip", "addr", "add", f"{c.controller_address}/24", "dev", c.bridge])
    _run(["ip", "link", "set", c.bridge, "up"])
    for i, n in enumerate(c.nodes, 1):
        n.netns = f"tm{c.suffix}n{i}"
        c._save_record()
        host_end, node_end = f"tm{c.suffix}h{i}", f"tm{c.suffix}v{i}"
        _run(["ip", "netns", "add", n.netns])
        _run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end])
        _run(["ip", "link", "set", node_end, "netns", n.netns])
        _run(["ip", "link", "set", host_end, "master", c.bridge])
        _run(["ip", "link", "set", host_end, "up"])
        _run(["ip", "-n", n.netns, "link", "set", node_end, "name", "eth0"])
        _run(["ip", "-n", n.netns, "addr", "add", f"{n.address}/24", "dev", "eth0"])
        _run(["ip", "-n", n.netns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", n.netns, "link", "set", "lo", "up"])


def start_cluster(mode: str = "netns", cpus_per_node: int = NODE_CPUS, timeout: float = 30) -> SlurmCluster:
    """Start munged, slurmctld and two slurmd nodes; return when both nodes are idle.

    Args:
        mode: ``"netns"`` or ``"loopback"`` (see the module docstring).
        cpus_per_node: CPUs each node declares (``CPUs=``); may exceed the machine's.
        timeout: seconds to wait for both nodes to be idle.

    Returns:
        The running cluster; its ``start_s`` says how long this took (seconds).

    Raises:
        ClusterError: a program is missing, a namespace/bridge/daemon could not be made, or the
            nodes did not come up; whatever was made is removed first.
        ValueError: unknown ``mode``.
    """
    if mode not in ("netns", "loopback"):
        raise ValueError(f"mode must be 'netns' or 'loopback', not {mode!r}")
    missing = missing_programs()
    if missing:
        raise ClusterError(f"missing {', '.join(missing)}; run scripts/install-slurm")
    t0 = time.monotonic()
    suffix = secrets.token_hex(2)
    run_dir = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{suffix}-"))
    for sub in ("munge", "state", "log", "shared", "spool"):
        (run_dir / sub).mkdir(mode=0o700 if sub == "munge" else 0o755)
    run_dir.chmod(0o755)  # jobs run as root anyway, but the shared dir must be reachable
    ctl_port = free_port()
    if mode == "netns":
        subnet = _pick_subnet()
        ctl_addr = f"{subnet}.1"
        port = free_port()
        nodes = [SlurmNode(f"tmnode{i}", f"{subnet}.{i + 1}", port) for i in (1, 2)]
    else:
        ctl_addr = "127.0.0.1"
        nodes = [SlurmNode(f"tmnode{i}", "127.0.0.1", free_port()) for i in (1, 2)]
    c = SlurmCluster(
        mode=mode, suffix=suffix, run_dir=run_dir, conf=run_dir / "slurm.conf", shared_dir=run_dir / "shared",
        controller_address=ctl_addr, controller_port=ctl_port, nodes=nodes,
    )
    c.env = scrub_env(SLURM_CONF=str(c.conf))
    try:
        _start(c, cpus_per_node, timeout)
    except BaseException:
        c.stop(keep_run_dir=True)
        raise
    c.start_s = time.monotonic() - t0
    return c


def _start(c: SlurmCluster, cpus: int, timeout: float) -> None:
    r = c.run_dir
    c._save_record()
    ctl_host = socket.gethostname().split(".")[0]
    if c.mode == "netns":
        _make_network(c, c.controller_address.rsplit(".", 1)[0])
        for n in c.nodes:
            n.hosts_file = r / f"hosts-{n.name}"
            n.hosts_file.write_text(_hosts_text(n))
    for n in c.nodes:
        (r / "spool" / n.name).mkdir()
    c.conf.write_text(_slurm_conf(c, ctl_host, cpus))

    key = r / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    sock = r / "munge" / "munge.socket"
    _spawn(c, "munged", [
        _exe("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={sock}",
        f"--pid-file={r / 'munge' / 'munged.pid'}", f"--seed-file={r / 'munge' / 'munged.seed'}",
        f"--log-file={r / 'log' / 'munged.log'}", "--num-threads=2",
    ])
    _wait_for(lambda: sock.exists(), 10, c, "munged")

    _spawn(c, "slurmctld", [_exe("slurmctld"), "-D", "-c", "-f", str(c.conf)])
    for n in c.nodes:
        slurmd = [_exe("slurmd"), "-D", "-f", str(c.conf), "-N", n.name]
        if c.mode == "netns":
            # own host name and /etc/hosts; exec keeps one pid: nsenter -> unshare -> sh -> slurmd
            setup = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
            argv = [_exe("nsenter"), f"--net={NETNS_DIR / n.netns}", _exe("unshare"), "--uts", "--mount",
                    "sh", "-c", setup, "sh", n.name, str(n.hosts_file), *slurmd]
        else:
            argv = slurmd
        n.pid = _spawn(c, n.name, argv)

    deadline = time.monotonic() + timeout
    while True:
        for name, pid in c.pids.items():
            if not _alive(pid):
                raise ClusterError(_daemon_failed(c, name))
        states = c.client(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, timeout=10).stdout.split("\n")
        idle = {line.split()[0] for line in states if line.endswith(" idle")}
        if idle >= set(c.node_names):
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"nodes not idle after {timeout} s (sinfo: {states}); "
                               f"slurmctld log ends:\n{c.log('slurmctld')[-2000:]}")
        time.sleep(0.1)


def _wait_for(cond, timeout: float, c: SlurmCluster, name: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if not _alive(c.pids[name]):
            raise ClusterError(_daemon_failed(c, name))
        if time.monotonic() > deadline:
            raise ClusterError(f"{name} not ready after {timeout} s")
        time.sleep(0.05)


def reap_stale_clusters() -> list[str]:
    """Tear down test clusters whose owning test session is gone; return their run dirs.

    Reads each ``$TMPDIR/tm-slurm-*/cluster.json``; a cluster whose owner process is dead (or a
    different process with a reused pid) gets its recorded daemons (when pid and start time still
    match), namespaces and bridge removed, by name and pid only.
    """
    reaped = []
    for rec_file in Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}*/cluster.json"):
        try:
            rec = json.loads(rec_file.read_text())
        except (OSError, ValueError):
            continue
        owner_ct = _create_time(rec.get("owner_pid", -1))
        if owner_ct is not None and abs(owner_ct - rec.get("owner_create_time", 0)) < 1:
            continue  # its session still runs
        procs = []
        for pid, ct in rec.get("pids", {}).values():
            now = _create_time(pid)
            if now is not None and ct is not None and abs(now - ct) < 1:
                procs.append(psutil.Process(pid))
        ns_inodes = {_netns_inode(str(NETNS_DIR / ns)) for ns in rec.get("netns", [])} - {None}
        for p in psutil.process_iter(["pid"]):
            if ns_inodes and _netns_inode(f"/proc/{p.pid}/ns/net") in ns_inodes:
                procs.append(p)
        if rec.get("conf"):  # loopback-mode jobs: found by their SLURM_CONF
            procs += _processes_with_env("SLURM_CONF", rec["conf"])
        _kill_all(procs)
        for i, ns in enumerate(rec.get("netns", []), 1):
            _delete_link(f"tm{rec['suffix']}h{i}")
            if (NETNS_DIR / ns).exists():
                subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        if rec.get("bridge"):
            _delete_link(rec["bridge"])
        shutil.rmtree(rec_file.parent, ignore_errors=True)
        reaped.append(str(rec_file.parent))
    return reaped
