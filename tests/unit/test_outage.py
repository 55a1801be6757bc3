"""A listener's loops share one view of the connection: one line when it goes, one when
it is back (with the new address after a failover), however many loops notice."""

from __future__ import annotations

import logging

import pytest

from timers.listener.retrying import Outage


def test_a_failover_seen_by_every_loop_logs_one_line_lost_and_one_back(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    outage = Outage(clock=lambda: now[0])
    claims, events = "claims", "event subscription"
    outage.ok(events, "127.0.0.1:7001")
    with caplog.at_level(logging.WARNING, logger="timers.listener"):
        outage.failed(claims, ConnectionError("Connection reset by peer"))
        outage.failed(events, ConnectionError("Connect call failed"))
        outage.failed(claims, ConnectionError("again"))
        now[0] += 3.2
        outage.ok(events, "127.0.0.1:7002")
        assert [r.getMessage() for r in caplog.records] == [
            "connection to Redis lost (claims): Connection reset by peer; retrying"]
        outage.ok(claims)
    assert [r.getMessage() for r in caplog.records][1:] == [
        "connection to Redis back after 3.2 s; the server is now 127.0.0.1:7002 "
        "(was 127.0.0.1:7001)"]


def test_a_lost_subscription_on_the_same_server_says_nothing_of_an_address(
        caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage(clock=lambda: 0.0)
    events = "event subscription"
    outage.ok(events, "127.0.0.1:7001")
    with caplog.at_level(logging.WARNING, logger="timers.listener"):
        outage.ok(events, "127.0.0.1:7001")  # working: nothing to say
        outage.failed(events, ConnectionError("killed"))
        outage.ok(events, "127.0.0.1:7001")
    assert [r.getMessage() for r in caplog.records] == [
        "connection to Redis lost (event subscription): killed; retrying",
        "connection to Redis back after 0.0 s"]


def test_the_fault_suite_reads_the_lines_the_listener_writes(
        caplog: pytest.LogCaptureFixture) -> None:
    from bench.faults.scenario import OUTAGE_BACK, OUTAGE_LOST, SUBSCRIPTION_LOST

    outage = Outage(clock=lambda: 0.0)
    with caplog.at_level(logging.WARNING, logger="timers.listener"):
        outage.failed("event subscription", ConnectionError("Connection closed by server."))
        outage.ok("event subscription")
    lost, back = (r.getMessage() for r in caplog.records)
    assert lost.startswith(SUBSCRIPTION_LOST) and lost.startswith(OUTAGE_LOST)
    assert back.startswith(OUTAGE_BACK)


def test_the_connection_is_back_only_once_every_loop_that_lost_it_has_it_again(
        caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage(clock=lambda: 0.0)
    with caplog.at_level(logging.WARNING, logger="timers.listener"):
        outage.failed("claims", ConnectionError("reset"))
        outage.failed("event subscription", ConnectionError("reset"))
        outage.ok("claims")  # the subscription is still down: not back yet
        assert [r.getMessage() for r in caplog.records] == [
            "connection to Redis lost (claims): reset; retrying"]
        outage.ok("event subscription")
    assert [r.getMessage() for r in caplog.records][1:] == [
        "connection to Redis back after 0.0 s"]
