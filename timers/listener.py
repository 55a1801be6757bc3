"""The listener: finds due timers, claims them, runs them, records how they ended.

Four loops share one asyncio event loop:

- **events**: subscribed to ``__keyevent@<db>__:expired`` and the wake channel. An expired
  timer key names its timer id, which goes to the next claim; a wake message moves the
  next due time earlier. Undecodable keys and refused tasks are recorded as rejected.
- **sweep**: sleeps until the earliest due time or lease deadline (see
  :mod:`timers.sweeper`), then claims what is due, up to the free task slots, in one
  atomic script call. Every timer goes through this one claim, whichever path found it,
  so each runs once however many listeners race for it. It sweeps at start and after
  every reconnect, which covers events lost while the listener was away.
- **leases** (a thread: :mod:`timers.lease_keeper`, so a blocked loop cannot starve it):
  keeps a live listener's timers; a dead one's run again once their lease lapses.
- **finish**: writes the endings of runs in batches: counts, failure records, retries.

Plus a heartbeat, so ``timers listeners`` shows who is alive. On ``stop()`` the listener
stops claiming, gives running tasks ``shutdown_timeout`` seconds, and hands the unfinished
runs back to the due index so another listener runs them at once, not after a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from timers.check import ENABLE_EVENTS, expired_events_on
from timers.client import configured_url
from timers.clock import Clock, SystemClock
from timers.connection import listener_client
from timers.crashes import crash_outcome, listener_name
from timers.cron import RECURRENCE_OPTION, RecurrenceHook
from timers.encoding import Entry, Record, as_text, entry_text, escape_id
from timers.eviction import EvictionUnsafe, judge, read_policy, report_late_finishes
from timers.exceptions import MalformedTimerKey, TaskRefused, TasksUnavailable
from timers.keys import DEFAULT_PREFIX, Keyspace
from timers.lease_keeper import HeldRuns, LeaseKeeper, sync_twin
from timers.loader import TASKS_ENV, TaskLoader, configured_package
from timers.loop_watch import LoopWatch
from timers.memory_guard import MemoryGuard
from timers.permissions import (
    SWEEP_ONLY_MAX_SLEEP,
    SWEEPER_ONLY,
    PermissionMissing,
    check_at_start,
    explain,
    is_permanent,
)
from timers.policy import DEFAULT_POLICY, TaskPolicy, policy_of
from timers.precise import PreciseSleeper
from timers.quarantine import Quarantine, is_suspect
from timers.runner import Runner
from timers.runs import Fired, Outcome, Run, failure_entry, rejected_entry
from timers.scripts import register_all
from timers.sweeper import CLAIM_LEAD_MS, DueTracker

log = logging.getLogger("timers.listener")

TRANSIENT = (RedisConnectionError, RedisTimeoutError, ConnectionError, TimeoutError, OSError)
RETRYABLE = (*TRANSIENT, redis.RedisError)
"""Errors a loop outlives by retrying with backoff: a lost connection, and also a server
that refuses for a while (OOM under noeviction, READONLY after a failover, LOADING)."""
DEFAULT_LEASE = 15.0
DEFAULT_CONCURRENCY = 32
DEFAULT_FAILURE_RETENTION = 7 * 86400.0
MAX_CLAIM_BATCH = 500
HEARTBEAT_INTERVAL = 10.0
PUBSUB_POLL = 1.0
"""Seconds between reads of the subscription; each read also runs redis-py's health check."""


class _Backoff:
    """Exponential delays for reconnecting: 0.1 s doubling to 5 s."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first, self.cap, self.current = first, cap, first

    def next(self) -> float:
        delay, self.current = self.current, min(self.current * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.current = self.first


class _ConnectionState:
    """Logs each change of a connection's health once, not once per attempt."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.lost = False

    def failed(self, exc: BaseException) -> None:
        if not self.lost:
            self.lost = True
            log.warning("%s lost: %s; retrying", self.what, exc or type(exc).__name__)

    def ok(self) -> None:
        if self.lost:
            self.lost = False
            log.warning("%s back", self.what)


