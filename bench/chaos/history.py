"""The history of a chaos run: the ledger the tasks write, and the final state read from
Redis once every listener stopped (dead timers with their reasons, what is still pending)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.chaos.checker import Cancel, Cut, Dead, History, Mark, Move, Scheduled
from timers import Timers

SAVED = "history.json"
"""Next to the ledger: the rest of the history, so ``--check DIR`` can judge it again."""


def read_ledger(path: Path) -> list[Mark]:
    """Every complete run line of the ledger (a line being written, or torn by a kill, is
    left out)."""
    marks = []
    for data in _lines(path):
        try:
            marks.append(Mark.from_json(data))
        except (ValueError, KeyError, TypeError):
            continue
    return marks


def read_stalls(path: Path) -> list[tuple[int, float, float]]:
    """Every stall the ledger's ``G`` lines note (:mod:`bench.fault_tasks.stall_watch`): the
    process, and the monotonic times of the ticks before and after it."""
    stalls = []
    for data in _lines(path):
        if data.get("k") == "G":
            try:
                stalls.append((int(data["pid"]), float(data["from"]), float(data["to"])))
            except (ValueError, KeyError, TypeError):
                continue
    return stalls


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    """The ledger's complete lines that are JSON objects."""
    try:
        text = path.read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            yield data


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


def save(history: History, directory: Path) -> None:
    """Write everything but the ledger's lines to ``directory/history.json``."""
    data: dict[str, Any] = asdict(history)
    del data["marks"]
    data["left_in_source"] = sorted(history.left_in_source)
    for cut in data["cuts"]:
        cut["pids"] = sorted(cut["pids"])
    for move in data["moves"]:
        move["source_listeners"] = sorted(move["source_listeners"])
    (directory / SAVED).write_text(json.dumps(data))


def load(directory: Path, ledger: str = "ledger.jsonl") -> History:
    """The history :func:`save` wrote, with the ledger's lines."""
    data = json.loads((directory / SAVED).read_text())
    return History(
        marks=read_ledger(directory / ledger),
        scheduled={k: Scheduled(**v) for k, v in data["scheduled"].items()},
        cancels=[Cancel(**c) for c in data["cancels"]],
        cuts=[Cut(**{**c, "pids": frozenset(c["pids"])}) for c in data["cuts"]],
        moves=[Move(**{**m, "source_listeners": frozenset(m["source_listeners"])})
               for m in data["moves"]],
        limits=data["limits"], rates=data["rates"],
        dead=[Dead(**d) for d in data["dead"]],
        left_in_source=set(data["left_in_source"]),
    )
