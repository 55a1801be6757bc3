"""The Lua scripts in ``timers/lua``, loaded once and registered on a client.

Each script starts with a Redis 7 shebang: ``#!lua flags=allow-oom`` on those that free
memory or keep it constant (renew, finish, cancel …), so they run on a full server, and a
plain ``#!lua`` on those that need memory (claim, schedule …), so a full server refuses
them before their first write instead of part-way. fakeredis cannot read a shebang; it
gets the scripts without that line.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any, Literal

ScriptName = Literal[
    "schedule", "reschedule", "cancel", "claim", "renew", "finish", "heartbeat", "forget",
    "cron_declare", "cron_next", "cron_pause", "cron_remove",
]
SCRIPT_NAMES: tuple[ScriptName, ...] = (
    "schedule",
    "reschedule",
    "cancel",
    "claim",
    "renew",
    "finish",
    "heartbeat",
    "forget",
    "cron_declare",
    "cron_next",
    "cron_pause",
    "cron_remove",
)


@cache
def source(name: ScriptName) -> str:
    return resources.files("timers").joinpath("lua", f"{name}.lua").read_text("utf-8")


def without_shebang(text: str) -> str:
    """The script without its ``#!lua …`` first line (for servers that cannot read it)."""
    return text.partition("\n")[2] if text.startswith("#!") else text


def _reads_shebang(client: Any) -> bool:
    return not type(client).__module__.startswith("fakeredis")


def register(client: Any, name: ScriptName) -> Any:
    """``register_script`` one script on a redis-py client, sync or asyncio."""
    text = source(name)
    return client.register_script(text if _reads_shebang(client) else without_shebang(text))


def register_all(client: Any) -> dict[ScriptName, Any]:
    """``register_script`` each script on a redis-py client, sync or asyncio.

    The returned objects run by EVALSHA and fall back to EVAL after a server restart.
    """
    return {name: register(client, name) for name in SCRIPT_NAMES}
