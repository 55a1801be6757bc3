"""What runs now, and what limits a task's runs, as Redis shows them: for the dashboard's
task and recurrence pages.

A task declares its limits in code (``@timers.task(concurrency=…, key=…, rate=…)``), which
only listeners import; Redis holds what those limits are doing: the slots of a concurrency
key held by runs (``P|held``: ``limit|lease|key``), the timers waiting in a key's or a rate
limit's queue (``P|parked``: the limit or interval with each), a rate limit's next slot
(``P|rate|<name>``). A task-wide limit is named ``task:<task>``
(:data:`timers.model.flow.names.TASK_KEY`). So a limit shows here once a run of the task
holds it or a timer of the task waits on it. These are admin reads: they read the whole
``P|parked`` and ``P|held`` hashes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from timers.model.encoding import Record, as_text
from timers.model.flow.names import TASK_KEY
from timers.model.keys import DEFAULT_GROUP, Keyspace
from timers.model.runs import Run
from timers.ops.base import Call, Operation, pairs
from timers.ops.fleet import decode_task_set
from timers.ops.flow_views import Parked, parked_entries, read_record
from timers.ops.listings import listener_groups


@dataclass(frozen=True)
class Running:
    """A run under way: its token, the timer it runs, and its group."""

    run: Run
    record: Record | None
    group: str
    lease_ms: float


def running_runs(keys: Keyspace) -> Operation[list[Running]]:
    """Every run under way in every group (the groups with a due index, and those the
    listeners' heartbeats name), in lease order. Three round trips."""
    now, queues, infos = yield [Call(command=("TIME",)), Call(command=("SMEMBERS", keys.queues)),
                                Call(command=("HGETALL", keys.listener_info))]
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    groups = sorted({DEFAULT_GROUP, *listener_groups(infos),
                     *(as_text(q).rpartition("|")[0] for q in queues)} - {""})
    heads = yield [Call(command=("ZRANGEBYSCORE", keys.running_of(g), now_ms, "+inf",
                                 "WITHSCORES")) for g in groups]
    tokens = [(g, as_text(t), float(s)) for g, head in zip(groups, heads, strict=True)
              for t, s in pairs(head)]
    if not tokens:
        return []
    (texts,) = yield [Call(command=("HMGET", keys.running_records, *(t for _, t, _ in tokens)))]
    out = []
    for (group, token, lease), text in zip(tokens, texts, strict=True):
        if text is None:
            continue
        try:
            run = Run.parse(token, text, "s")
        except ValueError:
            continue
        out.append(Running(run, read_record(run.record_text), group, lease))
    return out


@dataclass(frozen=True)
class Limit:
    """One concurrency key or rate limit as Redis shows it."""

    kind: str
    """``key`` or ``rate``."""
    name: str
    limit: str
    """``2 at once``, ``1 every 600 ms (burst 1)``, or ``?`` (no run or wait shows it)."""
    running: int = 0
    """A key's slots held now."""
    waiting: int = 0
    """Timers waiting for it (of every task)."""
    waiting_here: int = 0
    """Of those, the task's."""
    next_slot_ms: float | None = None
    """A rate limit's next free slot (Redis ms)."""


@dataclass(frozen=True)
class TaskFlow:
    """The limits a task's runs meet, and its runs under way."""

    task: str
    limits: list[Limit] = field(default_factory=list)
    running: list[Running] = field(default_factory=list)


def _limit_text(kind: str, values: set[tuple[int, int]]) -> str:
    if not values:
        return "?"
    a, b = sorted(values)[-1]
    return f"{a} at once" if kind == "key" else f"1 every {a:,} ms (burst {b})"


def task_flow(keys: Keyspace, task: str) -> Operation[TaskFlow]:
    """The limits ``task``'s runs and waiting timers meet, and its runs under way."""
    running = [r for r in (yield from running_runs(keys))
               if r.record is not None and r.record.task == task]
    now, parked_reply, held_reply = yield [Call(command=("TIME",)),
                                           Call(command=("HGETALL", keys.parked)),
                                           Call(command=("HGETALL", keys.held))]
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    parked = parked_entries(parked_reply)
    ids = list(parked)
    (records,) = (yield [Call(command=("HMGET", keys.records, *ids))]) if ids else ([],)
    named, waits = _limits_met(task, parked, records, held_reply,
                               {r.run.token for r in running})
    order = sorted(named)
    replies = yield [call for kind, name in order for call in _state_calls(keys, kind, name,
                                                                          now_ms)]
    limits = []
    for i, (kind, name) in enumerate(order):
        first, waiting = replies[2 * i], int(replies[2 * i + 1])
        text, here = _limit_text(kind, named[(kind, name)]), waits.get((kind, name), 0)
        if kind == "key":
            shown = Limit(kind, name, text, running=int(first), waiting=waiting,
                          waiting_here=here)
        else:
            tat = float(first) if first is not None else None
            shown = Limit(kind, name, text, waiting=waiting, waiting_here=here,
                          next_slot_ms=tat if tat is not None and tat > now_ms else None)
        if shown.running or shown.waiting or named[(kind, name)] or shown.next_slot_ms:
            limits.append(shown)
    return TaskFlow(task, limits, running)


_Named = dict[tuple[str, str], set[tuple[int, int]]]


def _limits_met(task: str, parked: dict[str, Parked], records: list[Any], held_reply: Any,
                own_tokens: set[str]) -> tuple[_Named, dict[tuple[str, str], int]]:
    """The limits (kind, name) ``task`` meets, each with the (limit, burst) values seen,
    and how many of the task's timers wait on each: its task-wide key and rate, the keys and
    rates its waiting timers are parked on, and the keys its runs hold a slot of."""
    named: _Named = {("key", TASK_KEY + task): set(), ("rate", TASK_KEY + task): set()}
    waits: dict[tuple[str, str], int] = {}
    for p, value in zip(parked.values(), records, strict=True):
        kind = "key" if p.is_key else "rate"
        record = read_record(value)
        if record is not None and record.task == task:
            named.setdefault((kind, p.name), set())
            if p.waiting:
                waits[(kind, p.name)] = waits.get((kind, p.name), 0) + 1
    for p in parked.values():
        kind = "key" if p.is_key else "rate"
        if (kind, p.name) in named:
            named[(kind, p.name)].add((p.a, p.b) if kind == "rate" else (p.a, 0))
    held = {as_text(t): as_text(v).split("|", 2) for t, v in pairs(held_reply)}
    for token, parts in held.items():
        if len(parts) == 3 and parts[0].isdigit() and (
                token in own_tokens or ("key", parts[2]) in named):
            named.setdefault(("key", parts[2]), set()).add((int(parts[0]), 0))
    return named, waits


def _state_calls(keys: Keyspace, kind: str, name: str, now_ms: int) -> list[Call]:
    """What a limit's state is read with: a key's live slots and queue, a rate's next
    arrival time (``tat``) and queue."""
    if kind == "key":
        return [Call(command=("ZCOUNT", keys.slots(name), f"({now_ms}", "+inf")),
                Call(command=("ZCARD", keys.key_queue(name)))]
    return [Call(command=("HGET", keys.rate(name), "tat")),
            Call(command=("ZCARD", keys.rate_queue(name)))]


def announced_tasks(keys: Keyspace) -> Operation[set[str]]:
    """The task paths the live listeners announce (``P|tasks``, :mod:`timers.ops.fleet`)."""
    (sets,) = yield [Call(command=("HVALS", keys.task_sets))]
    return {task for value in sets for task in decode_task_set(as_text(value))}
