"""Acknowledged means replicated, when asked: ``WAIT`` (and ``WAITAOF``) after a write.

Redis answers a write before any replica has it, so a failover right after (the primary
killed, a replica promoted) can lose a timer whose id the producer already returned;
``min-replicas-to-write`` narrows that window but does not close it. A producer asked for
``replicas=n`` (per client or per call) sends after its write, in the same round trip and
on the same connection (``WAIT`` counts the writes of its own connection; on a cluster,
the node that owns the shard's slot):

- ``WAIT n timeout``: until n replicas have the write (in memory);
- with ``fsync=True``, where the server has it (Redis ≥ 7.2, Valkey), also
  ``WAITAOF 0 n timeout``: until n replicas have written it to their AOF and fsynced it
  (a replica without ``appendonly yes`` never counts; under ``appendfsync everysec`` that
  takes up to a second). A server without ``WAITAOF`` is judged on ``WAIT`` alone.

Fewer than n in time raises :class:`~timers.exceptions.NotReplicated`, which names the ids
written: the write is done on the primary and not undone. Each wait lasts at most the
timeout. Without ``replicas`` nothing is added to a request: one round trip, as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from timers.exceptions import NotReplicated, ServerError
from timers.ops.base import Call
from timers.store.cluster import is_cluster
from timers.store.script_modes import declares_keys

DEFAULT_TIMEOUT = 1.0
"""Seconds a write waits for its replicas (``replicas_timeout=``) unless told otherwise."""
SHOWN_IDS = 5
"""Ids an error message names (all of them are in :attr:`NotReplicated.timer_ids`)."""


@dataclass(frozen=True)
class Replication:
    """How many replicas must confirm a write, and for how long to wait for them."""

    replicas: int
    timeout: float = DEFAULT_TIMEOUT
    """Seconds, for ``WAIT`` and again for ``WAITAOF``."""
    fsync: bool = False
    """Also wait for the replicas' AOF fsync (``WAITAOF``), where the server has it."""

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) \
                or self.replicas < 1:
            raise ValueError(f"replicas must be a whole number, 1 or more (0 or None: do "
                             f"not wait), got {self.replicas!r}")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, int | float) \
                or not math.isfinite(self.timeout) or self.timeout <= 0:
            raise ValueError(f"replicas_timeout must be a number of seconds above 0, got "
                             f"{self.timeout!r}")

    @property
    def timeout_ms(self) -> int:
        """The timeout as ``WAIT`` takes it (milliseconds, at least 1: 0 would block)."""
        return max(1, math.ceil(self.timeout * 1000))

    def calls(self) -> list[Call]:
        """The calls that follow a write in its round trip (see the module docstring)."""
        wait = Call(command=("WAIT", self.replicas, self.timeout_ms), after=True)
        if not self.fsync:
            return [wait]
        return [wait, Call(command=("WAITAOF", 0, self.replicas, self.timeout_ms),
                           after=True, may_fail=True)]

    def shortfall(self, replies: Sequence[Any]) -> tuple[int, int | None] | None:
        """``(acked, fsynced)`` when ``replies`` (to :meth:`calls`) say too few replicas
        have the write; None when enough do."""
        acked = int(replies[0])
        fsynced = _fsynced(replies[1]) if self.fsync else None
        if acked >= self.replicas and (fsynced is None or fsynced >= self.replicas):
            return None
        return acked, fsynced

    def error(self, short: tuple[int, int | None], timer_ids: Sequence[str],
              done: str) -> NotReplicated:
        """The error for a :meth:`shortfall` of the write of ``timer_ids``; ``done`` says
        what the write did ("exists on the primary" …)."""
        acked, fsynced = short
        if acked < self.replicas:
            words = f"only {acked} of the {self.replicas} replicas asked for had it"
        else:
            words = (f"only {fsynced} of the {self.replicas} replicas asked for had it "
                     f"fsynced to their AOF (a replica without appendonly never counts)")
        return NotReplicated(
            f"{_naming(timer_ids)} {done}, but {words} within {self.timeout:g} s: the "
            f"write is not undone, and a failover before a replica has it can lose it",
            list(timer_ids), self.replicas, acked, fsynced)

    def check(self, replies: Sequence[Any], timer_ids: Sequence[str], done: str) -> None:
        """Raise :meth:`error` if ``replies`` show a :meth:`shortfall`."""
        short = self.shortfall(replies)
        if short is not None:
            raise self.error(short, timer_ids, done)


