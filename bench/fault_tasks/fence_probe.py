"""When a run's fence let it start, for the chaos ledger (:mod:`bench.fault_tasks.chaos`).

The listener asks a run's fence (``still_held``, invariant 12) right before it calls the
task: in the task's worker thread, on the event loop for an ``async def`` (in the same step
of the loop as the task's first line), in a quarantine child. A ``SIGSTOP`` between that
check and the task's first line is allowed; no check can close it. To tell that apart from
a start the fence did not check, the probe wraps the fence handed to
:meth:`timers.listener.calling.runner.Runner.call` so that each check that lets a run start
notes its monotonic time on the calling thread; the task's first line reads it back
(:func:`passed`), and the checker dates such a start from its check.

It reaches into the listener on purpose (a test harness watching the system under test),
and fails at import if the name it wraps is gone: a rename then stops the chaos run rather
than silently dropping the probe (:func:`install`).
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

from timers.listener.calling import runner

_noted = threading.local()
_PATCHED = "_timers_chaos_fence_probe"


def _probed(fence: Callable[[], bool]) -> Callable[[], bool]:
    def check() -> bool:
        ok = fence()
        if ok:
            _noted.at = time.monotonic()
        return ok

    return check


def install() -> None:
    """Wrap the fence of every run started in this process (once per process)."""
    call = runner.Runner.call
    if getattr(call, _PATCHED, False):
        return
    signature = inspect.signature(call)
    if "fence" not in signature.parameters:
        raise RuntimeError("Runner.call takes no fence any more: the chaos probe needs one")

    @functools.wraps(call)
    async def probed_call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        fence = bound.arguments.get("fence")
        if fence is not None:
            bound.arguments["fence"] = _probed(fence)
        return await call(*bound.args, **bound.kwargs)

    setattr(probed_call, _PATCHED, True)
    runner.Runner.call = probed_call  # type: ignore[method-assign]


def passed() -> float | None:
    """The monotonic time this thread's last fence check let a run start, once (None: no
    fence let a run start here since the last read)."""
    at: float | None = getattr(_noted, "at", None)
    _noted.at = None
    return at
