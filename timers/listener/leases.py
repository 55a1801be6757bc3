"""Keeping the leases of running timers from a thread of its own.

A lease renewed from the event loop lapses whenever the loop is blocked (an ``async def``
task that calls ``time.sleep``, a slow import): another listener then runs the timer
again. So the renewals run in a thread, on a synchronous connection of their own, every
``lease / 3`` seconds, for the run tokens the listener holds (:class:`HeldRuns`, shared
with the event loop under a lock).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import redis

from timers.listener.retrying import RETRYABLE, ReconnectDelays
from timers.model.encoding import as_text
from timers.model.keys import Keyspace
from timers.model.runs import Run
from timers.store import cluster, sentinel
from timers.store.scripts import Scripts

log = logging.getLogger("timers.listener")

_PASSED_ON = frozenset({
    "host", "port", "path", "db", "username", "password", "credential_provider",
    "socket_connect_timeout", "socket_keepalive", "socket_keepalive_options", "client_name",
    "protocol", "encoding", "encoding_errors",
})
"""Connection settings a synchronous twin takes over from an asyncio client (plus ssl_*)."""


class HeldRuns:
    """Run tokens whose leases are kept, each with its timer id and how long its lease is
    known to hold (monotonic); safe across threads.

    The fence (invariant 12, docs/state-machine.md): a run is started only while
    :meth:`fresh` says its lease holds for a while yet. A claim's reply is read within half
    a lease (the claimer revalidates a later one), so a run is fresh for half a lease from
    when it is held; each renewal that keeps it makes it fresh for a lease from when the
    renewal was sent. A stall (the process paused, a blocked loop, renewals failing) lets
    that lapse, and the run is revalidated in Redis before it starts.

    A run that starts in another process (a quarantine child) gets the same check from a
    shared cell (:meth:`share`): its lease's end as known here, on the system-wide
    monotonic clock (``CLOCK_MONOTONIC``, the same in every process of the machine), kept
    up to date by every renewal and 0 once the run is released or lost.
    """

    def __init__(self, lease: float = 15.0) -> None:
        self.lease = lease
        self.margin = lease / 10
        """How long a lease must hold yet for a run to start (seconds)."""
        self._lock = threading.Lock()
        self._runs: dict[str, str] = {}
        self._until: dict[str, float] = {}  # token -> monotonic time its lease holds to
        self._ending: set[str] = set()  # held, with their ending on its way to Redis
        self._shared: dict[str, SharedUntil] = {}  # token -> its cell in another process

    def hold(self, token: str, timer_id: str) -> None:
        with self._lock:
            self._runs[token] = timer_id
            self._until[token] = time.monotonic() + self.lease / 2

    def confirm(self, tokens: Iterable[str], sent: float) -> None:
        """A renewal sent at monotonic ``sent`` kept ``tokens``: each holds a lease from then."""
        until = sent + self.lease
        with self._lock:
            shared = self._shared
            for token in tokens:
                if token in self._runs:
                    self._until[token] = until
                    if shared and token in shared:
                        shared[token].value = until

    def fresh(self, token: str) -> bool:
        """Whether ``token`` is held and its lease known to hold for a tenth of a lease yet:
        a run may start. False after a stall longer than the renewals allow for."""
        until = self._until.get(token)
        return until is not None and time.monotonic() + self.margin < until

    def share(self, token: str, cell: SharedUntil) -> None:
        """Keep ``cell.value`` at the monotonic time ``token``'s lease is known to hold to
        (0: not held), for a process that starts the run: it starts it only while that is
        more than :attr:`margin` away (:func:`fresh_in`), as :meth:`fresh` says here."""
        with self._lock:
            cell.value = self._until.get(token, 0.0)
            self._shared[token] = cell

    def unshare(self, token: str) -> None:
        """Stop keeping ``token``'s shared cell (its process ended)."""
        with self._lock:
            self._shared.pop(token, None)

    def release(self, tokens: Iterable[str]) -> dict[str, str]:
        """Stop keeping ``tokens``; returns those that were held, with their timer ids."""
        with self._lock:
            self._ending.difference_update(tokens)
            for token in tokens:
                self._until.pop(token, None)
            if self._shared:
                for token in tokens:
                    self._unheld(token)
            return {t: self._runs.pop(t) for t in tokens if t in self._runs}

    def _unheld(self, token: str) -> None:
        """(Under the lock.) ``token`` is not held any more: its shared cell says so."""
        cell = self._shared.pop(token, None)
        if cell is not None:
            cell.value = 0.0

    def ending(self, tokens: Iterable[str], sent: bool = True) -> None:
        """Mark ``tokens`` as having their ending on its way (``sent=False``: no longer).

        They are still renewed until the ending is written, so a blocked event loop
        between sending and reading the reply cannot let their leases lapse; a renewal
        that finds one already ended drops it without a warning. A flow gate's call marks
        its runs the same way while it is out: the gate may hold one back, out of the
        running set, before the listener reads that it did.
        """
        with self._lock:
            if sent:
                self._ending.update(t for t in tokens if t in self._runs)
            else:
                self._ending.difference_update(tokens)

    def drop_lost(self, token: str) -> str | None:
        """Stop keeping a token a renewal found lost; its timer id, or None when it was
        not held or its ending was on its way (nothing was lost)."""
        with self._lock:
            timer_id = self._runs.pop(token, None)
            self._until.pop(token, None)
            if self._shared:
                self._unheld(token)
            if token in self._ending:
                self._ending.discard(token)
                return None
            return timer_id

    def holds(self, token: str) -> bool:
        """Whether ``token``'s lease is kept here (its ending not written yet)."""
        return token in self._runs

    def tokens(self) -> list[str]:
        with self._lock:
            return list(self._runs)

    def __contains__(self, token: object) -> bool:
        with self._lock:
            return token in self._runs

    def __len__(self) -> int:
        with self._lock:
            return len(self._runs)


