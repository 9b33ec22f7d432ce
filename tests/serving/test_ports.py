"""serving/ports.py: a port someone listens on is not free; a picked one is, until someone binds it."""
from __future__ import annotations

import socket

from kvstrata.serving.ports import free_port, port_is_free


def test_a_listening_port_is_not_free_and_a_closed_one_is() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not port_is_free("127.0.0.1", port)
    assert port_is_free("127.0.0.1", port)


def test_free_port_picks_one_a_server_can_bind() -> None:
    port = free_port()
    assert 0 < port < 65536
    assert port_is_free("127.0.0.1", port)
