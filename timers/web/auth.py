"""Who may act on the dashboard: actions (cancel, reschedule, run now, retry, purge, pause,
resume) need the token given to ``timers web --auth`` — entered once on the login page,
then carried by an HttpOnly, SameSite=Strict cookie — and the form's CSRF token. Without
``--auth`` (or with ``--read-only``) the dashboard only shows."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

COOKIE = "timers_auth"


@dataclass
class Guard:
    token: str | None = None
    read_only: bool = False
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    """Per process: cookies and CSRF tokens of an earlier run no longer count."""

    @property
    def actions_allowed(self) -> bool:
        return self.token is not None and not self.read_only

    def _sign(self, purpose: str) -> str:
        return hmac.new(self.secret, purpose.encode(), hashlib.sha256).hexdigest()

    def cookie_for(self, offered: str) -> str | None:
        """The login cookie's value for a correct token, else None."""
        if self.token is None or not hmac.compare_digest(offered.encode(), self.token.encode()):
            return None
        return self._sign("login")

    def logged_in(self, cookie: str | None) -> bool:
        return cookie is not None and hmac.compare_digest(cookie, self._sign("login"))

    @property
    def csrf(self) -> str:
        return self._sign("csrf")

    def refusal(self, cookie: str | None, csrf: str | None) -> str | None:
        """Why an action is refused (None: allowed)."""
        if self.read_only:
            return "the dashboard is read-only"
        if self.token is None:
            return "actions need timers web --auth TOKEN"
        if not self.logged_in(cookie):
            return "log in first"
        if csrf is None or not hmac.compare_digest(csrf, self.csrf):
            return "the form's CSRF token is missing or wrong"
        return None
