"""The Lua scripts in ``timers/lua``, loaded once and registered on a client."""

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


def register_all(client: Any) -> dict[ScriptName, Any]:
    """``register_script`` each script on a redis-py client, sync or asyncio.

    The returned objects run by EVALSHA and fall back to EVAL after a server restart.
    """
    return {name: client.register_script(source(name)) for name in SCRIPT_NAMES}
