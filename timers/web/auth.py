"""Who may look and who may act on the dashboard.

With ``timers web --auth TOKEN`` (or ``$TIMERS_WEB_TOKEN``) every page, ``/live`` and
``/metrics`` need the token: a browser enters it once on the login page and then carries an
HttpOnly, SameSite=Strict cookie; a scraper sends ``Authorization: Bearer TOKEN``. Actions
(cancel, reschedule, run now, retry, purge, pause, resume) also need the form's CSRF token,
and are refused under ``--read-only`` (then the token only lets one look). Without a token
the dashboard only shows, to whoever reaches it (it binds 127.0.0.1 by default).

Every value offered (token, cookie, CSRF token, notice cookie) is compared as bytes, so text
of any alphabet is refused like any other wrong value, never an error.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    BaseUser,
    SimpleUser,
)
from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, RedirectResponse, Response

COOKIE = "timers_auth"
NOTE_COOKIE = "timers_said"
"""A signed one-time notice (what an action did), shown by the next page and cleared."""
NOTE_LIMIT = 500
"""Characters of a notice kept (a cookie holds about 4 kB)."""
PUBLIC_PATHS = frozenset({"/login"})
"""Paths that answer without the login when a token is set."""


def _same(offered: str, expected: str) -> bool:
    """Constant-time equality of two texts of any alphabet."""
    return hmac.compare_digest(offered.encode("utf-8", "surrogatepass"),
                               expected.encode("utf-8", "surrogatepass"))


@dataclass
class Guard:
    """The dashboard's token (None: no login, show only) and its signing secret."""

    token: str | None = None
    read_only: bool = False
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    """Per process: cookies and CSRF tokens of an earlier run no longer count."""

    @property
    def actions_allowed(self) -> bool:
        """True when actions can be allowed at all (a token is set, not read-only)."""
        return self.token is not None and not self.read_only

    def _sign(self, purpose: str) -> str:
        return hmac.new(self.secret, purpose.encode(), hashlib.sha256).hexdigest()

    def cookie_for(self, offered: str) -> str | None:
        """The login cookie's value for a correct token, else None."""
        if self.token is None or not _same(offered, self.token):
            return None
        return self._sign("login")

    def logged_in(self, cookie: str | None) -> bool:
        """True for the login cookie of this process."""
        return cookie is not None and _same(cookie, self._sign("login"))

    def bearer(self, header: str | None) -> bool:
        """True for an ``Authorization: Bearer TOKEN`` header with the token."""
        scheme, _, offered = (header or "").partition(" ")
        return (self.token is not None and scheme.lower() == "bearer"
                and _same(offered.strip(), self.token))

    @property
    def csrf(self) -> str:
        """The CSRF token every form carries."""
        return self._sign("csrf")

    def refusal(self, cookie: str | None, csrf: str | None) -> str | None:
        """Why an action is refused (None: allowed)."""
        if self.read_only:
            return "the dashboard is read-only"
        if self.token is None:
            return "actions need timers web --auth TOKEN"
        if not self.logged_in(cookie):
            return "log in first"
        if csrf is None or not _same(csrf, self.csrf):
            return "the form's CSRF token is missing or wrong"
        return None

    def note_cookie(self, text: str) -> str:
        """The signed cookie value carrying the notice ``text`` to the next page."""
        body = base64.urlsafe_b64encode(text[:NOTE_LIMIT].encode()).decode()
        return f"{body}.{self._sign('note:' + body)}"

    def note(self, cookie: str | None) -> str | None:
        """The notice a cookie of :meth:`note_cookie` carries; None if absent or forged."""
        body, _, signature = (cookie or "").partition(".")
        if not body or not _same(signature, self._sign("note:" + body)):
            return None
        try:
            return base64.urlsafe_b64decode(body.encode()).decode()
        except (binascii.Error, UnicodeDecodeError):  # (signed by us: never happens)
            return None


class LoginGate(AuthenticationBackend):
    """Starlette's authentication backend for a :class:`Guard`: with a token set, a request
    without the login cookie or the bearer token is refused (see :func:`refused`), except
    on :data:`PUBLIC_PATHS`. Scopes: ``read`` for whoever may look."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials,
                                                                BaseUser] | None:
        """The visitor's credentials, or :class:`AuthenticationError` if they need the
        login and have none."""
        if self.guard.token is None:
            return AuthCredentials(["read"]), SimpleUser("anyone")
        if (self.guard.logged_in(conn.cookies.get(COOKIE))
                or self.guard.bearer(conn.headers.get("authorization"))):
            return AuthCredentials(["read"]), SimpleUser("token")
        if conn.url.path in PUBLIC_PATHS:
            return None
        raise AuthenticationError("this dashboard needs the token given to timers web --auth")


def refused(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    """The answer to a visitor without the login: a page opened in a browser goes to the
    login page; ``/live`` and ``/metrics`` answer 401, a form post 403 (one line each)."""
    if conn.url.path in ("/live", "/metrics"):
        return PlainTextResponse(f"{exc}: log in, or send Authorization: Bearer TOKEN",
                                 status_code=401, headers={"WWW-Authenticate": "Bearer"})
    if conn.scope.get("method") in ("GET", "HEAD"):
        return RedirectResponse("/login", status_code=303)
    return PlainTextResponse(f"refused: {exc}", status_code=403)