def _fsynced(reply: Any) -> int | None:
    """Replicas that fsynced, from a ``WAITAOF`` reply (None: the server has no WAITAOF)."""
    if isinstance(reply, Exception):
        if "unknown command" in str(reply).lower():
            return None
        raise ServerError(f"Redis refused WAITAOF after the write: {reply}") from reply
    return int(reply[1])


def _naming(timer_ids: Sequence[str]) -> str:
    if len(timer_ids) == 1:
        return f"timer {timer_ids[0]!r}"
    shown = ", ".join(repr(i) for i in timer_ids[:SHOWN_IDS])
    more = f", … ({len(timer_ids)} in all)" if len(timer_ids) > SHOWN_IDS else ""
    return f"timers {shown}{more}"


@dataclass(frozen=True)
class ReplicaPolicy:
    """A producer client's replication options (``Timers(replicas=…)``), and what one
    call asks for over them."""

    replicas: int | None = None
    """Replicas each write waits for (None or 0: none)."""
    timeout: float | None = None
    """Seconds (None: :data:`DEFAULT_TIMEOUT`)."""
    fsync: bool = False
    in_memory: bool = False
    """The client's server is an in-memory one (fakeredis, :mod:`timers.testing`): it has
    no replica and knows no ``WAIT``, so the options are checked and not waited for (an
    app's tests run its code as written)."""
    default: Replication | None = field(init=False, repr=False, compare=False)
    """What a call without options of its own asks for."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "default", self._make(self.replicas, self.timeout))

    def _make(self, replicas: int | None, timeout: float | None) -> Replication | None:
        wait = DEFAULT_TIMEOUT if timeout is None else timeout
        if replicas is None or replicas == 0:
            Replication(1, wait)  # the timeout checked all the same
            return None
        wanted = Replication(replicas, wait, self.fsync)
        return None if self.in_memory else wanted

    def for_call(self, replicas: int | None = None,
                 timeout: float | None = None) -> Replication | None:
        """What a call asks for: its own ``replicas`` (0: none) and ``timeout`` over the
        client's (None: the client's)."""
        if replicas is None and timeout is None:
            return self.default
        return self._make(self.replicas if replicas is None else replicas,
                          self.timeout if timeout is None else timeout)


def in_memory(client: object) -> bool:
    """Whether ``client`` talks to an in-memory server (fakeredis) rather than Redis."""
    return type(client).__module__.split(".", 1)[0] == "fakeredis"


def for_listener(client: object, replicas: int | None,
                 timeout: float | None) -> Replication | None:
    """What a listener's ``replicas=`` and ``replicas_timeout=`` ask of its claims
    (:mod:`timers.store.replicated`): None for none, or on an in-memory server (checked,
    not waited for). :class:`ValueError` where a claim's ``WAIT`` cannot count its write:
    Redis Cluster, and scripts that declare their keys (``TIMERS_DECLARE_KEYS``)."""
    wanted = ReplicaPolicy(replicas, timeout).default
    if wanted is None or in_memory(client):
        return None
    if is_cluster(client) or declares_keys(client):
        raise ValueError("replicas= on a listener needs one primary with its replicas (a "
                         "redis:// or Sentinel URL): not Redis Cluster, nor "
                         "TIMERS_DECLARE_KEYS=1")
    return wanted
