"""Where a metrics port or the dashboard serves: its address as a URL a person can open,
and a listening socket bound before anything is printed (a busy port is one line, not a
server's traceback)."""

from __future__ import annotations

import ipaddress
import socket


def http_url(host: str, port: int) -> str:
    """``http://host:port`` (an IPv6 address in brackets)."""
    try:
        if ipaddress.ip_address(host.strip("[]")).version == 6:
            host = f"[{host.strip('[]')}]"
    except ValueError:
        pass
    return f"http://{host}:{port}"


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port``; OSError (e.g. the port is in use, the
    address is not this machine's) if it cannot."""
    found = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(found[0], socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(found[4])
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock
