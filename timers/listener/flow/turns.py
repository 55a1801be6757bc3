"""Runs next in line on a concurrency key slot, and the runs they wait for.

Along with a run that holds a key's slot, ``finish.lua`` may hand the listener the key's
next waiting timer as the run next in line after it (source ``next``,
:attr:`Run.follows`): that one must start only once the first has ended, and then at
once. Each run that may be followed has a :class:`~timers.listener.calling.runner.Turn`: the pool
job its function runs in, and whether it has ended. A plain function next in line is queued
on that job and starts in the same thread the moment the function before it returns (no
event loop hop, no Redis round trip: the slot passes on when the first run's ending is
written, while the second runs). Anything else next in line waits for the first run to end.
"""

from __future__ import annotations

from timers.listener.calling.runner import Turn
from timers.model.runs import Run
from timers.model.wire import ClaimSource

FOLLOWED = frozenset({ClaimSource.HANDOFF.label, ClaimSource.NEXT.label})
"""Sources of runs that hold a key slot handed over by ``finish.lua``: only those may have
a run next in line after them."""


class Turns:
    """The turns of a lane's runs that may be followed, by run token."""

    def __init__(self) -> None:
        self._open: dict[str, Turn] = {}
        self._followed: set[str] = set()
        self._following: dict[str, str] = {}  # run next in line -> the run before it

    @property
    def waiting(self) -> int:
        """Runs next in line whose run before them has not ended: they take over that
        run's place in the listener's concurrency, so they do not count in it yet."""
        return len(self._followed)

    def start(self, run: Run) -> None:
        """Keep a turn for ``run`` if it may be followed; note a run next in line."""
        if run.source in FOLLOWED:
            self._open[run.token] = Turn()
        if run.follows and run.follows in self._open:
            self._followed.add(run.follows)
            self._following[run.token] = run.follows

    def of(self, token: str) -> Turn | None:
        return self._open.get(token)

    def before(self, run: Run) -> Turn | None:
        """The turn of the run ``run`` follows, while that one has not ended."""
        return self._open.get(run.follows) if run.follows else None

    def not_started(self, token: str, taken_back: bool) -> None:
        """The run under ``token`` was held back by its gate and never starts: the run next
        in line after it (which waits for it, so has not started either) follows it only
        into a start, so it does not start. With ``taken_back`` that gate took it back into
        its key's queue (``gate.lua`` ``take_back_next``): no ending to write; else (the
        held run's lease was lost) it is handed back."""
        for follower, before in self._following.items():
            turn = self._open.get(follower)
            if before == token and turn is not None:
                turn.revoked, turn.taken_back = True, taken_back

    def end(self, token: str) -> None:
        """The run under ``token`` ended: the run next in line after it may go."""
        turn = self._open.pop(token, None)
        if turn is None:  # most runs: none may follow them
            return
        self._following.pop(token, None)
        self._followed.discard(token)
        turn.started.set()
        turn.ended.set()
