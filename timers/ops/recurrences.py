"""The recurrence operations of :class:`timers.ops.operations.Operations`: declare, change,
pause, resume, remove and read recurring timers (see :mod:`timers.model.cron`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from timers.exceptions import MalformedTimerKey, TimersError
from timers.model.cron import Recurrence, check_name, decode_recurrences, read_state
from timers.model.cron.schedule import from_ms, to_ms
from timers.model.encoding import as_text, escape_id
from timers.model.keys import Keyspace
from timers.ops.base import Call, Operation, pairs
from timers.store.script_calls import ScriptCalls

DECLARE_ATTEMPTS = 20
"""Reads and writes of a recurrence declaration before giving up on a state that keeps
changing (each retry means another process changed it in between)."""


class RecurrenceOperations:
    """Recurring timers, as sans-I/O operations (one round trip per yield)."""

    keys: Keyspace
    calls: ScriptCalls
    max_args_bytes: int

    def every(self, spec: Recurrence) -> Operation[Recurrence]:
        """Declare a recurrence, or change it in place; declaring it unchanged changes
        nothing (its pending occurrence included)."""
        definition = spec.definition(self.max_args_bytes)
        return (yield from self._declare(spec, definition, "keep"))

    def _declare(self, spec: Recurrence, definition: str, paused: str) -> Operation[Recurrence]:
        name_field = escape_id(spec.name)
        for _ in range(DECLARE_ATTEMPTS):
            now, stored, raw_state = yield [
                Call(command=("TIME",)),
                Call(command=("HGET", self.keys.recurrences, name_field)),
                Call(command=("HGET", self.keys.recurrence_states, name_field)),
            ]
            now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
            state = read_state(raw_state)
            anchor = now_ms
            if spec.interval is not None and state.anchor and stored is not None:
                with contextlib.suppress(MalformedTimerKey):
                    old = Recurrence.from_redis(spec.name, stored, None)
                    anchor = state.anchor if old.interval == spec.interval else now_ms
            schedule = spec.schedule(from_ms(anchor))
            version = state.version + 1
            # later than now, and than the last occurrence a listener may have taken
            due_if_withdrawn = to_ms(schedule.next_after(from_ms(max(now_ms, state.prev))))
            due_otherwise = to_ms(schedule.next_after(from_ms(max(now_ms, state.last))))
            _, record = spec.occurrence(version, due_otherwise, self.max_args_bytes)
            (reply,) = yield [Call.of(self.calls.cron_declare(
                name_field=name_field, definition=definition,
                read_state=as_text(raw_state) if raw_state is not None else "", paused=paused,
                version=version, anchor_ms=anchor if spec.interval is not None else 0,
                record=record, due_if_withdrawn=due_if_withdrawn, due_otherwise=due_otherwise,
            ))]
            result, version, due = (int(x) for x in reply)
            if result == -1:
                continue  # the state moved on between the read and the write: read again
            return replace(
                spec, version=version, next_due=None if due == -1 else from_ms(due),
                paused=state.paused if paused == "keep" else paused == "1",
                anchor=from_ms(anchor) if spec.interval is not None else None,
            )
        raise TimersError(f"recurrence {spec.name!r} kept changing while being declared")

    def unschedule_recurring(self, name: str) -> Operation[bool]:
        """Delete a recurrence and its pending occurrence; False if there was none."""
        (reply,) = yield [Call.of(self.calls.cron_remove(escape_id(check_name(name))))]
        return int(reply) == 1

    def pause(self, name: str) -> Operation[bool]:
        """Stop scheduling occurrences (the pending one is withdrawn); False if unknown."""
        (reply,) = yield [Call.of(self.calls.cron_pause(escape_id(check_name(name))))]
        return int(reply) != -1

    def resume(self, name: str) -> Operation[bool]:
        """Schedule a paused recurrence again from now (missed times are not caught up);
        False if unknown."""
        name_field = escape_id(check_name(name))
        stored, raw_state = yield from self._read(name_field)
        if stored is None:
            return False
        if raw_state is not None and not read_state(raw_state).paused:
            return True
        current = Recurrence.from_redis(name, stored, None)
        yield from self._declare(current, as_text(stored), "0")
        return True

    def _read(self, name_field: str) -> Operation[tuple[Any, Any]]:
        """A recurrence's stored definition and state (each None when absent)."""
        stored, raw_state = yield [
            Call(command=("HGET", self.keys.recurrences, name_field)),
            Call(command=("HGET", self.keys.recurrence_states, name_field)),
        ]
        return stored, raw_state

    def get_recurrence(self, name: str) -> Operation[Recurrence | None]:
        """One recurrence as Redis holds it, or None."""
        name_field = escape_id(check_name(name))
        stored, raw_state = yield from self._read(name_field)
        if stored is None:
            return None
        pending = yield from self._pending({name_field: raw_state})
        return Recurrence.from_redis(name, stored, raw_state, pending.get(name_field, False))

    def recurrences(self) -> Operation[list[Recurrence]]:
        """Every recurrence, by name."""
        defs, states = yield [
            Call(command=("HGETALL", self.keys.recurrences)),
            Call(command=("HGETALL", self.keys.recurrence_states)),
        ]
        defs = dict(pairs(defs))
        states = dict(pairs(states))
        pending = yield from self._pending({as_text(k): v for k, v in states.items()})
        return decode_recurrences(defs, states, pending)

    def _pending(self, states: Mapping[str, Any]) -> Operation[dict[str, bool]]:
        """Whether each recurrence's latest occurrence is still waiting in the due index."""
        fields = [f for f, raw in states.items() if raw is not None]
        if not fields:
            return {}
        replies = yield [
            Call(command=("HEXISTS", self.keys.records,
                          f"{f}@{read_state(states[f]).last}")) for f in fields
        ]
        return {f: bool(int(r)) for f, r in zip(fields, replies, strict=True)}
