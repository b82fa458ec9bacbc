#!/bin/bash
# One torchrun agent on this node of a SLURM job, with the three multi-node rendezvous traps of
# /work/shared/notes/slurm-and-multinode.md handled. Run by srun, one task per node:
#
#     srun --ntasks-per-node=1 bash torchrun_node.sh PORT PYTHON SCRIPT [ARGS...]
#
# PORT was picked free on the head node (where the batch script runs; tests/slurm/free_port.py). Nothing here resolves a
# host name: on Debian a node's own name resolves to 127.0.1.1 and the test cluster's nodes cannot
# resolve each other's names at all.
set -euo pipefail
port=$1 python=$2
shift 2
head_name=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# srun's own address on the batch (head) node, as the other nodes reach it (srun(1): OUTPUT ENVIRONMENT)
head_addr=$SLURM_LAUNCH_NODE_IPADDR
# this node's address: the source of its route to the head (on the head itself: the head's address)
addr=$(ip -o route get "$head_addr" | sed -n 's/.* src \([0-9.]*\).*/\1/p')
iface=$(ip -o -4 addr show | awk -v a="$addr" '{split($4, p, "/"); if (p[1] == a) print $2}')
# trap 1: only the head hosts the c10d store, and every other node is told so too: left to guess,
# torch says "host" wherever the endpoint's address is local (so on every node when the nodes
# share an address, measured: EADDRINUSE on the head). SLURM's node name decides, not the host name.
is_host=0
if [ "$SLURMD_NODENAME" = "$head_name" ]; then is_host=1; fi
echo "node $SLURMD_NODENAME $(hostname) $addr $iface"
# trap 3: gloo binds this node's interface, not the loopback one
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$iface}
# trap 2: --local-addr makes rank 0 publish this address, not a name the others cannot resolve
exec "$python" -m torch.distributed.run --nnodes "$SLURM_JOB_NUM_NODES" --nproc_per_node 1 \
    --rdzv-backend c10d --rdzv-endpoint "$head_addr:$port" --rdzv-id "$SLURM_JOB_ID" \
    --rdzv-conf "is_host=$is_host" --local-addr "$addr" "$@"
