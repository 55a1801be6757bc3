"""How a script runs on a redis-py client, sync or asyncio: as a function of the library
(``FCALL``), by ``EVALSHA``, and, where scripts ask for the keys they need (Redis
Cluster, fakeredis), through :class:`timers.store.declare.Declaring`.

:func:`register` picks the way for one script on one client; :func:`register_all` gives
every script of a client, each registered on its first use.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from timers.store.cluster import is_cluster
from timers.store.declare import AsyncDeclaring, Declaring
from timers.store.lua_library import AsyncFunction, Function
from timers.store.lua_source import script_library, source, without_shebang
from timers.store.script_manifest import SCRIPT_NAMES, ScriptName


def _reads_shebang(client: Any) -> bool:
    return not any(kind.__module__.startswith("fakeredis") for kind in type(client).__mro__)


EVAL_ONLY_ENV = "TIMERS_EVAL_ONLY"
"""Set to 1 to run every script by EVALSHA, never as a function of the library."""


DECLARE_KEYS_ENV = "TIMERS_DECLARE_KEYS"
"""Set to 1 to have every script ask for the keys it needs and was not given (as on Redis
Cluster) on any server."""


def declares_keys(client: Any) -> bool:
    """Whether scripts on ``client`` run their declare part (``lua/declare.lua``): on Redis
    Cluster, where only KEYS are checked before a script runs, and on fakeredis, so that
    the unit tests' check (``tests/unit/declared_keys.py``) proves each part complete. A
    single server needs none of it, and pays nothing for it: the part is cut out."""
    return (is_cluster(client) or not _reads_shebang(client)
            or os.environ.get(DECLARE_KEYS_ENV) == "1")


def register(client: Any, name: ScriptName) -> Any:
    """One script on a redis-py client, sync or asyncio: a function of the library (see
    :mod:`timers.store.lua_library`), run by EVALSHA where the server refuses functions and on
    Redis Cluster (whose redis-py client finds an FCALL's slot by asking a node for its
    keys first: a round trip more per call). Where scripts declare their keys
    (:func:`declares_keys`), it is called again with the keys a call asks for
    (:class:`timers.store.declare.Declaring`)."""
    declare = declares_keys(client)
    text = source(name, declare)
    script = client.register_script(text if _reads_shebang(client) else without_shebang(text))
    if os.environ.get(EVAL_ONLY_ENV) == "1" or is_cluster(client):
        runner: Any = script
    else:
        library_name, code = script_library(declare)
        kind = AsyncFunction if inspect.iscoroutinefunction(client.execute_command) else Function
        runner = kind(client, f"{library_name}_{name}", code, script)
    if not declare:
        return runner
    asynchronous = inspect.iscoroutinefunction(client.execute_command)
    return (AsyncDeclaring if asynchronous else Declaring)(name, runner, is_cluster(client))


class Registered(dict[ScriptName, Any]):
    """The scripts of :data:`SCRIPT_NAMES` on a client, each registered (:func:`register`)
    when first looked up: a process that calls one script (``timers schedule``) builds and
    hashes one, not every one. With ``connection`` (a connection of the client kept for
    script calls, :mod:`timers.store.connect`), each function of the library sends its
    ``FCALL`` on it (:meth:`~timers.store.lua_library.Function.send_by`)."""

    def __init__(self, client: Any, connection: Any = None) -> None:
        super().__init__()
        self.client, self.connection = client, connection

    def __missing__(self, name: ScriptName) -> Any:
        if name not in SCRIPT_NAMES:
            raise KeyError(name)
        runner = self[name] = register(self.client, name)
        if self.connection is not None and isinstance(runner, Function):
            runner.send_by(self.connection.execute_command)
        return runner


def register_all(client: Any, connection: Any = None) -> Registered:
    """Every script on a redis-py client, sync or asyncio, each registered on its first
    use (:class:`Registered`; ``connection``: a kept connection its functions send on)."""
    return Registered(client, connection)
