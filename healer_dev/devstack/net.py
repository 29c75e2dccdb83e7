"""Loopback ports for the local stack's daemons."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct TCP ports that were free on ``host`` a moment ago (another process may
    still take one before its daemon binds it: callers retry a start that lost the race)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = LOOPBACK) -> int:
    """One TCP port that was free on ``host`` a moment ago."""
    return free_ports(1, host)[0]


def listening(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port`` now (0.2 s to answer)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0
