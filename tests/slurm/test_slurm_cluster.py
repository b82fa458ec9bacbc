"""Smoke tests of the two-node SLURM test cluster (tests/slurmcluster.py) and the multi-node
torchrun recipe it must run (tests/slurm/torchrun_node.sh)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

import slurmcluster
from waiting import wait_for

HERE = Path(__file__).parent
NODE_LINE = re.compile(r"^node (\S+) (\S+) (\S+) (\S+)$", re.M)


def _output(cluster, job_id: str) -> str:
    path = cluster.shared_dir / f"{job_id}.out"
    return path.read_text() if path.exists() else "(no output file)"


def test_client_env_is_the_clusters_own(slurm_cluster, monkeypatch):
    env = slurm_cluster.env
    assert env["SLURM_CONF"] == str(slurm_cluster.conf)
    assert not [k for k in env if k.startswith(("SBATCH_", "SQUEUE_")) or k == "TUNE_MAGIC_SCHEDULER"]
    assert [k for k in env if k.startswith("SLURM_")] == ["SLURM_CONF"]
    conf = slurm_cluster.conf.read_text()
    ports = [int(p) for p in re.findall(r"^(?:SlurmctldPort|SlurmdPort)=(\d+)$", conf, re.M)]
    assert len(ports) == 2 and not {6817, 6818} & set(ports)
    # a polluted environment is scrubbed the same way
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setenv("SBATCH_PARTITION", "elsewhere")
    monkeypatch.setenv("TUNE_MAGIC_SCHEDULER", "slurm")
    monkeypatch.setenv("SQUEUE_FORMAT", "%i")
    scrubbed = slurmcluster.scrub_env(SLURM_CONF="x")
    assert scrubbed["SLURM_CONF"] == "x" and scrubbed["PATH"] == env["PATH"]
    assert not {"SLURM_JOB_ID", "SBATCH_PARTITION", "TUNE_MAGIC_SCHEDULER", "SQUEUE_FORMAT"} & set(scrubbed)


def test_two_node_batch_job_prints_each_nodes_name_and_address(slurm_cluster):
    script = slurm_cluster.shared_dir / "hosts.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        "srun --ntasks-per-node=1 bash -c '"
        'addr=$(ip -o route get "$SLURM_LAUNCH_NODE_IPADDR" | sed -n "s/.* src \\([0-9.]*\\).*/\\1/p"); '
        'echo node $SLURMD_NODENAME $(hostname) $addr $(hostname --ip-address)\'\n'
    )
    out_file = slurm_cluster.shared_dir / "hosts.out"
    done = slurm_cluster.client(["sbatch", "--wait", "--nodes=2", f"--output={out_file}", str(script)], timeout=60,
                                check=False)
    text = out_file.read_text() if out_file.exists() else "(no output)"
    assert done.returncode == 0, (done.stdout, done.stderr, text)
    nodes = {m[0]: m[1:] for m in NODE_LINE.findall(text)}
    assert sorted(nodes) == slurm_cluster.node_names, text
    if slurm_cluster.mode == "netns":
        assert {n: v[0] for n, v in nodes.items()} == {n: n for n in slurm_cluster.node_names}  # host name = node
        assert [nodes[n][1] for n in slurm_cluster.node_names] == slurm_cluster.node_addresses
        assert len(set(slurm_cluster.node_addresses)) == 2
        assert {v[2] for v in nodes.values()} == {"127.0.1.1"}  # Debian's trap is there on every node
    else:
        assert {v[1] for v in nodes.values()} == {"127.0.0.1"}


def test_netns_nodes_have_own_names_addresses_and_the_127_0_1_1_line(slurm_netns_cluster):
    c = slurm_netns_cluster
    for node, other in ((c.nodes[0], c.nodes[1]), (c.nodes[1], c.nodes[0])):
        assert c.run_in_node(node, ["hostname"]).stdout.strip() == node.name
        assert c.run_in_node(node, ["hostname", "--ip-address"]).stdout.strip() == "127.0.1.1"
        route = c.run_in_node(node, ["ip", "-o", "route", "get", other.address]).stdout
        assert f" src {node.address} " in route and " dev eth0 " in route
        # a peer's name resolves nowhere: a job must take addresses from SLURM or a route
        assert c.run_in_node(node, ["getent", "hosts", other.name], check=False).returncode == 2
    assert subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip() not in c.node_names


def test_two_node_torchrun_with_the_three_trap_fixes(slurm_cluster):
    """The recipe of tests/slurm/torchrun_node.sh: is_host on the head only, --local-addr,
    GLOO_SOCKET_IFNAME. In netns mode each one left out makes this job hang (measured)."""
    c = slurm_cluster
    script = c.shared_dir / "torchrun.sbatch"
    script.write_text(
        "#!/bin/bash\nset -euo pipefail\n"
        f"port=$({sys.executable} {HERE / 'free_port.py'})\n"
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash {HERE / 'torchrun_node.sh'} \"$port\" {sys.executable} "
        f"{HERE / 'gloo_allreduce.py'}\n"
    )
    job = c.sbatch(["--nodes=2", "--time=3", str(script)])
    state = c.wait_job(job, timeout=170)
    text = _output(c, job)
    assert state == "COMPLETED", text
    ranks = re.findall(r"^rank (\d)/(\d) node (\S+) host \S+ master (\S+) sum (\d+)$", text, re.M)
    assert sorted(r[0] for r in ranks) == ["0", "1"], text
    assert {r[1] for r in ranks} == {"2"} and {r[4] for r in ranks} == {"1"}
    assert sorted(r[2] for r in ranks) == c.node_names  # one rank on each node
    masters = {r[3] for r in ranks}
    assert len(masters) == 1 and masters <= set(c.node_addresses)  # an address, never a name
    agents = {m[0]: m for m in NODE_LINE.findall(text)}
    assert sorted(agents) == c.node_names
    if c.mode == "netns":
        assert {a[3] for a in agents.values()} == {"eth0"}  # GLOO_SOCKET_IFNAME


def test_node_processes_sees_a_jobs_processes_on_each_node_until_cancelled(slurm_cluster):
    c = slurm_cluster
    job = c.sbatch(["--nodes=2", "--wrap=srun --ntasks-per-node=1 sleep 300"])
    c.wait_job(job, timeout=30, states=("RUNNING",))
    def sleeps_on_each_node() -> dict | None:
        sleeps = {n: [p for p in c.node_processes(n) if p.name() == "sleep"] for n in c.node_names}
        return sleeps if all(sleeps.values()) else None

    sleeps = wait_for(sleeps_on_each_node, timeout=15, interval=0.2, what="the job's sleep on each node",
                      describe=lambda: {n: [p.name() for p in c.node_processes(n)] for n in c.node_names})
    assert all(sleeps.values()), sleeps
    c.client(["scancel", job])
    assert c.wait_job(job, timeout=30) == "CANCELLED"
    wait_for(lambda: not any(c.node_processes(n) for n in c.node_names), timeout=20, interval=0.2,  # KillWait=10
             what="no process left on the nodes")
    assert {n: [p.name() for p in c.node_processes(n)] for n in c.node_names} == {n: [] for n in c.node_names}


# --- the fixture module itself: it removes exactly what it made ------------------------------------


def _made_by(cluster) -> dict:
    links = Path("/sys/class/net")
    return {
        "netns": sorted(n.netns for n in cluster.nodes if n.netns and (slurmcluster.NETNS_DIR / n.netns).exists()),
        "bridge": bool(cluster.bridge and (links / cluster.bridge).exists()),
        "veths": sorted(p.name for p in links.iterdir() if p.name.startswith(f"tm{cluster.suffix}")),
        "pids": sorted(pid for pid in cluster.pids.values() if psutil.pid_exists(pid)
                       and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE),
        "run_dir": cluster.run_dir.exists(),
    }


def test_stop_removes_everything_the_cluster_made_even_with_a_job_running(slurm_cluster):
    c2 = slurmcluster.start_cluster(slurm_cluster.mode)
    try:
        assert c2.suffix != slurm_cluster.suffix and c2.controller_port != slurm_cluster.controller_port
        made = _made_by(c2)
        assert made["pids"] and made["run_dir"]
        if c2.mode == "netns":
            assert made["netns"] and made["bridge"] and made["veths"]
        job = c2.sbatch(["--nodes=2", "--wrap=srun --ntasks-per-node=1 sleep 300"])
        c2.wait_job(job, timeout=30, states=("RUNNING",))
    finally:
        c2.stop()
    assert _made_by(c2) == {"netns": [], "bridge": False, "veths": [], "pids": [], "run_dir": False}
    leftover = [p for p in psutil.process_iter(["cmdline"]) if str(c2.conf) in " ".join(p.info["cmdline"] or [])]
    assert leftover == []
    # the session's cluster is untouched
    assert slurm_cluster.client(["sinfo", "-h", "-N", "-o", "%T"]).stdout.split() == ["idle", "idle"]


def test_a_failed_start_removes_what_it_had_made(slurm_cluster, monkeypatch):
    real_exe = slurmcluster._exe
    monkeypatch.setattr(slurmcluster, "_exe", lambda name: "/nonexistent/slurmd" if name == "slurmd" else real_exe(name))
    made = {}
    real_start = slurmcluster._start

    def start_and_remember(c, cpus, timeout):
        made["cluster"] = c
        real_start(c, cpus, timeout)

    monkeypatch.setattr(slurmcluster, "_start", start_and_remember)
    with pytest.raises(slurmcluster.ClusterError, match="slurmd|tmnode"):
        slurmcluster.start_cluster(slurm_cluster.mode, timeout=10)
    c = made["cluster"]
    after = _made_by(c)
    assert after["pids"] == [] and after["netns"] == [] and after["bridge"] is False and after["veths"] == []
    assert after["run_dir"]  # kept on failure, for its logs
    subprocess.run(["rm", "-rf", str(c.run_dir)], check=True)


def test_a_crashed_sessions_cluster_is_reaped_by_the_next_one(slurm_cluster):
    c3 = slurmcluster.start_cluster(slurm_cluster.mode)
    try:
        dead = subprocess.Popen(["true"])
        dead.wait()
        record = json.loads((c3.run_dir / "cluster.json").read_text())
        assert record["pids"].keys() == {"munged", "slurmctld", *c3.node_names}
        record["owner_pid"] = dead.pid  # as if the pytest that started it had been killed
        (c3.run_dir / "cluster.json").write_text(json.dumps(record))
        reaped = slurmcluster.reap_stale_clusters()
        assert reaped == [str(c3.run_dir)]  # only that one: the session's own cluster is alive
        assert _made_by(c3) == {"netns": [], "bridge": False, "veths": [], "pids": [], "run_dir": False}
        assert slurm_cluster.client(["sinfo", "-h", "-N", "-o", "%T"]).stdout.split() == ["idle", "idle"]
    finally:
        c3.stop()
