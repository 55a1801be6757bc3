"""Poison timers: a timer is dead of crashes only on deaths seen, never of lapsed leases.

The claim script re-claims a run whose lease lapsed with ``reruns + 1`` and names the
listener that held it. A lapse says a listener died *or* stalled past its lease (a pause,
a swap storm): it is counted (``reruns`` in ``timers stats``) and makes the run a suspect,
but it is no evidence of a death, and a run that lapsed before it started (held next in
line, handed back, held at its gate) died of nothing. So a suspect runs again in a child
process (:mod:`timers.listener.quarantine.parent`), where its listener sees each death itself: a
child that exits without an outcome. Only those deaths count toward the task's
``max_crashes``; a poison still stops (after its first death, every run of it is a
suspect), and a timer whose listener was paused never ends dead for it.

What a dead timer's record says is what is known: how many of its starts died in
quarantine, how many children died before they started it, and, as context, how many
lapsed leases came before.
"""

from __future__ import annotations

from timers.model.runs import Outcome


def died_outcome(died: int, last: str, lapses: int = 0, before_start: int = 0) -> Outcome:
    """A timer dead of crashes in quarantine: ``died`` starts that died there (the last
    one ``last``, how and where), and ``before_start`` quarantine processes that died
    before they started it; ``lapses``: leases of it that lapsed before (not crashes)."""
    parts = [f"its process died {times(died)} in quarantine (last: {last})"]
    if before_start:
        parts.append(f"{before_start} quarantine process(es) died before starting it")
    if lapses:
        parts.append(f"after its lease lapsed {times(lapses)} (its listener died or stalled)")
    return Outcome("crashed", "ProcessDied", ", ".join(parts))


def times(n: int) -> str:
    """``once``, ``2 times``."""
    return "once" if n == 1 else f"{n} times"


def listener_name(listener_id: str) -> str:
    """``host:pid`` of a listener id ``host:pid:<random>``."""
    host, sep, rest = listener_id.partition(":")
    return f"{host}:{rest.partition(':')[0]}" if sep else listener_id
