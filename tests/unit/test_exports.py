"""The public API is what ``__all__`` says: complete, importable, nothing stray."""

from __future__ import annotations

import types

import timers
import timers.aio


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
    assert set(timers.__all__) == _public_members(timers)


def test_all_lists_every_function_defined_in_timers_aio() -> None:
    defined_here = {
        name for name in _public_members(timers.aio)
        if getattr(getattr(timers.aio, name), "__module__", "") == "timers.aio"
    }
    assert set(timers.aio.__all__) == defined_here


def test_every_name_in_all_is_importable() -> None:
    for name in timers.__all__:
        assert getattr(timers, name) is not None
