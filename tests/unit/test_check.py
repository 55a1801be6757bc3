"""``timers check``: judging a server's INFO and CONFIG for reliable timers."""

from __future__ import annotations

import pytest

from timers.store.check import ENABLE_EVENTS, Finding, assess, expired_events_on, verdict

GOOD_CONFIG = {
    "notify-keyspace-events": "Ex",
    "maxmemory-policy": "noeviction",
    "appendonly": "yes",
    "save": "3600 1",
    "hz": "100",
}
INFO = {"redis_version": "7.2.4"}


def finding(findings: list[Finding], name: str) -> Finding:
    (match,) = [f for f in findings if f.name == name]
    return match


def with_config(**changes: str | None) -> dict[str, str]:
    config = dict(GOOD_CONFIG)
    for key, value in changes.items():
        name = key.replace("_", "-")
        if value is None:
            config.pop(name, None)
        else:
            config[name] = value
    return config


def test_a_well_configured_server_is_all_ok() -> None:
    findings = assess(INFO, GOOD_CONFIG)
    assert [f.level for f in findings] == ["ok"] * len(findings)
    assert {f.name for f in findings} == {
        "server", "notify-keyspace-events", "maxmemory-policy", "persistence", "hz"}
    assert finding(findings, "server").value == "redis 7.2.4"
    assert verdict(findings) is True


def test_valkey_is_named() -> None:
    findings = assess({"server_name": "valkey", "valkey_version": "8.1.8",
                       "redis_version": "7.2.4"}, GOOD_CONFIG)
    assert finding(findings, "server").value == "valkey 8.1.8"


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_an_allkeys_policy_fails_saying_every_pending_timer_can_be_lost(policy: str) -> None:
    """allkeys-* evicts the due index and the records (5,000 of 5,000 pending lost)."""
    findings = assess(INFO, with_config(maxmemory_policy=policy))
    result = finding(findings, "maxmemory-policy")
    assert (result.level, result.value) == ("fail", policy)
    assert "due index" in result.advice and "every pending timer lost" in result.advice
    assert "noeviction" in result.advice
    assert verdict(findings) is False


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-lfu", "volatile-ttl",
                                    "volatile-random"])
def test_a_volatile_policy_warns_that_only_events_are_lost(policy: str) -> None:
    """volatile-* evicts only the expiring keys: the sweeper fires every timer anyway."""
    findings = assess(INFO, with_config(maxmemory_policy=policy))
    result = finding(findings, "maxmemory-policy")
    assert (result.level, result.value) == ("warn", policy)
    assert "sweeper" in result.advice
    assert verdict(findings) is True


@pytest.mark.parametrize("flags", ["", "K", "Kx", "E", "Eg", "KEg$lsh"])
def test_expired_events_off_warns_and_names_the_fix(flags: str) -> None:
    findings = assess(INFO, with_config(notify_keyspace_events=flags))
    result = finding(findings, "notify-keyspace-events")
    assert result.level == "warn" and result.value == (flags or '""')  # what is set now
    assert ENABLE_EVENTS in result.advice
    assert "notify-keyspace-events Ex" in result.advice
    assert verdict(findings) is True  # the sweeper still fires timers


@pytest.mark.parametrize("flags", ["Ex", "xE", "KEA", "EA", "AKE", "Exe", "KEx$"])
def test_expired_events_on(flags: str) -> None:
    assert expired_events_on(flags)
    result = finding(assess(INFO, with_config(notify_keyspace_events=flags)),
                     "notify-keyspace-events")
    assert (result.level, result.value) == ("ok", flags)


def test_unreadable_config_warns_without_failing() -> None:
    findings = assess(INFO, {})
    assert finding(findings, "notify-keyspace-events").value.startswith("unreadable")
    assert finding(findings, "notify-keyspace-events").level == "warn"
    assert finding(findings, "maxmemory-policy").level == "warn"
    assert verdict(findings) is True


def test_appendonly_is_ok() -> None:
    result = finding(assess(INFO, with_config(appendonly="yes", save="")), "persistence")
    assert result.level == "ok"


def test_rdb_only_warns_of_lost_and_refired_timers() -> None:
    result = finding(assess(INFO, with_config(appendonly="no")), "persistence")
    assert result.level == "warn"
    assert "loses the timers scheduled since the last snapshot" in result.advice
    assert "runs again the timers that fired since it" in result.advice
    assert "appendonly yes with appendfsync everysec" in result.advice


def test_aof_without_fsync_warns() -> None:
    result = finding(assess(INFO, with_config(appendfsync="no")), "persistence")
    assert result.level == "warn"
    assert "appendfsync everysec" in result.advice
    ok = finding(assess(INFO, with_config(appendfsync="everysec")), "persistence")
    assert (ok.level, ok.value) == ("ok", "appendonly yes, appendfsync everysec")


def test_no_persistence_warns() -> None:
    result = finding(assess(INFO, with_config(appendonly="no", save="")), "persistence")
    assert (result.level, result.value) == ("warn", "off")
    assert "appendonly yes" in result.advice


@pytest.mark.parametrize(("hz", "level"), [("10", "warn"), ("49", "warn"), ("50", "ok"),
                                           ("100", "ok"), ("500", "ok")])
def test_low_hz_warns(hz: str, level: str) -> None:
    result = finding(assess(INFO, with_config(hz=hz)), "hz")
    assert result.level == level
    if level == "warn":
        assert "hz 100" in result.advice


def test_verdict_fails_only_on_fail() -> None:
    assert verdict([Finding("warn", "a", "b"), Finding("ok", "c", "d")]) is True
    assert verdict([Finding("ok", "a", "b"), Finding("fail", "c", "d")]) is False
    assert verdict([]) is True


def test_permission_findings_fail_without_scripts_and_warn_without_channels() -> None:
    from timers.store.check import permission_findings
    from timers.store.permissions import Problem

    assert [f.level for f in permission_findings([])] == ["ok"]
    scripts = Problem("scripts", "the Redis user may not run EVALSHA: add the ACL rule +evalsha")
    channel = Problem("events", "the Redis user may not SUBSCRIBE to 'x': add the ACL rule &x")
    findings = permission_findings([scripts, channel])
    assert [(f.level, f.value) for f in findings] == [("fail", scripts.line),
                                                      ("warn", channel.line)]
    assert verdict(findings) is False
    assert verdict(permission_findings([channel])) is True
