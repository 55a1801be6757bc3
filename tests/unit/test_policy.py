"""Task policies: backoff delays, when retries stop, the decorator, and what it refuses.

Pure: no Redis, no waiting. Jitter is checked with seeded ``random.Random`` instances.
"""

from __future__ import annotations

import inspect
import math
import random

import pytest

import timers
from timers.model.policy import DEFAULT_POLICY, Backoff, TaskPolicy, policy_of, registered, task

# -- Backoff ----------------------------------------------------------------------------


def test_backoff_without_jitter_grows_by_its_factor_from_first() -> None:
    backoff = Backoff(first=1, factor=2, cap=1000, jitter=False)
    assert [backoff.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 32, 64]
    assert [Backoff(first=10, factor=3, cap=1e9, jitter=False).delay(n)
            for n in (1, 2, 3)] == [10, 30, 90]


def test_backoff_stops_growing_at_its_cap() -> None:
    backoff = Backoff(first=1, factor=2, cap=100, jitter=False)
    assert [backoff.delay(n) for n in range(6, 11)] == [32, 64, 100, 100, 100]
    assert Backoff(first=500, factor=2, cap=100, jitter=False).delay(1) == 100


def test_backoff_before_any_failure_is_the_first_delay() -> None:
    assert Backoff(first=7, factor=2, cap=100, jitter=False).delay(0) == 7


@pytest.mark.parametrize("factor", [2, 2.0, 1.5])
def test_backoff_stays_at_its_cap_for_large_attempt_numbers(factor: float) -> None:
    """``@task(retries=5000)`` is a way to say "keep trying": attempt 2000 waits ``cap``."""
    backoff = Backoff(first=1, factor=factor, cap=60, jitter=False)
    assert backoff.delay(2000) == 60
    assert TaskPolicy(retries=5000, backoff=backoff).retry_delay(2000) == 60
    jittered = Backoff(first=1, factor=factor, cap=60, jitter=True)
    assert 30 <= jittered.delay(2000, random.Random(1)) <= 60


def test_jittered_backoff_stays_between_half_and_all_of_the_plain_delay() -> None:
    plain = Backoff(first=1, factor=2, cap=50, jitter=False)
    jittered = Backoff(first=1, factor=2, cap=50, jitter=True)
    for seed in range(50):
        rng = random.Random(seed)
        for n in range(1, 12):
            base = plain.delay(n)
            assert base / 2 <= jittered.delay(n, rng) <= base, (seed, n)


def test_jitter_is_drawn_from_the_given_random_source() -> None:
    jittered = Backoff(first=10, factor=2, cap=1000, jitter=True)
    first = [jittered.delay(n, random.Random(42)) for n in range(1, 6)]
    again = [jittered.delay(n, random.Random(42)) for n in range(1, 6)]
    assert first == again
    rng = random.Random(7)
    spread = {jittered.delay(3, rng) for _ in range(100)}
    assert len(spread) > 50, "jitter must actually vary the delay"
    assert min(spread) < 0.6 * 40 and max(spread) > 0.9 * 40, "jitter spans [base/2, base]"


def test_jitter_uses_the_module_random_without_a_source() -> None:
    jittered = Backoff(first=4, factor=2, cap=100, jitter=True)
    for _ in range(100):
        assert 2 <= jittered.delay(1) <= 4


# -- TaskPolicy.retry_delay -------------------------------------------------------------


def test_explicit_delays_are_used_in_order_and_the_last_repeats() -> None:
    policy = TaskPolicy(retries=6, backoff=(30.0, 300.0, 3600.0))
    assert [policy.retry_delay(n) for n in range(1, 7)] == [30, 300, 3600, 3600, 3600, 3600]


def test_retry_delay_is_none_once_the_retries_are_used_up() -> None:
    policy = TaskPolicy(retries=3, backoff=(1.0, 2.0))
    assert [policy.retry_delay(n) for n in range(1, 6)] == [1, 2, 2, None, None]


def test_no_retries_by_default() -> None:
    assert TaskPolicy() == DEFAULT_POLICY
    assert DEFAULT_POLICY.retries == 0
    assert DEFAULT_POLICY.timeout is None and DEFAULT_POLICY.max_lateness is None
    assert DEFAULT_POLICY.retry_delay(1) is None