class SharedUntil(Protocol):
    """A float shared with another process (a ``multiprocessing`` ``RawValue('d')``)."""

    value: float


def fresh_in(cell: SharedUntil, margin: float) -> bool:
    """In the process that starts a run: whether its lease, as shared by the listener
    (:meth:`HeldRuns.share`), holds for ``margin`` seconds yet: the check of
    :meth:`HeldRuns.fresh`, made where the run's code is."""
    return time.monotonic() + margin < cell.value


def sync_twin(client: Any, socket_timeout: float) -> redis.Redis | redis.RedisCluster:
    """A synchronous client for the server an asyncio client talks to."""
    watched = sentinel.sync_twin_of(client, socket_timeout) or cluster.sync_twin_of(
        client, socket_timeout)
    if watched is not None:
        return watched
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    if "server" in kwargs and type(client).__module__.startswith("fakeredis"):
        import fakeredis  # the unit tests' in-memory server

        return fakeredis.FakeRedis(server=kwargs["server"], db=kwargs.get("db", 0))
    cls: type[redis.connection.AbstractConnection] = getattr(
        redis.connection, pool.connection_class.__name__, redis.Connection)
    accepted: set[str] = set()
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is not None:
            accepted |= set(inspect.signature(init).parameters)
    settings = {k: v for k, v in kwargs.items()
                if (k in _PASSED_ON or k.startswith("ssl_")) and k in accepted}
    return redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=cls, socket_timeout=socket_timeout, **settings))


def renewal_timeout(lease: float) -> float:
    """How long one renewal call may wait on a socket (seconds): a third of the lease,
    the keeper's own interval, so a call that hangs fails and is tried again well before
    the lease lapses."""
    return max(0.5, lease / 3)


