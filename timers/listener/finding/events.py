"""The event source: what ``expired`` events and wake messages tell the listener.

An expired timer key names its timer id, which goes to the next claim; a wake message
moves the next due time earlier. :func:`classify` decides what one message means and
does nothing else; :class:`EventSource` keeps the subscription and acts on the result.

A listener's :class:`EventHub` keeps one subscription per Redis node for its lanes
(:mod:`timers.listener.lanes`; a lane alone: a hub of one). Every lane would otherwise
subscribe to the ``expired`` events of its shard's node, and each message of a node would
be read once per lane there (16 times over on one server with 16 shards). Instead the
lanes are grouped by the node that holds their shard; the first lane of each group
subscribes, for its group, to the node's ``expired`` events and to the group's wake
channels, and hands each message to the lane it names (by the timer key's prefix, or the
wake channel; a lane alone takes them all). The groups follow the cluster: a lane whose
shard moved (a failover, a migration) lands in another group, and the subscriptions of
the groups it left and joined are made again (see :meth:`EventSource.run`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

try:  # redis-py's own parser class: private, so its absence only turns the fast read off
    from redis._parsers import _AsyncHiredisParser as _parser_class

    _HIREDIS_PARSER: type[Any] | None = _parser_class
except ImportError:  # pragma: no cover - a redis-py that moved it
    _HIREDIS_PARSER = None
try:
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
except ImportError:  # pragma: no cover - a redis-py whose hiredis reader says False
    _NOT_ENOUGH_DATA = False

from timers import speed
from timers.exceptions import MalformedTimerKey, TaskRefused
from timers.listener.finding.due_tracker import DueTracker
from timers.listener.retrying import RETRYABLE, Outage, Retry, pause
from timers.model.encoding import Entry, as_text, escape_id
from timers.model.keys import DEFAULT_GROUP, Keyspace
from timers.model.wire import Option
from timers.store.cluster import is_cluster
from timers.store.permissions import SWEEP_ONLY_MAX_SLEEP, SWEEPER_ONLY, explain

log = logging.getLogger("timers.listener")

PUBSUB_POLL = 1.0
"""Seconds between reads of the subscription; each read also runs redis-py's health check."""
YIELD_EVERY = 8
"""Messages read before the event loop gets a turn for everything else."""
GROUP_CHECK = 0.25
"""Seconds between checks, on a cluster, that a lane's shard and its node's group stay."""


@dataclass(frozen=True)
class Channels:
    """The names the listener subscribes to and the start of every timer key, as bytes."""

    expired: bytes
    wake: bytes
    timer_key_start: bytes
    groups: frozenset[str] = frozenset({DEFAULT_GROUP})
    """The groups the listener serves: keys of other groups' timers are not its business."""

    @classmethod
    def of(cls, keys: Keyspace, db: int, groups: Iterable[str] = (DEFAULT_GROUP,)) -> Channels:
        return cls(keys.expired_channel(db).encode(), keys.wake_channel.encode(),
                   keys.timer_key_start.encode(), frozenset(groups))


@dataclass(frozen=True)
class Wake:
    """A producer scheduled a timer earlier than the head: sweep (``due_ms`` if readable)."""

    due_ms: float | None


@dataclass(frozen=True)
class Due:
    """An expired timer key naming a runnable timer: claim it next."""

    escaped_id: str


@dataclass(frozen=True)
class Rejected:
    """An expired timer key that names no runnable timer: record it as rejected."""

    key: bytes
    reason: str
    escaped_id: str | None


Event = Wake | Due | Rejected | None


