"""Declaring, changing, pausing, resuming and removing recurrences on fakeredis."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import fakeredis
import pytest

from tests.unit.helpers import claim
from timers import AsyncTimers, InvalidTimer, Recurrence, Timers
from timers.exceptions import MalformedTimerKey
from timers.model.cron import State, name_from_option
from timers.model.encoding import Entry, Record, as_text, escape_id
from timers.model.flow.names import DEFAULT_GROUP
from timers.model.keys import Keyspace
from timers.model.wire import NEAR_HORIZON_MS


@pytest.fixture
def every_timer_near(fake: fakeredis.FakeRedis) -> None:
    """For tests about the expiring keys: a near horizon of a year keys every timer they
    schedule (tests/unit/test_near_keys.py covers timers beyond it)."""
    fake.hset(Keyspace().near, "horizon", 365 * 86_400_000)

KS = Keyspace()
BERLIN = "Europe/Berlin"


@pytest.fixture
def t(fake: fakeredis.FakeRedis) -> Iterator[Timers]:
    with Timers(fake) as client:
        yield client


def pending(fake: fakeredis.FakeRedis) -> dict[str, tuple[int, Record]]:
    """Every pending timer: id → (due ms, record)."""
    out = {}
    for raw_id, score in fake.zrange(KS.due, 0, -1, withscores=True):
        escaped = as_text(raw_id)
        record = as_text(fake.hget(KS.records, escaped))
        entry = Entry.decode(f"{escaped}:{record}")
        out[entry.id] = (int(score), entry.record)
    return out


def timer_keys(fake: fakeredis.FakeRedis) -> list[str]:
    return sorted(as_text(k) for k in fake.keys(KS.timer_key_start + "*"))


def state(fake: fakeredis.FakeRedis, name: str) -> State:
    return State.decode(fake.hget(KS.recurrence_states, escape_id(name)))


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


# -- declaring ---------------------------------------------------------------------------


def test_every_schedules_one_occurrence_with_a_deterministic_id(
    t: Timers, fake: fakeredis.FakeRedis
) -> None:
    rec = t.every("daily-report", "reports.daily", {"team": "a"}, cron="0 9 * * mon-fri",
                  tz=BERLIN)
    assert rec.version == 1 and rec.next_due is not None and not rec.paused
    local = rec.next_due.astimezone(rec.zone)
    assert (local.hour, local.minute) == (9, 0) and local.weekday() < 5
    [(timer_id, (due, record))] = pending(fake).items()
    assert timer_id == f"daily-report@{ms(rec.next_due)}" and due == ms(rec.next_due)
    assert record.task == "reports.daily" and record.args == {"team": "a"}
    assert name_from_option(record.options["r"]) == "daily-report"
    assert record.options["v"] == "1"
    seconds, micros = fake.time()
    near = due - (int(seconds) * 1000 + int(micros) // 1000) <= NEAR_HORIZON_MS
    assert len(timer_keys(fake)) == (1 if near else 0)  # keyed once within the near horizon


def test_declaring_the_same_recurrence_again_changes_nothing(
    t: Timers, fake: fakeredis.FakeRedis
) -> None:
    first = t.every("tick", "mod.add", [1], interval=timedelta(minutes=5))
    before = (pending(fake), timer_keys(fake), fake.hgetall(KS.recurrence_states),
              fake.hgetall(KS.recurrences))
    for _ in range(20):  # every web worker at start-up
        again = t.every("tick", "mod.add", (1,), interval=300)
        assert again == first
    after = (pending(fake), timer_keys(fake), fake.hgetall(KS.recurrence_states),
             fake.hgetall(KS.recurrences))
    assert after == before


def test_keyword_order_does_not_make_a_new_definition(t: Timers) -> None:
    a = t.every("r", "mod.add", {"a": 1, "b": 2}, cron="0 * * * *")
    b = t.every("r", "mod.add", {"b": 2, "a": 1}, cron="0 * * * *")
    assert a.version == b.version == 1


def test_changing_args_replaces_the_pending_occurrence_in_place(
    t: Timers, fake: fakeredis.FakeRedis
) -> None:
    first = t.every("tick", "mod.add", [1], interval=timedelta(minutes=5))
    changed = t.every("tick", "mod.add", [2], interval=timedelta(minutes=5))
    assert changed.version == 2
    assert changed.next_due == first.next_due  # same grid: no gap, no extra run
    [(_, (_, record))] = pending(fake).items()
    assert record.args == [2] and record.options["v"] == "2"
    assert len(timer_keys(fake)) == 1


@pytest.mark.usefixtures("every_timer_near")
def test_changing_the_cron_and_zone_moves_the_pending_occurrence(
    t: Timers, fake: fakeredis.FakeRedis
) -> None:
    t.every("report", "mod.add", cron="0 9 * * *", tz=BERLIN)
    changed = t.every("report", "mod.add", cron="30 10 * * *", tz="America/New_York")
    assert changed.next_due is not None
    local = changed.next_due.astimezone(changed.zone)
    assert (local.hour, local.minute) == (10, 30)
    [(timer_id, (due, _))] = pending(fake).items()
    assert timer_id == f"report@{due}" and due == ms(changed.next_due)
    assert len(timer_keys(fake)) == 1


def test_changing_the_interval_restarts_it_from_now(t: Timers, fake: fakeredis.FakeRedis) -> None:
    first = t.every("tick", "mod.add", interval=3600)
    changed = t.every("tick", "mod.add", interval=60)
    assert changed.anchor is not None and first.anchor is not None
    assert changed.anchor >= first.anchor
    assert changed.next_due == changed.anchor + timedelta(seconds=60)
    assert len(pending(fake)) == 1


def test_a_change_after_the_occurrence_was_claimed_never_schedules_it_again(
    t: Timers, fake: fakeredis.FakeRedis, scripts: dict[str, Any]
) -> None:
    t.every("sec", "mod.add", [1], cron="* * * * * *")
    [taken] = claim(scripts, KS, horizon_ms=5000).claimed  # a listener holds it now
    changed = t.every("sec", "mod.add", [2], cron="* * * * * *")
    assert changed.next_due is not None and ms(changed.next_due) > taken.due_ms
    assert state(fake, "sec").prev == taken.due_ms


def test_concurrent_declarations_retry_on_a_changed_state(
    t: Timers, fake: fakeredis.FakeRedis
) -> None:
    """A declaration reads, computes, then writes only if the state is what it read."""
    t.every("r", "mod.add", [1], cron="0 * * * *")
    spec = Recurrence("r", "mod.add", [3], cron="0 12 * * *")
    slow = t.ops.every(spec)
    request = next(slow)
    reply = t.run(iter_once(request))  # the slow declaration has read the state…
    t.every("r", "mod.add", [2], cron="0 6 * * *")  # …when another one changes it
    request = slow.send(reply)
    reply = t.run(iter_once(request))
    assert reply[0][0] == -1  # refused: the state moved on
    result = t.run(resume_with(slow, reply))
    assert result.version == 3 and result.args == [3]
    [(_, (due, record))] = pending(fake).items()
    assert record.args == [3] and datetime.fromtimestamp(due / 1000, UTC).hour == 12


def iter_once(request: Any) -> Any:
    """An operation that sends one request and returns its raw reply."""
    reply = yield request
    return reply


def resume_with(operation: Any, reply: Any) -> Any:
    request = operation.send(reply)
    while True:
        try:
            reply = yield request
            request = operation.send(reply)
        except StopIteration as done:
            return done.value


# -- refused declarations ----------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cron": "61 * * * *"}, "not a valid expression"),
    ({"cron": "0 9 * * *", "tz": "Mars/Olympus_Mons"}, "unknown time zone"),
    ({"cron": "0 9 * * *", "tz": "../etc/passwd"}, "unknown time zone"),
    ({"cron": "R 9 * * *"}, "random"),
    ({"cron": "0 0 31 2 *"}, "never matches"),
    ({}, "exactly one of cron"),
    ({"cron": "* * * * *", "interval": 60}, "exactly one of cron"),
    ({"interval": 0.001}, "at least 10 ms"),
    ({"interval": "5m"}, "interval must be"),
    ({"cron": "* * * * *", "catch_up": "some"}, "catch_up must be one of"),
    ({"cron": "* * * * *", "max_lateness": -1}, "max_lateness"),
    ({"cron": ""}, "cron must be an expression"),
])
def test_bad_declarations_are_refused_with_a_clear_error(
    t: Timers, fake: fakeredis.FakeRedis, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidTimer, match=message):
        t.every("job", "mod.add", **kwargs)
    assert fake.dbsize() == 0


@pytest.mark.parametrize(("name", "task", "args", "message"), [
    ("", "mod.add", None, "non-empty"),
    ("a\nb", "mod.add", None, "control"),
    ("x" * 101, "mod.add", None, "longer than"),
    ("job", "../etc", None, "dotted path"),
    ("job", "mod.add", {1: 2}, "string keys"),
    ("job", "mod.add", "text", "args must be"),
])
def test_bad_names_tasks_and_args_are_refused(
    t: Timers, fake: fakeredis.FakeRedis, name: str, task: str, args: Any, message: str
) -> None:
    with pytest.raises(InvalidTimer, match=message) as refused:
        t.every(name, task, args, cron="* * * * *")
    assert "\n" not in str(refused.value) and fake.dbsize() == 0  # one line, nothing written


def test_any_name_works(t: Timers, fake: fakeredis.FakeRedis) -> None:
    name = "Bericht: täglich @9 ~ 100%"
    rec = t.every(name, "mod.add", cron="0 9 * * *")
    [(timer_id, (_, record))] = pending(fake).items()
    assert timer_id.startswith(name + "@")
    assert name_from_option(record.options["r"]) == name
    assert t.get_recurrence(name) == rec
    assert t.unschedule_recurring(name)


# -- pause, resume, remove, list ---------------------------------------------------------


def test_pause_withdraws_the_pending_occurrence_and_resume_brings_one_back(
    t: Timers, fake: fakeredis.FakeRedis
) -> None:
    rec = t.every("tick", "mod.add", interval=60)
    assert t.pause("tick") and t.pause("tick")  # pausing twice is fine
    assert pending(fake) == {} and timer_keys(fake) == []
    paused = t.get_recurrence("tick")
    assert paused is not None and paused.paused and paused.next_due is None
    # start-up declarations do not undo a pause, changed or not
    assert t.every("tick", "mod.add", interval=60).paused
    changed = t.every("tick", "mod.add", [5], interval=60)
    assert changed.paused and changed.version == 2 and pending(fake) == {}
    assert t.resume("tick")
    resumed = t.get_recurrence("tick")
    assert resumed is not None and not resumed.paused and resumed.version == 3
    assert resumed.next_due == rec.next_due  # the grid goes on; nothing caught up
    [(_, (_, record))] = pending(fake).items()
    assert record.args == [5] and record.options["v"] == "3"
    assert t.resume("tick")  # resuming a running recurrence changes nothing
    assert len(pending(fake)) == 1


def test_unknown_names(t: Timers) -> None:
    assert not t.pause("nope")
    assert not t.resume("nope")
    assert not t.unschedule_recurring("nope")
    assert t.get_recurrence("nope") is None


@pytest.mark.usefixtures("every_timer_near")
def test_unschedule_removes_definition_state_and_pending_occurrence(
    t: Timers, fake: fakeredis.FakeRedis
) -> None:
    t.every("a", "mod.add", cron="0 9 * * *")
    t.every("b", "mod.add", cron="0 10 * * *")
    assert t.unschedule_recurring("a")
    assert [r.name for r in t.recurrences()] == ["b"]
    assert [i.split("@")[0] for i in pending(fake)] == ["b"]
    assert not fake.hexists(KS.recurrence_states, "a")
    assert len(timer_keys(fake)) == 1


def test_recurrences_lists_every_recurrence_with_its_next_runs_in_its_zone(t: Timers) -> None:
    t.every("daily-report", "reports.daily", cron="0 9 * * mon-fri", tz=BERLIN)
    t.every("tick", "mod.add", interval=timedelta(minutes=5), overlap=False,
            catch_up="all", max_lateness=30)
    t.pause("tick")
    daily, tick = t.recurrences()
    assert (daily.name, tick.name) == ("daily-report", "tick")
    times = daily.upcoming(3)
    assert len(times) == 3 and times[0] == daily.next_due
    assert all((x.hour, x.minute, str(x.tzinfo)) == (9, 0, BERLIN) for x in times)
    assert times == sorted(times) and len(set(times)) == 3
    assert tick.paused and not tick.overlap and tick.catch_up == "all"
    assert tick.max_lateness == timedelta(seconds=30)
    assert tick.when == "every 5m" and daily.when == "cron 0 9 * * mon-fri"


def test_a_broken_definition_is_left_out_of_the_list(t: Timers, fake: fakeredis.FakeRedis) -> None:
    t.every("good", "mod.add", cron="0 9 * * *")
    fake.hset(KS.recurrences, "bad", "{not json")
    assert [r.name for r in t.recurrences()] == ["good"]


def test_async_twin(fake: fakeredis.FakeRedis) -> None:
    async def scenario() -> None:
        client = fakeredis.FakeAsyncRedis(server=fake.connection_pool.connection_kwargs[
            "server"])
        async with AsyncTimers(client) as at:
            rec = await at.every("tick", "mod.add", [1], interval=60)
            assert (await at.every("tick", "mod.add", [1], interval=60)) == rec
            assert [r.name for r in await at.recurrences()] == ["tick"]
            assert await at.pause("tick") and await at.resume("tick")
            assert (await at.get_recurrence("tick")) is not None
            assert await at.unschedule_recurring("tick")
        await client.aclose()

    asyncio.run(scenario())


# -- flow options of recurrences ------------------------------------------------------------


def test_a_recurrences_occurrences_carry_its_group_key_and_priority(
    fake: fakeredis.FakeRedis
) -> None:
    """A recurrence of video tasks had no group: a web node's listener claimed its
    occurrences and dead-lettered them."""
    with Timers(fake) as t:
        rec = t.every("encode-night", "video.encode", ["all"], interval=3600, group="video",
                      key="gpu:0", priority=7)
        (first,) = t.list(group="video")
        assert (first.group, first.key, first.priority) == ("video", "gpu:0", 7)
        assert t.list(group="default") == []
        assert t.every("encode-night", "video.encode", ["all"], interval=3600,
                       group="video", key="gpu:0", priority=7).version == rec.version
        assert t.every("encode-night", "video.encode", ["all"], interval=3600,
                       group="video", key="gpu:0", priority=8).version == rec.version + 1
        stored = t.get_recurrence("encode-night")
    assert stored is not None and (stored.group, stored.key, stored.priority) == (
        "video", "gpu:0", 8)
    # the successor a listener schedules is built from the same definition
    _, successor = stored.occurrence(stored.version, 1_900_000_000_000)
    options = Record.decode(successor).options
    assert (options["g"], options["k"], options["p"]) == ("video", "gpu%3A0", "8")


def test_a_recurrence_takes_the_clients_group_when_it_names_none(
    fake: fakeredis.FakeRedis
) -> None:
    with Timers(fake, group="web") as web:
        web.every("digest", "mail.digest", interval=60)
        (first,) = web.list(group="web")
        assert first.group == "web"
    with Timers(fake) as t:
        t.every("plain", "mail.digest", interval=60)
        assert [p.group for p in t.list(group="default")] == ["default"]


def test_a_recurrence_with_a_bad_key_or_priority_is_refused_and_nothing_is_written(
    fake: fakeredis.FakeRedis
) -> None:
    with Timers(fake) as t:
        with pytest.raises(InvalidTimer, match="priority"):
            t.every("bad", "a.b", interval=60, priority=5000)
        with pytest.raises(InvalidTimer, match="key"):
            t.every("bad", "a.b", interval=60, key="")
        assert t.recurrences() == [] and fake.zcard(KS.due) == 0


def test_a_definition_stored_before_flow_options_reads_with_the_defaults() -> None:
    old = '{"args":null,"catch_up":"latest","every_ms":60000,"overlap":true,"task":"a.b",' \
          '"tz":"UTC"}'
    rec = Recurrence.from_redis("old", old, None)
    assert (rec.group, rec.key, rec.priority) == (DEFAULT_GROUP, None, 0)
    assert rec.definition() == old  # declaring it again unchanged changes nothing


@pytest.mark.parametrize("forged", ['"key":""', '"priority":"high"', '"group":"a b"',
                                    '"key":7'])
def test_a_definition_with_forged_flow_options_reads_as_one_clear_error(forged: str) -> None:
    """A definition is data in Redis: one whose flow options do not read is refused, not
    turned into occurrences under a key or group nobody asked for."""
    text = '{"args":null,"catch_up":"latest","every_ms":60000,"overlap":true,"task":"a.b",' \
           f'"tz":"UTC",{forged}}}'
    with pytest.raises(MalformedTimerKey, match="unreadable definition of recurrence 'x'"):
        Recurrence.from_redis("x", text, None)
