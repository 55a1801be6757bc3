"""What a Redis server must be like for timers to fire reliably, and what to change."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import redis

from timers.model.url_parts import is_sentinel_url
from timers.store import cluster, sentinel
from timers.store.connect import configured_url
from timers.store.eviction import ALLKEYS_LOSS, EVICTION_ADVICE
from timers.store.permissions import Problem, probe_url

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

    out.append(_eviction(config.get("maxmemory-policy")))
    persistence = _persistence(config.get("appendonly"), config.get("save"),
                               config.get("appendfsync"))
    if persistence is not None:
        out.append(persistence)

    hz = config.get("hz")
    if hz is not None:
        level: Level = "ok" if int(hz) >= 50 else "warn"
        out.append(Finding(level, "hz", hz, "" if level == "ok" else
                           "expired events come late at low hz (p99 ~1 s at hz 10): hz 100 "
                           "and active-expire-effort 10 cut that about 10x; the sweeper keeps "
                           "timers on time either way"))
    return out


RDB_ONLY = ("a crash of Redis loses the timers scheduled since the last snapshot AND runs "
            "again the timers that fired since it (they come back pending)")
AOF_EVERYSEC = "appendonly yes with appendfsync everysec (at most ~1 s lost)"


def _eviction(policy: str | None) -> Finding:
    """``allkeys-*`` can evict the due index (every pending timer lost); ``volatile-*``
    evicts only keys with a TTL, the expiring timer keys: their events are lost, and the
    sweeper fires those timers from the due index all the same."""
    if policy is None:
        return Finding("warn", "maxmemory-policy", "unreadable")
    if policy.startswith("allkeys-"):
        return Finding("fail", "maxmemory-policy", policy,
                       f"{ALLKEYS_LOSS}: {EVICTION_ADVICE}")
    if policy.startswith("volatile-"):
        return Finding("warn", "maxmemory-policy", policy,
                       "under memory pressure Redis evicts the expiring timer keys: their "
                       "expired events are lost and the sweeper fires those timers (on time, "
                       "from the due index). noeviction keeps the events too")
    return Finding("ok", "maxmemory-policy", policy)


def _persistence(aof: str | None, rdb: str | None, fsync: str | None) -> Finding | None:
    if aof == "yes":
        if fsync == "no":
            return Finding("warn", "persistence", "appendonly yes, appendfsync no",
                           f"the OS decides when to write: a crash may lose more than a "
                           f"second of timers. For nothing lost: {AOF_EVERYSEC}")
        return Finding("ok", "persistence",
                       f"appendonly yes{f', appendfsync {fsync}' if fsync else ''}")
    if rdb:
        return Finding("warn", "persistence", f"RDB only (save {rdb})",
                       f"{RDB_ONLY}. For nothing lost: {AOF_EVERYSEC}")
    if aof is not None:
        return Finding("warn", "persistence", "off",
                       f"a restart loses every pending timer. For nothing lost: {AOF_EVERYSEC}")
    return None


def permission_findings(problems: Sequence[Problem]) -> list[Finding]:
    """The Redis user's permissions: no scripts fails (a listener can do nothing); no
    channels warns (listeners fire through the sweeper alone)."""
    if not problems:
        return [Finding("ok", "permissions", "EVAL/EVALSHA, SUBSCRIBE, PUBLISH")]
    return [Finding("fail" if p.capability == "scripts" else "warn", "permissions", p.line)
            for p in problems]


def inspect_server(url: str | None, prefix: str) -> list[Finding]:
    """Every finding about the server at ``url`` (``$TIMERS_REDIS_URL`` when None): its
    ``INFO``, its ``CONFIG`` (when the user may read it) and the user's permissions. Behind
    Sentinel or on a cluster, every node's settings, each finding named by its node (a
    replica becomes a primary with its own settings)."""
    url = configured_url(url)
    nodes = (sentinel.node_clients(url) if is_sentinel_url(url)
             else cluster.node_clients(url) if cluster.is_cluster_url(url) else None)
    if nodes is not None:
        findings: list[Finding] = []
        for node, client in nodes:
            findings += [replace(f, name=f"{node}: {f.name}") for f in _inspect(client)]
    else:
        findings = _inspect(redis.Redis.from_url(url, decode_responses=True))
    return findings + permission_findings(probe_url(url, prefix))


def _inspect(client: redis.Redis) -> list[Finding]:
    """:func:`assess` of one server's ``INFO`` and ``CONFIG``; closes ``client``."""
    try:
        info = {str(k): str(v) for k, v in client.info("server").items()}
        try:
            config = {str(k): str(v) for k, v in client.config_get("*").items()}
        except redis.exceptions.ResponseError:
            config = {}
    finally:
        client.close()
    return assess(info, config)


def verdict(findings: list[Finding]) -> bool:
    """True when nothing would stop timers firing reliably."""
    return all(f.level != "fail" for f in findings)