def classify(message: Mapping[str, Any], channels: Channels,
             resolve: Callable[[str], object]) -> Event:
    """What one pub/sub message means (None: nothing to do).

    ``resolve`` checks that a task may run (raises :class:`TaskRefused`); nothing else
    is called. What runs is always the record stored with the pending timer, never the
    key name, so a forged key can at most make a due timer fire on time.
    """
    if message.get("type") != "message" or message.get("data") is None:
        return None
    channel, data = message["channel"], message["data"]
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if channel == channels.wake:
        try:
            due = float(data)
        except ValueError:
            # no wake (each is a due time): the permission probe's "check", or anything
            # else a client published there; nothing to do
            log.debug("ignored a message on the wake channel that is not a due time: %r",
                      data[:40])
            return None
        return Wake(due if math.isfinite(due) else None)
    if channel != channels.expired or not data.startswith(channels.timer_key_start):
        return None
    escaped: str | None = None
    try:
        entry = Entry.decode(as_text(data[len(channels.timer_key_start):]))
        escaped = escape_id(entry.id)
        if entry.record.options.get(Option.GROUP, DEFAULT_GROUP) not in channels.groups:
            return None  # another group's timer: its own listeners claim it
        resolve(entry.record.task)
    except (MalformedTimerKey, TaskRefused) as exc:
        return Rejected(bytes(data), str(exc), escaped)
    return Due(escaped)


class EventHub:
    """Routes one node's messages to the lanes' event sources (see the module doc)."""

    def __init__(self, sources: Sequence[EventSource] = ()) -> None:
        self.sources: list[EventSource] = []
        self._by_start: dict[bytes, EventSource] = {}
        self._by_wake: dict[bytes, EventSource] = {}
        for source in sources:
            self.join(source)

    def join(self, source: EventSource) -> None:
        """Route ``source``'s messages to it (a lane's source joins as it is made)."""
        self.sources.append(source)
        self._by_start[source.channels.timer_key_start] = source
        self._by_wake[source.channels.wake] = source

    def group_of(self, source: EventSource) -> list[EventSource]:
        """The lanes whose shards are on the node ``source``'s shard is on (in lane order)."""
        mine = source.holder()
        return [s for s in self.sources if s is source or s.holder() == mine]

    def channels_for(self, source: EventSource) -> tuple[bytes, ...]:
        """What ``source`` subscribes to: nothing unless it is its group's first lane."""
        group = self.group_of(source)
        if group[0] is not source:
            return ()
        return (source.channels.expired, *(s.channels.wake for s in group))

    def dispatch(self, message: Mapping[str, Any]) -> None:
        """Hand ``message`` to the lane it concerns (none: another app's key, say)."""
        channel, data = message.get("channel"), message.get("data")
        target = self._by_wake.get(channel) if isinstance(channel, bytes) else None
        if target is None and isinstance(data, bytes):
            target = self._by_start.get(data[:data.find(b":") + 1])
        if target is not None:
            target.handle(message)


