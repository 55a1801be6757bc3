"""A module whose import takes a second, like one that loads a model or a big table.

At the end of its import it records in ``test:imported`` how many timers were still in the
due index: a listener that imports its package before claiming finds them all there.
"""

from __future__ import annotations

import json
import time

from tests.slow_import_tasks import IMPORTED
from tests.task_pkg import RUNS, client
from timers.model.keys import Keyspace

time.sleep(1.0)  # the slow import itself, not a wait for an outcome
client().rpush(IMPORTED, client().zcard(Keyspace().due))


def work(tag: str) -> None:
    client().rpush(RUNS, json.dumps([tag, "heavy"]))
