"""A module that fails on import, counting each attempt."""

from __future__ import annotations

from tests.unit.sample_tasks import IMPORT_ATTEMPTS

IMPORT_ATTEMPTS[__name__] = IMPORT_ATTEMPTS.get(__name__, 0) + 1

raise RuntimeError("broken on purpose")
