"""Ports for the servers that tests and benches start as subprocesses or Ray actors."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Ray's workers listen on 10002-19999 by default; everything else that binds port 0 (Ray's raylet,
# GCS and agents, every outgoing connection) draws from the kernel's ephemeral range. A port found
# free by binding port 0 is in that range, and between its release and the server's bind another
# process could take it: CI once failed a test so ("Failed to bind to address '127.0.0.1:44367'").
# Ports are drawn from what lies between the two instead, at random so that the processes of one
# run (xdist workers, benches) rarely draw the same one.
_LOW = 20000
_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A free 127.0.0.1 port outside the ephemeral range, not handed out before in this process."""
    ephemeral_low, ephemeral_high = _ephemeral_range()
    high = ephemeral_low - 1 if ephemeral_low > _LOW + 1000 else 65535
    for _ in range(200):
        port = random.randint(_LOW, high)
        if port in _handed_out or ephemeral_low <= port <= ephemeral_high:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {_LOW}-{high} outside the ephemeral range after 200 draws")