def test_retry_delay_with_a_backoff_is_the_backoff_delay() -> None:
    backoff = Backoff(first=2, factor=3, cap=500, jitter=True)
    policy = TaskPolicy(retries=4, backoff=backoff)
    for n in range(1, 5):
        assert policy.retry_delay(n, random.Random(n)) == backoff.delay(n, random.Random(n))
    assert policy.retry_delay(5, random.Random(5)) is None


# -- the decorator ----------------------------------------------------------------------


def test_bare_decorator_attaches_the_default_policy_and_returns_the_function() -> None:
    def plain(x: int) -> int:
        return x + 1

    decorated = task(plain)
    assert decorated is plain
    assert decorated(1) == 2
    assert policy_of(plain) == TaskPolicy()

    @timers.task
    def bare() -> str:
        return "ran"

    assert bare() == "ran"
    assert policy_of(bare) == DEFAULT_POLICY


def test_decorator_with_arguments_builds_the_policy() -> None:
    @task(retries=3, backoff=[30, 300], timeout=20, max_lateness=3600)
    def digest(user_id: int) -> int:
        return user_id

    assert digest(5) == 5
    assert digest.__name__ == "digest"
    policy = policy_of(digest)
    assert policy == TaskPolicy(retries=3, backoff=(30.0, 300.0), timeout=20,
                                max_lateness=3600)
    assert isinstance(policy.backoff, tuple)
    assert all(isinstance(d, float) for d in policy.backoff)
    assert [policy.retry_delay(n) for n in (1, 2, 3, 4)] == [30, 300, 300, None]

    backoff = Backoff(first=10, factor=2, cap=3600)

    @task(retries=5, backoff=backoff)
    def sms(user_id: int) -> None: ...

    assert policy_of(sms).backoff is backoff
    assert policy_of(sms).retries == 5


def test_decorator_leaves_async_functions_async() -> None:
    @task(timeout=0.5)
    async def coro() -> None: ...

    assert inspect.iscoroutinefunction(coro)
    assert policy_of(coro).timeout == 0.5


def test_policy_of_an_undecorated_function_is_the_default() -> None:
    def plain() -> None: ...

    assert policy_of(plain) is DEFAULT_POLICY
    plain.__timers_policy__ = "not a policy"  # type: ignore[attr-defined]
    assert policy_of(plain) is DEFAULT_POLICY


def test_name_registers_the_function_for_listeners() -> None:
    @task(name="test_policy.named", retries=1, backoff=[5])
    def named() -> None: ...

    @task(retries=1)
    def unnamed() -> None: ...

    found = registered()
    assert found["test_policy.named"] is named
    assert unnamed not in found.values()
    assert policy_of(found["test_policy.named"]).retries == 1
    found.pop("test_policy.named")
    assert registered()["test_policy.named"] is named, "registered() returns a copy"
    assert timers.registered()["test_policy.named"] is named


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"retries": -1}, "retries"),
        ({"retries": 2, "backoff": []}, "at least one delay"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1.5}, "timeout"),
        ({"max_lateness": -1}, "max_lateness"),
    ],
)
def test_bad_policies_raise_value_error(options: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        task(**options)
    with pytest.raises(ValueError, match=says):
        TaskPolicy(**{k: tuple(v) if isinstance(v, list) else v  # type: ignore[arg-type]
                      for k, v in options.items()})


def test_edge_values_that_are_fine() -> None:
    assert TaskPolicy(retries=0, backoff=()).retry_delay(1) is None
    assert TaskPolicy(max_lateness=0).max_lateness == 0
    assert TaskPolicy(timeout=0.001).timeout == 0.001


@pytest.mark.parametrize(
    "options",
    [
        {"timeout": math.nan},
        {"max_lateness": math.nan},
        {"retries": 1, "backoff": [-5]},
    ],
    ids=["nan-timeout", "nan-max-lateness", "negative-delay"],
)
def test_nonsense_numbers_are_bad_policies_too(options: dict[str, object]) -> None:
    """NaN passes the ``<= 0`` / ``< 0`` checks, yet a NaN max_lateness makes every run
    "missed" (no lateness is ``<=`` NaN) and a NaN timeout times out every task that awaits
    anything; a negative delay is a typo like a negative timeout. Each must be refused."""
    with pytest.raises(ValueError):
        task(**options)
