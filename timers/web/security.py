"""What keeps other sites out of the dashboard: the names it answers to (a DNS-rebinding
page's ``Host`` is refused by Starlette's ``TrustedHostMiddleware``) and the headers every
response carries (:class:`SecurityHeaders`).

The Content-Security-Policy allows no script or style but the page's own, marked with a
nonce made per response (``request.state.csp_nonce``): no inline event handler, no
``style=""`` attribute, no other origin, and no page may frame the dashboard.
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Iterable

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
"""The names the dashboard answers to by default (with the address it binds)."""
ANY_ADDRESS = frozenset({"", "0.0.0.0", "::", "[::]"})


def host_name(value: str) -> str:
    """``value`` as a ``Host`` header names it: lower case, an IPv6 address in brackets.
    Raises ValueError for a value with a port or a misplaced wildcard."""
    name = value.strip().lower()
    bare = name.strip("[]")
    try:
        if ipaddress.ip_address(bare).version == 6:
            return f"[{bare}]"
    except ValueError:
        pass
    if not name or ":" in name or "/" in name:
        raise ValueError(f"{value!r} is not a host name (give it without a port, e.g. "
                         f"dashboard.example.com)")
    if "*" in name[1:] or (name.startswith("*") and name != "*" and
                           not name.startswith("*.")):
        raise ValueError(f"{value!r}: a wildcard must be a whole first label, as in "
                         f"*.example.com")
    return name


def allowed_hosts(bind: str, extra: Iterable[str] = ()) -> list[str]:
    """The ``Host`` names the dashboard answers to: :data:`LOCAL_HOSTS`, the address it
    binds (unless it binds every interface) and ``extra`` (``--allow-host``)."""
    names = list(LOCAL_HOSTS)
    if bind.strip() not in ANY_ADDRESS:
        names.append(host_name(bind))
    names += (host_name(x) for x in extra)
    return list(dict.fromkeys(names))


def content_security_policy(nonce: str) -> str:
    """The policy of a response whose own scripts and styles carry ``nonce``."""
    return (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
            "img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; "
            "frame-ancestors 'none'")


HEADERS = {"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cross-Origin-Opener-Policy": "same-origin",
           "Cache-Control": "no-store"}
"""Sent with every response besides the policy (pages show timers' args: no caching)."""


class SecurityHeaders:
    """ASGI middleware: a fresh CSP nonce in ``scope["state"]["csp_nonce"]`` for the
    templates, and :data:`HEADERS` and the policy on every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app with a nonce, adding the headers to its response."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        nonce = secrets.token_urlsafe(18)
        scope.setdefault("state", {})["csp_nonce"] = nonce

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Content-Security-Policy"] = content_security_policy(nonce)
                for name, value in HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
