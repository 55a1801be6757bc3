"""Releases that disagree on a task's group: move a timer a bounded number of times, then
let it wait where it is, saying why.

A listener that claims a timer whose task declares another group (``@task(group=…)``)
moves it there, uncounted as an attempt. When two releases disagree (listener A serves
``a`` and its code says ``b``; B serves ``b`` and its code says ``a``), each would move it
back: a livelock. So a timer counts its moves (:attr:`Option.GROUP_MOVES`), and:

- its first :data:`FREE_MOVES` moves happen at once (a task moved to another group by a
  release, a rolling deploy);
- after those, the listener leaves it pending in the group it is in, due again
  :data:`RECHECK_MS` later (its lateness still counts from its own due time), marked with
  the group its task declares here (:attr:`Option.GROUP_DISAGREEMENT`), which ``timers
  get`` and ``timers list`` show; a listener of that group whose release agrees then runs
  it;
- a timer that has waited may move once more after each wait (the releases may agree by
  now, on the other group), up to :data:`MAX_MOVES` moves in all; then it only waits.

Pure functions of the record: the executor applies them.
"""

from __future__ import annotations

from dataclasses import dataclass

from timers.model.encoding import Record
from timers.model.keys import DEFAULT_GROUP
from timers.model.wire import Option

FREE_MOVES = 3
"""Moves a timer makes at once before it waits between moves."""
MAX_MOVES = 10
"""Moves a timer makes in all; after these it waits in its group until one agrees."""
RECHECK_MS = 60_000
"""How long a timer left unmoved waits before a listener of its group looks again."""
_GROUP = Option.GROUP  # read once: group_of is on every run's path


def group_of(record: Record) -> str:
    """The group a record names (absent: the default group)."""
    return record.options.get(_GROUP) or DEFAULT_GROUP


def moves_of(record: Record) -> int:
    """How many times the timer was moved to its task's group so far."""
    value = record.options.get(Option.GROUP_MOVES, "0")
    return int(value) if value.isascii() and value.isdigit() else 0


def may_move(record: Record) -> bool:
    """Whether a listener may move this timer to the group its task declares now, or must
    leave it waiting (see the module doc)."""
    moves = moves_of(record)
    waited = Option.GROUP_DISAGREEMENT in record.options
    return moves < FREE_MOVES or (waited and moves < MAX_MOVES)


def describe(task: str, declared: str, served: str) -> str:
    """``group disagreement: task T says group X, listener serves Y``."""
    return f"group disagreement: task {task} says group {declared}, listener serves {served}"


@dataclass(frozen=True)
class Disagreement:
    """A timer left waiting: its task, the group its task declares at the listener that
    left it, and the group it waits in (the one that listener serves)."""

    task: str
    declared: str
    served: str

    @classmethod
    def of(cls, record: Record) -> Disagreement | None:
        """The disagreement a record waits on, or None."""
        declared = record.options.get(Option.GROUP_DISAGREEMENT)
        return None if declared is None else cls(record.task, declared, group_of(record))

    def describe(self) -> str:
        return describe(self.task, self.declared, self.served)


def _encoded(record: Record, options: dict[str, str]) -> str:
    return Record(record.task, record.args, options).encode(max_args_bytes=1 << 62)


def moved(record: Record, group: str) -> str:
    """The record moved to ``group``: its move counted, no longer waiting, other options
    kept."""
    options = {k: v for k, v in record.options.items()
               if k not in (Option.GROUP, Option.GROUP_DISAGREEMENT)}
    if group != DEFAULT_GROUP:
        options[Option.GROUP] = group
    options[Option.GROUP_MOVES] = str(moves_of(record) + 1)
    return _encoded(record, options)


def waiting(record: Record, declared: str, waited_from_ms: int) -> str:
    """The record left in its group, waiting on a disagreement: ``declared`` is the group
    its task declares here; its lateness counts from ``waited_from_ms``."""
    options = dict(record.options)
    options[Option.GROUP_DISAGREEMENT] = declared
    options.setdefault(Option.WAITED_FROM, str(waited_from_ms))
    return _encoded(record, options)
