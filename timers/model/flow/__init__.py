"""Flow control: which listeners run a timer (groups), how many at once (concurrency keys),
how fast (rate limits) and in what order (priority).

- :mod:`timers.model.flow.names`: group names, priorities and concurrency keys, checked and escaped
  for the stored record.
- :mod:`timers.model.flow.rates`: :class:`Rate`, a rate limit such as ``"100/m"``.
- :mod:`timers.model.flow.declared`: what ``@timers.task(concurrency=…, key=…, rate=…)`` declares.
- :mod:`timers.model.flow.options`: the record options a producer writes and reads back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from timers.model.flow.names import DEFAULT_GROUP, GROUP_ENV

if TYPE_CHECKING:
    from timers.model.flow.rates import Rate

__all__ = ["DEFAULT_GROUP", "GROUP_ENV", "Rate"]


def __getattr__(name: str) -> Any:
    """``Rate`` on first use: a producer that reads group names loads no rate limits."""
    if name == "Rate":
        from timers.model.flow.rates import Rate

        return Rate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
