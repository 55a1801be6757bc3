"""A claimed run of a timer, how it ended, and the failure record kept for the CLI."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, NamedTuple, TypeVar

from timers.exceptions import MalformedTimerKey
from timers.model.encoding import Args, Record, as_text, unescape_id
from timers.model.fast_init import fast_init
from timers.model.keys import DEFAULT_GROUP
from timers.model.run_record import decode, record_option
from timers.model.tracebacks import from_task_frames
from timers.model.wire import ClaimSource, FailureRecord, Option, kept_options

MAX_MESSAGE = 2000
_WAITED_MARK = f";{Option.WAITED_FROM}="
_ATTEMPTS_MARK = f";{Option.ATTEMPTS}="
_ATTEMPTS, _ORIGINAL_DUE = Option.ATTEMPTS, Option.ORIGINAL_DUE
_LABELS = {source.value: source.label for source in ClaimSource}
"""A claim reply's source tag -> the run's :attr:`Run.source` (an unknown tag: a sweep)."""
_SWEEP, _NEXT = ClaimSource.SWEEP.label, ClaimSource.NEXT.label
MAX_TRACEBACK = 8000
_PLAN = "_plan"

T = TypeVar("T")

TaskOutcomeKind = Literal[
    "ok", "error", "refused", "bad_args", "rejected", "malformed", "missed", "skipped",
    "crashed",
]
"""What became of a run's task: it returned, raised, could not be called, was not run (too
late, skipped), or its process died. Each ends the run with an ending to write."""

ListenerActionKind = Literal[
    "held", "moved", "disagreed", "revoked", "stale", "late", "taken", "passed",
]
"""What the listener does with a run whose task it did not call: held back by its flow
gate, moved to its group, asked back or taken over before it started, handed back late or
for a listener that has its task (``stale``: found not fresh where it was to start, asked
again)."""

OutcomeKind = TaskOutcomeKind | ListenerActionKind


@fast_init  # made once or more per run
@dataclass(frozen=True)
class Run:
    """One claimed run: which timer, when it was due, how it was found, and (once a stage
    of its listener asked) its flow plan (:meth:`planned`)."""

    token: str
    escaped_id: str
    record_text: str
    due_ms: int
    reruns: int
    source: str
    died_on: str = ""
    """For a recovered run: the listener that held it before and died (``host:pid:…``)."""
    follows: str = ""
    """For a run next in line on a concurrency key slot: the token of the run it follows
    (it must not start before that one ends)."""

    @classmethod
    def parse(cls, token: Any, text: Any, source: Any) -> Run:
        """Read a claim reply item ``token, "reruns@<listener>|due|<id>:<record>", source``
        where source is ``e``, ``s``, ``h``, ``r@<listener that died>`` or ``n@<token of
        the run it follows>``."""
        reruns, _, due_ms, escaped, record = decode(as_text(text))
        tag, _, died_on = as_text(source).partition("@")
        label = _LABELS.get(tag, _SWEEP)  # as ClaimSource.read, without an enum call
        follows = died_on if label == _NEXT else ""
        return cls(as_text(token), escaped, record, due_ms, reruns, label,
                   "" if follows else died_on, follows)

    def planned(self, plan: Callable[[], T]) -> T:
        """The run's flow plan (:func:`timers.listener.flow.plan.plan_of_run`): ``plan()`` at
        the first ask, kept on the run and given back to every later one, so the stages of
        one run (its claim's screen, its placement, its gate) read one plan, and a task's
        key function is called once per run. Not a field: a copy made by
        :func:`dataclasses.replace` starts without one."""
        kept = self.__dict__
        try:
            planned: T = kept[_PLAN]
        except KeyError:
            planned = kept[_PLAN] = plan()
        return planned

    @cached_property
    def timer_id(self) -> str:
        """The timer's id (read twice per run: worked out once, kept on the run)."""
        try:
            return unescape_id(self.escaped_id)
        except MalformedTimerKey:
            return self.escaped_id

    def record(self) -> Record:
        """The decoded record; :class:`MalformedTimerKey` if it was stored broken."""
        return Record.decode(self.record_text)

    @property
    def previous_attempts(self) -> int:
        """Failed attempts before this run, from the record's options (``;a=N``): the
        listener asks for it on every run."""
        # most runs have no options (figures: bench/FINDINGS.md, "A run's option markers")
        if _ATTEMPTS_MARK not in self.record_text:
            return 0
        value = record_option(self.record_text, _ATTEMPTS)
        return int(value) if value and value.isascii() and value.isdigit() else 0

    @property
    def original_due_ms(self) -> int:
        """The timer's own due time: a retry's record keeps it (``;d=ms``), while
        :attr:`due_ms` is the due time of this attempt."""
        value = record_option(self.record_text, _ORIGINAL_DUE)
        try:
            return int(value) if value is not None and value.isascii() else self.waited_from_ms
        except ValueError:
            return self.waited_from_ms

    @property
    def waited_from_ms(self) -> int:
        """The due time its lateness counts from: the one it had before a concurrency key
        or a rate limit held it back (``;w=ms``), else this run's."""
        if _WAITED_MARK not in self.record_text:  # as above
            return self.due_ms
        value = record_option(self.record_text, Option.WAITED_FROM)
        return int(value) if value and value.isascii() and value.isdigit() else self.due_ms

    @property
    def attempt(self) -> int:
        """1 for a first run; more after failed attempts or runs cut short by a crash."""
        return self.previous_attempts + self.reruns + 1


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    error_type: str = ""
    message: str = ""
    traceback: str = ""

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


OK = Outcome("ok")


def failure_entry(
    run: Run,
    outcome: Outcome,
    task: str | None,
    args: Args,
    now_ms: int,
    first_failure_ms: int | None = None,
    options: Mapping[str, str] | None = None,
) -> tuple[str, FailureRecord]:
    """The failure id and record for a timer that failed for good: what it was, the
    error, the attempts with the first and last failure times (``now_ms``: Redis time),
    and its original due time.

    The failure id is ``<escaped id>:<run token>``: one per dead timer (a run token is
    never reused), so a later timer with the same id never replaces this record, and all
    records of one id sort together (see :attr:`timers.model.keys.Keyspace.failure_index`)."""
    record = FailureRecord(
        id=run.timer_id,
        task=task,
        args=args,
        record=None if task is not None else run.record_text[:1000],
        kind=outcome.kind,
        error_type=outcome.error_type,
        message=outcome.message[:MAX_MESSAGE],
        traceback=from_task_frames(outcome.traceback)[-MAX_TRACEBACK:],
        attempts=run.attempt,
        due_ms=run.original_due_ms,
        first_failure=first_failure_ms or now_ms,
        failed_at=now_ms,
        options=kept_options(options),
    )
    return f"{run.escaped_id}:{run.token}", record


def rejected_entry(
    key: bytes, reason: str, now_ms: int, escaped_id: str | None = None
) -> tuple[str, FailureRecord]:
    """A failure id and record for an event key that names no runnable timer
    (``now_ms``: Redis time).

    The id is the timer's escaped id when the key decodes (the record of a run of that
    timer then takes precedence), else ``:`` and a digest of the key: a timer id never
    contains ``:``, so the two can't collide, and every listener that sees the event
    writes the same one.
    """
    if escaped_id is None:
        failure_id = ":" + hashlib.sha1(key, usedforsecurity=False).hexdigest()[:20]
    else:
        failure_id = escaped_id
    record = FailureRecord(
        id=None if escaped_id is None else unescape_id(escaped_id),
        key=key[:300].decode("utf-8", "backslashreplace"),
        kind="rejected",
        error_type="RejectedKey",
        message=reason[:MAX_MESSAGE],
        failed_at=now_ms,
    )
    return failure_id, record


class RunFacts(NamedTuple):
    """What the run history and the task's series keep of a run that ended (Redis ms).

    ``ends``: the timer ended with it (completed, skipped, dead), so its history record
    is kept; else (a failure that will retry) it only counts in the series. ``ran``: it
    counts as a run in the series (a skipped occurrence does not); ``failed``: as a
    failure. ``history_ms``: how long its task keeps its history record (None: the
    listener's age; 0: none, ``@task(history=False)``); ``history_count``: how many of its
    task's records the history keeps at most (None: the listener's count only; 0: none).
    A tuple: one is made per run, on the listener's hot path."""

    escaped_id: str
    task: str
    ended_ms: int
    duration_ms: int | None
    attempts: int
    lateness_ms: int | None
    ends: bool = True
    ran: bool = True
    failed: bool = False
    error: str = ""
    history_ms: int | None = None
    history_count: int | None = None


@fast_init  # made once or more per run
@dataclass(frozen=True)
class Fired:
    """What a listener reports to its observer after each run (the demo and bench use it)."""

    timer_id: str
    task: str | None
    due_ms: int
    started_ms: float
    finished_ms: float
    source: str
    attempt: int
    outcome: Outcome
    group: str = DEFAULT_GROUP
    trace: str | None = None
    """The ``traceparent`` of the span that scheduled the timer, if it was stored."""

    @property
    def lateness_ms(self) -> float:
        """Task start minus due time, on the Redis clock."""
        return self.started_ms - self.due_ms
