"""What an app's own tests need: timers in memory, run on demand, with time to advance.

    from timers.testing import TimersTest

    def test_signup_sends_the_reminder_a_day_later():
        with TimersTest() as t:            # timers.* and timers.aio.* now use it
            app.sign_up("ann@example.com")     # calls timers.schedule(..., in_=86400)
            assert t.run_due() == []           # nothing due yet
            t.advance(hours=24)
            (run,) = t.run_due()               # the real listener ran the reminder
            assert run.outcome.ok

With pytest, the ``timers_test`` fixture gives the same object (``pip install
'redis-timers[testing]'``; the plugin is registered by the package's ``pytest11`` entry point).

How it works, so that a test tests what production does:

- The server is an in-memory fakeredis server running timers' own Lua scripts
  (``fakeredis[lua]``). The default instances of [`timers`][module-level-functions] and
  [`timers.aio`][asyncio-timersaio] point at it inside the block (a ``configure()`` the app calls
  there leaves them so); the previous ones are back (unclosed) after it. So does every
  ``Timers``/``AsyncTimers`` the app makes inside the block from a URL or from none (a FastAPI
  lifespan's); one made before it, or on a redis-py client of the app's own, raises at its first
  call instead (`timers.store.connect.InMemoryServer`).
- Flow gates run as in production: a concurrency key's timers run in turn. A rate limit
  holds what is over it (``wait.kind == "rate"``) until
  [`TimersTest.advance`][timers.testing.TimersTest.advance] moves its clock (with the due times) to
  its next slot; ``run_all`` goes slot by slot.
- [`TimersTest.run_due`][timers.testing.TimersTest.run_due] runs a real
  [`timers.listener.Listener`][timers.listener.Listener] in burst mode, in this process: the same
  claim, policies (retries, max lateness …), recurrences and endings as ``timers listen``. A retry
  or a new timer that a run makes due at once runs in the same call. ``concurrency=1`` (the default
  here) runs timers one at a time, in due order.
- Due times are computed by the server's clock (``TIME`` inside the scripts), which a test
  cannot move. So [`TimersTest.advance`][timers.testing.TimersTest.advance] moves every pending
  timer that much earlier instead (a reschedule of each, the same operation as
  [`timers.reschedule`][timers.producer.client.Timers.reschedule]), brings each rate limit's next
  free slot (and the timer promoted to it) that much closer, and adds it to
  [`TimersTest.now`][timers.testing.TimersTest.now]. Timers waiting in a rate limit's or a
  concurrency key's queue stay there, in their order: the runs before them let them go, as in
  production, and ``run_all`` advances to each next rate slot as to a due time. What a test sees is
  what it would see had that much time passed: a timer due in 24 h runs after ``advance(hours=24)``,
  not after ``advance(hours=23)``. Times recorded by the server (a
  [`Fired`][timers.model.runs.Fired] report's ``due_ms``, ``timers.current().due``, failure times)
  stay on the server's real clock, as does an absolute time (``at=``, a cron expression) given after
  an advance; relative ones (``in_=``) are exact. A recurrence's next occurrence counts from the
  previous one on the real clock: on the test's clock it comes late by the time advanced so far
  (only the first occurrence is on time).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import timers
import timers.aio
from timers.exceptions import StillDue
from timers.listener import Listener
from timers.listener.calling.context import TimerContext, entered
from timers.model.encoding import Record, as_text, is_occurrence_id
from timers.model.keys import DEFAULT_GROUP, DEFAULT_PREFIX
from timers.model.runs import Fired
from timers.ops.failures import Failure
from timers.ops.flow_views import Parked, group_of, priority_of
from timers.ops.pending import PendingTimer
from timers.producer.async_client import AsyncTimers
from timers.producer.client import Timers
from timers.producer.loops import PerLoop
from timers.store import connect

if importlib.util.find_spec("fakeredis") is None or importlib.util.find_spec("lupa") is None:
    raise ImportError(
        "timers.testing needs fakeredis with Lua support: pip install 'redis-timers[testing]' "
        "(or fakeredis[lua])")

import fakeredis  # after the check, so a missing one gets the line above

__all__ = ["StillDue", "TimersTest", "timer_context"]

MAX_BURSTS = 100
"""Listener bursts one [`TimersTest.run_due`][timers.testing.TimersTest.run_due] may take before it
gives up."""
_ALL = 1_000_000
"""As many pending timers as a test can have (listings are limited)."""


class TimersTest:
    """An in-memory server for timers, the defaults pointed at it, and a listener on demand.

    ``tasks``: the app's tasks package, as ``timers listen --tasks`` takes it (default
    ``$TIMERS_TASKS`` or ``tasks``), imported from ``search_path`` (default the working
    directory); ``registry`` adds callables by name, as for [`Listener`][timers.listener.Listener].
    ``groups``: the groups its listener serves (default: every group that has timers pending).
    """

    def __init__(self, tasks: str | None = None, *, prefix: str = DEFAULT_PREFIX,
                 registry: Mapping[str, Callable[..., Any]] | None = None,
                 search_path: str | None = None, concurrency: int = 1,
                 groups: Sequence[str] | None = None) -> None:
        self.server = fakeredis.FakeServer()
        self.timers = Timers(fakeredis.FakeRedis(server=self.server), prefix=prefix)
        self.timers.warn_in_event_loop = False  # in memory: nothing to block on
        """A sync client on the in-memory server (the admin calls: stats, failures …)."""
        self.fired: list[Fired] = []
        """Every run so far, in the order they ended."""
        self.offset = timedelta(0)
        """How far [`advance`][timers.testing.TimersTest.advance] has moved time so far."""
        self._listener_options: dict[str, Any] = {
            "prefix": prefix, "tasks": tasks, "registry": registry,
            "search_path": search_path, "concurrency": concurrency, "shutdown_timeout": 5.0,
            # its in-memory server answers a gate call slower than a rate's start window
            "rate_start_window": None}
        self._saved: tuple[Any, ...] | None = None
        self._saved_server: connect.InMemoryServer | None = None
        self._groups = tuple(groups) if groups else None

    # -- the defaults ----------------------------------------------------------------

    def __enter__(self) -> TimersTest:
        """Point ``timers.*``, ``timers.aio.*`` and every ``Timers``/``AsyncTimers`` made from
        a URL (or none) at this server until the block ends; a client made before it, or
        on a redis-py client of the app's own, raises at its first call instead."""
        async_default = PerLoop(lambda: AsyncTimers(  # one per event loop, as in production
            fakeredis.FakeAsyncRedis(server=self.server), prefix=self.timers.keys.prefix))
        with timers._default_lock, timers.aio._default_lock:
            self._saved = (timers._default, timers.aio._default, timers._pinned)
            self._saved_server = connect.in_memory_server
            timers._default = self.timers
            timers.aio._default = async_default
            timers._pinned = timers.aio._pinned = True  # configure() inside keeps them
            connect.in_memory_server = connect.InMemoryServer(  # every client the app makes too
                sync_client=lambda: fakeredis.FakeRedis(server=self.server),
                async_client=lambda: fakeredis.FakeAsyncRedis(server=self.server),
                serves=self._serves)
        return self

    def _serves(self, client: object) -> bool:
        """True for a client of this test's in-memory server."""
        pool = getattr(client, "connection_pool", None)
        kwargs = getattr(pool, "connection_kwargs", None) or {}
        return kwargs.get("server") is self.server

    def __exit__(self, *exc: object) -> None:
        """Put the previous defaults back (they were not closed)."""
        if self._saved is None:
            return
        with timers._default_lock, timers.aio._default_lock:
            timers._default, timers.aio._default, pinned = self._saved
            timers._pinned = timers.aio._pinned = pinned
            connect.in_memory_server = self._saved_server
        self._saved = None

    # -- time ------------------------------------------------------------------------

    def now(self) -> datetime:
        """The test's now (UTC): the real time plus what
        [`advance`][timers.testing.TimersTest.advance] added."""
        return datetime.now(UTC) + self.offset

    def advance(self, delta: timedelta | float = 0, *, seconds: float = 0, minutes: float = 0,
                hours: float = 0, days: float = 0) -> None:
        """Let time pass: every pending timer comes that much closer to its due time.

        It does not run them: [`run_due`][timers.testing.TimersTest.run_due] does. ``delta`` is a
        timedelta or seconds."""
        shift = (delta if isinstance(delta, timedelta) else timedelta(seconds=delta)) + \
            timedelta(seconds=seconds, minutes=minutes, hours=hours, days=days)
        if shift < timedelta(0):
            raise ValueError(f"time only moves forward, got {shift}")
        self.offset += shift
        for timer in self.timers.list(limit=_ALL):
            if timer.wait is None or timer.wait.kind == "group":
                self.timers.reschedule(timer.id, at=max(timer.due - shift, _EPOCH))
        self._shift_rates(round(shift.total_seconds() * 1000))

    def _shift_rates(self, shift_ms: int) -> None:
        """Rate limits' clocks, which the server keeps on its real clock, come ``shift_ms``
        closer too: each limit's next free slot (GCRA ``tat``), and the slot of the timer
        promoted to it (in its due index at that time). Timers waiting in a queue (for a
        rate or a concurrency key) are left there, in their order: time alone does not
        free them."""
        if shift_ms <= 0:
            return
        redis, keys = self.timers.redis, self.timers.keys
        parked = {as_text(i): Parked.read(v) for i, v in redis.hgetall(keys.parked).items()}
        promoted = {i: p for i, p in parked.items() if p is not None and p.state == "R"}
        records = redis.hmget(keys.records, list(promoted)) if promoted else []
        pipe = redis.pipeline(transaction=True)
        for (escaped, p), value in zip(promoted.items(), records, strict=True):
            if value is None:
                continue  # cancelled meanwhile
            record = Record.decode(as_text(value))
            index = keys.due_index(group_of(record), priority_of(record))
            pipe.zincrby(index, -shift_ms, escaped)
            pipe.hset(keys.parked, escaped, "|".join(
                (p.state, str(p.a), str(p.b), str(max(p.c - shift_ms, 0)), p.name)))
        for state in redis.scan_iter(match=keys.rate("*"), count=1000):
            tat = redis.hget(state, "tat")
            if tat is not None:
                pipe.hset(state, "tat", str(max(int(float(tat)) - shift_ms, 0)))
        pipe.execute()

    # -- running ---------------------------------------------------------------------

    def run_due(self) -> list[Fired]:
        """Run every timer due now (and what its runs make due now, such as a retry
        without backoff) through the listener; the reports of those runs, in order."""
        return _run_sync(self.arun_due)

    def run_all(self, max_rounds: int = MAX_BURSTS) -> list[Fired]:
        """Run everything pending, advancing time to each next due time (a rate limit's
        clock too), until only the occurrences of recurrences are left (they would go on
        for ever); the reports."""
        return _run_sync(lambda: self.arun_all(max_rounds))

    async def arun_due(self) -> list[Fired]:
        """[`run_due`][timers.testing.TimersTest.run_due] for an async test (inside a running event
        loop)."""
        ran: list[Fired] = []
        for _ in range(MAX_BURSTS):
            await self._burst(ran)
            head = self._next_due(include_recurrences=True)
            if head is None or head.due > datetime.now(UTC):
                return ran
        raise StillDue(f"timers were still due after {MAX_BURSTS} listener runs (last "
                       f"ran: {ran[-1].task if ran else None!r}): a task that schedules a "
                       f"timer due at once every time it runs?")

    async def arun_all(self, max_rounds: int = MAX_BURSTS) -> list[Fired]:
        """[`run_all`][timers.testing.TimersTest.run_all] for an async test (inside a running event
        loop)."""
        ran = await self.arun_due()
        for _ in range(max_rounds):
            head = self._next_due(include_recurrences=False)
            if head is None:
                return ran
            wait = head.due - datetime.now(UTC)
            if wait > timedelta(0):
                self.advance(wait)
            ran += await self.arun_due()
        raise StillDue(f"timers were still pending after {max_rounds} rounds of run_all "
                       f"(next: {self._next_due(include_recurrences=False)}): tasks that "
                       f"keep scheduling timers?")

    async def _burst(self, ran: list[Fired]) -> None:
        def observe(report: Fired) -> None:
            ran.append(report)
            self.fired.append(report)

        client = fakeredis.FakeAsyncRedis(server=self.server)
        listener_log = logging.getLogger("timers.listener")
        listener_log.addFilter(_no_server_checks)
        try:
            listener = Listener(client, observer=observe, groups=self._served(),
                                **self._listener_options)
            await listener.run(burst=True)
        finally:
            listener_log.removeFilter(_no_server_checks)
            await client.aclose()

    def _served(self) -> tuple[str, ...]:
        """The groups given, else every group with a due index (and the default group)."""
        if self._groups:
            return self._groups
        queues = self.timers.redis.smembers(self.timers.keys.queues)
        return tuple(sorted({DEFAULT_GROUP} | {as_text(q).rpartition("|")[0] for q in queues}))

    def _next_due(self, include_recurrences: bool) -> PendingTimer | None:
        """The soonest pending timer that time alone makes due, on the server's clock (not
        shifted by the offset): one waiting in a queue for a rate limit or a concurrency
        key is let go by the runs before it, not by time (the one a rate limit promoted is
        due at its slot)."""
        for timer in self.timers.list(limit=_ALL):
            waits = timer.wait is not None and timer.wait.waiting and timer.wait.kind != "group"
            if not waits and (include_recurrences or not is_occurrence_id(timer.id)):
                return timer
        return None

    # -- inspection ------------------------------------------------------------------

    def pending(self) -> list[PendingTimer]:
        """The pending timers, soonest first; their due times on the test's clock
        ([`now`][timers.testing.TimersTest.now])."""
        return [replace(t, due=t.due + self.offset) for t in self.timers.list(limit=_ALL)]

    def failed(self) -> list[Failure]:
        """The timers that failed for good (the records ``timers failed`` lists)."""
        return self.timers.failed(limit=_ALL)

    def ran(self, task: str | None = None) -> list[Fired]:
        """The runs so far (of ``task`` if given), in the order they ended."""
        return [f for f in self.fired if task is None or f.task == task]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _no_server_checks(record: logging.LogRecord) -> bool:
    """Drop the listener's warnings about a real server's settings (keyspace events,
    eviction): the in-memory server has none to fix, and a test's log should not say so
    at every run."""
    return record.module != "preflight"


def _run_sync(make: Callable[[], Coroutine[Any, Any, list[Fired]]]) -> list[Fired]:
    """Run the coroutine ``make()`` returns to its end, from a test that has no event loop
    running in this thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    raise RuntimeError("run_due()/run_all() cannot run inside a running event loop (an "
                       "async test): await arun_due() / arun_all() instead")


@contextlib.contextmanager
def timer_context(id: str = "test-timer", task: str = "", *, attempt: int = 1,
                  due: datetime | None = None, lateness: float = 0.0,
                  recurrence: str | None = None) -> Iterator[TimerContext]:
    """Give a task called directly from a test the context
    [`timers.current`][timers.listener.calling.context.current] returns under the listener."""
    when = due or datetime.now(UTC)
    with entered(TimerContext(id, task, attempt, when, when, lateness, recurrence)) as context:
        yield context

