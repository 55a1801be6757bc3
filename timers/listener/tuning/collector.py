"""The garbage collector of a listener process (``timers listen``).

Each run allocates a few dozen short-lived objects (its run, record, outcome, ending,
report, the task's own). With Python's default thresholds (700, 10, 10) the collector ran
a young collection every few dozen runs, and every few hundred a full one that walks
every object of the process: the listener's, redis-py's, the tasks package's. In a burst
of ``async def`` runs they took a good share of the listener's CPU, and each full one
paused every run while it walked.

:func:`tune`, called once the tasks package is imported, collects what is garbage by then
and moves the rest out of the collector's reach for good (``gc.freeze``: a full
collection no longer walks it) and raises the young threshold to
:data:`YOUNG_THRESHOLD`, so a young collection comes after that many more container
objects are alive, not 700. Objects in reference cycles still go at the next collection;
the same burst then ran a few young collections and no full one
(figures: bench/FINDINGS.md, "The listener's garbage collector").
Only ``timers listen`` does this: a :class:`~timers.Listener` inside an application
leaves that process's collector as it is.
"""

from __future__ import annotations

import gc

from timers import speed

YOUNG_THRESHOLD = 7_000
"""Container objects allocated (less those freed) between two young collections."""


def tune() -> None:
    """Collect, freeze what the process holds now, and raise the young threshold (not with
    the speed trick ``gc`` off: :mod:`timers.speed`)."""
    if not speed.on("gc"):
        return
    _, older, oldest = gc.get_threshold()
    gc.collect()  # garbage frozen would never be freed
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
