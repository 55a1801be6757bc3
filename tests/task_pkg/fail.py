"""Tasks that fail."""

from __future__ import annotations


class TaskBroke(RuntimeError):
    """What :func:`boom` raises."""


def boom(tag: str) -> None:
    raise TaskBroke(f"boom {tag}")



HEALED = "test:healed"


def until_healed(tag: str) -> None:
    """Fails until the key ``test:healed`` exists, then records the run in ``test:runs``
    (a bug fixed, then the dead timer retried)."""
    from tests.task_pkg import client
    from tests.task_pkg.record import hit

    if not client().exists(HEALED):
        raise TaskBroke(f"not healed yet {tag}")
    hit(tag)
