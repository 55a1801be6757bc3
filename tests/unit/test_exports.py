"""The public API is what ``__all__`` says: complete, importable, nothing stray."""

from __future__ import annotations

import importlib
import sys
import types

import timers
import timers.aio
from tests.unit.fresh_imports import fresh_modules, loaded


def _public_members(module: types.ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and getattr(value, "__module__", module.__name__).startswith("timers")
        and name not in {"annotations"}
    }


def test_all_lists_every_public_member_of_timers() -> None:
    for name in timers.__all__:  # most are imported on first use: load them before listing
        getattr(timers, name)
    assert set(timers.__all__) == _public_members(timers)


def test_the_names_imported_on_first_use_are_public() -> None:
    assert set(timers._LAZY) - {"aio"} <= set(timers.__all__)
    assert "aio" in dir(timers) and "Timers" in dir(timers)


def test_all_lists_every_function_defined_in_timers_aio() -> None:
    defined_here = {
        name for name in _public_members(timers.aio)
        if getattr(getattr(timers.aio, name), "__module__", "") == "timers.aio"
    }
    assert set(timers.aio.__all__) == defined_here


def test_every_name_in_all_is_importable() -> None:
    for name in timers.__all__:
        assert getattr(timers, name) is not None


LISTENER_SIDE = "timers.listener"  # the package of every listener part (runner, leases …)


def test_a_producer_import_loads_none_of_the_listener() -> None:
    """``import timers`` in a web process that only schedules loads no listener, runner or
    sleeper; ``timers.aio`` and ``timers.Listener`` are still reachable from it."""
    with fresh_modules("timers"):
        fresh = importlib.import_module("timers")
        assert loaded(LISTENER_SIDE) == []
        assert callable(fresh.aio.schedule)
        assert fresh.Listener.__module__ == "timers.listener.lifecycle"
    assert sys.modules["timers"] is timers, "the fresh copy is gone"


def test_an_unknown_attribute_of_timers_is_an_attribute_error() -> None:
    assert not hasattr(timers, "Listner")


def test_every_exception_class_of_timers_is_in_timers_exceptions() -> None:
    """One home for errors: each is defined in :mod:`timers.exceptions`, listed in its
    ``__all__``, and derives from :class:`timers.TimersError` (warnings aside)."""
    import importlib
    import inspect
    import pkgutil

    import timers.exceptions

    defined_elsewhere = set()
    for info in pkgutil.walk_packages(timers.__path__, "timers."):
        if info.name == "timers.__main__":
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and not issubclass(value, Warning)
                    and value.__module__ == info.name != "timers.exceptions"):
                defined_elsewhere.add(f"{info.name}.{value.__qualname__}")
    assert defined_elsewhere == set()
    errors = {name for name, value in vars(timers.exceptions).items()
              if inspect.isclass(value) and issubclass(value, BaseException)}
    assert set(timers.exceptions.__all__) == errors
    assert all(issubclass(getattr(timers.exceptions, name), timers.TimersError)
               for name in errors)
