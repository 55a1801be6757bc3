"""What the Redis user must be allowed, tried for real and harmlessly, and the ACL rule to
add when it is not.

A listener needs EVAL/EVALSHA (every claim and ending is a script; where the user may
also run FUNCTION LOAD and FCALL, the scripts run as functions of one library, which costs
Redis less per call: see :mod:`timers.store.lua_library`), SUBSCRIBE to the
``expired`` keyevent channel and the wake channel, and PUBLISH to the wake channel. Redis 7
creates users without channel access by default. ``ACL DRYRUN`` would tell, but only an
admin may run it; so each is tried: ``EVAL 'return 1' 0``, ``EVALSHA`` of the same,
SUBSCRIBE then UNSUBSCRIBE, and PUBLISH of ``check`` on the wake channel (a payload the
listener ignores).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from dataclasses import dataclass
from typing import Any, Literal

import redis
import redis.asyncio

from timers.exceptions import PermissionMissing
from timers.model.keys import Keyspace
from timers.store.cluster import database_of
from timers.store.listener_client import listener_client

Capability = Literal["scripts", "events", "wake"]
PROBE_SCRIPT = "return 1"
WAKE_PROBE = "check"
"""The payload of the PUBLISH probe: not a due time, so listeners ignore it."""
PERMANENT_PREFIXES = ("WRONGTYPE",)
SWEEP_ONLY_MAX_SLEEP = 0.5
"""Longest sweeper sleep when no wake message can come (the user may not subscribe)."""
SWEEPER_ONLY = ("Timers fire through the due-driven sweeper alone (on time; expired events "
                "are only a second path)")
log = logging.getLogger("timers.listener")


@dataclass(frozen=True)
class Problem:
    capability: Capability
    line: str
    """One line: what the user may not do, and the ACL rule that allows it."""




def is_permanent(exc: BaseException) -> bool:
    """An error that retrying will not cure: a missing permission, failed authentication,
    a key of the wrong type. (OOM, READONLY, LOADING and lost connections pass.)"""
    if isinstance(exc, (redis.exceptions.NoPermissionError,
                        redis.exceptions.AuthenticationError)):
        return True
    return isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith(
        PERMANENT_PREFIXES)


def explain(exc: BaseException, keys: Keyspace) -> str:
    """One line for a permanent error, with the fix."""
    text = str(exc)
    command = re.search(r"run the '([^']+)' command", text)
    if command:
        return (f"the Redis user may not run {command.group(1).upper()}: add the ACL rule "
                f"+{command.group(1).lower()}")
    if "one of the keys" in text:
        return (f"the Redis user may not access timers' keys: add the ACL rule "
                f"~{keys.prefix}*")
    if "one of the channels" in text:
        return (f"the Redis user may not use timers' channels: add the ACL rules "
                f"&{keys.wake_channel} and &__keyevent@*__:expired")
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return f"Redis refused the credentials: {text} (check the user and password in the URL)"
    if text.startswith("WRONGTYPE"):
        return (f"a key under the prefix {keys.prefix!r} holds the wrong type ({text}): "
                f"another program writes there; give timers its own prefix or database")
    return text


async def probe(client: redis.asyncio.Redis, keys: Keyspace, db: int) -> list[Problem]:
    """Try each thing a listener needs; the problems found (lost connections propagate)."""
    problems = await _probe_scripts(client)
    for channel in (keys.expired_channel(db), keys.wake_channel):
        if not await _may_subscribe(client, channel):
            problems.append(Problem("events", (
                f"the Redis user may not SUBSCRIBE to {channel!r}: add the ACL rule "
                f"&{channel}")))
    try:
        await client.publish(keys.wake_channel, WAKE_PROBE)
    except redis.exceptions.NoPermissionError:
        problems.append(Problem("wake", (
            f"the Redis user may not PUBLISH to {keys.wake_channel!r}: add the ACL rule "
            f"&{keys.wake_channel}")))
    return problems


async def _probe_scripts(client: redis.asyncio.Redis) -> list[Problem]:
    missing = []
    sha = hashlib.sha1(PROBE_SCRIPT.encode(), usedforsecurity=False).hexdigest()
    for command, call in (("EVAL", lambda: client.eval(PROBE_SCRIPT, 0)),
                          ("EVALSHA", lambda: client.evalsha(sha, 0))):
        try:
            await call()  # type: ignore[no-untyped-call]
        except redis.exceptions.NoPermissionError:
            missing.append(command)
        except redis.exceptions.NoScriptError:
            pass  # EVALSHA is allowed; the script was flushed meanwhile
    if not missing:
        return []
    rules = " ".join(f"+{c.lower()}" for c in missing)
    return [Problem("scripts", f"the Redis user may not run {' or '.join(missing)}: add the "
                               f"ACL rule {rules}")]


async def _may_subscribe(client: redis.asyncio.Redis, channel: str) -> bool:
    pubsub: Any = client.pubsub()
    try:
        await pubsub.subscribe(channel)
        async with asyncio.timeout(5):
            while True:
                message = await pubsub.get_message(timeout=1)
                if message is not None and message.get("type") == "subscribe":
                    break
        await pubsub.unsubscribe(channel)
        return True
    except redis.exceptions.NoPermissionError:
        return False
    except TimeoutError:
        return True  # no answer is not a refusal
    finally:
        with contextlib.suppress(Exception):
            await pubsub.aclose()


async def check_at_start(client: redis.asyncio.Redis, keys: Keyspace, db: int) -> set[str]:
    """A listener's start-up test: raises :class:`PermissionMissing` if it may not run
    scripts (it could do nothing), else logs each missing capability once, loudly, and
    returns them (the listener carries on, sweeper alone)."""
    try:
        problems = await probe(client, keys, db)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        log.warning("could not test the Redis user's permissions (%s)", exc)
        return set()
    for problem in problems:
        if problem.capability == "scripts":
            raise PermissionMissing(problem.line)  # the caller says it, once
    for problem in problems:
        consequence = SWEEPER_ONLY if problem.capability == "events" else (
            f"Producers cannot wake listeners for an earlier timer; the sweeper finds it "
            f"within {SWEEP_ONLY_MAX_SLEEP:g} s")
        log.warning("%s. %s", problem.line, consequence)
    return {p.capability for p in problems}


def probe_url(url: str, prefix: str) -> list[Problem]:
    """:func:`probe` on a fresh client of ``url`` (for ``timers check``)."""

    async def run() -> list[Problem]:
        client = listener_client(url)
        try:
            db = database_of(client)
            return await probe(client, Keyspace(prefix), db)
        finally:
            await client.aclose()

    return asyncio.run(run())
