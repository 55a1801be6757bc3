"""A listener's loops share one view of the connection: one line when it goes, one when
it is back (with the new address after a failover), however many loops notice."""

from __future__ import annotations

import logging

import pytest

from timers.listener.retrying import ConnectionState, Outage


def test_a_failover_seen_by_every_loop_logs_one_line_lost_and_one_back(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    outage = Outage(clock=lambda: now[0])
    claims, events = ConnectionState("claims", outage), ConnectionState("event subscription",
                                                                        outage)
    events.ok("127.0.0.1:7001")
    with caplog.at_level(logging.WARNING, logger="timers.listener"):
        claims.failed(ConnectionError("Connection reset by peer"))
        events.failed(ConnectionError("Connect call failed"))
        claims.failed(ConnectionError("again"))
        now[0] += 3.2
        events.ok("127.0.0.1:7002")
        assert [r.getMessage() for r in caplog.records] == [
            "connection to Redis lost (claims): Connection reset by peer; retrying"]
        claims.ok()
    assert [r.getMessage() for r in caplog.records][1:] == [
        "connection to Redis back after 3.2 s; the server is now 127.0.0.1:7002 "
        "(was 127.0.0.1:7001)"]


def test_a_lost_subscription_on_the_same_server_says_nothing_of_an_address(
        caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage(clock=lambda: 0.0)
    events = ConnectionState("event subscription", outage)
    events.ok("127.0.0.1:7001")
    with caplog.at_level(logging.WARNING, logger="timers.listener"):
        events.ok("127.0.0.1:7001")  # working: nothing to say
        events.failed(ConnectionError("killed"))
        events.ok("127.0.0.1:7001")
    assert [r.getMessage() for r in caplog.records] == [
        "connection to Redis lost (event subscription): killed; retrying",
        "connection to Redis back after 0.0 s"]


def test_the_fault_suite_reads_the_lines_the_listener_writes(
        caplog: pytest.LogCaptureFixture) -> None:
    from bench.faults.scenario import OUTAGE_BACK, OUTAGE_LOST, SUBSCRIPTION_LOST

    outage = Outage(clock=lambda: 0.0)
    events = ConnectionState("event subscription", outage)
    with caplog.at_level(logging.WARNING, logger="timers.listener"):
        events.failed(ConnectionError("Connection closed by server."))
        events.ok()
    lost, back = (r.getMessage() for r in caplog.records)
    assert lost.startswith(SUBSCRIPTION_LOST) and lost.startswith(OUTAGE_LOST)
    assert back.startswith(OUTAGE_BACK)
