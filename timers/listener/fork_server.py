"""The process quarantine children fork from, with the tasks package imported in it.

A quarantine child (:mod:`timers.listener.quarantine`) forks from multiprocessing's fork
server. Were the tasks package imported in each child, a listener that reruns a dead
peer's 30 runs would import the app 30 times while its other timers come due: on a
2-core machine the other timers ran 10 to 40 ms late for a second or two. So the fork
server imports it once, as it starts (a few seconds into the listener's life, off its
event loop): each child forks with the package in it and imports nothing more.

The fork server is a new interpreter started by the listener; what it is to import
reaches it in the environment of its start (:data:`PRELOAD_ENV`, set only while it
starts), read when this module is imported there (multiprocessing's preload). It logs
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
import os
import sys
import threading
from multiprocessing import forkserver
from typing import Any

PRELOAD_ENV = "TIMERS_FORK_SERVER_PRELOAD"
"""JSON ``{"parent": pid, "package": ..., "search_path": ..., "logs": [level, format,
listener]}``: what the fork server about to start imports."""

PRELOADED: tuple[str, str | None] | None = None
"""In the fork server and its children: (package, search path) imported at its start."""

_lock = threading.Lock()
log = logging.getLogger("timers.listener")


def ensure_running(package: str, search_path: str | None, logs: Any) -> None:
    """Start the fork server, unless it runs: importing ``package`` (found on
    ``search_path``) as it starts, logging as ``logs`` (a ``ChildLogs``) says. Blocking:
    call it off the event loop."""
    with _lock:
        os.environ[PRELOAD_ENV] = json.dumps({
            "parent": os.getpid(), "package": package, "search_path": search_path,
            "logs": [logs.level, logs.format, logs.listener]})
        try:
            forkserver.ensure_running()
        finally:
            os.environ.pop(PRELOAD_ENV, None)


def forget_other_package(package: str, search_path: str | None) -> None:
    """In a child: when the fork server imported another package than the one the child
    runs (or the same name from elsewhere), drop it from ``sys.modules`` so the child's
    own import finds its package."""
    if PRELOADED is None or (package, search_path) == PRELOADED:
        return
    name = PRELOADED[0]
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def _preload() -> None:
    """In the fork server, as multiprocessing imports this module there: import the tasks
    package the listener that started it named. Nothing escapes: a fork server that died
    of an app's import would take every quarantine child with it."""
    global PRELOADED
    raw = os.environ.pop(PRELOAD_ENV, None)
    if not raw:
        return
    try:
        spec = json.loads(raw)
        if spec.get("parent") != os.getppid():
            return  # not the fork server of the listener that set it
        from timers.listener.loader import TaskLoader
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
