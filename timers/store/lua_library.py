"""The scripts as one Redis function library: the shared helpers made once per server,
not on every call.

Redis runs an ``EVALSHA`` script's whole text on each call, so every shared helper it
includes (``lua/prelude.lua``, ``lua/flow.lua``) is made anew each time, a large share
of a single ``schedule()``'s Redis CPU. A function library (``FUNCTION LOAD``, Redis 7
and Valkey) runs its top level once, at load; each script becomes one function of it,
called by ``FCALL`` with the same KEYS and ARGV, under the same flags its shebang gives,
``allow-oom`` or none (figures: bench/FINDINGS.md, "Shared Lua helpers").

- The library's name, and each function's, carry a digest of the Lua they hold
  (``timers_<digest>_<script>``), so two releases of timers on one server each call
  their own code. A client calls the function straight away: a server that does not
  have the library yet (the first client of this release, a restart without
  persistence, a ``FUNCTION FLUSH``, a new cluster node) answers "Function not found",
  and only then is the library loaded and the call sent once more (nothing of it ran).
  Loading it stalls the server, which serves nobody meanwhile: so it is loaded once per
  server, not once per client such as each of a web app's workers or each listener
  start (figures: bench/FINDINGS.md, "Shared Lua helpers").
- A helper file's top-level ``local`` that is not a constant (``UPPER_CASE``) is state
  of one call (``index_heads``, ``taker`` …). In a library it would outlive the call, so
  each function sets it back to its first value before its body runs; and it sets the
  library's ``KEYS`` and ``ARGV`` to its own, which helpers read as a script's do.
- A client whose server refuses functions (an ACL without ``FUNCTION``/``FCALL``, a
  server older than 7) runs the same scripts by ``EVALSHA``, as before: the first refusal
  decides for that client. Pipelines (several calls in one round trip) keep ``EVALSHA``,
  whose scripts redis-py loads before a transaction starts; so does Redis Cluster, where
  redis-py asks a node for an FCALL's keys (``COMMAND GETKEYS``) before each call.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Sequence
from functools import cache
from typing import Any

import redis.exceptions

_STATE = re.compile(r"^local ([a-z_][a-z0-9_]*) = ([^\n]*?)\s*(?:--[^\n]*)?$", re.MULTILINE)
_FLAGS = re.compile(r"flags=([\w,-]+)")

_EVAL_ONLY: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
"""Clients whose server refused the library: they run scripts by EVALSHA."""
_any_eval_only = False
"""Whether :data:`_EVAL_ONLY` was ever given a client: until then a call reads this flag
alone, not the weak dictionary's length (a Python method) on every script call."""


def _eval_only(target: Any) -> None:
    """Send ``target``'s script calls by EVALSHA from now on."""
    global _any_eval_only
    _EVAL_ONLY[target] = True
    _any_eval_only = True


def state_resets(helpers: str) -> str:
    """Lua that sets each per-call state variable of ``helpers`` back to its first value."""
    return "".join(f"{name} = {value}\n" for name, value in _STATE.findall(helpers))


def function_flags(shebang: str) -> str:
    """The flags of a ``#!lua flags=…`` line as a Lua table: ``{'allow-oom'}`` or ``{}``."""
    match = _FLAGS.search(shebang)
    names = match.group(1).split(",") if match else []
    return "{" + ", ".join(f"'{name}'" for name in names) + "}"


