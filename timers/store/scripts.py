"""Running the Lua scripts on a redis-py client: :class:`Scripts`, one method per builder of
:class:`~timers.store.script_calls.ScriptCalls`, of its name and arguments, whose call
:meth:`Scripts.run` runs (the script registered on its first use, the way
:mod:`timers.store.script_modes` picks for the client).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, Self, overload

from timers.model.keys import Keyspace
from timers.store.replicated import ReplicatedScript
from timers.store.script_calls import Invocation, ScriptCalls
from timers.store.script_manifest import ScriptName
from timers.store.script_modes import register_all

P = ParamSpec("P")


class _Runs(Generic[P]):
    """A method of :class:`Scripts`: the :class:`ScriptCalls` builder ``build``, with its
    arguments (checked by mypy), whose call :meth:`Scripts.run` runs. Made on its first
    look-up on a :class:`Scripts` and kept in the instance, found there from then on (as
    :func:`functools.cached_property` does); a test may replace it there."""

    def __init__(self, build: Callable[Concatenate[ScriptCalls, P], Invocation]) -> None:
        self.build = build
        self.__doc__ = build.__doc__

    def __set_name__(self, owner: type[Scripts], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, scripts: None, owner: type[Scripts]) -> Self: ...

    @overload
    def __get__(self, scripts: Scripts, owner: type[Scripts]) -> Callable[P, Any]: ...

    def __get__(self, scripts: Scripts | None, owner: type[Scripts]) -> Self | Callable[P, Any]:
        if scripts is None:
            return self
        build, calls, run = self.build, scripts.calls, scripts.run

        def call(*args: P.args, **kwargs: P.kwargs) -> Any:
            return run(build(calls, *args, **kwargs))

        vars(scripts)[self.name] = call
        return call


class Scripts:
    """Each script as a method on one redis-py client and keyspace: a method of
    :class:`ScriptCalls` of the same name and arguments builds the call, and :meth:`run`
    runs it.

    A method returns the script's reply on a sync client and an awaitable of it on an
    asyncio one (redis-py's ``Script`` does the same), hence ``Any``. Scripts are
    registered on first use, once per :class:`Scripts`.
    """

    def __init__(self, client: Any, keys: Keyspace) -> None:
        self.client = client
        self.calls = ScriptCalls(keys)
        self._registered = register_all(client)

    def script(self, name: ScriptName) -> Any:
        """The registered redis-py ``Script`` object (or the function standing for it)."""
        return self._registered[name]

    def replicated(self, replicas: int, timeout_ms: int, *names: ScriptName) -> None:
        """Send each script of ``names`` (on an asyncio client) with ``WAIT replicas
        timeout_ms`` behind it: :class:`~timers.store.replicated.ReplicatedScript`."""
        for name in names:
            self._registered[name] = ReplicatedScript(self.client, self.script(name),
                                                      replicas, timeout_ms)

    def run(self, call: Invocation) -> Any:
        """Run ``call`` on this client: the script's reply, or an awaitable of it."""
        return self.script(call.script)(keys=list(call.keys), args=list(call.args))

    schedule = _Runs(ScriptCalls.schedule)
    reschedule = _Runs(ScriptCalls.reschedule)
    cancel = _Runs(ScriptCalls.cancel)
    claim = _Runs(ScriptCalls.claim)
    gate = _Runs(ScriptCalls.gate)
    renew = _Runs(ScriptCalls.renew)
    peek = _Runs(ScriptCalls.peek)
    floor = _Runs(ScriptCalls.floor)
    park = _Runs(ScriptCalls.park)
    near = _Runs(ScriptCalls.near)
    finish = _Runs(ScriptCalls.finish)
    trim = _Runs(ScriptCalls.trim)
    heartbeat = _Runs(ScriptCalls.heartbeat)
    arrive = _Runs(ScriptCalls.arrive)
    settle = _Runs(ScriptCalls.settle)
    depart = _Runs(ScriptCalls.depart)
    departed = _Runs(ScriptCalls.departed)
    forget = _Runs(ScriptCalls.forget)
    cron_declare = _Runs(ScriptCalls.cron_declare)
    cron_next = _Runs(ScriptCalls.cron_next)
    cron_pause = _Runs(ScriptCalls.cron_pause)
    cron_remove = _Runs(ScriptCalls.cron_remove)
