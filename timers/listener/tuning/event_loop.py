"""Which event loop a listener process runs on: asyncio's own, or uvloop's.

uvloop (the ``fast`` extra: ``pip install 'redis-timers[fast]'``) runs the same asyncio
code on libuv, with less CPU per callback and per socket read. ``timers listen`` runs on
it whenever it is installed (``--loop auto``, the default); ``--loop asyncio`` (or
``$TIMERS_LOOP``) keeps asyncio's own. A write to a connection closed under it, which
uvloop refuses with ``RuntimeError`` where asyncio's loop lets redis-py raise
``ConnectionError``, is raised as the ``ConnectionError`` it is by the listener's
connections (:mod:`timers.store.listener_client`), so the listener outlives it on either
loop. The choice travels in the environment to every process the listener starts (a
supervisor's listeners, quarantine processes).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar, get_args

LOOP_ENV = "TIMERS_LOOP"
"""``auto``, ``asyncio`` or ``uvloop``: the loop of ``timers listen`` without ``--loop``
(unset: ``auto``)."""

LoopChoice = Literal["auto", "asyncio", "uvloop"]
CHOICES: tuple[str, ...] = get_args(LoopChoice)

T = TypeVar("T")


def chosen_loop(choice: str | None = None) -> Literal["asyncio", "uvloop"]:
    """The loop to run for ``choice`` (None: ``$TIMERS_LOOP``, else ``auto``): ``auto`` is
    uvloop when it can be imported. ValueError: an unknown name, or uvloop asked for and
    not installed."""
    name = (choice or os.environ.get(LOOP_ENV) or "auto").strip().lower()
    if name not in CHOICES:
        raise ValueError(f"unknown event loop {name!r}: one of {', '.join(CHOICES)}")
    installed = importlib.util.find_spec("uvloop") is not None
    if name == "uvloop" and not installed:
        raise ValueError("the uvloop event loop is not installed: "
                         "pip install 'redis-timers[fast]'")
    return "uvloop" if name == "uvloop" or (name == "auto" and installed) else "asyncio"


def loop_factory(
        name: Literal["asyncio", "uvloop"]) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes a new event loop of that kind for :class:`asyncio.Runner` (None: its
    default, asyncio's loop set as the thread's current one, as ``asyncio.run`` does)."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


def run(main: Coroutine[Any, Any, T], choice: str | None = None) -> T:
    """``asyncio.run(main)`` on the loop :func:`chosen_loop` picks for ``choice``: the same
    Ctrl-C handling, the same clean-up of tasks, async generators and the default executor."""
    with asyncio.Runner(loop_factory=loop_factory(chosen_loop(choice))) as runner:
        return runner.run(main)


def loop_name(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """``uvloop`` or ``asyncio``: the kind of ``loop`` (None: the running one)."""
    loop = loop if loop is not None else asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
