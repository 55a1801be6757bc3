"""The history of a chaos run: the ledger the tasks write, and the final state read from
Redis once every listener stopped (dead timers with their reasons, what is still pending)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from bench.chaos.checker import Dead, Mark
from timers import Timers


def read_ledger(path: Path) -> list[Mark]:
    """Every complete line of the ledger (a line being written, or torn by a kill, is
    left out)."""
    try:
        text = path.read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return []
    marks = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            continue
        try:
            marks.append(Mark.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError):
            continue
    return marks


def completed(marks: Iterable[Mark]) -> set[str]:
    """Timers with a run that returned."""
    return {m.run_of for m in marks if m.kind == "E" and m.ok}


def dead_timers(timers: Timers, limit: int = 100_000) -> list[Dead]:
    """The dead timers of a prefix, with their reasons."""
    out = []
    for failure in timers.failed(limit):
        record = failure.record
        if record.id is None or record.task is None:
            continue  # a rejected event key: no timer
        out.append(Dead(record.id, record.kind, record.error_type, record.message))
    return out


def pending_ids(timers: Timers, task: str, limit: int = 100_000) -> set[str]:
    """The pending timers of ``task`` in a prefix."""
    return {p.id for p in timers.list(limit) if p.task == task}
