"""Per-task policy: retries with backoff, a run timeout, a maximum lateness.

```python
@timers.task(retries=5, backoff=timers.Backoff(first=10, cap=3600))
def sms(user_id: int) -> None: ...

@timers.task(retries=3, backoff=[30, 300, 3600], max_lateness=3600)
def morning_digest(user_id: int) -> None: ...

@timers.task(max_crashes=1)   # a task that may kill its process: never run it twice
def render(doc_id: int) -> None: ...
```

Flow control, fleet-wide (enforced in Redis by every listener together):

```python
@timers.task(concurrency=1, key=lambda device_id, command: f"device:{device_id}")
def send(device_id: int, command: str) -> None: ...   # one command at a time per device

@timers.task(concurrency=20, rate="600/m", group="llm")
def complete(prompt_id: int) -> None: ...
```

- ``concurrency=N`` alone: at most N runs of this task at once, across all listeners.
- ``key=`` with it: at most N runs at once *per key* (N is 1 when only ``key`` is given).
  ``key`` is a string, or a function called with the timer's args the way the task is
  called, returning the key. A timer whose key is full waits (not an attempt, not lost).
- ``rate="100/m"``: starts spread evenly at that rate (see [`Rate`][timers.model.flow.rates.Rate]),
  per ``rate_key`` value when given (a string or a function of the args, like ``key``);
  ``burst`` starts may go back to back.
- ``group=``: the task's timers run only on listeners serving that group.

``history=``: how long the run history keeps the task's ended timers. ``True`` (or
``None``, the default): as long as the listener keeps every task's (``timers listen
--history-age``, default 7 days); a duration, ``"1h"``, ``"30d"``, or a number of seconds:
that long instead, longer or shorter than the listener's; ``False`` (or ``0``): none (a
chatty task's records would push out the others'). Its per-minute series is kept either
way, and the listener's ``--history-count`` bounds every task's records together.

```python
@timers.task(history="30d")   # kept a month, whatever the listener's age
def charge(order_id: int) -> None: ...

@timers.task(history=False)   # a heartbeat every second: keep none
def ping() -> None: ...
```

``history_count=N``: at most the N newest ended timers of this task are kept (per shard,
like the listener's ``--history-count``), on top of the ages and the listener's count;
``0`` keeps none (as ``history=False``); ``None`` (the default): only the listener's count
bounds them. A task without one costs the history nothing more; one with one, a sorted
set entry per kept record.

```python
@timers.task(history_count=1000)   # a chatty task: its last thousand ends are enough
def poll_feed(feed_id: int) -> None: ...
```

The decorator only attaches the policy to the function (the function is still found by its
path in the tasks package); with ``name=`` it is also registered under that name, for
listeners built with ``registry=timers.registered()``.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar, overload

from timers.exceptions import InvalidDueTime
from timers.model.due import MAX_DELAY_MS, parse_duration
from timers.model.flow.declared import KeySpec, check_flow, key_for
from timers.model.flow.names import TASK_KEY
from timers.model.flow.rates import Rate

F = TypeVar("F", bound=Callable[..., Any])
POLICY_ATTRIBUTE = "__timers_policy__"

MAX_HISTORY_COUNT = 10**9
"""The most ``@task(history_count=...)`` takes (a bound on a number sent to Redis)."""

HistorySpec = bool | float | str | timedelta | None
"""What ``@task(history=...)`` takes: ``True``/``None`` (the listener's age), ``False``/``0``
(none), or how long: seconds, a duration such as ``"7d"``, or a timedelta."""


def history_age(value: HistorySpec) -> float | None:
    """The seconds a task's ``history=`` keeps its ended timers: None for the listener's
    age (``True``, ``None``), 0.0 for none (``False``, ``0``), else how long (a number of
    seconds, a duration such as ``"7d"``, a timedelta). Anything else (negative, not
    finite, over a hundred years, unreadable) is a ValueError saying what it takes:
    ``"7d"`` is 604800.0, ``False`` 0.0, ``True`` None."""
    if value is None or value is True:
        return None
    if value is False:
        return 0.0
    age = math.nan
    if isinstance(value, timedelta):
        age = value.total_seconds()
    elif isinstance(value, int | float):
        age = float(value)
    elif isinstance(value, str):
        with contextlib.suppress(InvalidDueTime, ValueError):
            age = parse_duration(value)
    if not (math.isfinite(age) and 0 <= age * 1000 <= MAX_DELAY_MS):
        raise ValueError(f"history must be True, False, or how long to keep the task's ended "
                         f"timers (seconds, or a duration such as '7d'), got {value!r}")
    return age


def history_count_of(value: object) -> int | None:
    """``@task(history_count=...)`` checked: None (only the listener's count applies) or
    a whole number of 0 or more, at most `MAX_HISTORY_COUNT`; anything else is a
    ValueError saying what it takes."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, int)
            or not 0 <= value <= MAX_HISTORY_COUNT):
        raise ValueError(f"history_count must be None or a whole number from 0 to "
                         f"{MAX_HISTORY_COUNT}, got {value!r}")
    return value


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: attempt n waits up to ``first * factor**(n-1)``,
    capped at ``cap`` seconds; with ``jitter`` a random share of that, never under half."""

    first: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: bool = True

    def __post_init__(self) -> None:
        for name in ("first", "factor", "cap"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"Backoff {name} must be a finite number >= 0, got {value!r}")

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        try:
            base = min(self.cap, self.first * self.factor ** max(failures - 1, 0))
        except OverflowError:
            base = self.cap
        if not self.jitter:
            return base
        return base * (0.5 + 0.5 * (rng or random).random())


@dataclass(frozen=True)
class TaskPolicy:
    """How a task's timers are retried and bounded. The default: no retries, no limits."""

    retries: int = 0
    backoff: Backoff | tuple[float, ...] = field(default_factory=Backoff)
    timeout: float | None = None
    max_lateness: float | None = None
    max_crashes: int = 3
    """Runs cut short by their listener dying (os._exit, a segfault, kill -9) before the
    timer is recorded dead instead of run again."""
    group: str | None = None
    """The group the task's timers belong to (None: the group they were scheduled in)."""
    concurrency: int | None = None
    """At most this many runs at once, fleet-wide (per key with ``key``)."""
    key: KeySpec | None = None
    """The concurrency key: a string, or a function of the timer's args."""
    rate: Rate | None = None
    """Starts spread evenly at this rate, fleet-wide (per ``rate_key`` value if given)."""
    rate_key: KeySpec | None = None
    burst: int = 1
    history: float | None = None
    """How long (seconds) the run history keeps this task's ended timers: None, the
    listener's ``--history-age``; 0, none (its series is kept either way). Given as
    ``@task(history=...)`` takes it ([`history_age`][timers.model.policy.history_age])."""
    history_ms: int | None = field(default=None, init=False, repr=False, compare=False)
    """[`history`][timers.model.policy.TaskPolicy.history] in ms as the run history stores it (at
    least 1 when not 0)."""
    history_count: int | None = None
    """At most this many of the task's ended timers are kept in the run history, per
    shard (the newest; 0: none); None: only the listener's ``--history-count`` applies.
    Given as ``@task(history_count=...)``
    ([`history_count_of`][timers.model.policy.history_count_of])."""

    def __post_init__(self) -> None:
        concurrency, rate, burst = check_flow(self.group, self.concurrency, self.key,
                                              self.rate, self.rate_key, self.burst)
        object.__setattr__(self, "concurrency", concurrency)
        object.__setattr__(self, "rate", rate)
        object.__setattr__(self, "burst", burst)
        age = history_age(self.history)
        object.__setattr__(self, "history", age)
        object.__setattr__(self, "history_ms",
                           None if age is None else max(1, round(age * 1000)) if age else 0)
        history_count_of(self.history_count)
        if self.retries < 0:
            raise ValueError("retries must be 0 or more")
        if self.max_crashes < 1:
            raise ValueError(f"max_crashes must be 1 or more, got {self.max_crashes}")
        if isinstance(self.backoff, tuple):
            if not self.backoff and self.retries:
                raise ValueError("an explicit backoff list needs at least one delay")
            if not all(math.isfinite(d) and d >= 0 for d in self.backoff):
                raise ValueError(f"backoff delays must be finite and >= 0, got {self.backoff}")
        if self.timeout is not None and not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {self.timeout}")
        if self.max_lateness is not None and not (
            math.isfinite(self.max_lateness) and self.max_lateness >= 0
        ):
            raise ValueError(f"max_lateness must be 0 or more seconds, got {self.max_lateness}")

    @property
    def flow_limited(self) -> bool:
        """Whether the task limits its runs (concurrency, a key or a rate)."""
        return self.concurrency is not None or self.key is not None or self.rate is not None

    def limit_name(self, task: str, args: Any) -> str | None:
        """The name whose shard holds a timer of ``task`` with ``args`` on a prefix of
        several shards (`timers.ops.shards`, rules 2 and 3): its rate's (``rate_key``'s,
        else the task's), else its concurrency key's (``key``'s, else the task's for a
        cap); None without a limit. A key function's own error propagates."""
        if self.rate is not None:
            return TASK_KEY + task if self.rate_key is None else key_for(
                self.rate_key, args, "rate_key")
        if self.key is not None:
            return key_for(self.key, args)
        return None if self.concurrency is None else TASK_KEY + task

    def retry_delay(self, failures: int, rng: random.Random | None = None) -> float | None:
        """Seconds until the next attempt after ``failures`` failed ones; None: give up."""
        if failures > self.retries:
            return None
        if isinstance(self.backoff, tuple):
            return self.backoff[min(failures, len(self.backoff)) - 1]
        return self.backoff.delay(failures, rng)


DEFAULT_POLICY = TaskPolicy()
_registry: dict[str, Callable[..., Any]] = {}


@overload
def task(fn: F) -> F: ...


@overload
def task(
    fn: None = None,
    *,
    retries: int = 0,
    backoff: Backoff | Sequence[float] | None = None,
    timeout: float | None = None,
    max_lateness: float | None = None,
    max_crashes: int = 3,
    name: str | None = None,
    group: str | None = None,
    concurrency: int | None = None,
    key: KeySpec | None = None,
    rate: str | Rate | None = None,
    rate_key: KeySpec | None = None,
    burst: int = 1,
    history: HistorySpec = True,
    history_count: int | None = None,
) -> Callable[[F], F]: ...


def task(
    fn: F | None = None,
    *,
    retries: int = 0,
    backoff: Backoff | Sequence[float] | None = None,
    timeout: float | None = None,
    max_lateness: float | None = None,
    max_crashes: int = 3,
    name: str | None = None,
    group: str | None = None,
    concurrency: int | None = None,
    key: KeySpec | None = None,
    rate: str | Rate | None = None,
    rate_key: KeySpec | None = None,
    burst: int = 1,
    history: HistorySpec = True,
    history_count: int | None = None,
) -> Any:
    """Give a task a retry/timeout/lateness policy and flow limits (see the module
    docstring); usable bare or with arguments."""
    policy = TaskPolicy(
        retries=retries,
        backoff=Backoff() if backoff is None else (
            backoff if isinstance(backoff, Backoff) else tuple(float(d) for d in backoff)
        ),
        timeout=timeout,
        max_lateness=max_lateness,
        max_crashes=max_crashes,
        group=group,
        concurrency=concurrency,
        key=key,
        rate=rate,  # type: ignore[arg-type]  # parsed to a Rate by TaskPolicy
        rate_key=rate_key,
        burst=burst,
        history=history,  # type: ignore[arg-type]  # read by TaskPolicy (history_age)
        history_count=history_count,
    )

    def decorate(func: F) -> F:
        setattr(func, POLICY_ATTRIBUTE, policy)
        if name is not None:
            _registry[name] = func
        return func

    return decorate(fn) if fn is not None else decorate


def policy_of(fn: Callable[..., Any]) -> TaskPolicy:
    policy = getattr(fn, POLICY_ATTRIBUTE, None)
    return policy if isinstance(policy, TaskPolicy) else DEFAULT_POLICY


def registered() -> dict[str, Callable[..., Any]]:
    """Tasks registered by name with ``@timers.task(name=...)``."""
    return dict(_registry)


def registered_policy(name: str) -> TaskPolicy | None:
    """The policy of the task registered as ``name`` in this process, if any."""
    fn = _registry.get(name)
    return None if fn is None else policy_of(fn)