class EventSource:
    """Keeps the subscription, hands timer ids to the claim and rejections onward.

    ``poke`` wakes the sweep; ``reject`` receives each :class:`Rejected` key (and logs
    it if it records it). ``outage`` is shared with the lane's other loops (one warning
    for all).
    ``hub``: the listener's lanes share one subscription per node through it; the source
    joins it here. ``subscribed``: set while the subscription is up (the listener's own
    event for its first lane)."""

    def __init__(self, client: redis.asyncio.Redis, channels: Channels, keys: Keyspace,
                 resolve: Callable[[str], object], tracker: DueTracker,
                 poke: Callable[[], None], reject: Callable[[Rejected], None],
                 stopping: asyncio.Event, *, outage: Outage,
                 hub: EventHub, subscribed: asyncio.Event | None = None) -> None:
        self.redis, self.channels, self.keys = client, channels, keys
        self.resolve, self.tracker = resolve, tracker
        self.poke, self.reject, self.stopping = poke, reject, stopping
        self.outage, self.hub = outage, hub
        self.pending: dict[str, None] = {}
        """Escaped ids named by events, oldest first, not yet passed to a claim."""
        self.subscribed = subscribed or asyncio.Event()
        hub.join(self)

    def holder(self) -> str | None:
        """``host:port`` of the cluster node holding this source's shard (None: not a
        cluster)."""
        return slot_holder(self.redis, self.keys)

    def take(self, limit: int) -> list[str]:
        """Up to ``limit`` pending timer ids, for the next claim."""
        ids = list(itertools.islice(self.pending, limit))
        for escaped in ids:
            del self.pending[escaped]
        return ids

    def passed_over(self, channel: Any) -> bool:
        """Whether a message on ``channel`` is not read: an expired key while the sweep is
        taking due timers in due order already (a burst), or while another listener sweeps
        this shard first: it names one of them, or none, and reading it would only slow
        the sweep."""
        tracker = self.tracker
        return bool(tracker.backlogged or tracker.defer_ms) and channel == self.channels.expired

    def handle(self, message: Mapping[str, Any]) -> None:
        if self.passed_over(message.get("channel")):
            return
        event = classify(message, self.channels, self.resolve)
        if isinstance(event, Wake):
            if event.due_ms is not None:
                self.tracker.note_due(event.due_ms)
            self.poke()
        elif isinstance(event, Due):
            self.pending[event.escaped_id] = None
            self.poke()
        elif isinstance(event, Rejected):
            self.reject(event)  # logged where it is recorded (not if another listener runs it)

    async def run(self) -> None:
        """Subscribe and handle messages until stopped, resubscribing after a loss."""
        retry = Retry(self.stopping, "event subscription", self.outage)
        while not self.stopping.is_set():
            channels = self.hub.channels_for(self)
            if not channels:  # another lane of the listener listens to this shard's node
                self.subscribed.set()
                await pause(PUBSUB_POLL, self.stopping)
                continue
            pubsub = subscription(self.redis, self.keys)
            try:
                await pubsub.subscribe(*channels)
                await pubsub.get_message(timeout=0)  # a cluster's pub/sub connects lazily
                retry.ok(_address(pubsub))
                self.subscribed.set()
                for source in self.hub.group_of(self):
                    source.poke()  # sweep: events may have been lost while unsubscribed
                await self._read(pubsub, _address(pubsub), channels)
            except redis.exceptions.NoPermissionError as exc:
                log.warning("%s. %s", explain(exc, self.keys), SWEEPER_ONLY)  # once: it ends
                for source in self.hub.group_of(self):
                    source.tracker.max_sleep = min(source.tracker.max_sleep,
                                                   SWEEP_ONLY_MAX_SLEEP)
                return
            except RETRYABLE as exc:
                self.subscribed.clear()
                await retry.failed(exc)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def _read(self, pubsub: Any, where: str | None, channels: tuple[bytes, ...]) -> None:
        # redis-py's get_message can swallow a cancellation, so the loop also ends on the
        # stop flag, within PUBSUB_POLL seconds
        checked = 0.0
        read = 0
        # a lane alone in its hub (the listener's only one) takes its messages itself
        alone = len(self.hub.sources) == 1
        deliver = self.handle if alone else self.hub.dispatch
        moves = is_cluster(self.redis)  # (elsewhere no shard changes node)
        while not self.stopping.is_set():
            read += 1
            if read % YIELD_EVERY == 0:
                # messages already buffered are read without a pause: a flood of expired
                # keys (a burst coming due) would hold the event loop, and the claims',
                # gates' and runs' replies wait behind it
                await asyncio.sleep(0)
            if moves and time.monotonic() - checked > GROUP_CHECK:
                checked = time.monotonic()
                holder = self.holder()
                if holder is not None and where is not None and holder != where:
                    # on a cluster, the timers' slot moved (a failover, a migration): the
                    # old node, still up, publishes their events no more
                    log.warning("the hash slot of %r is now on %s (was %s): subscribing to "
                                "its events there, and sweeping", self.keys.prefix, holder,
                                where)
                    return
                if self.hub.channels_for(self) != channels:
                    return  # a shard moved into or out of this node's group: subscribe anew
            reply = buffered_reply(pubsub)
            if reply is NO_REPLY:
                message = await pubsub.get_message(timeout=PUBSUB_POLL)
            elif type(reply) is list and len(reply) == 3 and reply[0] == b"message":
                if alone and self.passed_over(reply[1]):
                    continue  # (as handle would: no message made for it)
                message = {"type": "message", "pattern": None, "channel": reply[1],
                           "data": reply[2]}
            else:
                message = await _other_reply(pubsub, reply)
            if message is not None:
                try:
                    deliver(message)
                except Exception:
                    # an event is data from the network: nothing it holds may stop the
                    # listener
                    log.exception("could not handle event %r", message)

    async def run_without(self) -> None:
        """The events loop of a listener whose user may not subscribe: nothing to do."""
        self.subscribed.set()
        await self.stopping.wait()


