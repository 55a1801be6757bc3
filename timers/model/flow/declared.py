"""What a task declares about its flow: ``@timers.task(concurrency=…, key=…, rate=…)``.

:func:`check_flow` checks the declaration (:class:`timers.TaskPolicy` calls it) and
:func:`key_for` turns a declared key (a string, or a function of the timer's args) into
the key of one timer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from timers.exceptions import InvalidTimer
from timers.model.flow.names import check_group, check_key, escape_key
from timers.model.flow.rates import Rate

KeySpec = str | Callable[..., str]
"""A declared key: the same for every timer, or computed from each timer's args."""


def check_key_spec(key: object, name: str) -> KeySpec | None:
    """None, a valid key string, or a callable; else :class:`InvalidTimer`."""
    if key is None or callable(key):
        return key
    if isinstance(key, str):
        escape_key(check_key(key))
        return key
    raise InvalidTimer(
        f"{name} must be a string or a function of the task's args, got {type(key).__name__}"
    )


def _check_concurrency(concurrency: object) -> None:
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise InvalidTimer(f"concurrency must be an integer of 1 or more, got {concurrency!r}")


def check_flow(
    group: str | None,
    concurrency: int | None,
    key: object,
    rate: Rate | str | None,
    rate_key: object,
    burst: int,
) -> tuple[int | None, Rate | None, int]:
    """Check a task's flow declaration; returns its concurrency (1 when only ``key`` is
    given), its rate (parsed, carrying ``burst``) and its burst."""
    if group is not None:
        check_group(group)
    _check_concurrency(concurrency)
    check_key_spec(key, "key")
    check_key_spec(rate_key, "rate_key")
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise InvalidTimer(f"burst must be an integer of 1 or more, got {burst!r}")
    if rate is None:
        if rate_key is not None:
            raise InvalidTimer("rate_key needs rate= (the rate to enforce per key)")
        if burst != 1:
            raise InvalidTimer("burst needs rate= (the rate it lets starts bunch up in)")
        return (1 if concurrency is None and key is not None else concurrency), None, 1
    if isinstance(rate, str):
        rate = Rate.parse(rate, burst)
    elif not isinstance(rate, Rate):
        raise InvalidTimer(f"rate must be a string such as '100/m' or a Rate, got {rate!r}")
    elif burst != 1:
        rate = replace(rate, burst=burst)
    return (1 if concurrency is None and key is not None else concurrency), rate, rate.burst


def key_for(key: KeySpec, args: Any, name: str = "key") -> str:
    """The key of one timer: ``key`` itself, or ``key`` called with the timer's args the
    way the task is called (a list as positional, a dict as keyword arguments). The
    function's own error propagates; a result that is not a valid key is
    :class:`InvalidTimer`."""
    if isinstance(key, str):
        return key
    if isinstance(args, dict):
        value = key(**args)
    elif isinstance(args, list | tuple):
        value = key(*args)
    else:
        value = key()
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # key=lambda device_id, **_: device_id
    try:
        checked = check_key(value)
        escape_key(checked)
    except InvalidTimer as exc:
        label = getattr(key, "__qualname__", repr(key))
        raise InvalidTimer(f"{name} function {label} gave a bad key: {exc}") from None
    return checked
