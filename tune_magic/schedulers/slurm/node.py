"""What runs on each node of a SLURM job: ``python -m tune_magic.schedulers.slurm.node head|run``.

``head`` (in the batch script, on the batch host) prints the head node's address and a free port
for the rendezvous: the address SLURM knows the node by (``scontrol show node``'s ``NodeAddr``),
resolved, never a loopback address (Debian's ``127.0.1.1 <hostname>`` line is the usual trap); the
port is picked free on this host when the job starts, so two jobs sharing a head node never
collide (never a fixed 29500).

``run`` (one task per node, through ``srun``) handles the three multi-node rendezvous traps of one
node, then runs the per-node torchrun command given after ``--``:

1. this node's address is the source address of its route to the head (what ``ip route get
   <head>`` prints), not ``hostname --ip-address``; torchrun gets it as ``--local-addr``
   (``PET_LOCAL_ADDR``), so rank 0 never publishes ``MASTER_ADDR=localhost``;
2. only the head node hosts the c10d store (``is_host=1`` merged into the user's ``--rdzv-conf``,
   as ``PET_RDZV_CONF``), whatever host names resolve to;
3. gloo and NCCL use the interface that carries that address (``GLOO_SOCKET_IFNAME``,
   ``NCCL_SOCKET_IFNAME``) unless the user set them.

It prints ``node <hostname> <address>`` first, then ``worker <hostname> <rank>`` for each rank
process torchrun starts here, and ends with torchrun's exit code after killing whatever of the
job outlived the agent on this node. These lines are this module's format; read by
:mod:`tune_magic.logs.summary`.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time

#: Environment variables the batch script sets for every node.
HEAD_HOST_ENV = "TUNE_MAGIC_HEAD_HOST"
HEAD_ADDR_ENV = "TUNE_MAGIC_HEAD_ADDR"
RDZV_CONF_ENV = "TUNE_MAGIC_RDZV_CONF"


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _node_addr(host: str) -> str | None:
    """``NodeAddr`` of ``host`` as SLURM knows it (an address or a name), or ``None``."""
    try:
        out = subprocess.run(["scontrol", "show", "node", host, "-o"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for word in out.split():
        if word.startswith("NodeAddr="):
            return word.split("=", 1)[1] or None
    return None


def _resolve(name: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return list(dict.fromkeys(i[4][0] for i in infos))


def _own_addresses() -> list[str]:
    """This host's non-loopback addresses, IPv4 first."""
    import psutil

    out4, out6 = [], []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not _is_loopback(a.address):
                out4.append(a.address)
            elif a.family == socket.AF_INET6 and not _is_loopback(a.address) and not a.address.startswith("fe80"):
                out6.append(a.address.split("%")[0])
    return out4 + out6


def head_address(host: str) -> str:
    """The address other nodes reach ``host`` (this node) at: its NodeAddr, resolved, or else this
    host's first non-loopback address.

    Raises:
        RuntimeError: this host has no non-loopback address.
    """
    candidates = []
    given = _node_addr(host)
    for name in ([given] if given else []) + [host]:
        try:
            ipaddress.ip_address(name)
            candidates.append(name)
        except ValueError:
            candidates += _resolve(name)
    mine = set(_own_addresses())
    for addr in candidates:
        if not _is_loopback(addr) and (not mine or addr in mine):
            return addr
    if mine:
        return _own_addresses()[0]
    raise RuntimeError(f"node {host} has no address other nodes can reach (only loopback)")


def free_port() -> int:
    """A TCP port free on this host now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def route_source(dest: str) -> str:
    """The source address of this host's route to ``dest`` (what ``ip route get`` prints as src);
    a UDP connect sends nothing."""
    family = socket.AF_INET6 if ":" in dest else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((dest, 9))
        return s.getsockname()[0]


def interface_of(addr: str) -> str | None:
    """The network interface that carries ``addr``, or ``None``."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == addr for a in addrs):
            return name
    return None


def merge_rdzv_conf(user: str | None, extra: dict[str, str]) -> str:
    """``key=value,...`` of the user's ``--rdzv-conf`` with ``extra`` added (the user's value of a
    key wins only for keys the scheduler does not set)."""
    items: dict[str, str] = {}
    for part in (user or "").split(","):
        if "=" in part:
            key, value = part.split("=", 1)
            items[key.strip()] = value.strip()
    items.update(extra)
    return ",".join(f"{k}={v}" for k, v in items.items())


def _cmd_head(argv: list[str]) -> int:
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    print(host, head_address(host), free_port(), flush=True)
    return 0


def _report_workers(agent: subprocess.Popen, host: str, seen: set[int]) -> None:
    import psutil

    try:
        children = psutil.Process(agent.pid).children()
    except psutil.Error:
        return
    for child in children:
        if child.pid in seen:
            continue
        try:
            env = child.environ()
        except psutil.Error:
            continue
        if "RANK" in env and "TORCHELASTIC_RUN_ID" in env:
            seen.add(child.pid)
            print(f"worker {host} {env['RANK']}", flush=True)


def _kill_leftovers(agent_pid: int, worker_pids: set[int]) -> None:
    """Kill what outlived the agent on this node: members of the workers' sessions."""
    import psutil

    leaders = set(worker_pids) | {agent_pid}
    for _ in range(2):
        left = []
        for p in psutil.process_iter():
            try:
                if p.pid != os.getpid() and os.getsid(p.pid) in leaders:
                    left.append(p)
            except OSError:
                continue
        if not left:
            return
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=5)


def _cmd_run(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: node run [--user-endpoint] -- COMMAND...", file=sys.stderr)
        return 2
    own, command = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    user_endpoint = "--user-endpoint" in own
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    head_host, head_addr = os.environ.get(HEAD_HOST_ENV, ""), os.environ.get(HEAD_ADDR_ENV, "")
    addr = route_source(head_addr) if head_addr else _own_addresses()[0]
    iface = interface_of(addr)
    print(f"node {host} {addr}", flush=True)
    env = dict(os.environ)
    env["PET_LOCAL_ADDR"] = addr
    extra = {"is_host": "1" if host == head_host else "0"} if not user_endpoint else {}
    conf = merge_rdzv_conf(os.environ.get(RDZV_CONF_ENV), extra)
    if conf:
        env["PET_RDZV_CONF"] = conf
    if iface:
        env.setdefault("GLOO_SOCKET_IFNAME", iface)
        env.setdefault("NCCL_SOCKET_IFNAME", iface)
    agent = subprocess.Popen(command, env=env)

    def forward(signum, _frame):
        try:
            agent.send_signal(signum)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    seen: set[int] = set()
    next_look = 0.0
    while agent.poll() is None:
        if time.monotonic() >= next_look:
            _report_workers(agent, host, seen)
            next_look = time.monotonic() + (0.5 if len(seen) == 0 else 5.0)
        try:
            agent.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
    _kill_leftovers(agent.pid, seen)
    code = agent.returncode
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``node head`` or ``node run [--user-endpoint] -- COMMAND...``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["head"]:
        return _cmd_head(argv[1:])
    if argv[:1] == ["run"]:
        return _cmd_run(argv[1:])
    print("usage: python -m tune_magic.schedulers.slurm.node head | run [--user-endpoint] -- COMMAND...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
