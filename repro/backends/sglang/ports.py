"""Picking TCP ports for servers that bind them later (seconds to minutes after the pick).

A port picked with bind(0) comes from the kernel's ephemeral range, which every outgoing connection
and every other bind(0) also draws from: between our pick and the server's bind, something else can
take it (CI, stop 36: the router's port was taken while two SGLang servers started). Ports below the
ephemeral range are never handed out that way. SGLang draws its own torch.distributed port from
22000-29999 the same way (sglang.srt.utils.network.get_free_port_below_ephemeral), so we stay out
of that window too. Stdlib only: node_agent.py imports this on remote nodes.
"""

from __future__ import annotations

import random
import socket
from typing import Iterable

# below the ephemeral range and outside SGLang's nccl-port window (22000-29999)
PLANNED_RANGES = ((15000, 21999), (30000, 32767))
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_low() -> int:
    """First port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def candidate_ports() -> list[int]:
    """Every port we may plan, all below the ephemeral range."""
    top = ephemeral_low() - 1
    return [p for lo, hi in PLANNED_RANGES for p in range(lo, min(hi, top) + 1)]


def try_hold(host: str, port: int) -> socket.socket | None:
    """The port bound on host (the caller closes it), or None where it is taken."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, port))  # no SO_REUSEADDR: a port in TIME_WAIT or held by a client counts as taken
        return s
    except OSError:
        s.close()
        return None


def pick_free_ports(n: int, host: str = "127.0.0.1", avoid: Iterable[int] = ()) -> list[int]:
    """n distinct ports free on host now, none in `avoid`, from below the ephemeral range.

    The picks are held open together while picking, so they differ from each other; where fewer than
    n are free there (a machine with a narrowed ephemeral range), the rest come from bind(0).
    Unseeded: a port never enters a result.
    """
    avoid = set(avoid)
    pool = [p for p in candidate_ports() if p not in avoid]
    held: list[socket.socket] = []
    try:
        for port in random.SystemRandom().sample(pool, min(len(pool), max(4 * n, 64))):
            s = try_hold(host, port)
            if s is not None:
                held.append(s)
                if len(held) == n:
                    break
        for _ in range(n + len(avoid) + 100):
            if len(held) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            if s.getsockname()[1] in avoid:
                s.close()
                continue
            held.append(s)
        if len(held) < n:
            raise OSError(f"no {n} free ports on {host} outside {sorted(avoid)}")
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()
