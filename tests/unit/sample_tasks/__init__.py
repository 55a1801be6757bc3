"""A tasks package for the unit tests: ``tests.unit.sample_tasks``.

``IMPORT_ATTEMPTS`` counts how often each module of the package was executed, so tests
can tell whether the loader imported something again.
"""

from __future__ import annotations

IMPORT_ATTEMPTS: dict[str, int] = {}


def top_level(value: int) -> int:
    """A task defined in the package itself: task path ``top_level``."""
    return value
