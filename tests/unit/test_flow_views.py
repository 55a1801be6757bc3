"""What get, list and stats show of flow control (fakeredis + lupa): timers of every group
and priority, timers waiting for a concurrency key or a rate limit, and the counts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.unit.flow_helpers import LEASE, add, claim, s
from timers import Timers
from timers.model.runs import Run
from timers.store.script_rows import GateRun
from timers.store.scripts import Scripts

__all__ = ["s"]  # the fixture

def hold_back(s: Scripts, key: str = "", rate: str = "", n: int = 3) -> list[Run]:
    """``n`` due timers t0.. claimed; the first goes, the rest wait for ``key`` or ``rate``."""
    for i in range(n):
        add(s, f"t{i}", "t.f:", -30 + i)
    runs = claim(s)
    spec = GateRun("", key, 1, rate, 60_000, 1)
    s.gate(LEASE, [spec._replace(token=r.token) for r in runs])
    return runs


def test_get_finds_a_timer_of_another_group_and_priority(
        s: Scripts, producer: Timers) -> None:
    add(s, "vid", "video.encode;g=video;k=device%3A7;p=5:[1]", 60_000)
    timer = producer.get("vid")
    assert timer is not None
    assert (timer.task, timer.args, timer.group, timer.priority, timer.key) == \
        ("video.encode", [1], "video", 5, "device:7")
    assert timer.wait is None and timer.held_for(datetime.now(UTC)) is None
    assert producer.get("nope") is None


def test_get_says_what_a_waiting_timer_waits_for(s: Scripts, producer: Timers) -> None:
    runs = hold_back(s, key="device:7")
    timer = producer.get("t2")
    assert timer is not None and timer.wait is not None
    assert timer.wait.describe() == "waiting for key device:7 (1/1 running), 1 ahead"
    assert timer.due.timestamp() * 1000 == pytest.approx(runs[2].due_ms)
    held = timer.held_for(datetime.now(UTC))
    assert held is not None and held >= 0
    first = producer.get("t1")
    assert first is not None and first.wait is not None
    assert first.wait.describe() == "waiting for key device:7 (1/1 running)"


def test_a_promoted_timer_shows_its_kept_slot_and_how_long_it_was_held(
        s: Scripts, producer: Timers) -> None:
    runs = hold_back(s, key="k", n=2)
    s.finish(retention_ms=1000, endings=[(runs[0].token, "ok", "", "")])
    timer = producer.get("t1")
    assert timer is not None and timer.wait is not None
    assert timer.wait.describe() == "due again, a slot of key k kept for it (1/1 running)"
    assert timer.waited_from is not None
    assert timer.waited_from.timestamp() * 1000 == pytest.approx(runs[1].due_ms)


def test_rate_limited_timers_show_their_slot_or_their_place(
        s: Scripts, producer: Timers) -> None:
    hold_back(s, rate="api", n=3)
    pacer, queued = producer.get("t1"), producer.get("t2")
    assert pacer is not None and pacer.wait is not None
    assert pacer.wait.describe().startswith("rate-limited until 20")
    assert pacer.wait.describe().endswith(" UTC")
    assert pacer.due == pacer.wait.at, "the timer holding the rate's next slot is due at it"
    assert queued is not None and queued.wait is not None
    assert queued.wait.describe() == "waiting for rate limit api, 0 ahead"


def test_list_merges_every_group_soonest_first_and_filters_by_group(
        s: Scripts, producer: Timers) -> None:
    add(s, "late", "t.f:", 90_000)
    add(s, "vid", "v.e;g=video:", 30_000)
    add(s, "vip", "v.e;g=video;p=9:", 60_000)
    add(s, "hi", "t.f;p=2:", 10_000)
    assert [t.id for t in producer.list()] == ["hi", "vid", "vip", "late"]
    assert [t.id for t in producer.list(group="video")] == ["vid", "vip"]
    assert [t.id for t in producer.list(group="default")] == ["hi", "late"]
    assert [t.id for t in producer.list(2)] == ["hi", "vid"]


def test_list_shows_waiting_timers_and_by_key_the_queue_then_the_rest(
        s: Scripts, producer: Timers) -> None:
    hold_back(s, key="dev 7", n=3)
    add(s, "later", "t.f;k=dev%207:", 60_000)
    add(s, "other", "t.f;k=dev%208:", 30_000)
    listed = producer.list()
    assert [t.id for t in listed] == ["t1", "t2", "other", "later"]
    assert [t.wait is not None for t in listed] == [True, True, False, False]
    assert [t.id for t in producer.list(key="dev 7")] == ["t1", "t2", "later"]
    assert producer.list(key="nobody") == []


def test_stats_count_per_group_and_per_key_and_rate(
        s: Scripts, producer: Timers) -> None:
    hold_back(s, key="k", n=3)  # t0 runs, t1 and t2 wait
    add(s, "vid", "v.e;g=video:", 60_000)
    add(s, "vip", "v.e;g=video;p=3:", 60_000)
    add(s, "r0", "t.f;g=video:", -5)
    [run] = claim(s, groups=("video",))
    s.gate(LEASE, [GateRun(run.token, "", 1, "api", 60_000, 1)])  # goes: the first slot
    stats = producer.stats()
    assert stats.pending == 2 + 2 and stats.running == 2
    default, video = stats.groups["default"], stats.groups["video"]
    assert (default.pending, default.waiting, default.running) == (2, 2, 1)
    assert (video.pending, video.waiting, video.running) == (2, 0, 1)
    assert stats.waiting_keys == {"k": 2} and stats.waiting_rates == {}
