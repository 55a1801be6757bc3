"""The speed layer's one switch: each trick that makes a hot path faster by stepping past
redis-py's public API or Python's defaults is on unless ``$TIMERS_SPEED_OFF`` names it.

- ``init``: frozen dataclasses made once or more per run or per schedule get a generated
  ``__init__`` that fills ``__dict__`` (``timers/model/fast_init.py``).
- ``gc``: ``timers listen`` freezes what its process holds once the tasks are imported,
  and raises the young threshold (``timers/listener/tuning/collector.py``).
- ``reader``: the listener takes pub/sub replies hiredis has parsed straight from
  redis-py's reader (``timers/listener/finding/events.py``; private names, pinned by
  ``tests/unit/test_redis_py_private_names.py``).
- ``packing``: the listener's connections pack commands with hiredis
  (``timers/store/listener_client.py``).
- ``connections``: script calls go out on a connection kept aside for them, past
  redis-py's pool and command path (``timers/store/connect.py``,
  ``timers/store/listener_client.py``); off whenever ``packing`` is.

``TIMERS_SPEED_OFF=all`` turns every one off: timers then runs on redis-py's public API
and Python's defaults alone, only slower (CI runs the unit suite so once). A comma list
(``TIMERS_SPEED_OFF=reader,gc``) turns those off. Where a redis-py upgrade breaks one,
turning it off is the way round until timers follows. What each is worth, measured:
``bench/FINDINGS.md``, "Cost figures behind the code's speed tricks".

Each trick asks once, as it is set up (an import, a client made, a listener started), never
per run. The listener's thread pool (:mod:`timers.listener.calling.thread_pool`) is not one of them:
it is how a run next in line starts in the thread of the run before it, a rule of the
state machine, not only a speed.
"""

from __future__ import annotations

import os
import warnings

ENV = "TIMERS_SPEED_OFF"
TRICKS = ("init", "gc", "reader", "packing", "connections")
_NEEDS = {"connections": "packing"}


def off_names(text: str) -> frozenset[str]:
    """The tricks ``text`` (``$TIMERS_SPEED_OFF``'s form) turns off; ValueError (one line,
    naming it) for a name that is not a trick."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    if "all" in names:
        return frozenset(TRICKS)
    unknown = sorted(names - set(TRICKS))
    if unknown:
        raise ValueError(f"${ENV}: no speed trick named {', '.join(map(repr, unknown))} "
                         f"(known: all, {', '.join(TRICKS)})")
    return frozenset(names)


def on(trick: str) -> bool:
    """Whether speed trick ``trick`` (one of :data:`TRICKS`) is on now. A name in
    ``$TIMERS_SPEED_OFF`` that is no trick is said once (a warning) and left out."""
    if trick not in TRICKS:
        raise ValueError(f"no speed trick named {trick!r}")
    text = os.environ.get(ENV, "")
    try:
        off = off_names(text)
    except ValueError as exc:
        if text not in _WARNED:
            _WARNED.add(text)
            warnings.warn(f"{exc}: ignored", stacklevel=2)
        off = off_names(",".join(n for n in text.split(",") if n.strip() in TRICKS))
    needed = _NEEDS.get(trick)
    return trick not in off and (needed is None or needed not in off)


_WARNED: set[str] = set()
