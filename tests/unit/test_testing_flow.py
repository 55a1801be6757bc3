"""The testing helper with flow control: a concurrency key's timers run in turn within one
``run_due()``; a rate limit's clock is the server's real one, so the timers it holds stay
pending (and ``run_due``/``run_all`` return instead of spinning)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import timers
from tests.unit.conftest import ROOT, SAMPLE_TASKS
from tests.unit.sample_tasks import limited
from timers.testing import TimersTest


@pytest.fixture
def t() -> Iterator[TimersTest]:
    limited.RAN.clear()
    with TimersTest(SAMPLE_TASKS, search_path=str(ROOT)) as helper:
        yield helper


def test_a_keys_timers_run_in_turn_in_one_run_due(t: TimersTest) -> None:
    for command in ("on", "dim", "off"):
        timers.schedule("limited.command", [7, command], in_=0)
    assert len(t.run_due()) == 3
    assert limited.RAN == ["on", "dim", "off"]
    assert t.pending() == []


def test_a_rate_limit_holds_what_is_over_it_on_the_real_clock(t: TimersTest) -> None:
    for n in range(3):
        timers.schedule("limited.hourly", [n], in_=0)
    (run,) = t.run_due()  # one start an hour: the others wait, and run_due returns
    assert run.outcome.ok and limited.RAN == [0]
    held = t.pending()
    assert [p.wait.kind if p.wait else None for p in held] == ["rate", "rate"]
    t.advance(hours=1)  # moves due times, not the limit's clock
    assert t.run_due() == [] and t.run_all() == []
    assert len(t.pending()) == 2 and limited.RAN == [0]