NO_REPLY: Any = object()
"""From :func:`buffered_reply`: no whole reply in hand."""
FAST_READ = speed.on("reader")
"""Whether :func:`buffered_reply` reads hiredis' reader (the speed trick ``reader``)."""


def buffered_reply(pubsub: Any) -> Any:
    """The next reply the subscription's connection has read from the socket already, or
    :data:`NO_REPLY` (then ``get_message`` waits for one).

    When ``expired`` events flood in (a burst coming due), each socket read brings hundreds
    of messages, and redis-py's ``get_message`` costs far more per message than parsing it
    (a health check, a retry wrapper, a timeout context, its metrics hook, several
    coroutines): the listener takes the replies hiredis has parsed straight from its
    reader. With another parser, or the trick off (:data:`FAST_READ`), always
    :data:`NO_REPLY`: ``get_message`` reads everything."""
    if not FAST_READ:
        return NO_REPLY
    parser = getattr(pubsub.connection, "_parser", None)
    reader = (getattr(parser, "_reader", None)
              if _HIREDIS_PARSER is not None and isinstance(parser, _HIREDIS_PARSER)
              else None)
    if reader is None:
        return NO_REPLY
    try:
        reply = reader.gets()
    except Exception:  # a protocol error: get_message meets it again and deals with it
        return NO_REPLY
    return NO_REPLY if reply is False or reply is _NOT_ENOUGH_DATA else reply


async def _other_reply(pubsub: Any, reply: Any) -> Any:
    """What ``get_message`` makes of a reply :func:`buffered_reply` took that is not a
    message: an error raised, a health check's pong dropped, the rest through redis-py's
    ``handle_message`` (which keeps its subscription state)."""
    if isinstance(reply, list) and reply and isinstance(reply[0], redis.ConnectionError):
        reply = reply[0]
    if isinstance(reply, Exception):
        raise reply
    if pubsub.connection.health_check_interval and reply in pubsub.health_check_response:
        return None
    return await pubsub.handle_message(reply)


def _address(pubsub: Any) -> str | None:
    """``host:port`` of the server a subscription reached (behind Sentinel, the primary
    found), if redis-py says."""
    connection = getattr(pubsub, "connection", None)
    host, port = getattr(connection, "host", None), getattr(connection, "port", None)
    return f"{host}:{port}" if host and port else None


def subscription(client: Any, keys: Keyspace) -> Any:
    """A pub/sub of ``client``; on a cluster, on the primary that holds ``keys`` (their
    ``expired`` events are published there alone)."""
    if is_cluster(client):
        return client.pubsub(node=client.get_node_from_key(keys.due),
                             ignore_subscribe_messages=True)
    return client.pubsub(ignore_subscribe_messages=True)


def slot_holder(client: Any, keys: Keyspace) -> str | None:
    """On a cluster, ``host:port`` of the primary that holds ``keys`` as the client knows
    it (redis-py updates that on a ``MOVED`` reply), else None."""
    if not is_cluster(client):
        return None
    node = client.get_node_from_key(keys.due)
    return f"{node.host}:{node.port}"
