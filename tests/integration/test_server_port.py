"""``timers server``'s port probe: a port whose last server just stopped (its connections
in TIME_WAIT) is free; a port something listens on is not. Sockets in this process only.

A listening socket is a server: an integration test (no Redis involved, one server only).
"""

from __future__ import annotations

import socket

import pytest

from timers.dev.server import port_free

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def test_a_port_left_in_time_wait_is_free_and_a_listening_one_is_not() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Redis does
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        assert not port_free(port)
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        accepted, _ = listener.accept()
        accepted.close()  # the server's side closes first, as a stopping server does
        assert client.recv(1) == b""
        client.close()  # now the server's side of it waits in TIME_WAIT
    finally:
        listener.close()
    assert port_free(port)
