"""A run next in line on a key slot, as the listener runs it: a plain function starts in
the thread of the run before it the moment that one returns (never sooner, ahead of runs
queued for a thread), and otherwise waits for that run to end; one whose run before it
timed out, or that was cancelled at shutdown, is never stuck behind it or run after; one
whose run before it never started (held back by its gate) does not start either."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from tests.conftest import wait_until
from timers.listener.calling.runner import Runner, Turn
from timers.listener.flow.turns import Turns
from timers.model.runs import Run

WAIT = 10.0
QUIET = 0.05
"""Seconds in which a run that must not start yet is given the chance to (the event loop
and the pool's threads run on): long against the microseconds a wrong start would take."""


class Log:
    """What the task functions did, in order, and in which thread."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()
        self.gate = threading.Event()

    def task(self, name: str, block: bool = False) -> Any:
        def fn() -> None:
            self.note("start", name)
            if block:
                assert self.gate.wait(WAIT)
            self.note("end", name)
        return fn

    def note(self, what: str, name: str) -> None:
        with self.lock:
            self.lines.append((what, name, threading.get_ident()))

    def order(self) -> list[str]:
        return [f"{what} {name}" for what, name, _ in self.lines]

    def thread_of(self, name: str) -> int:
        return next(ident for what, n, ident in self.lines if n == name and what == "start")


async def until(condition: Any) -> None:
    """Wait for what the threads do, with a deadline, off the event loop."""
    await asyncio.to_thread(wait_until, condition, WAIT, message="the threads")


def test_the_run_next_in_line_starts_in_the_same_thread_ahead_of_queued_runs() -> None:
    log = Log()

    async def main() -> None:
        runner, turn = Runner(1), Turn()
        first = asyncio.create_task(runner.call(log.task("a", block=True), [], turn=turn))
        await until(lambda: log.order() == ["start a"])
        queued = asyncio.create_task(runner.call(log.task("x"), []))  # waits for a thread
        following = asyncio.create_task(runner.call(log.task("b"), [], after=turn))
        await until(lambda: turn.job is not None and turn.job.then is not None)  # b chained
        await asyncio.sleep(QUIET)
        assert log.order() == ["start a"]  # b never starts before a returns
        log.gate.set()
        outcomes = await asyncio.gather(first, following, queued)
        assert all(outcome.ok for outcome in outcomes)

    asyncio.run(main())
    assert log.order() == ["start a", "end a", "start b", "end b", "start x", "end x"]
    assert log.thread_of("a") == log.thread_of("b")


def test_a_run_next_in_line_after_a_timed_out_run_is_not_stuck_behind_it() -> None:
    log = Log()

    async def main() -> None:
        runner, turn = Runner(2), Turn()
        first = asyncio.create_task(runner.call(log.task("a", block=True), [], 0.2, turn))
        following = asyncio.create_task(runner.call(log.task("b"), [], after=turn))
        outcome = await first
        assert outcome.error_type == "TimeoutError"
        assert (await following).ok  # in the other thread, while a's goes on

    asyncio.run(main())
    log.gate.set()
    assert log.order()[:3] == ["start a", "start b", "end b"]
    assert log.thread_of("a") != log.thread_of("b")


def test_a_run_next_in_line_cancelled_at_shutdown_never_runs() -> None:
    log = Log()

    async def main() -> None:
        runner, turn = Runner(1), Turn()
        first = asyncio.create_task(runner.call(log.task("a", block=True), [], turn=turn))
        following = asyncio.create_task(runner.call(log.task("b"), [], after=turn))
        await until(lambda: turn.job is not None and turn.job.then is not None)
        following.cancel()  # the listener stops and hands b back
        await asyncio.wait([following])
        log.gate.set()
        assert (await first).ok
        queued_later = await runner.call(log.task("c"), [])  # the thread is free again
        assert queued_later.ok

    asyncio.run(main())
    assert log.order() == ["start a", "end a", "start c", "end c"]


def test_a_coroutine_next_in_line_waits_for_the_run_before_it_to_end() -> None:
    log = Log()

    async def main() -> None:
        runner, turn = Runner(1), Turn()
        first = asyncio.create_task(runner.call(log.task("a"), [], turn=turn))

        async def b() -> None:
            log.note("start", "b")

        following = asyncio.create_task(runner.call(b, [], after=turn))
        assert (await first).ok
        await asyncio.sleep(QUIET)
        assert log.order() == ["start a", "end a"]  # a returned, but has not ended yet
        turn.ended.set()
        assert (await following).ok

    asyncio.run(main())
    assert log.order() == ["start a", "end a", "start b"]


def run(token: str, source: str, follows: str = "") -> Run:
    return Run(token, "id" + token, "t.f:", 0, 0, source, follows=follows)


def test_a_run_next_in_line_takes_no_place_in_the_concurrency_until_the_one_before_ends(
        ) -> None:
    async def main() -> None:
        turns = Turns()
        turns.start(run("1", "handoff"))
        turns.start(run("2", "next", follows="1"))
        turns.start(run("3", "sweep"))
        assert turns.waiting == 1 and turns.of("3") is None
        before = turns.before(run("2", "next", follows="1"))
        assert before is turns.of("1") and before is not None
        turns.end("1")
        assert turns.waiting == 0 and before.ended.is_set() and before.started.is_set()
        assert turns.before(run("2", "next", follows="1")) is None  # it may go at once
        turns.start(run("4", "next", follows="gone"))  # the one before ended already
        assert turns.waiting == 0

    asyncio.run(main())


def two_in_line() -> Turns:
    """Run "1", handed over holding a key's slot, and run "2" next in line after it."""
    turns = Turns()
    turns.start(run("1", "handoff"))
    turns.start(run("2", "next", follows="1"))
    return turns


def test_a_run_next_in_line_after_a_run_its_gate_held_back_never_runs() -> None:
    """A run next in line follows the run before it only into a start (T22): that run was
    held back by its gate, which took the one after it back into the key's queue, so it
    does not start either, and the pool goes on with other runs."""
    log = Log()

    async def main() -> None:
        runner, turns = Runner(1), two_in_line()
        following = asyncio.create_task(runner.call(log.task("b"), [], turn=turns.of("2"),
                                                    after=turns.of("1")))
        turns.not_started("1", taken_back=True)
        turns.end("1")
        assert (await following).kind == "revoked"
        taken_back = turns.of("2")
        assert taken_back is not None and taken_back.taken_back  # no ending to write
        assert (await runner.call(log.task("c"), [])).ok

    asyncio.run(main())
    assert log.order() == ["start c", "end c"]
