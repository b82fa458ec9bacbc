"""Print a TCP port that is free on this node and outside the kernel's ephemeral range.

For the rendezvous port of a multi-node job, picked on the head node when the job starts (never
a fixed 29500: two jobs may share a head node). A port from the ephemeral range (the kernel's own
pick, ``bind(("", 0))``) can be handed to any outgoing connection between this pick and
torchrun's listen; below ``ip_local_port_range`` only another listener can take it.
"""

import random
import socket


def main() -> None:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        print(port)
        return
    raise SystemExit("no free port below the ephemeral range")


if __name__ == "__main__":
    main()
