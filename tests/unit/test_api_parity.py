"""One public API in four spellings that cannot drift: the methods of ``Timers`` and
``AsyncTimers``, and the module-level functions of ``timers`` and ``timers.aio`` made from
them. Each operation takes the same parameters (names, kinds, defaults) everywhere it is
offered, and every public function and method says what it does."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

import timers
import timers.aio
from timers import AsyncTimers, Timers
from timers.producer.forward import on_default
from timers.testing import TimersTest

CLIENT_ONLY = {"run", "close", "aclose"}
"""Methods about the client itself, not an operation."""


def public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    return {name: fn for name, fn in vars(cls).items()
            if not name.startswith("_") and callable(fn) and name not in CLIENT_ONLY}


def parameters(fn: Callable[..., Any], *, method: bool) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of each parameter, ``self`` left out."""
    params = list(inspect.signature(fn).parameters.values())
    if method:
        params = params[1:]
    return [(p.name, p.kind, p.default) for p in params]


def test_timers_and_async_timers_offer_the_same_operations() -> None:
    assert sorted(public_methods(Timers)) == sorted(public_methods(AsyncTimers))


@pytest.mark.parametrize("name", sorted(public_methods(Timers)))
def test_an_operation_takes_the_same_parameters_sync_and_async(name: str) -> None:
    sync, coro = public_methods(Timers)[name], public_methods(AsyncTimers)[name]
    assert parameters(sync, method=True) == parameters(coro, method=True)
    assert inspect.iscoroutinefunction(coro)


@pytest.mark.parametrize("module", [timers, timers.aio], ids=["timers", "timers.aio"])
def test_module_level_functions_take_the_clients_parameters(module: Any) -> None:
    methods = public_methods(Timers)
    offered = [name for name in module.__all__ if name in methods]
    assert offered, "the module offers the client's operations"
    for name in offered:
        assert (parameters(getattr(module, name), method=False)
                == parameters(methods[name], method=True)), name


def test_timers_and_timers_aio_offer_the_same_operations() -> None:
    methods = public_methods(Timers)
    assert ({name for name in timers.__all__ if name in methods}
            == {name for name in timers.aio.__all__ if name in methods})


@pytest.mark.parametrize("owner", [Timers, AsyncTimers], ids=["Timers", "AsyncTimers"])
def test_every_public_method_has_a_docstring(owner: type) -> None:
    missing = [name for name, fn in vars(owner).items()
               if not name.startswith("_") and callable(fn) and not inspect.getdoc(fn)]
    assert missing == []


@pytest.mark.parametrize("module", [timers, timers.aio], ids=["timers", "timers.aio"])
def test_every_public_function_has_a_docstring(module: Any) -> None:
    missing = [name for name in module.__all__
               if inspect.isfunction(getattr(module, name)) and not
               inspect.getdoc(getattr(module, name))]
    assert missing == []


def test_a_keyword_added_to_a_method_is_offered_by_its_function() -> None:
    """What ``help()`` and the docs show of a function is its method's, less ``self``."""

    class Client:
        def op(self, a: int, *, added: str = "") -> str:
            """What op does."""
            return f"{a}{added}"

    function = on_default(Client.op, Client, "somewhere")
    assert function(1, added="!") == "1!"
    assert str(inspect.signature(function)) == "(a: 'int', *, added: 'str' = '') -> 'str'"
    assert (function.__name__, function.__module__, function.__doc__) == (
        "op", "somewhere", "What op does.")


def test_a_function_calls_the_method_the_default_client_has_at_the_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that patches ``Timers.cancel`` patches ``timers.cancel`` too, as before."""
    with TimersTest():
        timers.cancel("warm")  # made before the patch
        monkeypatch.setattr(Timers, "cancel", lambda self, id, **options: f"patched {id}")
        assert timers.cancel("x") == "patched x"
