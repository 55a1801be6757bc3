"""The process quarantine children fork from, with the tasks package imported in it.

A quarantine child (:mod:`timers.listener.quarantine.parent`) forks from multiprocessing's fork
server. Were the tasks package imported in each child, a listener that reruns a dead
peer's 30 runs would import the app 30 times while its other timers come due: on a
2-core machine the other timers ran late for a while
(figures: bench/FINDINGS.md, "Quarantine children and the tasks package"). So the fork
server imports it once, as it starts (a few seconds into the listener's life, off its
event loop): each child forks with the package in it and imports nothing more.

The fork server is a new interpreter started by the listener; what it is to import
reaches it in multiprocessing's preload list (:data:`SPEC_PREFIX`: the one channel into
its start that changes nothing the listener's task threads read, as setting its
environment did: a task ended dead of a ``KeyError`` reading it), read when this module is
imported there (multiprocessing's preload). It logs
as the listener's quarantine children do, so what an import prints reads like the
listener's own lines. An import that fails there is left to each child, which imports
the package itself and reports the error as a refused run, as before.

Like any process that imports an app and forks (a prefork worker, a preloading web
server), an import that opens a connection leaves the children sharing it: tasks
packages open their connections on first use, as the guides say.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
from multiprocessing import forkserver
from types import FrameType
from typing import Any

PRELOAD = "timers.listener.quarantine.child"
"""What the fork server imports first: what a quarantine child runs (this module with it)."""

SPEC_PREFIX = "_timers_fork_server_spec_"
"""An entry of the fork server's preload list: this prefix, then the hex of the JSON
``{"package": ..., "search_path": ..., "logs": [level, format, listener]}`` that says what
it imports. No module has that name: multiprocessing's import of it fails quietly, after
:func:`_preload` has read it from the list."""

PRELOADED: tuple[str, str | None] | None = None
"""In the fork server and its children: (package, search path) imported at its start."""

_lock = threading.Lock()
log = logging.getLogger("timers.listener")


def ensure_running(package: str, search_path: str | None, logs: Any) -> None:
    """Start the fork server, unless it runs: importing ``package`` (found on
    ``search_path``) as it starts, logging as ``logs`` (a ``ChildLogs``) says. Blocking:
    call it off the event loop."""
    spec = json.dumps({"package": package, "search_path": search_path,
                       "logs": [logs.level, logs.format, logs.listener]})
    with _lock:  # (multiprocessing restarts a fork server that died with the same list)
        forkserver.set_forkserver_preload([PRELOAD, SPEC_PREFIX + spec.encode().hex()])
        forkserver.ensure_running()


def forget_other_package(package: str, search_path: str | None) -> None:
    """In a child: when the fork server imported another package than the one the child
    runs (or the same name from elsewhere), drop it from ``sys.modules`` so the child's
    own import finds its package."""
    if PRELOADED is None or (package, search_path) == PRELOADED:
        return
    name = PRELOADED[0]
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def _spec_given() -> str | None:
    """In the fork server, while multiprocessing's ``main`` imports its preload list: the
    spec the listener put in that list (None in any other process)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is forkserver.main.__code__:
            for name in frame.f_locals.get("preload") or ():
                if isinstance(name, str) and name.startswith(SPEC_PREFIX):
                    return bytes.fromhex(name[len(SPEC_PREFIX):]).decode()
            return None
        frame = frame.f_back
    return None


def _preload() -> None:
    """In the fork server, as multiprocessing imports this module there: import the tasks
    package the listener that started it named. Nothing escapes: a fork server that died
    of an app's import would take every quarantine child with it."""
    global PRELOADED
    try:
        raw = _spec_given()
        if raw is None:
            return
        spec = json.loads(raw)
        from timers.listener.calling.loader import TaskLoader
        from timers.logs import IDENTITY, configure

        level, form, listener = spec["logs"]
        configure(level, form, role="quarantine")  # as a quarantine child logs
        IDENTITY.listener = listener
        package, search_path = spec["package"], spec["search_path"]
        loader = TaskLoader(package, None, search_path)
        loader.load()
        PRELOADED = (package, search_path)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            log.debug("the quarantine fork server did not import the tasks package: %s", exc)


_preload()
