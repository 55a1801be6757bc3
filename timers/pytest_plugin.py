"""The pytest plugin of :mod:`timers.testing` (registered by the ``pytest11`` entry point).

It gives a test the ``timers_test`` fixture: a :class:`timers.testing.TimersTest` entered
for the test (``timers.*``, ``timers.aio.*`` and every ``Timers``/``AsyncTimers`` the app
makes meanwhile on an in-memory server), left after it.
The tasks package is the ``timers_tasks`` ini option, else ``$TIMERS_TASKS``, else
``tasks``, found as ``timers listen`` finds it with pytest's rootdir (the project's root)
in place of the working directory. This module imports nothing of the testing side
until a test asks for the fixture, so a project without ``redis-timers[testing]`` installed is
not affected.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from timers.testing import TimersTest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("timers_tasks", "the tasks package timers_test runs (default: "
                  "$TIMERS_TASKS or tasks)", default="")


@pytest.fixture
def timers_test(request: pytest.FixtureRequest) -> Iterator[TimersTest]:
    """Timers in memory for this test; ``timers_test.run_due()`` runs what is due."""
    from timers.testing import TimersTest  # needs fakeredis[lua]: only when asked for

    tasks = str(request.config.getini("timers_tasks")) or None
    # From the project's root, not the working directory: an IDE running one test file
    # starts pytest in that file's directory.
    with TimersTest(tasks, search_path=str(request.config.rootpath)) as t:
        yield t
