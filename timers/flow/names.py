"""Names of groups and concurrency keys (temporary: replaced by the producer API branch)."""

from __future__ import annotations

import os
import re
from urllib.parse import quote, unquote

from timers.exceptions import InvalidTimer

DEFAULT_GROUP = "default"
GROUP_ENV = "TIMERS_GROUP"
_GROUP_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_group(group: object, name: str = "group") -> str:
    if not isinstance(group, str) or not _GROUP_RE.fullmatch(group):
        raise InvalidTimer(f"{name} must be 1 to 64 letters, digits, '_', '.' or '-', "
                           f"got {group!r}")
    return group


def configured_group(group: str | None = None) -> str:
    if group is not None:
        return check_group(group)
    return check_group(os.environ.get(GROUP_ENV) or DEFAULT_GROUP, f"${GROUP_ENV}")


def check_key(key: object) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= 200:
        raise InvalidTimer(f"concurrency key must be text of 1 to 200 characters, got {key!r}")
    return key


def escape_key(key: str) -> str:
    return quote(check_key(key), safe="")


def unescape_key(text: str) -> str:
    return unquote(text)
