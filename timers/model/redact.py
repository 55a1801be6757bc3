"""Passwords out of everything printed: URLs shown without their credentials."""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
_PASSWORD_PARAM = re.compile(r"(?P<name>[?&]password=)[^&\s]*", re.IGNORECASE)


def safe_url(url: str) -> str:
    """The URL with any ``user:password@`` (and ``?password=``) replaced by ``***``."""
    return mask_secrets(url)


def mask_secrets(text: str) -> str:
    """``text`` with the credentials of every URL in it masked: safe to print or log."""
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    return _PASSWORD_PARAM.sub(r"\g<name>***", text)
