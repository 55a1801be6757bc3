"""``redis+sentinel://`` URLs: what they name, and one clear line for what is wrong."""

from __future__ import annotations

import pytest

from timers import ServerUnavailable, Timers
from timers.model.url_parts import is_sentinel_url
from timers.store.sentinel import SentinelURL


def test_a_sentinel_url_names_the_sentinels_the_service_the_db_and_the_credentials() -> None:
    target = SentinelURL.parse(
        "redis+sentinel://app:s%40cret@10.0.0.1:26379,10.0.0.2:26380,sentinel-3/mymaster/2"
        "?sentinel_password=watch&socket_timeout=3")
    assert target.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("sentinel-3", 26379))
    assert (target.service, target.db, target.username, target.password) == (
        "mymaster", 2, "app", "s@cret")
    assert target.connection_kwargs() == {"db": 2, "username": "app", "password": "s@cret",
                                          "socket_timeout": 3.0}
    assert target.sentinel_kwargs()["password"] == "watch"
    assert SentinelURL.parse("rediss+sentinel://h:1/m").connection_kwargs()["ssl"] is True
    assert is_sentinel_url("redis+sentinel://h/m") and not is_sentinel_url("redis://h:6379/0")


@pytest.mark.parametrize(("url", "says"), [
    ("redis+sentinel://h:26379", "path is /<service name>[/<db>]"),
    ("redis+sentinel://h:26379/m/x", "database in a Sentinel URL must be a number"),
    ("redis+sentinel:///m", "names no sentinel (host:port)"),
    ("redis+sentinel://h:port/m", "bad sentinel address 'h:port'"),
    ("redis+sentinel://h/m?sockettimeout=1", "unknown option 'sockettimeout'"),
    ("redis+sentinel://h/m?socket_timeout=soon", "must be a number of seconds"),
])
def test_a_bad_sentinel_url_is_refused_in_one_line_naming_the_problem(url: str,
                                                                      says: str) -> None:
    with pytest.raises(ValueError) as caught:
        Timers(url)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_no_sentinel_answering_is_one_line_naming_the_service() -> None:
    with Timers("redis+sentinel://127.0.0.1:1/orders") as t, \
            pytest.raises(ServerUnavailable) as caught:
        t.schedule("reminders.sms", [], in_=60)
    assert str(caught.value) == (
        "cannot reach the primary 'orders' (Sentinel): no sentinel named one that answers "
        "(sentinels down or unreachable, or a failover under way)")