class Listener:
    """Runs timers as they come due. Start it with ``await listener.run()``.

    ``redis_`` is a URL or a ``redis.asyncio.Redis`` that returns bytes (the listener reads
    key names that may not be UTF-8). ``tasks`` is the package whose functions may run
    (default ``$TIMERS_TASKS`` or ``tasks``, imported from ``search_path``, by default the
    working directory); ``registry`` adds callables by explicit name.
    """

    def __init__(
        self,
        redis_: str | redis.asyncio.Redis | None = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        tasks: str | None = None,
        registry: Mapping[str, Callable[..., Any]] | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        lease: float = DEFAULT_LEASE,
        failure_retention: float = DEFAULT_FAILURE_RETENTION,
        max_sleep: float = 60.0,
        shutdown_timeout: float = 30.0,
        clock: Clock | None = None,
        observer: Callable[[Fired], None] | None = None,
        search_path: str | None = None,
        allow_eviction: bool = False,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if lease < 0.1:
            raise ValueError("lease must be at least 0.1 seconds")
        if isinstance(redis_, redis.asyncio.Redis):
            if redis_.connection_pool.connection_kwargs.get("decode_responses"):
                raise ValueError("the listener needs a client with decode_responses=False")
            self.redis = redis_
            self._owns_client = False
        else:
            self.redis = listener_client(configured_url(redis_))
            self._owns_client = True
        self.keys = Keyspace(prefix)
        self.db = int(self.redis.connection_pool.connection_kwargs.get("db", 0) or 0)
        self._tasks_optional = bool(registry) and tasks is None and not os.environ.get(TASKS_ENV)
        self.loader = TaskLoader(
            configured_package(tasks),
            registry,
            os.getcwd() if search_path is None else search_path,
        )
        self.concurrency = concurrency
        self.lease = lease
        self.failure_retention = failure_retention
        self.shutdown_timeout = shutdown_timeout
        self.clock = clock or SystemClock()
        self.tracker = DueTracker(self.clock, max_sleep=max_sleep)
        self.observer = observer
        self._scripts = register_all(self.redis)
        self._recurrences = RecurrenceHook(self.redis, self.keys)
        self._runner = Runner(concurrency, on_free=lambda: self._slot_freed.set())
        self._precise = PreciseSleeper()
        self._memory = MemoryGuard()
        self.allow_eviction = allow_eviction
        self._eviction_policy: str | None = None
        self._timer_key_start = self.keys.timer_key_start.encode()
        self._expired_channel = self.keys.expired_channel(self.db).encode()
        self._wake_channel = self.keys.wake_channel.encode()
        self._event_ids: dict[str, None] = {}
        self._running: dict[str, Run] = {}
        self._held = HeldRuns()  # tokens whose lease we keep: running or unflushed
        self._finished: list[tuple[str, str, str, str]] = []
        # endings not yet written, by token: (escaped id, due ms, ending)
        self._unwritten: dict[str, tuple[str, int, tuple[str, str, str, str]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._poke = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._finish_ready = asyncio.Event()
        self._stopping = asyncio.Event()  # stop claiming
        self._closed = asyncio.Event()  # running tasks are done: stop renewing leases too
        self._aborting = False
        self._burst = False
        self.failed = False
        self._abort_event = asyncio.Event()
        self.subscribed = asyncio.Event()
        self.fired_count = 0
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._quarantine = Quarantine(self.loader, listener_name(self.id))
        self.started_at = time.time()

    # -- running ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None, *, burst: bool = False) -> None:
        """Listen until ``stop`` is set (or, with ``burst``, until nothing is due).

        On the way out it stops claiming, lets running tasks finish for up to
        ``shutdown_timeout`` seconds and writes their endings.
        """
        self._burst = burst
        try:  # the whole tasks package, off the loop, before any claim
            await asyncio.to_thread(self.loader.load_at_start, self._tasks_optional)
        except TasksUnavailable:
            if self._owns_client:
                await self.redis.aclose()
            raise
        await self._check_notifications()
        await self._check_eviction()
        events = await self._check_permissions()
        keeper = LeaseKeeper(sync_twin(self.redis, min(15.0, max(1.0, self.lease))),
                             self.keys.running, self.lease, self._held).start()
        watch = LoopWatch(asyncio.get_running_loop(), self._runner.on_loop.copy).start()
        loops = [
            asyncio.create_task(self._events_loop() if events else self._no_events(),
                                name="timers-events"),
            asyncio.create_task(self._finish_loop(), name="timers-finish"),
            asyncio.create_task(self._heartbeat_loop(), name="timers-heartbeat"),
        ]
        for loop_task in loops:
            loop_task.add_done_callback(self._loop_ended)
        watcher = asyncio.create_task(self._watch(stop)) if stop is not None else None
        try:
            await self._sweep_loop(burst)
        finally:
            self._stopping.set()
            if watcher is not None:
                watcher.cancel()
            await self._drain()
            self._closed.set()
            await asyncio.to_thread(keeper.close)
            watch.close()
            for loop_task in loops:
                loop_task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._flush_remaining()
            with contextlib.suppress(*TRANSIENT, redis.RedisError):
                await self._heartbeat(alive=False)
            self._runner.shutdown()
            self._precise.close()
            if self._owns_client:
                await self.redis.aclose()

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """A loop must only end on stop: if one dies of a bug, stop rather than limp on
        (``--processes`` restarts the listener; alone, it exits nonzero)."""
        if task.cancelled() or self._closed.is_set():
            return
        exc = task.exception()
        if exc is not None:
            log.critical("%s loop died: %r; stopping the listener", task.get_name(), exc,
                         exc_info=exc)
            self.failed = True
            self.abort()

    def stop(self) -> None:
        """Stop claiming, let running tasks finish (up to ``shutdown_timeout``), hand the
        rest back, and return from :meth:`run`. Only sets flags: safe in a signal handler."""
        self._stopping.set()
        self._poke.set()
        self._slot_freed.set()

    def abort(self) -> None:
        """Like :meth:`stop`, without waiting for running tasks: they are handed back."""
        self._aborting = True
        self._abort_event.set()
        self.stop()

    @property
    def aborted(self) -> bool:
        return self._aborting

    async def _watch(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stop()

    async def _drain(self) -> None:
        """Wait for running tasks, then hand back the runs that did not finish."""
        running = [t for t in self._tasks if not t.done()]
        if running and not self._aborting:
            log.info("waiting up to %gs for %d running task(s)", self.shutdown_timeout,
                     len(running))
            waiter = asyncio.create_task(self._until_aborted())
            everything: asyncio.Future[Any] = asyncio.gather(*running, return_exceptions=True)
            either: list[asyncio.Future[Any]] = [everything, waiter]
            await asyncio.wait(either, timeout=self.shutdown_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        unfinished = list(self._running)
        for token in unfinished:
            self._running.pop(token, None)
            self._finished.append((token, "release", "", ""))
        for task in self._tasks:
            task.cancel()
        if unfinished:
            log.warning("handing back %d unfinished run(s) to run elsewhere", len(unfinished))

    async def _until_aborted(self) -> None:
        await self._abort_event.wait()

    async def _flush_remaining(self) -> None:
        """Write what is left to finish, trying for a few seconds if Redis is away."""
        deadline = self.clock.monotonic() + 5.0
        while self._finished and self.clock.monotonic() < deadline:
            try:
                await self._flush()
            except RETRYABLE:
                await asyncio.sleep(0.2)
        if self._finished:
            log.error("could not write %d run ending(s) before exit; their leases will lapse "
                      "and they will run again", len(self._finished))

    async def _check_notifications(self) -> None:
        try:
            reply = await self.redis.config_get("notify-keyspace-events")
        except redis.ResponseError as exc:
            log.warning(
                "cannot read notify-keyspace-events (%s): timers will fire through the "
                "sweeper alone, which stays on time", exc)
            return
        except RETRYABLE as exc:
            log.warning("cannot reach Redis yet (%s); will keep trying", exc)
            return
        flags = as_text(next(iter(reply.values()), None) or b"")
        if not expired_events_on(flags):
            log.warning(
                "KEYSPACE EVENTS ARE OFF (notify-keyspace-events=%r): timers fire through "
                "the due-driven sweeper alone. Turn expired events on with %s",
                flags, ENABLE_EVENTS)

    async def _check_eviction(self) -> None:
        """Refuse to start where Redis may evict the due index (see :mod:`timers.eviction`)."""
        with contextlib.suppress(*RETRYABLE):
            self._eviction_policy = await read_policy(self.redis)
        try:
            judge(self._eviction_policy, self.allow_eviction)
        except EvictionUnsafe:
            if self._owns_client:
                await self.redis.aclose()
            raise

    async def _check_permissions(self) -> bool:
        """Refuse to start if the Redis user may not run scripts; False (sweeper alone)
        if it may not subscribe (see :mod:`timers.permissions`)."""
        try:
            missing = await check_at_start(self.redis, self.keys, self.db)
        except PermissionMissing:
            if self._owns_client:
                await self.redis.aclose()
            raise
        if missing:
            self.tracker.max_sleep = min(self.tracker.max_sleep, SWEEP_ONLY_MAX_SLEEP)
        return "events" not in missing

    async def _no_events(self) -> None:
        """The events loop of a listener whose user may not subscribe: nothing to do."""
        self.subscribed.set()
        await self._stopping.wait()

    def _give_up(self, exc: BaseException) -> None:
        """A permanent error (see :func:`timers.permissions.is_permanent`): one line with
        the fix, and stop with a failure rather than retry it forever."""
        log.error("cannot claim timers: %s; stopping", explain(exc, self.keys))
        self.failed = True
        self.stop()

    # -- sweep and claim --------------------------------------------------------------

    def _free_slots(self) -> int:
        return self.concurrency - len(self._running) - self._runner.stuck

    async def _sweep_loop(self, burst: bool) -> None:
        backoff = _Backoff()
        state = _ConnectionState("connection to Redis")
        while not self._stopping.is_set():
            if self._free_slots() <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            self._poke.clear()
            limit = min(self._free_slots(), MAX_CLAIM_BATCH)
            try:
                claimed = await self._claim(limit)
            except redis.exceptions.OutOfMemoryError as exc:
                await self._pause(self._memory.refused(exc))
                continue
            except RETRYABLE as exc:
                if is_permanent(exc):
                    self._give_up(exc)
                    break
                state.failed(exc)
                await self._wait_poke(backoff.next())
                continue
            state.ok()
            self._memory.claimed()
            backoff.reset()
            if claimed >= limit:
                continue
            if burst and self._idle():
                break
            delay = self.tracker.seconds_until_next()
            if claimed == 0:
                delay = max(delay, 0.0005)
            await self._wait_poke(delay)

    def _idle(self) -> bool:
        if self._running or self._event_ids:
            return False
        head = self.tracker.next_wake_ms()
        return head is None or head > self.tracker.redis_now_ms()

    async def _wait_poke(self, seconds: float) -> None:
        if self._poke.is_set() or seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._poke.wait()

    async def _claim(self, limit: int) -> int:
        ids = list(itertools.islice(self._event_ids, limit))
        for escaped in ids:
            del self._event_ids[escaped]
        k = self.keys
        sent = self.clock.monotonic()
        reply = await self._scripts["claim"](
            keys=[k.due, k.records, k.running, k.running_records, k.sequence, k.stats],
            args=[k.timer_key_start, limit, round(self.lease * 1000), round(2 * CLAIM_LEAD_MS),
                  self.id, *ids],
        )
        received = self.clock.monotonic()
        now_us, next_due, next_lease = (int(x) for x in reply[:3])
        self.tracker.observe_time(now_us, sent, received)
        self.tracker.observe_heads(
            None if next_due == -1 else next_due, None if next_lease == -1 else next_lease
        )
        items = reply[3:]
        runs = [Run.parse(items[i], items[i + 1], items[i + 2]) for i in range(0, len(items), 3)]
        if runs and received - sent > self.lease / 2:
            runs = await self._still_held(runs, received - sent)
        for run in runs:
            self._start(run)
        return len(items) // 3

    async def _still_held(self, runs: list[Run], waited: float) -> list[Run]:
        """The claims among ``runs`` whose leases are still this listener's.

        A claim's reply read late (the event loop was blocked, or the network stalled past
        half a lease) may name runs whose lease lapsed meanwhile and that another listener
        took over: they are renewed now, and only those still held are run here.
        """
        lost = {as_text(token) for token in await self._scripts["renew"](
            keys=[self.keys.running], args=[round(self.lease * 1000), *(r.token for r in runs)])}
        for run in runs:
            if run.token in lost:
                log.warning("timer %s: its claim was read %.1f s late (event loop blocked?) "
                            "and another listener took the run over: not running it here",
                            run.timer_id, waited)
        return [run for run in runs if run.token not in lost]

    # -- running tasks ----------------------------------------------------------------

    def _start(self, run: Run) -> None:
        if run.source == "recovered":
            done = self._unwritten_ending(run)
            if done is not None:
                # This listener ran the timer but could not write the ending before the
                # lease lapsed (Redis stalled): the run happened, so end the new claim the
                # same way instead of running the task twice.
                log.warning("timer %s: lease lapsed while its ending was on its way; "
                            "not running it again", run.timer_id)
                self._held.hold(run.token, run.timer_id)
                self._record_ending(run, (run.token, *done[1:]))
                return
        self._running[run.token] = run
        self._held.hold(run.token, run.timer_id)
        task = asyncio.create_task(self._execute(run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, run: Run) -> None:
        if run.due_ms > self.tracker.redis_now_ms():
            # claimed a few ms ahead: start exactly at the due time
            await self._precise.sleep_until(self.tracker.monotonic_at(run.due_ms))
        started = self.tracker.redis_now_ms()
        task: str | None = None
        args = None
        policy = DEFAULT_POLICY
        record: Record | None = None
        try:
            record = run.record()
            task, args = record.task, record.args
            recurring = RECURRENCE_OPTION in record.options
            # a recurrence's next occurrence is scheduled first, whatever becomes of this
            # one (even a task this listener cannot import must not end the chain)
            skip = (await self._recurrences.before_run(run, record, started)
                    if recurring else None)
            try:
                fn = self.loader.resolve(task)
                policy = policy_of(fn)
                missed = _missed(record, policy, started - run.due_ms)
                crashed = crash_outcome(run, policy)
                if skip is not None:
                    outcome = skip
                elif crashed is not None:
                    outcome = crashed
                elif missed is not None:
                    outcome = Outcome("missed", "Missed", missed)
                elif is_suspect(run.reruns):  # its listener died holding it: in a child
                    outcome = await self._quarantine.run(run.timer_id, task, fn, args, policy,
                                                         run.reruns)
                else:
                    outcome = await self._runner.call(fn, args, policy.timeout)
            except TaskRefused as exc:
                outcome = Outcome("refused", "TaskRefused", str(exc))
            if recurring:
                await self._recurrences.after_run(run, record, outcome)
        except MalformedTimerKey as exc:
            outcome = Outcome("malformed", "MalformedTimerKey", str(exc))
        except asyncio.CancelledError:
            return  # shutting down: _drain hands this run back
        except RETRYABLE as exc:
            # Redis went away around the run (a recurrence step): hand it back to run again
            log.warning("timer %s handed back: %s", run.timer_id, exc)
            self._finished.append((run.token, "release", "", ""))
            self._finish_ready.set()
            return
        except Exception as exc:
            log.exception("internal error around timer %s", run.timer_id)
            outcome = Outcome("error", type(exc).__qualname__, f"internal error: {exc}")
        finally:
            self._running.pop(run.token, None)
            self._slot_freed.set()
            if self._burst:
                self._poke.set()  # the sweep loop decides whether the burst is over
        try:
            ending = self._ending(run, record, outcome, policy)
        except Exception as exc:
            log.exception("could not decide how timer %s ended", run.timer_id)
            failure_id, data = failure_entry(
                run, Outcome("error", type(exc).__qualname__, f"internal error: {exc}"),
                task, args)
            ending = (run.token, "fail", failure_id, data)
        self._record_ending(run, ending)
        self.fired_count += 1
        self._finish_ready.set()
        if self.observer is not None:
            fired = Fired(run.timer_id, task, run.due_ms, started, self.tracker.redis_now_ms(),
                          run.source, run.attempt, outcome)
            try:
                self.observer(fired)
            except Exception:
                log.exception("observer failed")

    def _record_ending(self, run: Run, ending: tuple[str, str, str, str]) -> None:
        self._finished.append(ending)
        self._unwritten[run.token] = (run.escaped_id, run.due_ms, ending)
        self._finish_ready.set()

    def _unwritten_ending(self, run: Run) -> tuple[str, str, str, str] | None:
        """The ending of an earlier run of the same timer that is not written yet."""
        for escaped_id, due_ms, ending in self._unwritten.values():
            if escaped_id == run.escaped_id and due_ms == run.due_ms:
                return ending
        return None

    def _ending(
        self, run: Run, record: Record | None, outcome: Outcome, policy: TaskPolicy
    ) -> tuple[str, str, str, str]:
        """The finish item for a run: ok, a retry after a backoff, or a failure record."""
        if outcome.ok:
            return (run.token, "ok", "", "")
        if outcome.kind == "skipped":
            log.info("timer %s skipped: %s", run.timer_id, outcome.message)
            return (run.token, "skip", "", "")
        now_ms = round(time.time() * 1000)
        first_failure = record.options.get("f") if record else None
        delay = policy.retry_delay(run.attempt) if outcome.kind == "error" else None
        if record is not None and delay is not None:
            options = dict(record.options, a=str(run.attempt), f=first_failure or str(now_ms),
                           d=str(run.original_due_ms))
            retry = Record(record.task, record.args, options).encode(max_args_bytes=1 << 62)
            log.warning("timer %s (%s) failed, attempt %d; retrying in %.1fs: %s: %s",
                        run.timer_id, record.task, run.attempt, delay, outcome.error_type,
                        outcome.message[:300])
            return (run.token, "retry", entry_text(run.escaped_id, retry),
                    str(round(delay * 1000)))
        failure_id, data = failure_entry(
            run, outcome, record.task if record else None, record.args if record else None,
            first_failure_ms=int(first_failure) if first_failure else None,
        )
        log.warning("timer %s (%s) failed for good, attempt %d: %s: %s", run.timer_id,
                    record.task if record else "?", run.attempt, outcome.error_type,
                    outcome.message[:300])
        return (run.token, "fail", failure_id, data)

    # -- events -----------------------------------------------------------------------

    async def _events_loop(self) -> None:
        backoff = _Backoff()
        state = _ConnectionState("event subscription")
        while not self._stopping.is_set():
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._expired_channel, self._wake_channel)
                state.ok()
                backoff.reset()
                self.subscribed.set()
                self._poke.set()  # sweep: events may have been lost while unsubscribed
                # redis-py's get_message can swallow a cancellation, so the loop also ends
                # on the stop flag, within PUBSUB_POLL seconds
                while not self._stopping.is_set():
                    message = await pubsub.get_message(timeout=PUBSUB_POLL)
                    if message is not None:
                        try:
                            self._on_message(message)
                        except Exception:
                            # an event is data from the network: nothing it holds may stop
                            # the listener
                            log.exception("could not handle event %r", message)
            except redis.exceptions.NoPermissionError as exc:
                log.warning("%s. %s", explain(exc, self.keys), SWEEPER_ONLY)  # once: it ends
                self.tracker.max_sleep = min(self.tracker.max_sleep, SWEEP_ONLY_MAX_SLEEP)
                return
            except RETRYABLE as exc:
                self.subscribed.clear()
                state.failed(exc)
                await self._pause(backoff.next())
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _on_message(self, message: Mapping[str, Any]) -> None:
        if message.get("type") != "message":
            return
        channel, data = message["channel"], message["data"]
        if data is None:
            return
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        if channel == self._wake_channel:
            with contextlib.suppress(ValueError):
                due = float(data)
                if math.isfinite(due):
                    self.tracker.note_due(due)
            self._poke.set()
        elif channel == self._expired_channel and data.startswith(self._timer_key_start):
            self._on_expired(data)

    def _on_expired(self, key: bytes) -> None:
        """Pass the timer an expired key names to the next claim, or record a rejection.

        What runs is always the record stored with the pending timer, never the key name,
        so a forged key can at most make a due timer fire on time.
        """
        escaped: str | None = None
        try:
            entry = Entry.decode(as_text(key[len(self._timer_key_start):]))
            escaped = escape_id(entry.id)
            self.loader.resolve(entry.record.task)
        except (MalformedTimerKey, TaskRefused) as exc:
            log.warning("rejected expired key %r: %s", key[:120], exc)
            failure_id, data = rejected_entry(key, str(exc), escaped)
            self._finished.append(("", "reject", failure_id, data))
            self._finish_ready.set()
            return
        self._event_ids[escaped] = None
        self._poke.set()

    # -- leases and endings -----------------------------------------------------------

    async def _pause(self, seconds: float, until: asyncio.Event | None = None) -> None:
        """Sleep, but return at once when ``until`` (default: the stop flag) is set.

        Every loop checks its flag too: redis-py may swallow a task cancellation.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await (until or self._stopping).wait()

    async def _finish_loop(self) -> None:
        backoff = _Backoff()
        state = _ConnectionState("connection to Redis (finishing runs)")
        while not self._closed.is_set():
            if not self._finished:
                self._finish_ready.clear()
                await self._finish_ready.wait()
                continue
            try:
                await self._flush()
            except RETRYABLE as exc:
                state.failed(exc)
                await self._pause(backoff.next(), self._closed)
                continue
            state.ok()
            backoff.reset()

    async def _flush(self) -> None:
        """Write the first batch of run endings in one script call."""
        k = self.keys
        batch = self._finished[:MAX_CLAIM_BATCH]
        args: list[Any] = [k.timer_key_start, k.wake_channel, round(self.failure_retention * 1000)]
        for item in batch:
            args.extend(item)
        tokens = [item[0] for item in batch]
        # Renewed until the reply is read (the loop may block before it is), and a renewal
        # that crosses the ending drops them quietly.
        self._held.ending(tokens)
        try:
            late = await self._scripts["finish"](
                keys=[k.running, k.running_records, k.stats, k.failures, k.failure_records,
                      k.due, k.records, k.failure_index],
                args=args,
            )
        except BaseException:
            self._held.ending(tokens, sent=False)
            raise
        self._held.release(tokens)
        del self._finished[: len(batch)]
        report_late_finishes(int(late or 0), self._eviction_policy)
        for item in batch:
            self._unwritten.pop(item[0], None)

    async def _heartbeat_loop(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(*RETRYABLE):
                await self._heartbeat(alive=True)
            await self._pause(HEARTBEAT_INTERVAL)

    async def _heartbeat(self, alive: bool) -> None:
        info = json.dumps({
            "id": self.id, "host": socket.gethostname(), "pid": os.getpid(),
            "started": round(self.started_at), "running": len(self._running),
            "fired": self.fired_count, "concurrency": self.concurrency,
            "tasks": self.loader.package, "stuck": self._runner.stuck,
        }) if alive else ""
        await self._scripts["heartbeat"](
            keys=[self.keys.listeners, self.keys.listener_info],
            args=[self.id, round(HEARTBEAT_INTERVAL * 3000), info],
        )


def _missed(record: Record, policy: TaskPolicy, lateness_ms: float) -> str | None:
    """Why a run is too late to start, or None. The timer's own limit beats the task's."""
    limit_ms: float | None = None
    if "ml" in record.options:
        with contextlib.suppress(ValueError):
            limit_ms = float(record.options["ml"])
    elif policy.max_lateness is not None:
        limit_ms = policy.max_lateness * 1000
    if limit_ms is None or lateness_ms <= limit_ms:
        return None
    return (f"started {lateness_ms / 1000:.3f} s after its due time, over its max lateness "
            f"of {limit_ms / 1000:g} s: not run")
