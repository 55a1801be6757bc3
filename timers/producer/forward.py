"""The module-level functions of [`timers`][module-level-functions] and
[`timers.aio`][asyncio-timersaio], made from the client methods: each calls the method of the same
name on a default client, and shows the method's parameters (less ``self``) and docstring. So the
API is written once, on [`Timers`][timers.producer.client.Timers] and
[`AsyncTimers`][timers.producer.async_client.AsyncTimers]; a keyword added there is offered by the
functions too.

The method is looked up on the client at each call (as ``client.schedule(...)`` would be), and
the types stay exact: ``timers.schedule`` has the type of ``Timers.schedule`` less ``self``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

C = TypeVar("C")
P = ParamSpec("P")
R = TypeVar("R")


def on_default(method: Callable[Concatenate[C, P], R], default: Callable[[], C],
               module: str) -> Callable[P, R]:
    """A function of ``module`` that calls ``method``'s name on ``default()``."""
    name = method.__name__

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        return getattr(default(), name)(*args, **kwargs)  # type: ignore[no-any-return]

    return _like(call, method, module)


def on_default_async(method: Callable[Concatenate[C, P], Coroutine[Any, Any, R]],
                     default: Callable[[], C],
                     module: str) -> Callable[P, Coroutine[Any, Any, R]]:
    """The coroutine function twin of `on_default`: the default client is picked when
    the call is awaited, on the loop that awaits it (``asyncio.run(timers.aio.schedule(…))``
    works)."""
    name = method.__name__

    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        return await getattr(default(), name)(*args, **kwargs)  # type: ignore[no-any-return]

    return _like(call, method, module)


F = TypeVar("F", bound=Callable[..., Any])


def _like(call: F, method: Callable[..., Any], module: str) -> F:
    """``call`` named as ``method`` in ``module``, with its docstring and its signature less
    the first parameter (what ``help()`` and ``inspect.signature`` show)."""
    functools.update_wrapper(call, method)  # (its __wrapped__: get_type_hints reads it)
    signature = inspect.signature(method)
    call.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=tuple(signature.parameters.values())[1:])
    call.__module__ = module
    call.__qualname__ = method.__name__
    return call
