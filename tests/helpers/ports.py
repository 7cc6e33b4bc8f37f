"""Free TCP ports of 127.0.0.1 for the stacks a test starts."""

from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports.

    The sockets are held together so the kernel cannot hand out the same port twice."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
