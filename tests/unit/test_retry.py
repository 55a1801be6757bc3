"""A loop's way back to Redis (:class:`timers.listener.retrying.Retry`): a step is tried
again after each lost connection, with waits that grow, until it works or the listener
stops; an outage is one line lost and one back, however many attempts fail."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import pytest

from timers.listener.retrying import Outage, ReconnectDelays, Retry


class Step:
    """A loop's step: each call answers the next of ``replies`` (an error is raised), and
    notes when it was tried."""

    def __init__(self, *replies: object) -> None:
        self.replies = iter(replies)
        self.tried: list[float] = []

    async def __call__(self) -> Any:
        self.tried.append(time.monotonic())
        reply = next(self.replies)
        if isinstance(reply, BaseException):
            raise reply
        return reply


def test_a_step_is_tried_again_with_growing_waits_and_one_line_each_way(
        caplog: pytest.LogCaptureFixture) -> None:
    step = Step(*(ConnectionError(f"refused {n}") for n in (1, 2, 3)), "answered")

    async def scenario() -> str | None:
        retry = Retry(asyncio.Event(), "claims", Outage(clock=lambda: 0.0),
                      delays=ReconnectDelays(0.02, 1.0))
        return await retry.answer(step)

    with caplog.at_level(logging.WARNING, logger="timers.listener"):
        assert asyncio.run(scenario()) == "answered"
    assert len(step.tried) == 4
    waits = [after - before for before, after in itertools.pairwise(step.tried)]
    assert all(w >= d * 0.9 for w, d in zip(waits, (0.02, 0.04, 0.08), strict=True)), waits
    assert [r.getMessage() for r in caplog.records] == [
        "connection to Redis lost (claims): refused 1; retrying",
        "connection to Redis back after 0.0 s"]


def test_stopping_ends_a_wait_at_once_and_the_step_is_not_tried_again() -> None:
    step = Step(TimeoutError("no reply"))

    async def scenario() -> tuple[object, float]:
        stopping = asyncio.Event()
        retry = Retry(stopping, "finishing runs", delays=ReconnectDelays(30.0, 30.0))
        asyncio.get_running_loop().call_later(0.05, stopping.set)
        began = time.monotonic()
        reply = await retry.answer(step)
        return reply, time.monotonic() - began

    reply, took = asyncio.run(scenario())
    assert reply is None and len(step.tried) == 1
    assert took < 5.0  # not the 30 s wait


def test_a_check_before_the_listener_runs_says_its_own_line_once(
        caplog: pytest.LogCaptureFixture) -> None:
    step = Step(OSError("down"), OSError("still down"), 7)

    async def scenario() -> int | None:
        retry = Retry(asyncio.Event(), told="cannot read the thing yet (%s); will keep trying",
                      delays=ReconnectDelays(0.001, 0.001))
        return await retry.answer(step)

    with caplog.at_level(logging.WARNING, logger="timers.listener"):
        assert asyncio.run(scenario()) == 7
    assert [r.getMessage() for r in caplog.records] == [
        "cannot read the thing yet (down); will keep trying"]


def test_an_error_no_retry_mends_is_raised_at_once() -> None:
    step = Step(ValueError("garbled"))

    async def scenario() -> None:
        await Retry(asyncio.Event(), "claims").answer(step)

    with pytest.raises(ValueError, match="garbled"):
        asyncio.run(scenario())
    assert len(step.tried) == 1


def test_a_success_starts_the_waits_over() -> None:
    async def scenario() -> list[float]:
        retry = Retry(asyncio.Event(), "claims", delays=ReconnectDelays(0.001, 1.0))
        waits = []
        for _ in range(2):
            for _ in range(3):
                waits.append(retry.delays.current)
                await retry.failed(ConnectionError("lost"))
            retry.ok()
        return waits

    assert asyncio.run(scenario()) == [0.001, 0.002, 0.004] * 2