class LeaseKeeper:
    """Renews the leases of :class:`HeldRuns` every ``lease / 3`` seconds from a thread.

    Logs at WARNING each lease found lost (another listener may run that timer again) and
    each change between renewals failing and working again, not every failed attempt.
    """

    def __init__(self, client: redis.Redis | redis.RedisCluster, keys: Keyspace, lease: float,
                 held: HeldRuns) -> None:
        self.client = client
        self.lease = lease
        self.held = held
        self._scripts = Scripts(client, keys)
        self._stop = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._main, name="timers-leases", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop renewing, wait for the thread, then close the connection (blocking)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.client.close()

    def _main(self) -> None:
        while not self._stop.wait(self.lease / 3):
            self.renew_once()

    def renew_once(self) -> None:
        tokens = self.held.tokens()
        if not tokens or self._stop.is_set():
            return
        sent = time.monotonic()
        try:
            lost = self._scripts.renew(round(self.lease * 1000), tokens)
        except RETRYABLE as exc:
            if not self._failing:
                self._failing = True
                log.warning("lease renewal failed: %s; retrying every %.1f s (leases of "
                            "running timers lapse if this lasts %g s)",
                            exc or type(exc).__name__, self.lease / 3, self.lease)
            return
        if self._failing:
            self._failing = False
            log.warning("lease renewal works again")
        gone = {as_text(token) for token in lost}
        self.held.confirm((t for t in tokens if t not in gone), sent)
        for text in gone:
            timer_id = self.held.drop_lost(text)  # no use renewing it again
            if timer_id is not None:
                log.warning("lease of run %s (timer %s) lapsed and the run was recovered "
                            "elsewhere: this listener starts nothing it was handed with it",
                            text, timer_id)


REVALIDATE_FOR = 60.0
"""How long a stale run's lease is asked about while Redis cannot answer (seconds)."""


class Fence:
    """Whether this listener may start a run: only while it holds the run's lease.

    :meth:`fresh` is the cheap local check (no round trip, safe from any thread): true while
    renewals keep the lease. After a stall it is false, and :meth:`revalidate` asks Redis:
    the run starts only if its lease is still this listener's (renewed now). A run whose
    lease lapsed and that another listener took over is not started here.
    """

    def __init__(self, held: HeldRuns, scripts: Scripts, lease: float) -> None:
        self.held, self.scripts, self.lease = held, scripts, lease
        self.fresh: Callable[[str], bool] = held.fresh
        """Whether the run under ``token`` may start now without asking Redis (asked
        twice per run: the held runs' own check, with no call in between)."""

    async def revalidate(self, run: Run) -> bool:
        """Whether ``run``'s lease is still this listener's, asked of Redis (and renewed).
        While Redis cannot be asked (a failover), it asks again: nobody can take the run
        over meanwhile, and a lease that lapsed but was not taken over is renewed. Given
        up after :data:`REVALIDATE_FOR` s: False (not started; its lease lapses and it runs
        again elsewhere). Answering False at once instead dropped a run still held next in
        line on its key, and the key's next timer started before it.

        A run next in line is renewed with the run before it while that one's ending is
        not written: its lease may have lapsed in the same stall, and a claim that reran it
        would take this one back (T5) a moment after it started here."""
        tokens = [run.token]
        if run.follows and self.held.holds(run.follows):
            tokens.append(run.follows)
        gave_up = time.monotonic() + REVALIDATE_FOR
        delays = ReconnectDelays(min(0.05, self.lease / 8), self.lease / 4)
        while True:
            sent = time.monotonic()
            try:
                lost = await self.scripts.renew(round(self.lease * 1000), tokens)
                break
            except RETRYABLE as exc:
                if sent >= gave_up:
                    log.warning("timer %s not started: its lease could not be checked for "
                                "%.0f s after a stall (%s)", run.timer_id, REVALIDATE_FOR,
                                exc or type(exc).__name__)
                    return False
            await asyncio.sleep(delays.next())
        gone = {as_text(token) for token in lost}
        if run.token in gone:
            log.warning("timer %s not started: this listener stalled past its lease and "
                        "another listener took the run over", run.timer_id)
            return False
        self.held.confirm([t for t in tokens if t not in gone], sent)
        return True


async def still_held(scripts: Scripts, lease_ms: int, runs: list[Run], waited: float,
                     what: str) -> list[Run]:
    """The runs among ``runs`` whose leases are still this listener's, renewed now.

    A reply read late (the event loop was blocked, or the network stalled past half a
    lease) may name runs whose lease lapsed meanwhile and that another listener took over:
    only those still held are run here.
    """
    lost = {as_text(token) for token in await scripts.renew(lease_ms, [r.token for r in runs])}
    for run in runs:
        if run.token in lost:
            log.warning("timer %s: its %s was read %.1f s late (event loop blocked?) and "
                        "another listener took the run over: not running it here",
                        run.timer_id, what, waited)
    return [run for run in runs if run.token not in lost]
