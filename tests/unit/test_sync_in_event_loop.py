"""A sync producer call inside a running event loop blocks that loop: it says so."""

from __future__ import annotations

import asyncio
import warnings

import fakeredis
import pytest

from timers import Timers


def test_a_sync_call_on_a_running_loop_warns_at_the_callers_line() -> None:
    t = Timers(fakeredis.FakeRedis())

    async def endpoint() -> str:
        return t.schedule("reminders.sms", [1], in_=60)  # the line the warning names

    with pytest.warns(RuntimeWarning, match="blocks the loop") as caught:
        tid = asyncio.run(endpoint())
    assert t.get(tid) is not None, "the call still works"
    assert caught[0].filename == __file__


def test_no_warning_outside_an_event_loop() -> None:
    t = Timers(fakeredis.FakeRedis())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.schedule("reminders.sms", [1], in_=60)
