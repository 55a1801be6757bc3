"""Who may look and who may act on the dashboard.

With ``timers web --auth TOKEN`` (or ``$TIMERS_WEB_TOKEN``) every page, ``/live`` and
``/metrics`` need the token: a browser enters it once on the login page and then carries an
HttpOnly, SameSite=Strict cookie (or opens the one-time login link ``timers web`` prints,
:meth:`Guard.login_code`); a scraper sends ``Authorization: Bearer TOKEN``. Actions
(cancel, reschedule, run now, retry, purge, pause, resume) also need the form's CSRF token,
and are refused under ``--read-only`` (then the token only lets one look). Without a token
the dashboard only shows, to whoever reaches it (it binds 127.0.0.1 by default).

Every value offered (token, cookie, CSRF token, notice cookie) is compared as bytes, so text
of any alphabet is refused like any other wrong value, never an error, and in constant time.
Wrong tokens (on the login page or as a bearer) back their client off (:class:`Backoff`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
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
LOGIN_LINK_S = 900.0
"""How long a one-time login link (:meth:`Guard.login_code`) works, unless used first."""
PUBLIC_PATHS = frozenset({"/login"})
"""Paths that answer without the login when a token is set."""


def _same(offered: str, expected: str) -> bool:
    """Constant-time equality of two texts of any alphabet."""
    return hmac.compare_digest(offered.encode("utf-8", "surrogatepass"),
                               expected.encode("utf-8", "surrogatepass"))


@dataclass
class Backoff:
    """Wrong tokens per client address: after ``n`` in a row a client waits
    ``first_s * 2**(n-1)`` seconds (at most ``most_s``) before its next token is looked at;
    meanwhile it is answered 429 with ``Retry-After``. A right token forgets the client, as
    do ``most_s`` quiet seconds after its wait. Memory is bounded: the ``clients`` addresses
    that failed last are remembered, the least recent forgotten first."""

    first_s: float = 1.0
    most_s: float = 300.0
    clients: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _failing: OrderedDict[str, tuple[int, float]] = field(default_factory=OrderedDict,
                                                          repr=False)
    """Client address -> (wrong tokens in a row, when on ``clock`` it may try again)."""

    def wait_s(self, client: str) -> float:
        """Seconds ``client`` must wait before its next token is looked at (0: now)."""
        failures, until = self._failing.get(client, (0, 0.0))
        now = self.clock()
        if failures and now >= until + self.most_s:
            del self._failing[client]
        return max(until - now, 0.0)

    def failed(self, client: str) -> None:
        """``client`` offered a wrong token: it waits twice as long as after the last."""
        self.wait_s(client)  # forgotten if quiet long enough
        failures = min(self._failing.pop(client, (0, 0.0))[0] + 1, 64)
        self._failing[client] = (failures, self.clock()
                                 + min(self.first_s * 2 ** (failures - 1), self.most_s))
        while len(self._failing) > self.clients:
            self._failing.popitem(last=False)

    def succeeded(self, client: str) -> None:
        """``client`` offered the right token: no wait any more."""
        self._failing.pop(client, None)


RETRY_AFTER = "timers.retry_after"
"""Where :class:`LoginGate` leaves, in a request's scope, the seconds a client backed off
must wait (for :func:`refused`)."""


def client_of(conn: HTTPConnection) -> str:
    """The address a request came from (behind a proxy: the proxy's, shared by all)."""
    return conn.client.host if conn.client else ""


@dataclass
class Guard:
    """The dashboard's token (None: no login, show only) and its signing secret."""

    token: str | None = None
    read_only: bool = False
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    """Per process: cookies and CSRF tokens of an earlier run no longer count."""
    backoff: Backoff = field(default_factory=Backoff)
    """Who offered wrong tokens lately, and how long each must wait."""
    _codes: dict[str, float] = field(default_factory=dict, repr=False)
    """One-time login codes not used yet: their SHA-256 -> until when (backoff's clock)."""

    @property
    def actions_allowed(self) -> bool:
        """True when actions can be allowed at all (a token is set, not read-only)."""
        return self.token is not None and not self.read_only

    def _sign(self, purpose: str) -> str:
        return hmac.new(self.secret, purpose.encode(), hashlib.sha256).hexdigest()

    def wait_s(self, client: str) -> float:
        """Seconds ``client`` must wait before a token it offers is looked at (0: now)."""
        return self.backoff.wait_s(client)

    def cookie_for(self, offered: str, client: str) -> str | None:
        """The login cookie's value for a correct token offered by ``client``, else None
        (see :meth:`token_is`)."""
        if not self.token_is(offered, client):
            return None
        return self._sign("login")

    def token_is(self, offered: str, client: str) -> bool:
        """Whether ``offered`` is the token; a wrong one backs ``client`` off. Ask only
        once :meth:`wait_s` is 0."""
        if self.token is None:
            return False
        if _same(offered, self.token):
            self.backoff.succeeded(client)
            return True
        self.backoff.failed(client)
        return False

    def login_code(self, valid_s: float = LOGIN_LINK_S) -> str:
        """A new one-time login code (for ``/login?code=…``, the link ``timers web``
        prints): it logs one browser in, once, within ``valid_s`` seconds. Only its hash is
        kept."""
        if self.token is None:
            raise ValueError("a login code needs a token (timers web --auth)")
        code = secrets.token_urlsafe(24)
        now = self.backoff.clock()
        self._codes = {k: v for k, v in self._codes.items() if v > now}
        self._codes[hashlib.sha256(code.encode()).hexdigest()] = now + valid_s
        return code

    def cookie_for_code(self, offered: str, client: str) -> str | None:
        """The login cookie's value for a one-time code of :meth:`login_code` not used yet
        nor expired (it is used up), else None (``client`` backs off as for a wrong token).
        Ask only once :meth:`wait_s` is 0."""
        digest = hashlib.sha256(offered.encode("utf-8", "surrogatepass")).hexdigest()
        until = self._codes.pop(digest, None)
        if self.token is None or until is None or until <= self.backoff.clock():
            self.backoff.failed(client)
            return None
        self.backoff.succeeded(client)
        return self._sign("login")

    def logged_in(self, cookie: str | None) -> bool:
        """True for the login cookie of this process."""
        return cookie is not None and _same(cookie, self._sign("login"))

    def bearer(self, header: str | None, client: str) -> bool:
        """True for an ``Authorization: Bearer TOKEN`` header with the token (a wrong one
        backs ``client`` off, see :meth:`token_is`)."""
        scheme, _, offered = (header or "").partition(" ")
        return scheme.lower() == "bearer" and self.token_is(offered.strip(), client)

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
        if self.guard.logged_in(conn.cookies.get(COOKIE)):
            return AuthCredentials(["read"]), SimpleUser("token")
        header, client = conn.headers.get("authorization"), client_of(conn)
        if header and (wait := self.guard.wait_s(client)) > 0:
            conn.scope[RETRY_AFTER] = wait
            raise AuthenticationError(backed_off(wait))
        if self.guard.bearer(header, client):
            return AuthCredentials(["read"]), SimpleUser("token")
        if conn.url.path in PUBLIC_PATHS:
            return None
        raise AuthenticationError("this dashboard needs the token given to timers web --auth")


def refused(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    """The answer to a visitor without the login: a page opened in a browser goes to the
    login page; ``/live`` and ``/metrics`` answer 401, a form post 403 (one line each); a
    client backed off for wrong tokens, 429 with ``Retry-After``."""
    if RETRY_AFTER in conn.scope:
        return too_many(conn.scope[RETRY_AFTER])
    if conn.url.path in ("/live", "/metrics"):
        return PlainTextResponse(f"{exc}: log in, or send Authorization: Bearer TOKEN",
                                 status_code=401, headers={"WWW-Authenticate": "Bearer"})
    if conn.scope.get("method") in ("GET", "HEAD"):
        return RedirectResponse("/login", status_code=303)
    return PlainTextResponse(f"refused: {exc}", status_code=403)


def backed_off(wait_s: float) -> str:
    """What a client backed off for ``wait_s`` more seconds is told."""
    return f"too many wrong tokens from this address: try again in {_seconds(wait_s)} s"


def _seconds(wait_s: float) -> int:
    return max(math.ceil(wait_s), 1)


def too_many(wait_s: float) -> Response:
    """429 with ``Retry-After``: the client offered wrong tokens too recently."""
    return PlainTextResponse(f"refused: {backed_off(wait_s)}", status_code=429,
                             headers={"Retry-After": str(_seconds(wait_s))})
