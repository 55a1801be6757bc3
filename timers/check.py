"""What a Redis server must be like for timers to fire reliably, and what to change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["ok", "warn", "fail"]

ENABLE_EVENTS = "CONFIG SET notify-keyspace-events Ex  (or notify-keyspace-events Ex in redis.conf)"


def expired_events_on(flags: str) -> bool:
    """True when ``notify-keyspace-events`` flags publish ``expired`` keyevents."""
    return "E" in flags and ("x" in flags or "A" in flags)


@dataclass(frozen=True)
class Finding:
    level: Level
    name: str
    value: str
    advice: str = ""


def assess(info: dict[str, str], config: dict[str, str]) -> list[Finding]:
    """Judge a server from ``INFO`` fields and ``CONFIG GET`` values (either may be empty).

    ``fail`` means timers would be lost or never fire; ``warn`` means they fire but late or
    with less safety.
    """
    out: list[Finding] = []
    name = "valkey" if info.get("server_name") == "valkey" or "valkey_version" in info else "redis"
    version = info.get("valkey_version") or info.get("redis_version") or "unknown"
    out.append(Finding("ok", "server", f"{name} {version}"))

    flags = config.get("notify-keyspace-events")
    if flags is None:
        out.append(Finding("warn", "notify-keyspace-events", "unreadable (CONFIG not allowed)",
                           "timers fire through the sweeper alone; that is on time, but the "
                           "expired event is a second path worth having"))
    elif expired_events_on(flags):
        out.append(Finding("ok", "notify-keyspace-events", flags or '""'))
    else:
        out.append(Finding("warn", "notify-keyspace-events", flags or '""',
                           f"expired events are off; timers fire through the sweeper alone. "
                           f"Turn them on: {ENABLE_EVENTS}"))

    policy = config.get("maxmemory-policy")
    if policy is None:
        out.append(Finding("warn", "maxmemory-policy", "unreadable"))
    elif policy.startswith("volatile-"):
        out.append(Finding("fail", "maxmemory-policy", policy,
                           "Redis may evict timer keys (they all have a TTL) and pending "
                           "timers with them: set maxmemory-policy noeviction"))
    elif policy.startswith("allkeys-"):
        out.append(Finding("warn", "maxmemory-policy", policy,
                           "under memory pressure Redis may evict the due index itself: "
                           "noeviction is safer for timers"))
    else:
        out.append(Finding("ok", "maxmemory-policy", policy))

    aof = config.get("appendonly")
    rdb = config.get("save")
    if aof == "yes":
        out.append(Finding("ok", "persistence", "appendonly yes"))
    elif rdb:
        out.append(Finding("warn", "persistence", f"RDB only (save {rdb})",
                           "timers scheduled since the last snapshot are lost in a crash: "
                           "set appendonly yes"))
    elif aof is not None:
        out.append(Finding("warn", "persistence", "off",
                           "a restart loses every pending timer: set appendonly yes"))

    hz = config.get("hz")
    if hz is not None:
        level: Level = "ok" if int(hz) >= 50 else "warn"
        out.append(Finding(level, "hz", hz, "" if level == "ok" else
                           "expired events come late at low hz (p99 ~1 s at hz 10): hz 100 "
                           "and active-expire-effort 10 cut that about 10x; the sweeper keeps "
                           "timers on time either way"))
    return out


def verdict(findings: list[Finding]) -> bool:
    """True when nothing would stop timers firing reliably."""
    return all(f.level != "fail" for f in findings)
