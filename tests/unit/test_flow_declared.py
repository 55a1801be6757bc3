"""What ``@timers.task`` declares about flow control: stored on the task's policy, checked
when the module is imported, with a one-line error for each mistake."""

from __future__ import annotations

from typing import Any

import pytest

import timers
from timers import InvalidTimer, Rate, TaskPolicy
from timers.model.flow.declared import key_for
from timers.model.policy import policy_of


def declare(**options: Any) -> TaskPolicy:
    @timers.task(**options)
    def fn(*args: Any, **kwargs: Any) -> None: ...

    return policy_of(fn)


def test_a_task_without_flow_options_is_not_limited() -> None:
    policy = declare(retries=2)
    assert not policy.flow_limited
    assert (policy.group, policy.concurrency, policy.key, policy.rate) == (None, None, None,
                                                                           None)


def test_concurrency_alone_is_a_fleet_wide_cap() -> None:
    policy = declare(concurrency=20)
    assert policy.flow_limited and policy.concurrency == 20 and policy.key is None


def test_a_key_alone_means_one_run_at_a_time_per_key() -> None:
    policy = declare(key=lambda device_id, command: f"device:{device_id}")
    assert policy.concurrency == 1 and policy.flow_limited
    assert policy.key is not None
    assert key_for(policy.key, [7, "reboot"]) == "device:7"
    assert key_for(policy.key, {"device_id": 8, "command": "x"}) == "device:8"


def test_a_key_string_is_the_same_for_every_timer() -> None:
    policy = declare(concurrency=3, key="openai")
    assert policy.concurrency == 3 and key_for("openai", [1]) == "openai"


def test_a_rate_is_parsed_with_its_burst() -> None:
    policy = declare(rate="600/m", burst=5, rate_key=lambda user: f"user:{user}")
    assert policy.rate == Rate(600, 60_000, 5) and policy.burst == 5
    assert policy.rate.interval_ms == 100 and policy.flow_limited
    assert declare(rate=Rate(5, 1000)).rate == Rate(5, 1000)
    assert declare(rate=Rate(5, 1000), burst=2).rate == Rate(5, 1000, 2)


def test_a_group_is_stored_and_alone_limits_nothing() -> None:
    policy = declare(group="video")
    assert policy.group == "video" and not policy.flow_limited


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"group": "video nodes"},
         "group 'video nodes' must be 1 to 64 letters, digits, '_', '.' or '-'"),
        ({"concurrency": 0}, "concurrency must be an integer of 1 or more, got 0"),
        ({"concurrency": True}, "concurrency must be an integer of 1 or more, got True"),
        ({"concurrency": 2.0}, "concurrency must be an integer of 1 or more, got 2.0"),
        ({"key": 7}, "key must be a string or a function of the task's args, got int"),
        ({"key": ""}, "concurrency key must be 1 to 200 characters, got 0"),
        ({"rate": "100/x"},
         "rate '100/x' must look like '100/m' (per s, m, h or d; e.g. '10/30s')"),
        ({"rate": 100}, "rate must be a string such as '100/m' or a Rate, got 100"),
        ({"rate_key": "k"}, "rate_key needs rate= (the rate to enforce per key)"),
        ({"rate_key": 3, "rate": "1/s"},
         "rate_key must be a string or a function of the task's args, got int"),
        ({"burst": 3}, "burst needs rate= (the rate it lets starts bunch up in)"),
        ({"burst": 0, "rate": "1/s"}, "burst must be an integer of 1 or more, got 0"),
    ],
)
def test_a_bad_declaration_fails_at_import_in_one_line(options: dict[str, Any],
                                                       message: str) -> None:
    with pytest.raises(ValueError) as err:
        declare(**options)
    assert str(err.value) == message


def test_a_key_function_that_gives_no_valid_key_is_named() -> None:
    def device(n: int) -> Any:
        return n if n else None

    assert key_for(device, [7]) == "7"  # a whole number is taken as its text
    with pytest.raises(InvalidTimer) as err:
        key_for(device, [0])
    assert str(err.value) == (
        "key function test_a_key_function_that_gives_no_valid_key_is_named.<locals>.device "
        "gave a bad key: concurrency key must be a string, got NoneType"
    )
    assert key_for(lambda: "fixed", None) == "fixed"
