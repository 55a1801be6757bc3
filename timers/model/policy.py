"""Per-task policy: retries with backoff, a run timeout, a maximum lateness.

>>> @timers.task(retries=5, backoff=timers.Backoff(first=10, cap=3600))
... def sms(user_id: int) -> None: ...

>>> @timers.task(retries=3, backoff=[30, 300, 3600], max_lateness=3600)
... def morning_digest(user_id: int) -> None: ...

>>> @timers.task(max_crashes=1)   # a task that may kill its process: never run it twice
... def render(doc_id: int) -> None: ...

Flow control, fleet-wide (enforced in Redis by every listener together):

>>> @timers.task(concurrency=1, key=lambda device_id, command: f"device:{device_id}")
... def send(device_id: int, command: str) -> None: ...   # one command at a time per device

>>> @timers.task(concurrency=20, rate="600/m", group="llm")
... def complete(prompt_id: int) -> None: ...

- ``concurrency=N`` alone: at most N runs of this task at once, across all listeners.
- ``key=`` with it: at most N runs at once *per key* (N is 1 when only ``key`` is given).
  ``key`` is a string, or a function called with the timer's args the way the task is
  called, returning the key. A timer whose key is full waits (not an attempt, not lost).
- ``rate="100/m"``: starts spread evenly at that rate (see :class:`timers.model.flow.Rate`),
  per ``rate_key`` value when given (a string or a function of the args, like ``key``);
  ``burst`` starts may go back to back.
- ``group=``: the task's timers run only on listeners serving that group.

``history=False`` (or ``0``): the run history keeps none of the task's ended timers (a
chatty task's records would push out the others'); its per-minute series is kept.

The decorator only attaches the policy to the function (the function is still found by its
path in the tasks package); with ``name=`` it is also registered under that name, for
listeners built with ``registry=timers.registered()``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from timers.model.flow.declared import KeySpec, check_flow
from timers.model.flow.rates import Rate

F = TypeVar("F", bound=Callable[..., Any])
POLICY_ATTRIBUTE = "__timers_policy__"


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
    history: bool = True
    """Whether the run history keeps this task's ended timers (``False`` or ``0``: none;
    its series is kept either way). How long is the listener's (``--history-age``)."""

    def __post_init__(self) -> None:
        concurrency, rate, burst = check_flow(self.group, self.concurrency, self.key,
                                              self.rate, self.rate_key, self.burst)
        object.__setattr__(self, "concurrency", concurrency)
        object.__setattr__(self, "rate", rate)
        object.__setattr__(self, "burst", burst)
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
    history: bool = True,
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
    history: bool = True,
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
        history=bool(history),
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
