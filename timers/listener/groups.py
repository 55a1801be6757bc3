"""Which groups a listener serves: the ones it is given, else ``$TIMERS_GROUP``, else the
default group. It claims only timers of those groups (invariant 9)."""

from __future__ import annotations

from collections.abc import Sequence

from timers.flow.names import check_group, configured_group


def served_groups(groups: Sequence[str] | None = None) -> tuple[str, ...]:
    """The groups, each checked, in the order given, without repeats."""
    if not groups:
        return (configured_group(),)
    if isinstance(groups, str):
        groups = [groups]
    return tuple(dict.fromkeys(check_group(group) for group in groups))