@cache
def library(helpers: str, scripts: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    """``(name, code)`` of the library holding ``helpers`` once and each
    ``(script name, script text)`` as the function ``<name>_<script name>``."""
    digest = hashlib.sha1(
        "\0".join([helpers, *(f"{n}\0{t}" for n, t in scripts)]).encode()).hexdigest()[:12]
    name = f"timers_{digest}"
    resets = state_resets(helpers)
    parts = [f"#!lua name={name}\nlocal KEYS, ARGV\n", helpers]
    for script, text in scripts:
        shebang, _, body = text.partition("\n") if text.startswith("#!") else ("", "", text)
        parts.append(
            f"redis.register_function{{function_name = '{name}_{script}', "
            f"flags = {function_flags(shebang)}, callback = function(keys, args)\n"
            f"KEYS, ARGV = keys, args\n{resets}{body}\nend}}\n")
    return name, "".join(parts)


def _not_found(exc: redis.exceptions.ResponseError) -> bool:
    """Whether ``exc`` says the server lacks the function (the library is not loaded)."""
    return "function not found" in str(exc).lower()


def _refused(exc: redis.exceptions.RedisError) -> bool:
    """A refusal of functions themselves (ACL, unknown command), not of this call."""
    return (isinstance(exc, redis.exceptions.NoPermissionError)
            or "unknown command" in str(exc).lower())


def _load_failed(target: Any, exc: redis.exceptions.ResponseError) -> None:
    """After FUNCTION LOAD failed: a refusal sends the client to EVALSHA for good; a full
    server only for this call (the library is loaded at the next)."""
    if not isinstance(exc, redis.exceptions.OutOfMemoryError):
        _eval_only(target)


class Function:
    """One script as a function of the library on a sync redis-py client, called like
    redis-py's ``Script`` (``keys=``, ``args=``); its ``Script`` (``fallback``) runs it
    by EVALSHA where functions are refused and serves pipelines (``sha``, ``script``)."""

    def __init__(self, client: Any, name: str, code: str, fallback: Any) -> None:
        self.client = client
        self.name = name
        self.code = code
        self.fallback = fallback
        self.sha: str = fallback.sha
        self.script: str = fallback.script
        self.execute: Any = client.execute_command
        """What sends this client's FCALL: its ``execute_command``, or that of a
        connection of it kept for script calls (:meth:`send_by`)."""

    def send_by(self, execute: Any) -> None:
        """Send this function's ``FCALL`` by ``execute``: the ``execute_command`` of a
        connection of the client kept for script calls
        (:class:`timers.store.connect.ScriptConnection`,
        :class:`~timers.store.connect.AsyncScriptConnection`,
        :class:`~timers.store.listener_client.ReservedConnection`)."""
        self.execute = execute

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = (),
                 client: Any = None) -> Any:
        target = self.client if client is None else client
        execute = self.execute if client is None else client.execute_command
        for attempt in (1, 2):
            if ((_any_eval_only and _EVAL_ONLY.get(target))  # (none yet: no weakref made)
                    or (attempt == 2 and not self._load(target))):
                return self.fallback(keys=keys, args=args, client=target)
            try:  # (redis-py's fcall() sends just this)
                return execute("FCALL", self.name, len(keys), *keys, *args)
            except redis.exceptions.ResponseError as exc:
                if _refused(exc):
                    _eval_only(target)
                elif not _not_found(exc) or attempt == 2:
                    raise
        return self.fallback(keys=keys, args=args, client=target)

    def _load(self, target: Any) -> bool:
        try:
            target.function_load(self.code, replace=True)
        except redis.exceptions.ResponseError as exc:
            _load_failed(target, exc)
            return False
        return True


class AsyncFunction(Function):
    """:class:`Function` on an asyncio redis-py client: calling it gives a coroutine."""

    async def __call__(
            self, keys: Sequence[Any] = (), args: Sequence[Any] = (), client: Any = None) -> Any:
        target = self.client if client is None else client
        execute = self.execute if client is None else client.execute_command
        for attempt in (1, 2):
            if ((_any_eval_only and _EVAL_ONLY.get(target))
                    or (attempt == 2 and not await self.aload(target))):
                return await self.fallback(keys=keys, args=args, client=target)
            try:
                return await execute("FCALL", self.name, len(keys), *keys, *args)
            except redis.exceptions.ResponseError as exc:
                if _refused(exc):
                    _eval_only(target)
                elif not _not_found(exc) or attempt == 2:
                    raise
        return await self.fallback(keys=keys, args=args, client=target)

    async def aload(self, target: Any) -> bool:
        """Load the library on ``target``; False if that failed (a refusal sends the
        client to ``EVALSHA``)."""
        try:
            await target.function_load(self.code, replace=True)
        except redis.exceptions.ResponseError as exc:
            _load_failed(target, exc)
            return False
        return True
