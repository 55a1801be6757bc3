"""How one run ended: the :class:`Ending` the finish script reads (ok, skipped, a retry
after a backoff, a failure record, a rejected event key, or a run handed back), as the
executor makes it, the journal keeps it and :class:`~timers.listener.endings.writer.
EndingWriter` writes it; and :class:`Executed`, what the executor says of a run: its
ending and what the observers hear of it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from timers.model.encoding import entry_text
from timers.model.fast_init import fast_init
from timers.model.runs import Fired, Run, RunFacts
from timers.model.wire import EndingKind, FailureRecord


@fast_init  # made once or more per run
@dataclass(frozen=True)
class Ending:
    """How one run ended (``token`` is empty for a rejected event key)."""

    token: str
    kind: EndingKind
    failure_id: str = ""
    failure: FailureRecord | None = None
    """FAIL and REJECT: the record ``timers failed`` shows."""
    retry_entry: str = ""
    """RETRY, MOVE, WAIT: ``<escaped id>:<record>`` to schedule again."""
    retry_delay_ms: int = 0
    """RETRY: in how many ms it runs again; MOVE and WAIT: its due time in ms."""
    run_of: tuple[str, int] | None = None
    """The (escaped id, due ms) of the run ended, to match a recovered run of it."""
    grace_ms: int = 0
    """RELEASE of a run whose task may have started and still be going: how long its
    concurrency key slot stays held; its next start counts as a rerun (``finish.lua``)."""
    follows: str = ""
    """RELEASE of a run next in line: the token of the run it follows (it goes back into
    its key's queue, in its place)."""

    @classmethod
    def of(cls, run: Run, kind: EndingKind, **fields: Any) -> Ending:
        return cls(run.token, kind, run_of=(run.escaped_id, run.due_ms), **fields)

    @classmethod
    def release(cls, token: str, grace_ms: int = 0, follows: str = "") -> Ending:
        """Hand an unfinished run back (it runs again at once), in its place in its key's
        order: a key slot it held is kept for it, a run next in line (after ``follows``)
        goes back into its key's queue. With ``grace_ms``, its task may have started and
        still be going (in a process about to exit): the timer comes due again then, and
        its next start is a rerun, counted (T17)."""
        return cls(token, EndingKind.RELEASE, grace_ms=grace_ms, follows=follows)

    @classmethod
    def retry(cls, run: Run, record_text: str, delay_ms: int) -> Ending:
        return cls.of(run, EndingKind.RETRY, retry_entry=entry_text(run.escaped_id, record_text),
                      retry_delay_ms=delay_ms)

    @classmethod
    def move(cls, run: Run, record_text: str) -> Ending:
        """Pending again at its due time under another record (its task's group)."""
        return cls.of(run, EndingKind.MOVE, retry_entry=entry_text(run.escaped_id, record_text),
                      retry_delay_ms=run.due_ms)

    @classmethod
    def wait(cls, run: Run, record_text: str, due_ms: int) -> Ending:
        """Pending again, in the same group, under another record, at ``due_ms``: left
        unmoved on a group disagreement (:mod:`timers.model.flow.disagreement`)."""
        return cls.of(run, EndingKind.WAIT, retry_entry=entry_text(run.escaped_id, record_text),
                      retry_delay_ms=due_ms)

    def for_run(self, run: Run) -> Ending:
        """The same ending for another claim of the same run."""
        return replace(self, token=run.token, run_of=(run.escaped_id, run.due_ms))

    def wire(self) -> tuple[str, str, str, str]:
        """The four finish-script arguments: token, kind and two kind-specific fields."""
        kind = self.kind
        if kind in _REQUEUED:
            return self.token, _TEXT[kind], self.retry_entry, str(self.retry_delay_ms)
        if self.failure is not None:
            return self.token, _TEXT[kind], self.failure_id, self.failure.to_json()
        return (self.token, _TEXT[kind], str(self.grace_ms) if self.grace_ms else "",
                self.follows)


_REQUEUED = frozenset({EndingKind.RETRY, EndingKind.MOVE, EndingKind.WAIT})
"""The endings that schedule their timer again under a record they carry."""
_TEXT = {kind: kind.value for kind in EndingKind}
"""Each kind's wire text, read once (``kind.value`` is a property call each time)."""


class Executed(NamedTuple):
    """A run's ending (None: a flow gate held its timer back, nothing to write), and what
    the observer hears of it (None: handed back or held back unrun). A tuple: one is made
    per run, on the listener's hot path, and a frozen dataclass costs more to make
    (figures: bench/FINDINGS.md, "A run's Python in the listener")."""

    ending: Ending | None
    report: Fired | None
    facts: RunFacts | None = None
    """What the history and the series keep of the run (:mod:`timers.listener.endings.history`)."""
    prompt: bool = False
    """Its ending is to be written without waiting for others (:data:`~timers.listener.
    endings.GATHER`): the run went through a flow gate, so writing it may free a slot and
    hand over the next run waiting for it."""
