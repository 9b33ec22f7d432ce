"""TCP ports on the local host: whether a server could listen on one now (`kvstrata serve` checks its
--port before it loads the weights, the `--dp-size` launcher checks the gateway's and the ranks'), and
a free one picked by the kernel (ranks without --rank-ports, benchmarks and tests)."""
from __future__ import annotations

import socket


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now (SO_REUSEADDR, as uvicorn binds)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port no one listens on now, picked by the kernel (another process may take it before we bind)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
