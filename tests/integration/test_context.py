"""``timers.current()`` against the real server: a task sees its id and attempt on the first
run and on its retry, in a thread and on the event loop."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.integration.helpers import ListenerThread, settled
from tests.unit.conftest import SAMPLE_TASKS
from timers import Timers

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def test_a_task_sees_its_id_and_attempt_on_first_run_and_retry(
        timers_client: Timers, start_listener: Callable[..., ListenerThread],
        tmp_path: Path) -> None:
    listener = start_listener(tasks=SAMPLE_TASKS)
    sync_out, async_out = tmp_path / "sync.jsonl", tmp_path / "async.jsonl"
    timers_client.schedule("ctx.fails_once", [str(sync_out)], in_=0.05, id="order-1")
    timers_client.schedule("ctx.async_fails_once", [str(async_out)], in_=0.05, id="order-2")

    def seen(path: Path) -> list[dict[str, object]]:
        text = path.read_text() if path.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    wait_until(lambda: len(seen(sync_out)) == len(seen(async_out)) == 2
               and settled(timers_client), 10, message="both tasks to run twice")
    for path, timer_id, task in [(sync_out, "order-1", "ctx.fails_once"),
                                 (async_out, "order-2", "ctx.async_fails_once")]:
        first, second = seen(path)
        assert [(r["id"], r["task"], r["attempt"]) for r in (first, second)] == [
            (timer_id, task, 1), (timer_id, task, 2)]
        assert first["original_due"] == second["original_due"] == first["due"]
    attempts = sorted((f.timer_id, f.attempt, f.outcome.kind) for f in listener.reports())
    assert attempts == [("order-1", 1, "error"), ("order-1", 2, "ok"),
                        ("order-2", 1, "error"), ("order-2", 2, "ok")]
