"""What a schedule with a group, a concurrency key or a priority writes into the stored
record, and what ``get``/``list`` read back (fakeredis)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import fakeredis
import pytest

import timers
from timers import AsyncTimers, InvalidTimer, Timers, TimerSpec
from timers.model.encoding import Record, as_text, escape_id
from timers.model.flow.names import GROUP_ENV
from timers.model.keys import Keyspace

FAR = 3600.0


def stored(fake: fakeredis.FakeRedis, timer_id: str) -> str:
    """The record stored for a timer, as the scripts read it."""
    raw = fake.hget(Keyspace().records, escape_id(timer_id))
    assert raw is not None, f"no record for {timer_id!r}"
    return as_text(raw)


def nothing_written(fake: fakeredis.FakeRedis) -> bool:
    keys = Keyspace()
    return fake.zcard(keys.due) == 0 and fake.hlen(keys.records) == 0


@pytest.fixture(autouse=True)
def no_group_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GROUP_ENV, raising=False)


def test_a_timer_without_flow_options_is_stored_as_before(producer: Timers,
                                                          fake: fakeredis.FakeRedis) -> None:
    tid = producer.schedule("mail.send", [1], in_=FAR, id="plain")
    assert stored(fake, tid) == "mail.send:[1]"
    timer = producer.get(tid)
    assert timer is not None
    assert (timer.group, timer.priority, timer.key) == ("default", 0, None)


def test_the_default_group_priority_zero_and_no_key_write_no_option(
    producer: Timers, fake: fakeredis.FakeRedis
) -> None:
    tid = producer.schedule("mail.send", in_=FAR, group="default", priority=0, key=None)
    assert stored(fake, tid) == "mail.send:"


def test_group_key_and_priority_are_written_as_record_options(
    producer: Timers, fake: fakeredis.FakeRedis
) -> None:
    tid = producer.schedule("iot.command", {"device_id": 7}, in_=FAR, group="iot",
                            key="device:7", priority=-5)
    assert stored(fake, tid) == 'iot.command;g=iot;k=device%3A7;p=-5:{"device_id":7}'
    timer = producer.get(tid)
    assert timer is not None
    assert (timer.group, timer.priority, timer.key) == ("iot", -5, "device:7")
    assert Record.decode(stored(fake, tid)).options == {"g": "iot", "k": "device%3A7",
                                                        "p": "-5"}


@pytest.mark.parametrize("key", ["device:7", "设备/7", "100%", "a b", "plain-key_1.0"])
def test_a_key_reads_back_as_given(producer: Timers, key: str) -> None:
    tid = producer.schedule("iot.command", in_=FAR, key=key)
    [timer] = producer.list()
    assert timer.id == tid and timer.key == key


def test_the_client_group_is_the_default_of_its_timers(fake: fakeredis.FakeRedis) -> None:
    with Timers(fake, group="video") as video:
        tid = video.schedule("video.render", in_=FAR)
        other = video.schedule("mail.send", in_=FAR, group="default")
    assert stored(fake, tid) == "video.render;g=video:"
    assert stored(fake, other) == "mail.send:"


def test_the_group_comes_from_the_environment(fake: fakeredis.FakeRedis,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GROUP_ENV, "video")
    with Timers(fake) as video:
        tid = video.schedule("video.render", in_=FAR)
    with Timers(fake, group="web") as web:
        mine = web.schedule("mail.send", in_=FAR)
    assert stored(fake, tid) == "video.render;g=video:"
    assert stored(fake, mine) == "mail.send;g=web:"


def test_a_bad_group_in_the_environment_stops_the_client_in_one_line(
    fake: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(GROUP_ENV, "video nodes")
    with pytest.raises(InvalidTimer) as err:
        Timers(fake)
    assert str(err.value) == (
        "$TIMERS_GROUP 'video nodes' must be 1 to 64 letters, digits, '_', '.' or '-'"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"group": "a b"}, "group 'a b' must be 1 to 64 letters, digits, '_', '.' or '-'"),
        ({"group": 3}, "group must be a string, got int"),
        ({"priority": 1001}, "priority must be from -1000 to 1000, got 1001"),
        ({"priority": "high"}, "priority must be an integer, got str"),
        ({"key": ""}, "concurrency key must be 1 to 200 characters, got 0"),
        ({"key": "a\tb"}, "concurrency key 'a\\tb' holds a control character (U+0009)"),
        ({"key": 7}, "concurrency key must be a string, got int"),
        ({"key": "é" * 40}, "concurrency key too long once escaped: 240 characters, over 200 "
                            "(each byte outside A-Z a-z 0-9 _ . - takes 3)"),
    ],
)
def test_a_bad_flow_option_is_refused_in_one_line_and_nothing_is_written(
    producer: Timers, fake: fakeredis.FakeRedis, options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidTimer) as err:
        producer.schedule("a.b", in_=FAR, **options)  # type: ignore[arg-type]
    assert str(err.value) == message
    assert nothing_written(fake)


def test_schedule_many_writes_each_timers_options(producer: Timers,
                                                   fake: fakeredis.FakeRedis) -> None:
    ids = producer.schedule_many([
        TimerSpec("iot.command", [1], in_=FAR, key="device:1"),
        {"task": "iot.command", "args": [2], "in_": FAR, "key": "device:2", "priority": 9},
        TimerSpec("video.render", in_=FAR, group="video"),
    ])
    assert [stored(fake, i) for i in ids] == [
        "iot.command;k=device%3A1:[1]",
        "iot.command;k=device%3A2;p=9:[2]",
        "video.render;g=video:",
    ]


def test_a_bad_option_in_a_batch_names_the_timer_and_writes_nothing(
    producer: Timers, fake: fakeredis.FakeRedis
) -> None:
    with pytest.raises(InvalidTimer) as err:
        producer.schedule_many([TimerSpec("a.b", in_=FAR),
                                TimerSpec("a.b", in_=FAR, id="x", priority=5000)])
    assert str(err.value) == "timer 1 (id 'x'): priority must be from -1000 to 1000, got 5000"
    assert nothing_written(fake)


def test_a_tuple_of_args_is_still_stored_as_a_list(producer: Timers,
                                                   fake: fakeredis.FakeRedis) -> None:
    tid = producer.schedule("a.b", (1, "x"), in_=FAR, priority=1)
    assert stored(fake, tid) == 'a.b;p=1:[1,"x"]'


def test_the_async_client_writes_the_same_options() -> None:
    server = fakeredis.FakeServer()

    async def main() -> tuple[str, str]:
        async with AsyncTimers(fakeredis.aioredis.FakeRedis(server=server),
                               group="llm") as client:
            return (await client.schedule("llm.complete", [3], in_=FAR, key="user:3",
                                          priority=2),
                    await client.schedule("llm.complete", in_=FAR))

    first, second = asyncio.run(main())
    fake = fakeredis.FakeRedis(server=server)
    assert stored(fake, first) == "llm.complete;g=llm;k=user%3A3;p=2:[3]"
    assert stored(fake, second) == "llm.complete;g=llm:"


@pytest.fixture
def configured(fake: fakeredis.FakeRedis) -> Iterator[None]:
    saved = timers._default
    timers.configure(fake, group="video")
    try:
        yield
    finally:
        timers._default = saved


@pytest.mark.usefixtures("configured")
def test_the_module_level_schedule_takes_the_options_and_configure_takes_the_group(
    fake: fakeredis.FakeRedis,
) -> None:
    tid = timers.schedule("video.render", [1], in_=FAR, key="film:1", priority=100)
    other = timers.schedule("mail.send", in_=FAR, group="mail")
    assert stored(fake, tid) == "video.render;g=video;k=film%3A1;p=100:[1]"
    assert stored(fake, other) == "mail.send;g=mail:"


def test_timers_aio_schedule_takes_the_options() -> None:
    server = fakeredis.FakeServer()

    async def main() -> str:
        timers.aio.configure(fakeredis.aioredis.FakeRedis(server=server))
        return await timers.aio.schedule("a.b", in_=FAR, group="g1", key="k", priority=-1)

    try:
        tid = asyncio.run(main())
    finally:
        timers.aio.configure()  # the next test makes its own
    assert stored(fakeredis.FakeRedis(server=server), tid) == "a.b;g=g1;k=k;p=-1:"


def test_a_record_with_a_bad_key_escape_is_left_out_of_the_listing(
    producer: Timers, fake: fakeredis.FakeRedis
) -> None:
    good = producer.schedule("a.b", in_=FAR, key="ok")
    bad = producer.schedule("a.b", in_=FAR + 1, key="x")
    fake.hset(Keyspace().records, escape_id(bad), "a.b;k=%ZZ:")
    assert [t.id for t in producer.list()] == [good]
